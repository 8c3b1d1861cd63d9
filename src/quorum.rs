//! Quorum mode: one lock on N independent masters, granted by a majority, with fencing tokens
//! that never go back (see [`Topology::quorum`](crate::Topology::quorum)).
//!
//! The protocol, its assumptions and the argument for it are in docs/design.md ("Quorum
//! mode") and model/README.md, which spin checks. In short:
//!
//! ```text
//! attempt ─► acquire on all N ──► a majority granted in time? ──► T = the largest of their tokens
//!            (master.rs: in          no: release on all N,           │
//!             parallel)              retry later (wake.rs)            ▼
//!                                                         confirm(T) on those that granted
//!                                                         ──► a majority confirmed in time?
//!                                                             yes: granted with token T
//!                                                             no: release on all N, retry
//! held ─► renew.rs: extend on all N, a majority keeps it ─► release: on all N, wake waiters
//! ```
//!
//! | step | counts | ends the step early | gives up |
//! |---|---|---|---|
//! | acquire | grants `{1, token}`; refusals by holder | a majority of grants; or, once no majority of grants can come, a majority refused for one holder (held) or none can (split); a stalled master (master.rs) that has not answered counts as failed | the validity (lease − elapsed − drift) or the caller's deadline ran out, or no majority answered for a connection and a response timeout since the call's first unanswered attempt |
//! | confirm | `1`s | a majority of `1`s, or too many `0`s, failures or stalled masters for one | as acquire, counted from the acquire's start |
//! | renew (renew.rs) | `1`s | a majority of `1`s; lost at once on more than N − majority `0`s | the deadline |
//! | release | `1`s | every master answered or is stalled, or a majority released | a response timeout (`unlock`); never waited for (`drop`) |
//!
//! Every attempt has an owner id of its own: a release of a failed attempt that runs late must
//! not delete the next attempt's key.

mod master;
mod renew;
mod wake;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use redis::RedisError;

use crate::error::{Error, Result};
use crate::grant::{deadline_of, Grant, NewGrant};
use crate::guard::LockGuard;
use crate::key::LockKeys;
use crate::locks::Locks;
use crate::metrics;
use crate::net::connector::Connector;
use crate::net::wire::Arg;
use crate::options::LockOptions;
use crate::scripts::{self, Acquire};
use crate::token::FencingToken;

use master::{Call, Masters, Reply};
use renew::Renewal;
pub(crate) use wake::{Ticket, Waited, Wakes};

/// The quorum part of a client: its masters' workers, its renewal thread and its waiters.
pub(crate) struct Quorum {
    masters: Arc<Masters>,
    /// How many masters make a majority: N / 2 + 1.
    quorum: usize,
    pub(crate) renewal: Renewal,
    pub(crate) wakes: Arc<Wakes>,
    connector: Arc<Connector>,
    namespace: String,
    connection_timeout: Duration,
    response_timeout: Duration,
}

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

