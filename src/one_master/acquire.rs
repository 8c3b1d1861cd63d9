//! A lock call on one master: attempt, wait in the key's local queue, take the grant.
//!
//! ```text
//! until ─► turn ─► wait_for_grant ─► accept ─► OneMaster::hold ─► the grant, held
//!          (join the local queue;    (confirm a late
//!           the head attempts, the    handoff with one
//!           others wait for a wake)   extend first)
//! ```
//!
//! A waiter's states and what moves it between them are tabled in docs/design.md ("A waiter's
//! states"); in the code they are one [`State`](super::wait::State) per waiter, held by its
//! [`Ticket`], and this file makes the moves.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::listener;
use super::release;
use super::wait::{Ticket, Waited, Wake, MAX_LOCAL_RUN};
use super::OneMaster;
use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant};
use crate::key::LockKeys;
use crate::metrics::{self, How};
use crate::net::pool::{Run, MIN_READ};
use crate::net::router::Ride;
use crate::options::LockOptions;
use crate::scripts::{self, Acquire, JoinQueue, Leaving, HANDOFF_LEASE};
use crate::token::FencingToken;

/// One attempt, no waiting: the grant, or `None` if the lock is held.
pub(super) fn once(
    m: &Arc<OneMaster>,
    mut keys: LockKeys,
    lease: Duration,
    options: &LockOptions,
) -> Result<Option<Arc<Grant>>> {
    m.owners.next(&mut keys);
    let sent = Instant::now();
    let Acquire::Granted(token) = attempt(m, &keys, keys.owner(), lease, JoinQueue::Never, None)?
    else {
        return Ok(None);
    };
    let granted_by = GrantedBy::Attempt { queued: false };
    match accept(m, keys, token, sent, lease, None, options, granted_by)? {
        Turn::Granted(grant) => Ok(Some(grant)),
        Turn::Deadline | Turn::TooLate => Ok(None),
    }
}

/// Waits in the key's local queue until granted, `deadline`, or cancelled: at its head it
/// attempts when woken, and takes a lock handed to it by a release.
pub(super) fn until(
    m: &Arc<OneMaster>,
    keys: LockKeys,
    lease: Duration,
    deadline: Option<Instant>,
    options: &LockOptions,
) -> Result<Option<Arc<Grant>>> {
    loop {
        match turn(m, keys.clone(), lease, deadline, options)? {
            Turn::Granted(grant) => return Ok(Some(grant)),
            Turn::Deadline => return Ok(None),
            // A handoff came too late to use: wait again, as a new waiter.
            Turn::TooLate if options.is_cancelled() => return Err(Error::Cancelled),
            Turn::TooLate => {}
        }
    }
}

/// One turn in the key's local queue, with an owner id of its own.
fn turn(
    m: &Arc<OneMaster>,
    mut keys: LockKeys,
    lease: Duration,
    deadline: Option<Instant>,
    options: &LockOptions,
) -> Result<Turn> {
    m.owners.next(&mut keys);
    let owner = keys.owner();
    let ticket = m.waiters.join(keys.tag(), owner, lease);
    let found = wait_for_grant(m, &keys, owner, lease, deadline, options, &ticket);
    if let Ok(Some((token, sent, granted_by))) = found {
        ticket.leave_granted();
        return accept(m, keys, token, sent, lease, deadline, options, granted_by);
    }
    // Leaving without a grant; a handoff may have reached us all the same.
    let earliest = ticket.since();
    let (late, in_redis_queue) = ticket.leave();
    if let (Some(wake), Ok(None)) = (late, &found) {
        if let Some((token, since, granted_by)) = handed(wake, earliest) {
            // Granted before we gave up: better taken than handed on.
            return accept(m, keys, token, since, lease, deadline, options, granted_by);
        }
    }
    // Only a waiter in Redis' queue or named by a release can have been handed the lock.
    if !in_redis_queue {
        return found.map(|_| Turn::Deadline);
    }
    if matches!(&found, Err(e) if e.is_connection()) || m.router.unreachable(keys.lock()) {
        // Redis did not answer: leaving here would wait for it again, past the caller's
        // timeout. Until the background thread gets through, a lock handed to us meanwhile
        // stays held until its lease runs out (it hands it on if it is still ours).
        release::leave_later(m, keys);
        return found.map(|_| Turn::Deadline);
    }
    // Out of Redis' queue, so no handoff is wasted on us; one that already reached us is
    // passed on. Past a deadline, Redis gets a little while to answer (it may have stopped
    // while we waited); then the background thread tries again, so that a process that exits
    // right after a try_lock rarely leaves its entry behind, and its caller never waits long.
    let until = deadline.is_some().then(|| Instant::now() + LEAVE_PATIENCE);
    match release::hand_over(m, &keys, owner, Leaving::QueueAndLock, MAX_LOCAL_RUN, until) {
        Ok(_) => {}
        Err(e) if until.is_some() && e.is_connection() => release::leave_later(m, keys),
        // On failure, the entry expires by itself.
        Err(e) => log::warn!(
            "fencelock: leaving the queue of {:?} failed: {e}",
            keys.user()
        ),
    }
    found.map(|_| Turn::Deadline)
}

