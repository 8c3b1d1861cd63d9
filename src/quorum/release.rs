//! Giving a lock up on a quorum: delete the key on every master (the owner's, or with force
//! anyone's) and publish the release, which wakes waiters of every client (`wait.rs`).

use std::time::{Duration, Instant};

use super::round::Round;
use super::wait;
use super::{Quorum, Tally};
use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::key::LockKeys;
use crate::metrics::{self, Op};
use crate::net::wire::Arg;
use crate::scripts;

/// Releases what a failed attempt took, on every master, not waited for. It tells other
/// clients only with `tell` (the attempt had a majority of grants, so waiters refused by
/// them wait for a release message); otherwise nobody: no grant was reported, and a
/// message would wake the other waiters (this client's head is the caller) only to find
/// the lock as it was.
///
/// It goes behind the attempt's calls on `round`'s lanes, so that on every master it runs after
/// the acquire it undoes, however late that one runs. Where the acquire was not `answered`, it
/// may still run after the release all the same (sent again by a worker, on another
/// connection): the release remembers the owner there, so that the acquire is refused.
pub(super) fn give_up(
    q: &Quorum,
    round: &mut Round<'_>,
    keys: &LockKeys,
    lease: Duration,
    tell: bool,
    answered: &[bool],
) {
    let channel = if tell {
        wait::channel(&q.namespace, keys.tag())
    } else {
        String::new()
    };
    // Worth sending for as long as the attempt's lease may last: an acquire that reached a
    // frozen master runs when it wakes, and this release behind it then frees that master.
    let expires = Instant::now() + lease;
    let ran = |m: &usize| answered.get(*m).copied().unwrap_or(false);
    round.send_unwatched(
        q.all().filter(ran),
        &scripts::QUORUM_RELEASE,
        release_call(keys, &channel, false),
        expires,
    );
    // Usually every master answered: no second call to build.
    if q.all().all(|m| ran(&m)) {
        return;
    }
    round.send_unwatched(
        q.all().filter(|m| !ran(m)),
        &scripts::QUORUM_RELEASE,
        release_call(keys, &channel, true),
        expires,
    );
}

/// The release of a grant whose holder waits for the answer (`unlock`), a response timeout at
/// most.
pub(super) fn release(q: &Quorum, grant: &Grant) -> Result<()> {
    let user = grant.keys.user();
    let until = Instant::now() + q.response_timeout;
    let released = match release_keys(q, &grant.keys, Some(until)) {
        Some(Ok(false)) => {
            grant.mark_lost("a majority of the masters no longer held it at release");
            Err(Error::LockLost {
                key: user.to_owned(),
            })
        }
        Some(Err(e)) => {
            log::warn!("fencelock: releasing {user:?} failed, it expires with its lease: {e}");
            Err(e)
        }
        Some(Ok(true)) | None => Ok(()),
    };
    if let Err(e) = &released {
        metrics::failed(grant.keys.namespace(), Op::Unlock, e);
    }
    released
}