impl Quorum {
    pub(crate) fn start(
        connector: &Arc<Connector>,
        namespace: &str,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> std::io::Result<Quorum> {
        let masters = Arc::new(Masters::start(
            connector,
            connection_timeout,
            response_timeout,
        )?);
        let quorum = masters.len() / 2 + 1;
        let renewal = Renewal::spawn(Arc::clone(&masters), quorum, response_timeout)?;
        Ok(Quorum {
            masters,
            quorum,
            renewal,
            wakes: Arc::new(Wakes::new(namespace)),
            connector: Arc::clone(connector),
            namespace: namespace.to_owned(),
            connection_timeout,
            response_timeout,
        })
    }

    /// When a call whose masters have been asked without a majority answering since `quiet`
    /// stops asking: a connection and a response timeout later.
    fn gives_up_at(&self, quiet: Instant) -> Instant {
        quiet + self.connection_timeout + self.response_timeout
    }

    fn all(&self) -> std::ops::Range<usize> {
        0..self.masters.len()
    }

    /// The masters a step still waits for at `now`: not `done` (answered, or not asked), and
    /// not stalled (see [`Masters::is_stalled`]).
    fn waited_for<'a>(
        &'a self,
        done: &'a [bool],
        now: Instant,
    ) -> impl Iterator<Item = usize> + 'a {
        self.all()
            .filter(move |m| !done[*m] && !self.masters.is_stalled(*m, now))
    }

    /// The next reply on `rx`, waiting no later than `until`, nor past the moment a master the
    /// step still waits for stalls: the step then counts again without it.
    fn next_reply(
        &self,
        rx: &Receiver<Reply>,
        done: &[bool],
        now: Instant,
        until: Instant,
    ) -> Next {
        let look = self.masters.next_stall(self.waited_for(done, now), now);
        match rx.recv_deadline(look.min(until)) {
            Ok(reply) => Next::Reply(reply),
            Err(RecvTimeoutError::Timeout) if look < until => Next::Recount,
            Err(_) => Next::Done,
        }
    }

    /// Joins the local queue of `keys`' key.
    pub(crate) fn join(&self, keys: &LockKeys) -> Ticket {
        self.wakes.join(keys.tag())
    }

    /// A head was refused: it waits for release messages from now on.
    pub(crate) fn refused(&self, ticket: &Ticket) {
        ticket.refused(&self.connector, self.connection_timeout);
    }

    /// Sends one call to the masters `to`; replies come on the returned channel.
    fn ask(
        &self,
        to: impl IntoIterator<Item = usize>,
        script: &'static redis::Script,
        packed: Vec<u8>,
        expires: Instant,
        once: bool,
    ) -> Receiver<Reply> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let call = Call {
            script,
            packed,
            expires,
            reply: &tx,
            tag: 0,
            once,
        };
        self.masters.send(to, call);
        rx
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
    pub(crate) fn attempt(
        &self,
        keys: &LockKeys,
        lease: Duration,
        deadline: Option<Instant>,
        quiet: &mut Option<Instant>,
    ) -> Result<Attempt> {
        let n = self.masters.len();
        let t0 = Instant::now();
        // Past this the lease may have run out on the masters that granted first.
        let valid_until = deadline_of(t0, lease);
        // A reply is awaited until the caller's deadline, but at least a little while: a
        // deadline that is all but past still gets its attempt. No majority answering within a
        // connection and a response timeout of the last time one did is a timeout (a worker
        // connecting to a frozen master can take both).
        let patience = self.gives_up_at(quiet.unwrap_or(t0)).max(t0 + MIN_WAIT);
        let stop = deadline
            .map_or(valid_until, |d| d.max(t0 + MIN_WAIT).min(valid_until))
            .min(patience);
        let mut packed = Vec::with_capacity(256);
        scripts::evalsha(
            &mut packed,
            &scripts::ACQUIRE,
            &keys.all(),
            &[
                Arg::Str(keys.owner()),
                Arg::Int(crate::key::millis(lease)),
                // Never queued; a refusal names the holder.
                Arg::Str("h"),
                Arg::Int(keys.idle_ms()),
            ],
        );
        let rx = self.ask(self.all(), &scripts::ACQUIRE, packed, stop, false);
        let mut granted: Vec<(usize, FencingToken)> = Vec::with_capacity(n);
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
            if granted.len() >= self.quorum {
                break;
            }
            let now = Instant::now();
            let unanswered = self.waited_for(&answered, now).count();
            if n - granted.len() - unanswered > n - self.quorum {
                let best = held
                    .iter()
                    .filter_map(|(_, h)| h.as_ref())
                    .map(|h| held.iter().filter(|(_, o)| o.as_ref() == Some(h)).count())
                    .max()
                    .unwrap_or(0);
                if best >= self.quorum || best + unanswered < self.quorum {
                    break;
                }
            }
            let reply = match self.next_reply(&rx, &answered, now, stop) {
                Next::Reply(reply) => reply,
                Next::Recount => continue,
                Next::Done => break,
            };
            answered[reply.master] = true;
            match reply.result.and_then(|v| scripts::acquired_naming(v, keys)) {
                Ok((Acquire::Granted(token), _)) => granted.push((reply.master, token)),
                Ok((Acquire::Held(pttl), holder)) => held.push((pttl, holder)),
                Err(e) => failed.push(e),
            }
        }
        // Grants that came with the last counted one raise T and join the write-back.
        while let Ok(reply) = rx.try_recv() {
            answered[reply.master] = true;
            match reply.result.and_then(|v| scripts::acquired_naming(v, keys)) {
                Ok((Acquire::Granted(token), _)) => granted.push((reply.master, token)),
                Ok((Acquire::Held(pttl), holder)) => held.push((pttl, holder)),
                Err(e) => failed.push(e),
            }
        }
        if granted.len() + held.len() >= self.quorum {
            *quiet = None;
        } else if quiet.is_none() {
            *quiet = Some(t0);
        }
        if granted.len() < self.quorum {
            self.give_up(keys, lease, false);
            // Held only when a majority refused for one holder, who will publish its release.
            // Refusals by several owners are other attempts (or what failed attempts left, being
            // released unannounced): nobody may hold the lock, and nobody will say when it is
            // free, so that is a split.
            let holder = held.iter().filter_map(|(_, h)| h.as_ref()).find(|h| {
                held.iter().filter(|(_, o)| o.as_ref() == Some(*h)).count() >= self.quorum
            });
            if let Some(holder) = holder {
                let mut pttls: Vec<Option<Duration>> = held
                    .iter()
                    .filter(|(_, o)| o.as_ref() == Some(holder))
                    .map(|(p, _)| *p)
                    .collect();
                pttls.sort_by_key(|p| p.unwrap_or(Duration::MAX));
                return Ok(Attempt::Held(pttls[self.quorum - 1], holder.clone()));
            }
            if failed.len() > n - self.quorum {
                // A master that timed out is frozen or cut off rather than down: say so.
                let first = failed.iter().position(RedisError::is_timeout).unwrap_or(0);
                return Err(Error::from_redis(failed.swap_remove(first)));
            }
            if granted.len() + held.len() < self.quorum && Instant::now() >= patience {
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
        let token = granted
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(granted[0].1);
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
        let rx = self.ask(
            granted.iter().map(|(m, _)| *m),
            &scripts::CONFIRM,
            packed,
            stop,
            false,
        );
        let (mut yes, mut other) = (0, 0);
        let mut confirmed = vec![true; n];
        for (m, _) in &granted {
            confirmed[*m] = false;
        }
        loop {
            let now = Instant::now();
            let stalled = asked - yes - other - self.waited_for(&confirmed, now).count();
            if yes >= self.quorum || other + stalled > asked - self.quorum {
                break;
            }
            let reply = match self.next_reply(&rx, &confirmed, now, stop) {
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
        if yes < self.quorum || Instant::now() >= valid_until {
            // A majority granted it: waiters refused by that majority took it for held.
            self.give_up(keys, lease, true);
            return Ok(Attempt::Split { ahead: false });
        }
        Ok(Attempt::Granted(token, t0))
    }

    /// Releases what a failed attempt took, on every master, not waited for. It tells other
    /// clients only with `tell` (the attempt had a majority of grants, so waiters refused by
    /// them wait for a release message); otherwise nobody: no grant was reported, and a
    /// message would wake the other waiters (this client's head is the caller) only to find
    /// the lock as it was.
    fn give_up(&self, keys: &LockKeys, lease: Duration, tell: bool) {
        let channel = if tell {
            wake::channel(&self.namespace, keys.tag())
        } else {
            String::new()
        };
        // Worth sending for as long as the attempt's lease may last: an acquire that reached a
        // frozen master runs when it wakes, and this release behind it then frees that master.
        let expires = Instant::now() + lease;
        let _ = self.ask(
            self.all(),
            &scripts::QUORUM_RELEASE,
            release_call(keys, &channel),
            expires,
            false,
        );
    }

    /// Releases a grant's keys on every master and tells waiters (this client's at once, others
    /// by a message from each master). With `wait`, waits until then for the answers: `true`
    /// when released (found and deleted on at least one master, and not found gone on more than
    /// N − majority), `false` when more than N − majority said it was not ours any more (the
    /// lease ran out first); without, returns at once (`None`).
    pub(crate) fn release(&self, keys: &LockKeys, wait: Option<Instant>) -> Option<Result<bool>> {
        let channel = wake::channel(&self.namespace, keys.tag());
        // A drop waits for nothing: the release is worth sending while the lease may last.
        let expires = wait
            .unwrap_or_else(|| Instant::now() + self.response_timeout.max(Duration::from_secs(5)));
        let rx = self.ask(
            self.all(),
            &scripts::QUORUM_RELEASE,
            release_call(keys, &channel),
            expires,
            false,
        );
        // This client's next waiter needs no message from Redis. Woken now, its attempt races
        // this release on the masters, and the release's messages wake it again if it lost:
        // waking it only once a majority released (the messages then repeats) cost a third of
        // the acquisitions under contention.
        self.wakes.wake_head(keys.tag());
        let until = wait?;
        let n = self.masters.len();
        // A release sent twice (the first connection broke) that finds nothing: the first run
        // may have deleted it.
        let Tally { yes, no, failed } = self.tally(&rx, until, true);
        // Lost when a majority says the key is gone or another's. Otherwise released where it
        // was found: a master that failed or did not answer may hold it still, and it expires
        // there with its lease (as it would after a grant that master never saw).
        if no > n - self.quorum {
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

    /// Counts the `1`/`0` replies of an extend or release sent to every master, until a
    /// majority said either, every master answered, or `until`; with `retried_is_yes`, a `0`
    /// from a request sent twice counts as `1`.
    fn tally(&self, rx: &Receiver<Reply>, until: Instant, retried_is_yes: bool) -> Tally {
        let n = self.masters.len();
        let mut tally = Tally {
            yes: 0,
            no: 0,
            failed: Vec::new(),
        };
        let mut answered = vec![false; n];
        // A stalled master that has not answered is not waited for once every other one has.
        loop {
            let now = Instant::now();
            if tally.yes >= self.quorum
                || tally.no > n - self.quorum
                || self.waited_for(&answered, now).next().is_none()
            {
                break;
            }
            let reply = match self.next_reply(rx, &answered, now, until) {
                Next::Reply(reply) => reply,
                Next::Recount => continue,
                Next::Done => break,
            };
            answered[reply.master] = true;
            match reply.result.map(scripts::extended) {
                Ok(Ok(true)) => tally.yes += 1,
                Ok(Ok(false)) if retried_is_yes && reply.retried => tally.yes += 1,
                Ok(Ok(false)) => tally.no += 1,
                Ok(Err(e)) | Err(e) => tally.failed.push(e),
            }
        }
        tally
    }

    /// Re-arms `grant`'s lease to `lease` on every master; held while a majority does.
    pub(crate) fn extend(&self, grant: &Grant, lease: Duration) -> Result<()> {
        let lost = || Error::LockLost {
            key: grant.keys.user().to_owned(),
        };
        if !grant.is_held() {
            return Err(lost());
        }
        let sent = Instant::now();
        let until = (sent + self.response_timeout).min(grant.deadline());
        let mut packed = Vec::with_capacity(128);
        scripts::pack_extend(&mut packed, &grant.keys, grant.keys.owner(), lease);
        let rx = self.ask(self.all(), &scripts::EXTEND, packed, until, false);
        let n = self.masters.len();
        let Tally { yes, no, failed } = self.tally(&rx, until, false);
        if yes >= self.quorum {
            if grant.confirm(sent, lease, Instant::now()) {
                grant.renew_with(lease);
                return Ok(());
            }
            return Err(lost());
        }
        if no > n - self.quorum {
            grant.mark_lost("a majority of the masters no longer hold it");
            return Err(lost());
        }
        Err(match failed.into_iter().next() {
            Some(e) => Error::from_redis(e),
            None => Error::Timeout("no majority of the masters answered in time".into()),
        })
    }

    /// Deletes the lock on every master, whoever holds it; whether a majority held it. Never
    /// sent twice to one master: a second run could delete a grant made after the first.
    pub(crate) fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let until = Instant::now() + self.response_timeout;
        let channel = wake::channel(&self.namespace, keys.tag());
        let mut packed = Vec::with_capacity(128);
        crate::net::wire::pack(
            &mut packed,
            &[
                Arg::Str("EVAL"),
                Arg::Str(FORCE),
                Arg::Int(1),
                Arg::Str(keys.lock()),
                Arg::Str(&channel),
            ],
        );
        let rx = self.ask(self.all(), &scripts::QUORUM_RELEASE, packed, until, true);
        let n = self.masters.len();
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
        self.wakes.wake_head(keys.tag());
        if answered < self.quorum {
            return Err(match failed {
                Some(e) => Error::from_redis(e),
                None => Error::Timeout("no majority of the masters answered in time".into()),
            });
        }
        Ok(deleted >= self.quorum)
    }

    /// How the lock stands on a majority: held when a majority holds one owner's key; its
    /// token is then the fence value a majority of the holder's masters share (the write-back
    /// set every confirmed master's counter to it, and nothing changes it while the lock is
    /// held).
    pub(crate) fn status(&self, keys: &LockKeys) -> Result<crate::LockStatus> {
        let until = Instant::now() + self.response_timeout;
        let mut packed = Vec::with_capacity(128);
        crate::net::wire::pack(
            &mut packed,
            &[
                Arg::Str("EVAL"),
                Arg::Str(STATUS),
                Arg::Int(2),
                Arg::Str(keys.lock()),
                Arg::Str(keys.fence()),
            ],
        );
        let rx = self.ask(self.all(), &scripts::QUORUM_RELEASE, packed, until, false);
        let n = self.masters.len();
        type Seen = (Option<String>, i64, Option<u64>);
        let mut seen: Vec<Seen> = Vec::new();
        let mut failed = None;
        while seen.len() + usize::from(failed.is_some()) < n {
            let Ok(reply) = rx.recv_deadline(until) else {
                break;
            };
            match reply.result.and_then(|v| {
                Ok(redis::from_redis_value::<(
                    Option<String>,
                    i64,
                    Option<String>,
                )>(v)?)
            }) {
                Ok((owner, pttl, fence)) => {
                    seen.push((owner, pttl, fence.and_then(|f| f.parse().ok())));
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if seen.len() < self.quorum {
            return Err(match failed {
                Some(e) => Error::from_redis(e),
                None => Error::Timeout("no majority of the masters answered in time".into()),
            });
        }
        let quorum = self.quorum;
        let holder = seen
            .iter()
            .filter_map(|(o, ..)| o.as_ref())
            .find(|o| seen.iter().filter(|(x, ..)| x.as_ref() == Some(*o)).count() >= quorum);
        let Some(holder) = holder else {
            return Ok(crate::LockStatus {
                held: false,
                token: None,
                remaining_lease: None,
                waiters: 0,
            });
        };
        let holders: Vec<&Seen> = seen
            .iter()
            .filter(|(o, ..)| o.as_ref() == Some(holder))
            .collect();
        let token = holders
            .iter()
            .filter_map(|(.., f)| *f)
            .find(|f| holders.iter().filter(|(.., g)| *g == Some(*f)).count() >= quorum);
        // The lock is held until fewer than a majority of the holder's keys are left.
        let mut pttls: Vec<i64> = holders.iter().map(|(_, p, _)| *p).collect();
        pttls.sort_unstable_by(|a, b| b.cmp(a));
        Ok(crate::LockStatus {
            held: true,
            token: token.map(FencingToken::new),
            remaining_lease: pttls
                .get(quorum - 1)
                .filter(|p| **p >= 0)
                .map(|p| Duration::from_millis(p.unsigned_abs())),
            waiters: 0,
        })
    }
}

/// The `1`s, `0`s and failures among the replies to one call sent to every master.
struct Tally {
    yes: usize,
    no: usize,
    failed: Vec<RedisError>,
}

/// A release call of `keys.owner()`, telling `channel` (nobody if empty).
fn release_call(keys: &LockKeys, channel: &str) -> Vec<u8> {
    let mut packed = Vec::with_capacity(160);
    scripts::evalsha(
        &mut packed,
        &scripts::QUORUM_RELEASE,
        &[keys.lock()],
        &[Arg::Str(keys.owner()), Arg::Str(channel)],
    );
    packed
}

/// `force_unlock` on one master: delete the lock key whoever holds it, and tell waiters.
const FORCE: &str = "if redis.call('DEL', KEYS[1]) == 1 then \
     redis.pcall('PUBLISH', ARGV[1], '') return 1 end return 0";
/// `status` on one master: the owner, the remaining lease in ms, and the fence counter.
const STATUS: &str = "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), \
     redis.call('GET', KEYS[2])}";

impl Locks {
    /// A lock call on a quorum: the head of the key's local queue attempts; a refused head
    /// waits for a release message or for the holder's lease to run out, a split one for a
    /// random pause. With `once`, one attempt and no waiting.
    pub(crate) fn acquire_quorum(
        self: &Arc<Self>,
        quorum: &Quorum,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
        once: bool,
    ) -> Result<Option<LockGuard>> {
        let mut keys = self.prepare(key, options)?;
        let lease = options.lease.unwrap_or(self.config.lease);
        // The start of the first attempt since a majority of the masters last answered one: the
        // call's patience runs from there across attempts.
        let mut quiet = None;
        let attempt = |keys: &mut LockKeys, quiet: &mut Option<Instant>| {
            // A new owner id per attempt: a late release of a failed one must not delete this
            // one's key.
            self.new_owner(keys);
            quorum.attempt(keys, lease, deadline, quiet)
        };
        if once {
            return Ok(match attempt(&mut keys, &mut quiet)? {
                Attempt::Granted(token, sent) => {
                    Some(self.grant_quorum(keys, token, sent, lease, options))
                }
                Attempt::Held(..) | Attempt::Split { .. } => None,
            });
        }
        let ticket = quorum.join(&keys);
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
                let outcome = attempt(&mut keys, &mut quiet)?;
                if !matches!(outcome, Attempt::Granted(..)) {
                    quorum.refused(&ticket);
                }
                let retry = match outcome {
                    Attempt::Granted(token, sent) => {
                        ticket.granted();
                        return Ok(Some(self.grant_quorum(keys, token, sent, lease, options)));
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
                retry_at = quiet.map_or(retry, |q| retry.min(quorum.gives_up_at(q)));
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
                Waited::Woken if !split => retry_at = Instant::now(),
                Waited::Woken | Waited::Timer => {}
                Waited::Cancelled => return Err(Error::Cancelled),
            }
        }
    }

    fn grant_quorum(
        self: &Arc<Self>,
        keys: LockKeys,
        token: FencingToken,
        sent: Instant,
        lease: Duration,
        options: &LockOptions,
    ) -> LockGuard {
        let guard = self.grant(NewGrant {
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
        metrics::granted(&self.config.namespace, metrics::How::Attempt);
        guard
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
/// What [`Quorum::next_reply`] brought.
enum Next {
    Reply(Reply),
    /// A master the step waited for has stalled: count again without it.
    Recount,
    /// `until` came, or no master can answer any more.
    Done,
}

/// The least time an attempt waits for replies, whatever the caller's deadline.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// A random duration up to `max`.
fn jitter(max: Duration) -> Duration {
    let random = (uuid::Uuid::new_v4().as_u128() as u64) % 1_000_000;
    max.mul_f64(random as f64 / 1_000_000.0)
}
