//! A shared lock's grants on one master, for a semaphore's permits and a read-write lock's
//! reads and writes alike: attempt, wait in the lock's local queue, take the grant; release,
//! admitting the waiters that may hold next in the same script; status.
//!
//! Written as `acquire.rs` and `release.rs` are for a lock, over the same parts: the local queue
//! and a waiter's states (`wait.rs`), the release channel's listener (`listener.rs`), grants
//! held by the renewal thread. Each grant carries a key of its own as its lock key
//! (`key/shared_lock.rs`), so renewal, extends and loss work on it unchanged. What a grant
//! weighs (a permit one of N, a read one beside other reads, a write everything) is the
//! scripts' business (`scripts/shared_lock.rs`): here every kind is waited for, taken and
//! released the same way. Unlike a lock's, a release may admit several waiters (a writer's
//! admits every reader at the head of Redis' queue), a release names no next waiter of our own
//! (each waiter takes its turn in Redis' queue, which a release serves), and a grant wakes the
//! next waiter of ours at once: a permit may be free for it, or a reader may hold beside it.
//!
//! Replica acknowledgement (`min_replica_acks`) is waited for as for a lock: behind the grant,
//! or behind one extend for a handoff.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::listener;
use super::wait::{Ticket, Waited, Wake};
use super::OneMaster;
use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant};
use crate::key::{LockKeys, SharedLockKeys};
use crate::metrics::{self, How, Op};
use crate::net::pool::{Run, MIN_READ};
use crate::net::router::Ride;
use crate::options::Deadline;
use crate::scripts::shared_lock::{self as script, Access, Acquired, Released, Status};
use crate::scripts::{JoinQueue, Leaving, HANDOFF_LEASE};
use crate::token::FencingToken;

/// How long a waiter past its deadline waits for Redis to take it out of its queue.
const LEAVE_PATIENCE: Duration = Duration::from_millis(50);

/// See [`Engine::acquire_shared`](crate::engine::Engine::acquire_shared).
pub(super) fn acquire(
    m: &Arc<OneMaster>,
    keys: &SharedLockKeys,
    access: Access,
    lease: Duration,
    deadline: Deadline,
    cancel: Option<&Receiver<()>>,
) -> Result<Option<Arc<Grant>>> {
    let call = Call {
        keys,
        access,
        lease,
        cancel,
    };
    match deadline {
        Deadline::Now => call.once(m),
        Deadline::At(at) => call.until(m, Some(at)),
        Deadline::Never => call.until(m, None),
    }
}

/// One acquire call: the lock, what it asks for, the lease, and the caller's cancel signal.
#[derive(Clone, Copy)]
struct Call<'a> {
    keys: &'a SharedLockKeys,
    access: Access,
    lease: Duration,
    cancel: Option<&'a Receiver<()>>,
}

/// How one turn in the queue ended.
enum Turn {
    Granted(Arc<Grant>),
    Deadline,
    TooLate,
}

/// A grant: its token, the earliest its lease can have started, and for a handoff the lease
/// Redis set (capped at [`HANDOFF_LEASE`]) and whose release it was.
type Granted = (FencingToken, Instant, Option<(Duration, How)>);

