//! A lock call: check the input, attempt, wait in the key's local queue, take the grant.
//!
//! ```text
//! lock / try_lock ─► prepare ─► acquire_round ─► wait_for_grant ─► take ─► grant ─► LockGuard
//!                                 (join the local queue; the       (confirm a late
//!                                  head attempts, the others        handoff with one
//!                                  wait for a wake)                 extend first)
//! ```
//!
//! A waiter's states and what moves it between them are tabled in docs/design.md ("A waiter's
//! states"); in the code they are one [`State`](crate::wait::State) per waiter, held by its
//! [`Ticket`], and this file makes the moves.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant};
use crate::guard::LockGuard;
use crate::key::LockKeys;
use crate::listener;
use crate::locks::Locks;
use crate::metrics::{self, How, Since};
use crate::net::pool::{Run, MIN_READ};
use crate::net::router::Ride;
use crate::options::LockOptions;
use crate::reentrant;
use crate::scripts::{self, Acquire, JoinQueue, Leaving, HANDOFF_LEASE};
use crate::token::FencingToken;
use crate::wait::{Ticket, Waited, Wake, LOCAL_RUN};

impl Locks {
    /// Checks everything that needs no network: the key, the options, and that this thread does
    /// not hold the key through a [`ReentrantGuard`](crate::ReentrantGuard). A plain guard may
    /// have moved to another thread, so holding one is no reason to refuse (see
    /// [`LockClient::lock`](crate::LockClient::lock)).
    pub(crate) fn prepare(&self, key: &str, options: &LockOptions) -> Result<LockKeys> {
        let mut keys = LockKeys::new(&self.config.namespace, key)?;
        keys.set_idle_expiry(self.config.idle_expiry);
        options.validate()?;
        if reentrant::held_here(self.identity(), keys.tag()) {
            return Err(Error::WouldDeadlock {
                key: keys.user().to_owned(),
            });
        }
        if options.cancel.as_ref().is_some_and(is_ready) {
            return Err(Error::Cancelled);
        }
        Ok(keys)
    }

    pub(crate) fn acquire_once(
        self: &Arc<Self>,
        key: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let called = Since::now();
        let result = match &self.quorum {
            Some(quorum) => self.acquire_quorum(quorum, key, None, options, true),
            None => self.acquire_once_timed(key, options),
        };
        metrics::acquired(&self.config.namespace, called, &result);
        result
    }

    fn acquire_once_timed(
        self: &Arc<Self>,
        key: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let mut keys = self.prepare(key, options)?;
        self.new_owner(&mut keys);
        let lease = options.lease.unwrap_or(self.config.lease);
        let sent = Instant::now();
        let Acquire::Granted(token) =
            self.attempt(&keys, keys.owner(), lease, JoinQueue::Never, None)?
        else {
            return Ok(None);
        };
        let granted_by = GrantedBy::Attempt { queued: false };
        match self.take(keys, token, sent, lease, options, granted_by)? {
            Round::Granted(guard) => Ok(Some(guard)),
            Round::Deadline | Round::TooLate => Ok(None),
        }
    }

