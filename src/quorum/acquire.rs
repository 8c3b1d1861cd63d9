//! A lock call on a quorum: one attempt (acquire on every master proposing a token, which is the
//! grant's when a majority took it; otherwise confirm the largest token on a majority), and the
//! loop around it: the head of the key's local queue attempts; a refused head
//! waits for a release message or for the holder's lease to run out, a split one for a random
//! pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisError;

use super::release;
use super::wait::Waited;
use super::{Next, Quorum};
use crate::error::{Error, Result};
use crate::grant::{deadline_of, Grant, NewGrant};
use crate::key::LockKeys;
use crate::metrics;
use crate::net::wire::Arg;
use crate::options::LockOptions;
use crate::scripts::{self, Acquire};
use crate::token::FencingToken;

/// What one attempt came to.
pub(crate) enum Attempt {
    /// Granted by a majority and confirmed: the token, and when the attempt started (the
    /// lease's start, for the deadline).
    Granted(FencingToken, Instant),
    /// A majority refused for one holder: the lock may be free in about this long (the
    /// majority-th shortest of the leases they reported).
    Held(Option<Duration>, String),
    /// No majority either way: masters split between attempts (or held by what failed
    /// attempts left, being released), down, or slow. Retry after a random pause, a short one
    /// when `ahead` (this attempt had more grants than any other owner had refusals) and the call
    /// has waited before: the others' attempts are the ones to step back (with a frozen minority
    /// every meeting of two attempts is a split, and both stepping back as long cost grants).
    Split { ahead: bool },
}

/// One attempt, no waiting: the grant, or `None` if the lock is held or the masters split.
pub(super) fn once(
    q: &Quorum,
    mut keys: LockKeys,
    lease: Duration,
    options: &LockOptions,
) -> Result<Option<Arc<Grant>>> {
    q.owners.next(&mut keys);
    Ok(match attempt(q, &keys, lease, None, &mut None)? {
        Attempt::Granted(token, sent) => Some(hold(q, keys, token, sent, lease, options)),
        Attempt::Held(..) | Attempt::Split { .. } => None,
    })
}

/// Waits in the key's local queue until granted, `deadline`, or cancelled: the head attempts;
/// a refused head waits for a release message or for the holder's lease to run out, a split
/// one for a random pause.
pub(super) fn until(
    q: &Quorum,
    mut keys: LockKeys,
    lease: Duration,
    deadline: Option<Instant>,
    options: &LockOptions,
) -> Result<Option<Arc<Grant>>> {
    // The start of the first attempt since a majority of the masters last answered one: the
    // call's patience runs from there across attempts.
    let mut quiet = None;
    let next_attempt = |keys: &mut LockKeys, quiet: &mut Option<Instant>| {
        // A new owner id per attempt: a late release of a failed one must not delete this
        // one's key.
        q.owners.next(keys);
        attempt(q, keys, lease, deadline, quiet)
    };
    let ticket = q.waiters.join(keys.tag());
    // When the head attempts next, unless woken first.
    let mut retry_at = Instant::now();
    // The last attempt found no majority either way and was ahead: a wake does not cut its
    // short pause.
    let mut split = false;
    // Such attempts in a row: masters down or slow make the pauses grow.
    let mut splits = 0u32;
    // Refused attempts in a row. A refusal may come from other clients' failed attempts,
    // whose keys go at once and whose releases tell nobody, as well as from a holder, whose
    // release does: the timer grows from a short pause, to 2 s at most.
    let mut refusals = 0u32;
    // This call has been refused or split before: it has waited.
    let mut waited = false;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let due = Instant::now() >= retry_at;
        if due && ticket.is_head() {
            ticket.clear();
            split = false;
            let outcome = next_attempt(&mut keys, &mut quiet)?;
            if !matches!(outcome, Attempt::Granted(..)) {
                ticket.refused(&q.connector, q.connection_timeout);
            }
            let retry = match outcome {
                Attempt::Granted(token, sent) => {
                    ticket.granted();
                    return Ok(Some(hold(q, keys, token, sent, lease, options)));
                }
                // A release wakes us before then; the timer is for a holder that died.
                Attempt::Held(free_in, holder) => {
                    waited = true;
                    splits = 0;
                    // Refused by the owner whose release we heard: it has not reached every
                    // master yet, and its other messages were dropped as repeats.
                    if ticket.heard_release_of(&holder) {
                        refusals = 0;
                    }
                    let free_in = free_in.unwrap_or(lease).min(lease);
                    let pause = (MAX_PAUSE * 2u32.saturating_pow(refusals))
                        .min(MAX_HELD_PAUSE)
                        .min(free_in);
                    refusals = refusals.saturating_add(1);
                    Instant::now() + pause + jitter(pause / 10 + MIN_PAUSE)
                }
                // Others attempted at the same moment, or masters failed: a random pause
                // keeps the next attempts from meeting again. The attempt that was ahead
                // retries first; the others wait for its release as if refused by it (a wake
                // cuts their pause short): with a frozen minority every meeting of two
                // attempts is a split, and a pause that ignored the winner's release made its
                // waiter miss it.
                Attempt::Split { ahead } => {
                    // Only a call that has waited already takes the short pause: a thread
                    // woken by its own client's release is usually ahead of a waiter of
                    // another client (its acquire went out first), and taking the lock
                    // from it on every meeting would starve that client.
                    let ahead = ahead && std::mem::replace(&mut waited, true);
                    split = ahead;
                    refusals = 0;
                    let first = if ahead { AHEAD_PAUSE } else { MAX_PAUSE };
                    let most = (first * 2u32.saturating_pow(splits)).min(MAX_SPLIT_PAUSE);
                    splits = splits.saturating_add(1);
                    Instant::now() + MIN_PAUSE + jitter(most)
                }
            };
            // No pause outlasts the call's patience: with no majority answering, the next
            // attempt is the one that reports it.
            retry_at = quiet.map_or(retry, |since| retry.min(q.gives_up_at(since)));
            continue;
        }
        // A thread behind the head looks again every second: a head that left with the lock
        // wakes nobody, and a lock lost rather than released wakes nobody either.
        let at = if ticket.is_head() {
            retry_at
        } else {
            Instant::now() + NOT_HEAD_LOOK
        };
        let until = deadline.map_or(at, |d| at.min(d));
        match ticket.wait(until, options.cancel.as_ref()) {
            // A release: attempt now, unless a split asked for a pause.
            Waited::Woken(_) if !split => retry_at = Instant::now(),
            Waited::Woken(_) | Waited::TimedOut => {}
            Waited::Cancelled => return Err(Error::Cancelled),
        }
    }
}