impl Call<'_> {
    /// One attempt, no waiting and no queueing.
    fn once(self, m: &Arc<OneMaster>) -> Result<Option<Arc<Grant>>> {
        let hold = self.keys.hold(&m.owners.next_id(), self.access.kind());
        let sent = Instant::now();
        match self.attempt(m, &hold, JoinQueue::Never, None)? {
            Acquired::Granted(token) => match self.accept(m, hold, token, sent, None, None)? {
                Turn::Granted(grant) => Ok(Some(grant)),
                Turn::Deadline | Turn::TooLate => Ok(None),
            },
            Acquired::Refused(_) => Ok(None),
            Acquired::OtherCount(count) => Err(other_count(self.keys, count)),
        }
    }

    /// Waits in the lock's local queue until granted, `deadline`, or cancelled.
    fn until(self, m: &Arc<OneMaster>, deadline: Option<Instant>) -> Result<Option<Arc<Grant>>> {
        loop {
            match self.turn(m, deadline)? {
                Turn::Granted(grant) => return Ok(Some(grant)),
                Turn::Deadline => return Ok(None),
                Turn::TooLate if is_cancelled(self.cancel) => return Err(Error::Cancelled),
                // A handoff came too late to use: wait again, as a new waiter.
                Turn::TooLate => {}
            }
        }
    }

    /// One turn in the local queue, with an owner id of its own.
    fn turn(self, m: &Arc<OneMaster>, deadline: Option<Instant>) -> Result<Turn> {
        let keys = self.keys;
        let hold = keys.hold(&m.owners.next_id(), self.access.kind());
        let ticket = m.waiters.join(keys.tag(), hold.owner(), self.lease);
        let found = self.wait_for_grant(m, &hold, deadline, &ticket);
        if let Ok(Some((token, sent, handoff))) = found {
            ticket.leave_granted();
            // Our next waiter asks at once: a permit may be free for it, a reader may hold
            // beside this grant, and a writer takes its place in Redis' queue.
            m.waiters.wake_head(keys.tag());
            return self.accept(m, hold, token, sent, handoff, deadline);
        }
        // Leaving without a grant; a handoff may have reached us all the same.
        let earliest = ticket.since();
        let (late, in_redis_queue) = ticket.leave();
        if let (Some(wake), Ok(None)) = (late, &found) {
            if let Some((token, since, handoff)) = handed(wake, earliest) {
                // Granted before we gave up: better taken than handed on.
                return self.accept(m, hold, token, since, handoff, deadline);
            }
        }
        if !in_redis_queue {
            return found.map(|_| Turn::Deadline);
        }
        if matches!(&found, Err(e) if e.is_connection()) || m.router.unreachable(keys.holders()) {
            // Redis did not answer: leaving here would wait for it again, past the caller's
            // timeout. The background thread leaves for us; until it gets through, a grant
            // handed to us meanwhile stays held until its lease runs out.
            leave_later(m, keys, hold);
            return found.map(|_| Turn::Deadline);
        }
        // Out of Redis' queue, so no handoff is wasted on us; one that already reached us is
        // passed on. Past a deadline, Redis gets a little while to answer (it may have stopped
        // while we waited); then the background thread tries again, as for a lock, since an
        // entry left behind stays owed what frees up until it runs out. On other failures the
        // entry expires by itself, and a grant handed to us with it.
        let until = deadline.is_some().then(|| Instant::now() + LEAVE_PATIENCE);
        match hand_over(m, keys, &hold, Leaving::QueueAndLock, until) {
            Ok(_) => {}
            Err(e) if until.is_some() && e.is_connection() => leave_later(m, keys, hold),
            Err(e) => log::warn!(
                "fencelock: leaving the queue of {} {:?} failed: {e}",
                keys.what(),
                keys.name()
            ),
        }
        found.map(|_| Turn::Deadline)
    }

    /// The waiting loop of [`turn`](Call::turn): the grant, `None` at `deadline`, or
    /// `Error::Cancelled`.
    fn wait_for_grant(
        self,
        m: &OneMaster,
        hold: &LockKeys,
        deadline: Option<Instant>,
        ticket: &Ticket,
    ) -> Result<Option<Granted>> {
        let mut attempt_now = ticket.is_head();
        // When to ask again unprompted: a holder that crashed releases nothing.
        let mut retry_at: Option<Instant> = None;
        let mut ride = Ride::default();
        loop {
            if attempt_now {
                let sent = Instant::now();
                // Marked before sending: if the reply is lost, leaving must still withdraw.
                let queue = ticket.attempt(sent);
                match self.attempt(m, hold, queue, deadline) {
                    Ok(Acquired::Granted(token)) => return Ok(Some((token, sent, None))),
                    Ok(Acquired::OtherCount(count)) => return Err(other_count(self.keys, count)),
                    Ok(Acquired::Refused(pttl)) => {
                        ride = Ride::default();
                        ticket.refused();
                        watch_shard(m, self.keys, deadline);
                        let after = pttl.unwrap_or(self.lease).min(HANDOFF_LEASE)
                            + Duration::from_millis(1);
                        retry_at = Instant::now().checked_add(after);
                    }
                    // A master that stopped answering may be being replaced: the attempt goes
                    // again, with the same owner id, on the master the deployment names by then.
                    Err(e) => match m.router.ride(&mut ride, &e, deadline) {
                        Some(pause) => {
                            if pause_or_cancel(pause, self.cancel) {
                                return Err(Error::Cancelled);
                            }
                            continue;
                        }
                        None => return Err(e),
                    },
                }
            }
            attempt_now = false;
            let until = deadline.into_iter().chain(retry_at).min();
            match ticket.wait(until, self.cancel) {
                Waited::Woken(wakes) => {
                    for wake in wakes {
                        match wake {
                            Wake::Granted { .. } => return Ok(handed(wake, ticket.since())),
                            Wake::Attempt => attempt_now = true,
                            // Only a lock's release naming our own next waiter sends it; a
                            // shared lock's names none. Taken as a lock's waiter would.
                            Wake::Queued { retry_after, since } => {
                                ticket.queued(since);
                                retry_at = Instant::now()
                                    .checked_add(retry_after + Duration::from_millis(1));
                            }
                        }
                    }
                }
                Waited::Cancelled => return Err(Error::Cancelled),
                Waited::TimedOut => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    attempt_now = ticket.is_head();
                }
            }
        }
    }

    /// Turns a token into a held grant. A grant handed over by a release started its lease at
    /// some moment after `sent`, an attempt's after `sent` too; if half of it may be gone, one
    /// extend confirms it first, so that the grant starts out held and loss is never reported
    /// for a grant still ours. One whose lease ran out by that count before we heard of it is
    /// given back, never handed out: Redis may have granted it to a rival since. Neither the
    /// confirmation nor the give-back holds the caller past `deadline` (its own, if it has
    /// one): what Redis has not answered by then is a timeout, and the give-back goes on in the
    /// background, as a waiter's leaving does.
    fn accept(
        self,
        m: &Arc<OneMaster>,
        hold: LockKeys,
        token: FencingToken,
        sent: Instant,
        handoff: Option<(Duration, How)>,
        deadline: Option<Instant>,
    ) -> Result<Turn> {
        let (keys, lease) = (self.keys, self.lease);
        let acks = m.config.replica_acks;
        let (granted, how) = handoff.unwrap_or((lease, How::Attempt));
        // An attempt's WAIT went behind it on its own connection; a handoff's did not.
        let unacked = handoff.is_some() && acks.is_some();
        if !unacked && sent.elapsed() <= granted / 2 {
            self.count(m, how);
            return Ok(Turn::Granted(self.hold(m, hold, token, sent, granted)));
        }
        // With replica acks: the handoff was written by the releaser, on another connection,
        // and WAIT counts only what its own connection wrote, so the extend re-arms the lease
        // on ours and WAITs behind it.
        let sent = Instant::now();
        // The confirmation's own reply may be as late: the lease must not have run out by our
        // count before we heard that it was set.
        let confirmed = m
            .confirm(&hold, lease, deadline)
            .map(|(ours, acked)| (ours && sent.elapsed() < lease, acked));
        if let Ok((true, acked)) = confirmed {
            let grant = self.hold(m, hold, token, sent, lease);
            return match (acks, acked) {
                (Some(acks), Some(acked)) if acked < acks.replicas => {
                    let _ = m.release_shared(keys, &grant);
                    Err(Error::NotReplicated {
                        acked,
                        required: acks.replicas,
                    })
                }
                _ => {
                    self.count(m, how);
                    Ok(Turn::Granted(grant))
                }
            };
        }
        // Not ours any more, or not known: give it back in our name (it is passed on if still
        // ours), which also wakes our next waiter. Past a deadline, Redis gets a little while
        // to answer, then the background thread tries again.
        let until = deadline.map(|_| Instant::now() + LEAVE_PATIENCE);
        match hand_over(m, keys, &hold, Leaving::QueueAndLock, until) {
            Ok(_) => {}
            Err(e) if until.is_some() && e.is_connection() => leave_later(m, keys, hold),
            Err(e) => log::warn!(
                "fencelock: giving back an unconfirmed grant of {} {:?} failed, it expires \
                 with its lease: {e}",
                keys.what(),
                keys.name()
            ),
        }
        confirmed.map(drop)?;
        log::debug!(
            "fencelock: a grant of {} {:?} (token {token}) came too late to use",
            keys.what(),
            keys.name()
        );
        Ok(Turn::TooLate)
    }

    /// Counts a grant (the metrics' `fencelock_grants_total`), made `how`.
    fn count(self, m: &OneMaster, how: How) {
        metrics::granted_as(&m.config.namespace, self.access.kind(), how);
    }

    /// Makes the grant and hands it to the renewal thread, which renews the grant's key as a
    /// lock's. `granted`: the lease Redis set, from `sent` at the earliest.
    fn hold(
        self,
        m: &OneMaster,
        hold: LockKeys,
        token: FencingToken,
        sent: Instant,
        granted: Duration,
    ) -> Arc<Grant> {
        m.hold(NewGrant {
            keys: hold,
            token,
            sent,
            granted,
            lease: self.lease,
            auto_renew: true,
            max_hold: None,
            queued: false,
            local_run: 0,
        })
    }

    /// One run of the acquire script. A reply that has not come by `deadline` (if sooner than
    /// the response timeout) is a timeout.
    fn attempt(
        self,
        m: &OneMaster,
        hold: &LockKeys,
        queue: JoinQueue,
        deadline: Option<Instant>,
    ) -> Result<Acquired> {
        let keys = self.keys;
        let acks = m.config.replica_acks;
        let (sent, served) = (Instant::now(), Cell::new(None));
        let found =
            m.router
                .run_until_noting(keys.holders(), deadline, &served, |con, run| {
                    // A first run may have queued us before its reply was lost: a grant on this
                    // run must take the entry out.
                    let queue = match queue {
                        JoinQueue::Join if run == Run::Retry => JoinQueue::Rejoin,
                        queue => queue,
                    };
                    match script::acquire(con, keys, hold, self.access, self.lease, queue, acks) {
                        Err(e) if e.is_timeout() => {
                            // The script may still run and grant us what we are about to report
                            // as not taken: a release sent on the same connection runs after it,
                            // whatever it did, and takes us out of the queue. Its reply is of no
                            // use.
                            let _ = con.set_read_timeout(Some(MIN_READ));
                            let _ = script::release(con, keys, hold, Leaving::QueueAndLock);
                            Err(e)
                        }
                        Err(e) => Err(e),
                        Ok((found, acked)) => match (found, acks, acked) {
                            (Acquired::Granted(_), Some(acks), Some(acked))
                                if acked < acks.replicas =>
                            {
                                // Too few replicas have it, so a failover could lose it: give it
                                // back.
                                script::release(con, keys, hold, Leaving::Lock)?;
                                Ok(Err(Error::NotReplicated {
                                    acked,
                                    required: acks.replicas,
                                }))
                            }
                            (found, ..) => Ok(Ok(found)),
                        },
                    }
                })??;
        if let Acquired::Granted(token) = found {
            // A cluster master frozen while its replica took over answers when it wakes,
            // before it learns it was replaced: a slow grant counts only if the other nodes
            // still name its node.
            if let Some(node) = served.get() {
                if !m
                    .router
                    .trusted(keys.holders(), node, sent.elapsed(), deadline)
                {
                    log::warn!(
                        "fencelock: a grant of {} {:?} (token {token}) came from a master \
                         replaced while it answered; attempting again",
                        keys.what(),
                        keys.name()
                    );
                    return Ok(Acquired::Refused(Some(Duration::ZERO)));
                }
            }
        }
        Ok(found)
    }
}