    /// Waits in the key's local queue until granted, `deadline`, or cancelled: at its head it
    /// attempts when woken, and takes a lock handed to it by a release.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let called = Since::now();
        let result = match &self.quorum {
            Some(quorum) => self.acquire_quorum(quorum, key, deadline, options, false),
            None => self.acquire_timed(key, deadline, options),
        };
        metrics::acquired(&self.config.namespace, called, &result);
        result
    }

    fn acquire_timed(
        self: &Arc<Self>,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        loop {
            match self.acquire_round(key, deadline, options)? {
                Round::Granted(guard) => return Ok(Some(guard)),
                Round::Deadline => return Ok(None),
                Round::TooLate => {}
            }
        }
    }

    fn acquire_round(
        self: &Arc<Self>,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
    ) -> Result<Round> {
        let mut keys = self.prepare(key, options)?;
        self.new_owner(&mut keys);
        let owner = keys.owner();
        let lease = options.lease.unwrap_or(self.config.lease);
        let ticket = self.waiters.join(keys.tag(), owner, lease);
        let found = self.wait_for_grant(&keys, owner, lease, deadline, options, &ticket);
        if let Ok(Some((token, sent, granted_by))) = found {
            ticket.leave_granted();
            return self.take(keys, token, sent, lease, options, granted_by);
        }
        // Leaving without a grant; a handoff may have reached us all the same.
        let earliest = ticket.since();
        let (late, in_redis_queue) = ticket.leave();
        if let (Some(wake), Ok(None)) = (late, &found) {
            if let Some((token, since, granted_by)) = handed(wake, earliest) {
                // Granted before we gave up: better taken than handed on.
                return self.take(keys, token, since, lease, options, granted_by);
            }
        }
        // Only a waiter in Redis' queue or named by a release can have been handed the lock.
        if !in_redis_queue {
            return found.map(|_| Round::Deadline);
        }
        if matches!(&found, Err(e) if e.is_connection()) || self.router.unreachable(keys.lock()) {
            // Redis did not answer: leaving here would wait for it again, past the caller's
            // timeout. Until the background thread gets through, a lock handed to us meanwhile
            // stays held until its lease runs out (it hands it on if it is still ours).
            self.leave_later(keys);
            return found.map(|_| Round::Deadline);
        }
        // Out of Redis' queue, so no handoff is wasted on us; one that already reached us is
        // passed on. Past a deadline, Redis gets a little while to answer (it may have stopped
        // while we waited); then the background thread tries again, so that a process that exits
        // right after a try_lock rarely leaves its entry behind, and its caller never waits long.
        let until = deadline.is_some().then(|| Instant::now() + LEAVE_PATIENCE);
        match self.hand_over_until(&keys, owner, Leaving::QueueAndLock, LOCAL_RUN, until) {
            Ok(_) => {}
            Err(e) if until.is_some() && e.is_connection() => self.leave_later(keys),
            // On failure, the entry expires by itself.
            Err(e) => log::warn!("fencelock: leaving the queue of {key:?} failed: {e}"),
        }
        found.map(|_| Round::Deadline)
    }

    /// The waiting loop of [`acquire`](Locks::acquire): the token, the lower bound of the
    /// lease's start and how the lock came, or `None` at `deadline`.
    fn wait_for_grant(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        deadline: Option<Instant>,
        options: &LockOptions,
        ticket: &Ticket,
    ) -> Result<Option<(FencingToken, Instant, GrantedBy)>> {
        let mut attempt = ticket.is_head();
        // When the holder's lease runs out, as reported by our last attempt: a crashed holder
        // releases nothing, so the head attempts then.
        let mut holder_expiry: Option<Instant> = None;
        let mut ride = Ride::default();
        loop {
            if attempt {
                let sent = Instant::now();
                // Only an owner that may stand in Redis' queue has an entry to take out when
                // granted: one that attempted before or was named by a release. Marked before
                // sending: if the reply is lost, leaving must still withdraw.
                let queue = ticket.attempt(sent);
                let found = match self.attempt(keys, owner, lease, queue, deadline) {
                    // An attempt that got through ends the ride: a later failover is another
                    // one, with its own patience.
                    Ok(found) => {
                        ride = Ride::default();
                        found
                    }
                    // A master that stopped answering may be being replaced: the attempt (undone
                    // behind it on its connection) goes again, on the master the deployment
                    // names by then. The same owner id: should the lost attempt have granted
                    // on the old master and reached the new one, the retry finds it ours.
                    Err(e) => match self.router.ride(&mut ride, &e, deadline) {
                        Some(pause) => {
                            if pause_or_cancel(pause, options.cancel.as_ref()) {
                                return Err(Error::Cancelled);
                            }
                            continue;
                        }
                        None => return Err(e),
                    },
                };
                match found {
                    Acquire::Granted(token) => {
                        // A release that named us while our first attempt was out may have
                        // queued us: the grant's release then takes the entry out.
                        let queued = ticket.named();
                        return Ok(Some((token, sent, GrantedBy::Attempt { queued })));
                    }
                    Acquire::Held(pttl) => {
                        ticket.refused();
                        if let Some(wake) = self.sharded.as_ref().and_then(|s| s.watch(keys.tag()))
                        {
                            // Its master's thread may be waiting for messages only: one wakes
                            // it to subscribe now. Unheard, it subscribes within a second.
                            let woken = self
                                .router
                                .run_until(&wake, deadline, |con, _| listener::wake(con, &wake));
                            if let Err(e) = woken {
                                log::debug!("fencelock: waking a shard listener failed: {e}");
                            }
                        }
                        // A key without expiry was not set by fencelock; look again a lease later.
                        // Never later than a handoff's lease: the holder may meanwhile have
                        // handed the lock to a waiter ahead of us that died, whose grant runs out
                        // after that long without a release to wake us.
                        let after =
                            pttl.unwrap_or(lease).min(HANDOFF_LEASE) + Duration::from_millis(1);
                        holder_expiry = Instant::now().checked_add(after);
                    }
                }
            }
            attempt = false;
            let until = deadline.into_iter().chain(holder_expiry).min();
            match ticket.wait(until, options.cancel.as_ref()) {
                Waited::Woken(wakes) => {
                    for wake in wakes {
                        match wake {
                            Wake::Granted { .. } => return Ok(handed(wake, ticket.since())),
                            Wake::Attempt => attempt = true,
                            Wake::Queued { retry_after, since } => {
                                ticket.queued(since);
                                holder_expiry = Instant::now()
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
                    attempt = ticket.is_head();
                }
            }
        }
    }

    /// Turns a token into a guard. A lock handed over by a release started its lease at some
    /// unknown moment after `sent`, and Redis set it to `granted` (capped for a handoff from
    /// Redis' queue). If little of it is left by that count, or it is short of the lease asked
    /// for while nothing renews it, one extend confirms the lease first, so that the guard
    /// starts out held rather than lost, and loss is never reported for a lock still ours.
    fn take(
        self: &Arc<Self>,
        keys: LockKeys,
        token: FencingToken,
        sent: Instant,
        lease: Duration,
        options: &LockOptions,
        granted_by: GrantedBy,
    ) -> Result<Round> {
        let (granted, local_run, queued, how) = match granted_by {
            GrantedBy::Attempt { queued } => (lease, 0, queued, How::Attempt),
            GrantedBy::Handoff {
                granted,
                local_run,
                how,
            } => (granted, local_run, false, how),
        };
        let acks = self.config.replica_acks;
        // A lease capped for the handoff needs a renewal to reach the lease asked for: confirm it
        // now when renewal may never come (off, or stopped early by a maximum hold).
        let capped = granted < lease && (options.no_renewal || options.max_hold.is_some());
        let confirm = matches!(granted_by, GrantedBy::Handoff { .. })
            && (acks.is_some() || capped || sent.elapsed() > granted / 2);
        let (sent, granted, acked) = if confirm {
            // With replica acks: a handoff was written by the releaser, on another connection,
            // and WAIT counts only what its own connection wrote, so the extend re-arms the
            // lease on ours and WAITs behind it.
            let sent = Instant::now();
            let confirmed = self.router.run(keys.lock(), |con, _| match acks {
                Some(acks) => scripts::extend_acked(con, &keys, keys.owner(), lease, acks)
                    .map(|(ours, acked)| (ours, Some(acked))),
                None => scripts::extend(con, &keys, keys.owner(), lease).map(|ours| (ours, None)),
            });
            match confirmed {
                Ok((true, acked)) => (sent, lease, acked),
                not_confirmed => {
                    // No guard will release this grant, and the next waiter of ours is woken
                    // only by a release or a loss: release it in our name. That frees the lock
                    // or hands it on if it is still ours (an extend that timed out may have
                    // run), and wakes our next waiter either way.
                    if let Err(e) =
                        self.hand_over(&keys, keys.owner(), Leaving::QueueAndLock, LOCAL_RUN)
                    {
                        log::warn!(
                            "fencelock: giving back an unconfirmed handoff of {:?} failed, it \
                             expires with its lease: {e}",
                            keys.user()
                        );
                    }
                    not_confirmed?;
                    // It ran out before we heard of it: wait again.
                    log::debug!(
                        "fencelock: a handoff of {:?} (token {token}) came too late to use",
                        keys.user()
                    );
                    return Ok(Round::TooLate);
                }
            }
        } else {
            (sent, granted, None)
        };
        let guard = self.grant(NewGrant {
            keys,
            token,
            sent,
            granted,
            lease,
            auto_renew: !options.no_renewal,
            max_hold: options.max_hold,
            queued,
            local_run,
        });
        match (acks, acked) {
            (Some(acks), Some(acked)) if acked < acks.replicas => {
                let _ = guard.unlock();
                Err(Error::NotReplicated {
                    acked,
                    required: acks.replicas,
                })
            }
            _ => {
                metrics::granted(&self.config.namespace, how);
                Ok(Round::Granted(guard))
            }
        }
    }

    /// One run of the acquire script (and WAIT, if replica acks are required). `queue`: join
    /// Redis' queue for the key if the lock is held. A reply that has not come by `deadline`
    /// (if sooner than the response timeout) is a timeout.
    fn attempt(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        queue: JoinQueue,
        deadline: Option<Instant>,
    ) -> Result<Acquire> {
        let acks = self.config.replica_acks;
        let (sent, served) = (Instant::now(), Cell::new(None));
        let found =
            self.router
                .run_until_noting(keys.lock(), deadline, &served, |con, run| {
                    // A first run may have queued us before its reply was lost: a grant on this run must
                    // take the entry out.
                    let queue = match queue {
                        JoinQueue::Join if run == Run::Retry => JoinQueue::Rejoin,
                        queue => queue,
                    };
                    match scripts::acquire(con, keys, owner, lease, queue, acks) {
                        Err(e) if e.is_timeout() => {
                            // The script may still run and grant us the lock we are about to report as
                            // not taken. A release sent on the same connection runs after it, whatever
                            // it did, and takes us out of the queue. (A retry of the whole closure after
                            // a broken connection is safe too: the script treats a lock already ours as
                            // granted.)
                            // Its reply is of no use, and Redis is slow: wait for it only briefly, so that
                            // the caller's timeout holds. The connection is discarded either way.
                            let _ = con.set_read_timeout(Some(MIN_READ));
                            let _ = scripts::release(con, keys, owner, Leaving::QueueAndLock, None);
                            Err(e)
                        }
                        Err(e) => Err(e),
                        Ok((found, acked)) => match (found, acks, acked) {
                            (Acquire::Granted(_), Some(acks), Some(acked))
                                if acked < acks.replicas =>
                            {
                                // Too few replicas have it, so a failover could lose it: give it back.
                                scripts::release(con, keys, owner, Leaving::Lock, None)?;
                                Ok(Err(Error::NotReplicated {
                                    acked,
                                    required: acks.replicas,
                                }))
                            }
                            (found, ..) => Ok(Ok(found)),
                        },
                    }
                })??;
        // A cluster master frozen while its replica took over answers what waited in its socket
        // when it wakes, before it learns that it was replaced, and then drops what that wrote:
        // a slow grant is taken only if the other nodes still name its node.
        if let (Acquire::Granted(token), Some(node)) = (found, served.get()) {
            if !self
                .router
                .trusted(keys.lock(), node, sent.elapsed(), deadline)
            {
                log::warn!(
                    "fencelock: the grant of {:?} (token {token}) came from a master replaced \
                     while it answered; attempting again",
                    keys.user()
                );
                return Ok(Acquire::Held(Some(Duration::ZERO)));
            }
        }
        Ok(found)
    }

    /// Makes the guard of a grant and hands the grant to the renewal thread.
    pub(crate) fn grant(self: &Arc<Self>, new: NewGrant) -> LockGuard {
        let id = self.next_grant.fetch_add(1, Ordering::Relaxed);
        log::debug!(
            "fencelock: granted {:?} with token {}",
            new.keys.user(),
            new.token
        );
        let grant = Arc::new(Grant::new(id, new, Arc::downgrade(&self.waiters)));
        // The renewal thread outlives every guard, so this only fails if it died: then nothing
        // will renew this lease, and the holder must hear so now, not at the deadline.
        let held = match &self.quorum {
            Some(quorum) => quorum.renewal.hold(Arc::clone(&grant)),
            None => self.renewal.hold(Arc::clone(&grant)),
        };
        if !held {
            grant.mark_lost("the renewal thread is gone");
        }
        LockGuard::new(Arc::clone(self), grant)
    }
}

/// How long a waiter past its deadline waits for Redis to take it out of its queue before it
/// leaves that to the background thread.
const LEAVE_PATIENCE: Duration = Duration::from_millis(50);

/// How one round of waiting ended.
enum Round {
    Granted(LockGuard),
    Deadline,
    /// A handoff reached us too late to be used.
    TooLate,
}

/// How a waiter came by its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrantedBy {
    /// Its own attempt; `queued` if it may still stand in Redis' queue all the same.
    Attempt { queued: bool },
    /// A release handed it over, setting the lease to `granted`; see `Grant::local_run`.
    Handoff {
        granted: Duration,
        local_run: u32,
        how: How,
    },
}

/// The grant a wake carries, if it is one: its token, the earliest its lease can have started
/// (`earliest` unless the release that handed it over says), and how it came.
fn handed(wake: Wake, earliest: Instant) -> Option<(FencingToken, Instant, GrantedBy)> {
    match wake {
        Wake::Granted {
            token,
            since,
            lease,
            local_run,
        } => Some((
            token,
            since.unwrap_or(earliest),
            GrantedBy::Handoff {
                granted: lease,
                local_run,
                // Only a release of this client knows when it was sent.
                how: if since.is_some() {
                    How::LocalHandoff
                } else {
                    How::RemoteHandoff
                },
            },
        )),
        _ => None,
    }
}

/// Sleeps for `pause`, or until `cancel` is ready: whether it was.
fn pause_or_cancel(pause: Duration, cancel: Option<&Receiver<()>>) -> bool {
    match cancel {
        Some(cancel) => !matches!(
            cancel.recv_timeout(pause),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        ),
        None => {
            std::thread::sleep(pause);
            false
        }
    }
}

fn is_ready(cancel: &Receiver<()>) -> bool {
    !matches!(cancel.try_recv(), Err(TryRecvError::Empty))
}