/// Holds a grant of the lease asked for, sent at `sent`.
fn hold(
    q: &Quorum,
    keys: LockKeys,
    token: FencingToken,
    sent: Instant,
    lease: Duration,
    options: &LockOptions,
) -> Arc<Grant> {
    let grant = q.hold(NewGrant {
        keys,
        token,
        sent,
        granted: lease,
        lease,
        auto_renew: !options.no_renewal,
        max_hold: options.max_hold,
        queued: false,
        local_run: 0,
    });
    // A quorum has no handoff: every grant is its holder's own attempt.
    metrics::granted(&q.namespace, metrics::How::Attempt);
    grant
}

/// One attempt for `keys.owner()` (fresh for this attempt), with `lease`, giving up at
/// `deadline`. On anything but a grant, the attempt's keys are released on every master.
/// `quiet` is the start of the call's first attempt since the last one a majority of the
/// masters answered (`None` while the last one was): a call whose attempts end early
/// (masters stalled) gives up a connection and a response timeout after the majority went
/// quiet, whatever the number of attempts, and the pauses between attempts that were
/// answered do not count.
///
/// # Errors
/// When a majority of the masters failed (none refused): the quorum is unreachable, not
/// busy. A timeout among the failures makes it `Error::Timeout`, as does no majority
/// answering for a connection and a response timeout since `quiet`.
fn attempt(
    q: &Quorum,
    keys: &LockKeys,
    lease: Duration,
    deadline: Option<Instant>,
    quiet: &mut Option<Instant>,
) -> Result<Attempt> {
    let n = q.masters.len();
    let t0 = Instant::now();
    // Past this the lease may have run out on the masters that granted first.
    let valid_until = deadline_of(t0, lease);
    // A reply is awaited until the caller's deadline, but at least a little while: a
    // deadline that is all but past still gets its attempt. No majority answering within a
    // connection and a response timeout of the last time one did is a timeout (a worker
    // connecting to a frozen master can take both).
    let gives_up = q.gives_up_at(quiet.unwrap_or(t0));
    let patience = gives_up.max(t0 + MIN_WAIT);
    let stop = deadline
        .map_or(valid_until, |d| d.max(t0 + MIN_WAIT).min(valid_until))
        .min(patience);
    let proposal = q.proposer.next(t0);
    let proposed = proposal.to_string();
    let mut packed = Vec::with_capacity(300);
    let [lock, fence, queue, entries] = keys.all();
    let released = release::released_key(keys);
    scripts::evalsha(
        &mut packed,
        &scripts::ACQUIRE,
        &[lock, fence, queue, entries, &released],
        &[
            Arg::Str(keys.owner()),
            Arg::Int(crate::key::millis(lease)),
            // Never queued; a refusal names the holder; a grant may take the proposal.
            Arg::Str("h"),
            Arg::Int(keys.idle_ms()),
            Arg::Str(&proposed),
        ],
    );
    let mut round = q.round();
    round.send(q.all(), &scripts::ACQUIRE, packed, stop);
    // Grants: the master, its token, and whether the token is the proposal.
    let mut granted: Vec<(usize, FencingToken, bool)> = Vec::with_capacity(n);
    // Refusals: the holder's remaining lease, and who holds it.
    let mut held: Vec<(Option<Duration>, Option<String>)> = Vec::new();
    let mut failed: Vec<RedisError> = Vec::new();
    let mut answered = vec![false; n];
    // Ends at a majority of grants; once none can come, at a majority refused for one holder
    // or once no holder can reach one (a failed master, or another's key, among the first
    // refusals must not turn a held lock into a split). A stalled master that has not
    // answered counts as failed: waiting for it would hold the attempt up until its
    // validity ran out whenever the others split between contenders.
    loop {
        if granted.len() >= q.majority {
            break;
        }
        let now = Instant::now();
        let unanswered = round.waited_for(&answered, now).count();
        if n - granted.len() - unanswered > n - q.majority {
            let best = held
                .iter()
                .filter_map(|(_, h)| h.as_ref())
                .map(|h| held.iter().filter(|(_, o)| o.as_ref() == Some(h)).count())
                .max()
                .unwrap_or(0);
            if best >= q.majority || best + unanswered < q.majority {
                break;
            }
        }
        let reply = match round.next(&answered, stop) {
            Next::Reply(reply) => reply,
            Next::Recount => continue,
            Next::Done => break,
        };
        answered[reply.master] = true;
        let heard = reply.result.and_then(|v| scripts::acquired_quorum(v, keys));
        count(
            q,
            reply.master,
            t0,
            heard,
            &mut granted,
            &mut held,
            &mut failed,
        );
    }
    // Grants that came with the last counted one raise T and join the write-back.
    while let Some(reply) = round.try_next() {
        answered[reply.master] = true;
        let heard = reply.result.and_then(|v| scripts::acquired_quorum(v, keys));
        count(
            q,
            reply.master,
            t0,
            heard,
            &mut granted,
            &mut held,
            &mut failed,
        );
    }
    if granted.len() + held.len() >= q.majority {
        *quiet = None;
    } else if quiet.is_none() {
        *quiet = Some(t0);
    }
    if granted.len() < q.majority {
        release::give_up(q, &mut round, keys, lease, false, &answered);
        // Held only when a majority refused for one holder, who will publish its release.
        // Refusals by several owners are other attempts (or what failed attempts left, being
        // released unannounced): nobody may hold the lock, and nobody will say when it is
        // free, so that is a split.
        let holder = held
            .iter()
            .filter_map(|(_, h)| h.as_ref())
            .find(|h| held.iter().filter(|(_, o)| o.as_ref() == Some(*h)).count() >= q.majority);
        if let Some(holder) = holder {
            let mut pttls: Vec<Option<Duration>> = held
                .iter()
                .filter(|(_, o)| o.as_ref() == Some(holder))
                .map(|(p, _)| *p)
                .collect();
            pttls.sort_by_key(|p| p.unwrap_or(Duration::MAX));
            return Ok(Attempt::Held(pttls[q.majority - 1], holder.clone()));
        }
        if failed.len() > n - q.majority {
            // A master that timed out is frozen or cut off rather than down: say so.
            let first = failed.iter().position(RedisError::is_timeout).unwrap_or(0);
            return Err(Error::from_redis(failed.swap_remove(first)));
        }
        // Against the call's patience, not this attempt's wait: once the patience is past, an
        // attempt whose masters are all stalled ends at once, before its own least wait, and
        // counting from that would make the call attempt again and again without a pause.
        if granted.len() + held.len() < q.majority && Instant::now() >= gives_up {
            return Err(Error::Timeout(
                "no majority of the masters answered in time".into(),
            ));
        }
        let most_refused = held
            .iter()
            .filter_map(|(_, h)| h.as_ref())
            .map(|h| held.iter().filter(|(_, o)| o.as_ref() == Some(h)).count())
            .max()
            .unwrap_or(0);
        return Ok(Attempt::Split {
            ahead: granted.len() > most_refused,
        });
    }
    // A majority took the proposal: it is stored there as the write-back would store it, and
    // each of them held less before (model/README.md).
    if granted.iter().filter(|(_, _, taken)| *taken).count() >= q.majority {
        if Instant::now() >= valid_until {
            release::give_up(q, &mut round, keys, lease, true, &answered);
            return Ok(Attempt::Split { ahead: false });
        }
        return Ok(Attempt::Granted(FencingToken::new(proposal), t0));
    }
    let token = granted
        .iter()
        .map(|(_, t, _)| *t)
        .max()
        .unwrap_or(granted[0].1);
    q.proposer.saw(token.as_u64());
    // The write-back: every later grant's majority shares a master with these, whose fence
    // is then at least T, so it mints above T.
    let mut packed = Vec::with_capacity(256);
    let digits = token.as_u64().to_string();
    scripts::evalsha(
        &mut packed,
        &scripts::CONFIRM,
        &[keys.lock(), keys.fence()],
        &[
            Arg::Str(keys.owner()),
            Arg::Str(&digits),
            Arg::Int(crate::key::millis(lease)),
            Arg::Int(keys.idle_ms()),
        ],
    );
    let asked = granted.len();
    round.send(
        granted.iter().map(|(m, _, _)| *m),
        &scripts::CONFIRM,
        packed,
        stop,
    );
    let (mut yes, mut other) = (0, 0);
    let mut confirmed = vec![true; n];
    for (m, _, _) in &granted {
        confirmed[*m] = false;
    }
    loop {
        let now = Instant::now();
        let stalled = asked - yes - other - round.waited_for(&confirmed, now).count();
        if yes >= q.majority || other + stalled > asked - q.majority {
            break;
        }
        let reply = match round.next(&confirmed, stop) {
            Next::Reply(reply) => reply,
            Next::Recount => continue,
            Next::Done => break,
        };
        confirmed[reply.master] = true;
        match reply.result.map(scripts::extended) {
            Ok(Ok(true)) => yes += 1,
            _ => other += 1,
        }
    }
    if yes < q.majority || Instant::now() >= valid_until {
        // A majority granted it: waiters refused by that majority took it for held.
        release::give_up(q, &mut round, keys, lease, true, &answered);
        return Ok(Attempt::Split { ahead: false });
    }
    Ok(Attempt::Granted(token, t0))
}