/// The error of a semaphore handle whose count is not the one in force.
fn other_count(keys: &SharedLockKeys, count: u64) -> Error {
    Error::invalid(
        "permits",
        format!(
            "semaphore {:?} is in use with {count} permits, not {}: its count changes only \
             while no permit is held and nobody waits",
            keys.name(),
            keys.count()
        ),
    )
}

/// Whether the caller's cancel signal is ready (a message, or every sender gone).
fn is_cancelled(cancel: Option<&Receiver<()>>) -> bool {
    cancel.is_some_and(|cancel| !matches!(cancel.try_recv(), Err(TryRecvError::Empty)))
}

/// Sleeps for `pause`, or until `cancel` is ready: whether it was.
fn pause_or_cancel(pause: Duration, cancel: Option<&Receiver<()>>) -> bool {
    match cancel {
        Some(cancel) => !matches!(cancel.recv_timeout(pause), Err(RecvTimeoutError::Timeout)),
        None => {
            std::thread::sleep(pause);
            false
        }
    }
}

/// On a cluster, subscribes to the lock's shard channel, where other clients' releases tell us
/// of a handoff.
fn watch_shard(m: &OneMaster, keys: &SharedLockKeys, deadline: Option<Instant>) {
    if let Some(wake) = m.sharded.as_ref().and_then(|s| s.watch(keys.tag())) {
        let woken = m
            .router
            .run_until(&wake, deadline, |con, _| listener::wake(con, &wake));
        if let Err(e) = woken {
            log::debug!("fencelock: waking a shard listener failed: {e}");
        }
    }
}