/// The waiting loop of [`turn`]: the token, the lower bound of the
/// lease's start and how the lock came, or `None` at `deadline`.
fn wait_for_grant(
    m: &OneMaster,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    deadline: Option<Instant>,
    options: &LockOptions,
    ticket: &Ticket,
) -> Result<Option<(FencingToken, Instant, GrantedBy)>> {
    let mut attempt_now = ticket.is_head();
    // When the holder's lease runs out, as reported by our last attempt: a crashed holder
    // releases nothing, so the head attempts then.
    let mut holder_expiry: Option<Instant> = None;
    let mut ride = Ride::default();
    loop {
        if attempt_now {
            let sent = Instant::now();
            // Only an owner that may stand in Redis' queue has an entry to take out when
            // granted: one that attempted before or was named by a release. Marked before
            // sending: if the reply is lost, leaving must still withdraw.
            let queue = ticket.attempt(sent);
            let found = match attempt(m, keys, owner, lease, queue, deadline) {
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
                Err(e) => match m.router.ride(&mut ride, &e, deadline) {
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
                    if let Some(wake) = m.sharded.as_ref().and_then(|s| s.watch(keys.tag())) {
                        // Its master's thread may be waiting for messages only: one wakes
                        // it to subscribe now. Unheard, it subscribes within a second.
                        let woken = m
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
                    let after = pttl.unwrap_or(lease).min(HANDOFF_LEASE) + Duration::from_millis(1);
                    holder_expiry = Instant::now().checked_add(after);
                }
            }
        }
        attempt_now = false;
        let until = deadline.into_iter().chain(holder_expiry).min();
        match ticket.wait(until, options.cancel.as_ref()) {
            Waited::Woken(wakes) => {
                for wake in wakes {
                    match wake {
                        Wake::Granted { .. } => return Ok(handed(wake, ticket.since())),
                        Wake::Attempt => attempt_now = true,
                        Wake::Queued { retry_after, since } => {
                            ticket.queued(since);
                            holder_expiry =
                                Instant::now().checked_add(retry_after + Duration::from_millis(1));
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

/// Turns a token into a held grant. A lock handed over by a release started its lease at some
/// unknown moment after `sent`, and Redis set it to `granted` (capped for a handoff from
/// Redis' queue); an attempt's lease started after `sent` too. If little of it is left by
/// that count, or it is short of the lease asked for while nothing renews it, one extend
/// confirms the lease first, so that the grant starts out held rather than lost, and loss is
/// never reported for a lock still ours. A grant whose lease ran out, by our count, before we
/// heard of it is given back, never handed out: a rival may hold the key by then. Neither the
/// confirmation nor the give-back holds the caller past `deadline` (its own, if it has one):
/// what Redis has not answered by then is a timeout, and the give-back goes on in the
/// background, as a waiter's leaving does.
#[allow(clippy::too_many_arguments)]
fn accept(
    m: &Arc<OneMaster>,
    keys: LockKeys,
    token: FencingToken,
    sent: Instant,
    lease: Duration,
    deadline: Option<Instant>,
    options: &LockOptions,
    granted_by: GrantedBy,
) -> Result<Turn> {
    let (granted, local_run, queued, how) = match granted_by {
        GrantedBy::Attempt { queued } => (lease, 0, queued, How::Attempt),
        GrantedBy::Handoff {
            granted,
            local_run,
            how,
        } => (granted, local_run, false, how),
    };
    let acks = m.config.replica_acks;
    // A lease capped for the handoff needs a renewal to reach the lease asked for: confirm it
    // now when renewal may never come (off, or stopped early by a maximum hold).
    let capped = granted < lease && (options.no_renewal || options.max_hold.is_some());
    // A reply that took more than half the lease (a slow network, or this process starved of
    // CPU between the grant and reading it) leaves too little to count on, or nothing: Redis
    // may have expired the grant and granted a rival since. Confirm it before handing it out.
    let late = sent.elapsed() > granted / 2;
    let confirm =
        late || (matches!(granted_by, GrantedBy::Handoff { .. }) && (acks.is_some() || capped));
    let (sent, granted, acked) = if confirm {
        // With replica acks: a handoff was written by the releaser, on another connection,
        // and WAIT counts only what its own connection wrote, so the extend re-arms the
        // lease on ours and WAITs behind it.
        let sent = Instant::now();
        match m.confirm(&keys, lease, deadline) {
            // The confirmation's own reply may be as late: by our count the lease must not
            // have run out before we heard that it was set, or a rival may hold it now.
            Ok((true, acked)) if sent.elapsed() < lease => (sent, lease, acked),
            not_confirmed => {
                // No guard will release this grant, and the next waiter of ours is woken
                // only by a release or a loss: release it in our name. That frees the lock
                // or hands it on if it is still ours (an extend that timed out may have
                // run), and wakes our next waiter either way. Past a deadline, Redis gets a
                // little while to answer, then the background thread tries again.
                let until = deadline.map(|_| Instant::now() + LEAVE_PATIENCE);
                match release::hand_over(
                    m,
                    &keys,
                    keys.owner(),
                    Leaving::QueueAndLock,
                    MAX_LOCAL_RUN,
                    until,
                ) {
                    Ok(_) => {}
                    Err(e) if until.is_some() && e.is_connection() => {
                        release::leave_later(m, keys.clone());
                    }
                    Err(e) => log::warn!(
                        "fencelock: giving back an unconfirmed handoff of {:?} failed, it \
                         expires with its lease: {e}",
                        keys.user()
                    ),
                }
                not_confirmed?;
                // It ran out before we heard of it: wait again.
                log::debug!(
                    "fencelock: a grant of {:?} (token {token}) came too late to use",
                    keys.user()
                );
                return Ok(Turn::TooLate);
            }
        }
    } else {
        (sent, granted, None)
    };
    let grant = m.hold(NewGrant {
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
            let _ = m.release(&grant);
            Err(Error::NotReplicated {
                acked,
                required: acks.replicas,
            })
        }
        _ => {
            metrics::granted(&m.config.namespace, how);
            Ok(Turn::Granted(grant))
        }
    }
}

/// One run of the acquire script (and WAIT, if replica acks are required). `queue`: join
/// Redis' queue for the key if the lock is held. A reply that has not come by `deadline`
/// (if sooner than the response timeout) is a timeout.
fn attempt(
    m: &OneMaster,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    queue: JoinQueue,
    deadline: Option<Instant>,
) -> Result<Acquire> {
    let acks = m.config.replica_acks;
    let (sent, served) = (Instant::now(), Cell::new(None));
    let found = m
        .router
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
                    (Acquire::Granted(_), Some(acks), Some(acked)) if acked < acks.replicas => {
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
        if !m
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

/// How long a waiter past its deadline waits for Redis to take it out of its queue before it
/// leaves that to the background thread.
const LEAVE_PATIENCE: Duration = Duration::from_millis(50);

/// How one turn in the queue ended.
enum Turn {
    Granted(Arc<Grant>),
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