/// Releases a grant's keys on every master and tells waiters (this client's at once, others
/// by a message from each master). With `wait`, waits until then for the answers: `true`
/// when released (found and deleted on at least one master, and not found gone on more than
/// N − majority), `false` when more than N − majority said it was not ours any more (the
/// lease ran out first); without, returns at once (`None`).
pub(super) fn release_keys(
    q: &Quorum,
    keys: &LockKeys,
    wait: Option<Instant>,
) -> Option<Result<bool>> {
    let channel = wait::channel(&q.namespace, keys.tag());
    // A drop waits for nothing: the release is worth sending while the lease may last.
    let expires =
        wait.unwrap_or_else(|| Instant::now() + q.response_timeout.max(Duration::from_secs(5)));
    let packed = release_call(keys, &channel, true);
    let Some(until) = wait else {
        let _ = q.ask(q.all(), &scripts::QUORUM_RELEASE, packed, expires, false);
        q.waiters.wake_head(keys.tag());
        return None;
    };
    let mut round = q.round();
    round.send(q.all(), &scripts::QUORUM_RELEASE, packed, expires);
    // This client's next waiter needs no message from Redis. Woken now, its attempt races
    // this release on the masters, and the release's messages wake it again if it lost:
    // waking it only once a majority released (the messages then repeats) cost a third of
    // the acquisitions under contention.
    q.waiters.wake_head(keys.tag());
    let n = q.masters.len();
    // A release sent twice (the first connection broke) that finds nothing: the first run
    // may have deleted it.
    let Tally { yes, no, failed } = q.tally(&mut round, until, true);
    // Lost when a majority says the key is gone or another's. Otherwise released where it
    // was found: a master that failed or did not answer may hold it still, and it expires
    // there with its lease (as it would after a grant that master never saw).
    if no > n - q.majority {
        return Some(Ok(false));
    }
    if yes > 0 {
        return Some(Ok(true));
    }
    Some(match failed.into_iter().next() {
        Some(e) => Err(Error::from_redis(e)),
        None => Err(Error::Timeout(
            "no majority of the masters answered in time".into(),
        )),
    })
}

/// Deletes the lock on every master, whoever holds it; whether a majority held it. Never
/// sent twice to one master: a second run could delete a grant made after the first.
pub(super) fn force_unlock(q: &Quorum, keys: &LockKeys) -> Result<bool> {
    let until = Instant::now() + q.response_timeout;
    let channel = wait::channel(&q.namespace, keys.tag());
    let mut packed = Vec::with_capacity(128);
    scripts::evalsha(
        &mut packed,
        &scripts::QUORUM_FORCE,
        &[keys.lock()],
        &[Arg::Str(&channel)],
    );
    let rx = q.ask(q.all(), &scripts::QUORUM_FORCE, packed, until, true);
    let n = q.masters.len();
    let (mut deleted, mut answered, mut failed) = (0, 0, None);
    while answered + usize::from(failed.is_some()) < n {
        let Ok(reply) = rx.recv_deadline(until) else {
            break;
        };
        match reply
            .result
            .and_then(|v| Ok(redis::from_redis_value::<i64>(v)?))
        {
            Ok(found) => {
                answered += 1;
                deleted += usize::from(found == 1);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    q.waiters.wake_head(keys.tag());
    if answered < q.majority {
        return Err(match failed {
            Some(e) => Error::from_redis(e),
            None => Error::Timeout("no majority of the masters answered in time".into()),
        });
    }
    Ok(deleted >= q.majority)
}

/// A release call of `keys.owner()`, telling `channel` (nobody if empty). With `remember`,
/// where it finds the key gone it remembers the owner for [`REMEMBERED`], so that the attempt's
/// acquire, if it runs there later, is refused (`quorum_release.lua`). Without, for masters
/// that answered the acquire already: it cannot run after.
fn release_call(keys: &LockKeys, channel: &str, remember: bool) -> Vec<u8> {
    let mut packed = Vec::with_capacity(200);
    if !remember {
        scripts::evalsha(
            &mut packed,
            &scripts::QUORUM_RELEASE,
            &[keys.lock()],
            &[Arg::Str(keys.owner()), Arg::Str(channel)],
        );
        return packed;
    }
    let released = released_key(keys);
    scripts::evalsha(
        &mut packed,
        &scripts::QUORUM_RELEASE,
        &[keys.lock(), &released],
        &[
            Arg::Str(keys.owner()),
            Arg::Str(channel),
            Arg::Int(crate::key::millis(REMEMBERED)),
        ],
    );
    packed
}

/// How long a master remembers a release that ran before its acquire: far longer than two
/// connections to one master reorder requests, short enough to leave nothing behind. An
/// acquire later still (held by a master frozen for longer) leaves a key that expires with its
/// lease, as before.
const REMEMBERED: Duration = Duration::from_secs(10);

/// `<lock key>:released`: the owner ids of releases that ran before their acquire.
pub(super) fn released_key(keys: &LockKeys) -> String {
    format!("{}:released", keys.lock())
}