/// The grant a wake carries, if it is one.
fn handed(wake: Wake, earliest: Instant) -> Option<Granted> {
    match wake {
        Wake::Granted {
            token,
            since,
            lease,
            ..
        } => {
            // Our own release says when it sent the handoff; another client's says nothing.
            let how = match since {
                Some(_) => How::LocalHandoff,
                None => How::RemoteHandoff,
            };
            Some((token, since.unwrap_or(earliest), Some((lease, how))))
        }
        _ => None,
    }
}

/// The release in Redis of a grant already stopped here.
pub(super) fn release(
    m: &OneMaster,
    keys: &SharedLockKeys,
    grant: &Grant,
    was_held: bool,
) -> Result<()> {
    let (what, name) = (keys.what(), keys.name());
    let (released, reply_lost) = match hand_over(m, keys, &grant.keys, Leaving::Lock, None) {
        Ok(found) => found,
        Err(e) => {
            log::warn!(
                "fencelock: releasing a grant of {what} {name:?} failed, it expires with its \
                 lease: {e}"
            );
            metrics::failed(grant.keys.namespace(), Op::Unlock, &e);
            return Err(e);
        }
    };
    if released.ours || (reply_lost && was_held) {
        // (The first run may have released it before its connection broke.)
        log::debug!(
            "fencelock: released a grant of {what} {name:?} (token {})",
            grant.token
        );
        return Ok(());
    }
    if grant.mark_lost("it was no longer ours at release") {
        log::warn!(
            "fencelock: a grant of {what} {name:?} (token {}) was no longer ours at release",
            grant.token
        );
    }
    let lost = Error::LockLost {
        key: name.to_owned(),
    };
    metrics::failed(grant.keys.namespace(), Op::Unlock, &lost);
    Err(lost)
}