/// Counts master `master`'s reply to an acquire sent at `sent`, and tells the proposer what it
/// read of the master's clock and tokens.
fn count(
    q: &Quorum,
    master: usize,
    sent: Instant,
    heard: redis::RedisResult<scripts::QuorumAcquire>,
    granted: &mut Vec<(usize, FencingToken, bool)>,
    held: &mut Vec<(Option<Duration>, Option<String>)>,
    failed: &mut Vec<RedisError>,
) {
    match heard {
        Ok(reply) => {
            q.proposer.heard(master, reply.clock, sent, Instant::now());
            match reply.acquire {
                Acquire::Granted(token) => {
                    q.proposer.saw(token.as_u64());
                    granted.push((master, token, reply.taken));
                }
                Acquire::Held(pttl) => held.push((pttl, reply.holder)),
            }
        }
        Err(e) => failed.push(e),
    }
}

/// The shortest random pause after an attempt that found no majority either way, and the
/// longest for the first; it doubles with each such attempt in a row, up to `MAX_SPLIT_PAUSE`.
/// A refusal's timer starts at `MAX_PAUSE` too and doubles up to `MAX_HELD_PAUSE`.
const MIN_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(20);
/// The longest first pause after a split in which this attempt was ahead (see
/// [`Attempt::Split`]): it doubles as `MAX_PAUSE` does, so that an attempt that stays ahead of
/// keys that will not go (a holder granted by masters that froze since) does not spin.
const AHEAD_PAUSE: Duration = Duration::from_millis(2);
const MAX_SPLIT_PAUSE: Duration = Duration::from_secs(1);
/// The longest a refused head waits for a release message before it attempts again: the
/// backstop for a message that never comes (subscriptions down, a holder that died or whose
/// lock was lost), at the cost of an attempt every 2 s or so while a lock is held long.
const MAX_HELD_PAUSE: Duration = Duration::from_secs(2);
/// How often a waiter that is not its key's head looks whether it has become the head.
const NOT_HEAD_LOOK: Duration = Duration::from_secs(1);

/// The least time an attempt waits for replies, whatever the caller's deadline.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// A random duration up to `max`.
fn jitter(max: Duration) -> Duration {
    let random = (uuid::Uuid::new_v4().as_u128() as u64) % 1_000_000;
    max.mul_f64(random as f64 / 1_000_000.0)
}