/// A release for a guard's drop, which must not wait for a Redis that stopped answering: a
/// grant already known lost, or whose master the client last failed to reach, is released by
/// the background thread (`release.rs`). Failures are logged, never returned; the grant then
/// runs out with its lease.
pub(super) fn release_detached(
    m: &Arc<OneMaster>,
    keys: &SharedLockKeys,
    grant: &Arc<Grant>,
    was_held: bool,
) {
    if !was_held || m.router.unreachable(keys.holders()) {
        let (keys, grant) = (keys.clone(), Arc::clone(grant));
        super::release::later(m, move |m| {
            let _ = release(m, &keys, &grant, was_held);
        });
        return;
    }
    // `release` logs what failed.
    let _ = release(m, keys, grant, was_held);
}

/// Takes `hold`'s owner out of Redis' queue, and gives back a grant that reached it, from the
/// background thread (`release.rs`): for a waiter that gave up, or a grant it will not use,
/// while Redis did not answer. Failures are logged; what it cannot do runs out by itself.
fn leave_later(m: &Arc<OneMaster>, keys: &SharedLockKeys, hold: LockKeys) {
    let keys = keys.clone();
    super::release::later(m, move |m| {
        if let Err(e) = hand_over(m, &keys, &hold, Leaving::QueueAndLock, None) {
            log::warn!(
                "fencelock: leaving the queue of {} {:?} failed, its entry and a grant handed \
                 to it expire by themselves: {e}",
                keys.what(),
                keys.name()
            );
        }
    });
}

/// Runs the release script for `hold`'s owner, and tells our waiters it admitted. Returns what
/// the script found, and whether its first reply was lost (so it ran again).
fn hand_over(
    m: &OneMaster,
    keys: &SharedLockKeys,
    hold: &LockKeys,
    leaving: Leaving,
    until: Option<Instant>,
) -> Result<(Released, bool)> {
    let sent = Instant::now();
    let mut reply_lost = false;
    let released = m.router.run_until(keys.holders(), until, |con, run| {
        reply_lost |= run == Run::Retry;
        script::release(con, keys, hold, leaving)
    });
    let released = match released {
        Ok(released) => released,
        Err(e) => {
            // Whatever happened, the lock may be free for our next waiter.
            m.waiters.wake_head(keys.tag());
            return Err(e);
        }
    };
    let mut ours = false;
    for admitted in &released.admitted {
        let local = admitted.owner.starts_with(m.owners.prefix());
        metrics::handed_over(hold.namespace(), hold.kind(), local);
        if local {
            // One of ours that queued in Redis: if it left meanwhile, its leaving gives the
            // grant back.
            ours = true;
            let wake = Wake::Granted {
                token: admitted.token,
                since: Some(sent),
                lease: admitted.lease,
                local_run: 0,
            };
            m.waiters.deliver(keys.tag(), &admitted.owner, wake);
        }
    }
    if !ours {
        m.waiters.wake_head(keys.tag());
    }
    Ok((released, reply_lost))
}

/// See [`Engine::shared_status`](crate::engine::Engine::shared_status).
pub(super) fn status(m: &OneMaster, keys: &SharedLockKeys) -> Result<Status> {
    let status = m
        .router
        .run(keys.holders(), |con, _| script::status(con, keys))?;
    // As the acquire script decides: a count left behind by holders whose leases ran out is
    // replaced by the next acquire, so it is no error.
    let in_use = status.held > 0 || status.waiters > 0;
    match status.limit {
        Some(limit) if in_use && limit != u64::from(keys.count()) => Err(other_count(keys, limit)),
        _ => Ok(status),
    }
}
