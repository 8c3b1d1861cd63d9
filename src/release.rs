//! Giving a lock up: release (compare-and-delete, or compare-and-hand-over to the next waiter)
//! and explicit extend. A guard calls these on its client's [`Locks`].
//!
//! ```text
//! LockGuard::unlock / drop ─► release ─► hand_over ─► release.lua ─► the next waiter:
//!                                                     ours: a wake on its ticket (wait.rs)
//!                                                     another client's: PUBLISH (listener.rs),
//!                                                     on a cluster SPUBLISH (listener/sharded.rs)
//! ```

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::key::LockKeys;
use crate::locks::Locks;
use crate::metrics::{self, Op};
use crate::net::pool::{self, Run};
use crate::scripts::{self, Leaving, OwnNext, Released};
use crate::wait::{Left, Wake, LOCAL_RUN};

impl Locks {
    /// Re-arms a grant's lease to `lease`, through the renewal thread's connection.
    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        let lost = || Error::LockLost {
            key: grant.keys.user().to_owned(),
        };
        if let Some(quorum) = &self.quorum {
            return quorum.extend(grant, lease);
        }
        if !grant.is_held() {
            return Err(lost());
        }
        let answer = self.renewal.extend(Arc::clone(grant), lease);
        // The renewal thread bounds each of its round trips by the response timeout; allow for
        // one renewal batch ahead of ours.
        let patience = self.config.response_timeout * 3 + self.config.connection_timeout;
        match answer.recv_timeout(patience) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(lost()),
            Ok(Err(e)) => Err(e),
            // The thread is gone, and with it every lease it kept: see Renewer's Drop.
            Err(RecvTimeoutError::Disconnected) => Err(lost()),
            Err(RecvTimeoutError::Timeout) => Err(Error::Connection(
                "the renewal thread did not answer in time".into(),
            )),
        }
    }

    /// Releases a grant: stops its renewal, then compare-and-delete, or compare-and-hand-over
    /// to the next waiter. Logs failures at warn, so `Drop` can stay silent.
    pub(crate) fn release(&self, grant: &Grant) -> Result<()> {
        let was_held = self.stop(grant);
        self.give_back(grant, was_held)
    }

    /// [`release`](Locks::release) for a guard's drop, which must not wait for a Redis that
    /// stopped answering. The grant stops here and now (its renewal); its release goes to the
    /// background thread when the client last failed to reach Redis, when the lock is already
    /// known lost (renewal failed, maybe against a frozen Redis: nobody waits on this release
    /// here), or when it was not sent because the unlocks just ahead of it got no reply (see
    /// [`Unsent`](crate::net::pool::Unsent)). Failures are logged, never returned.
    pub(crate) fn release_on_drop(self: &Arc<Self>, grant: &Arc<Grant>) {
        let was_held = self.stop(grant);
        if let Some(quorum) = &self.quorum {
            // Each master's worker sends it; nobody waits.
            quorum.release(&grant.keys, None);
            return;
        }
        let later = || Work::Release {
            grant: Arc::clone(grant),
            was_held,
        };
        if self.router.unreachable(grant.keys.lock()) || !was_held {
            self.later(later());
        } else if let Err(e) = self.give_back(grant, was_held) {
            if pool::unsent(&e) {
                self.later(later());
            }
        }
    }

    /// Gives up a waiter's place in Redis' queue (and a lock handed to it meanwhile) from a
    /// background thread; see [`release_on_drop`](Locks::release_on_drop).
    pub(crate) fn leave_later(self: &Arc<Self>, keys: LockKeys) {
        self.later(Work::Leave { keys });
    }

    fn later(self: &Arc<Self>, work: Work) {
        let sender = self.later.get_or_init(|| {
            let (sender, work) = crossbeam_channel::unbounded::<Later>();
            let spawned = thread::Builder::new()
                .name("fencelock-release".into())
                .spawn(move || {
                    // Ends when the client is gone: the last share of it may be in a job.
                    for Later { locks, work } in work {
                        locks.run_later(work);
                    }
                });
            spawned.ok().map(|_| sender)
        });
        let later = Later {
            locks: Arc::clone(self),
            work,
        };
        match sender {
            Some(sender) => {
                if let Err(unsent) = sender.send(later) {
                    self.run_later(unsent.into_inner().work);
                }
            }
            // No thread could be started: do it now rather than not at all.
            None => self.run_later(later.work),
        }
    }

    fn run_later(&self, work: Work) {
        match work {
            // Failures are logged where they happen.
            Work::Release { grant, was_held } => {
                if let Err(e) = self.give_back(&grant, was_held) {
                    if pool::unsent(&e) {
                        log::warn!(
                            "fencelock: releasing {:?} failed, it expires with its lease: {e}",
                            grant.keys.user()
                        );
                    }
                }
            }
            Work::Leave { keys } => {
                if let Err(e) =
                    self.hand_over(&keys, keys.owner(), Leaving::QueueAndLock, LOCAL_RUN)
                {
                    log::warn!(
                        "fencelock: leaving the queue of {:?} failed: {e}",
                        keys.user()
                    );
                }
            }
        }
    }

    /// Releases the lock on `key` whoever holds it, and hands it to the next waiter as a release
    /// does; see [`LockClient::force_unlock`](crate::LockClient::force_unlock). Returns whether
    /// the lock was held.
    pub(crate) fn force_unlock(&self, key: &str) -> Result<bool> {
        let mut keys = LockKeys::new(&self.config.namespace, key)?;
        keys.set_idle_expiry(self.config.idle_expiry);
        if let Some(quorum) = &self.quorum {
            let held = quorum.force_unlock(&keys)?;
            if held {
                log::warn!("fencelock: the lock on {key:?} was released by force");
            }
            return Ok(held);
        }
        // This client's own waiters are served after Redis' queue, like any client's.
        let (released, _) =
            self.hand_over(&keys, &self.owner_prefix, Leaving::Forced, LOCAL_RUN)?;
        let held = !matches!(released, Released::NotOurs);
        if held {
            log::warn!("fencelock: the lock on {key:?} was released by force");
        }
        Ok(held)
    }

    /// Ends a grant in this process (no more renewal); returns whether it was held until now.
    fn stop(&self, grant: &Grant) -> bool {
        let was_held = grant.is_held();
        metrics::held(&grant.keys, grant.granted_at);
        grant.end();
        match &self.quorum {
            Some(quorum) => quorum.renewal.forget(grant.id),
            None => self.renewal.forget(grant.id),
        }
        was_held
    }

    /// The release in Redis of a grant already stopped here.
    fn give_back(&self, grant: &Grant, was_held: bool) -> Result<()> {
        let user = grant.keys.user();
        if let Some(quorum) = &self.quorum {
            let until = std::time::Instant::now() + self.config.response_timeout;
            return match quorum.release(&grant.keys, Some(until)) {
                Some(Ok(false)) => {
                    grant.mark_lost("a majority of the masters no longer held it at release");
                    Err(Error::LockLost {
                        key: user.to_owned(),
                    })
                }
                Some(Err(e)) => {
                    log::warn!(
                        "fencelock: releasing {user:?} failed, it expires with its lease: {e}"
                    );
                    Err(e)
                }
                Some(Ok(true)) | None => Ok(()),
            };
        }
        let (released, reply_lost) = match self.hand_over(
            &grant.keys,
            grant.keys.owner(),
            if grant.queued {
                Leaving::QueueAndLock
            } else {
                Leaving::Lock
            },
            grant.local_run,
        ) {
            Ok(found) => found,
            Err(e) if pool::unsent(&e) => {
                log::debug!("fencelock: releasing {user:?} was not sent: {e}");
                metrics::failed(grant.keys.namespace(), Op::Unlock, &e);
                return Err(e);
            }
            Err(e) => {
                log::warn!("fencelock: releasing {user:?} failed, it expires with its lease: {e}");
                metrics::failed(grant.keys.namespace(), Op::Unlock, &e);
                return Err(e);
            }
        };
        match released {
            Released::Freed | Released::HandedOver { .. } => {
                log::debug!("fencelock: released {user:?} (token {})", grant.token);
                Ok(())
            }
            // The first run may have deleted the key before its connection broke: if we still
            // held the lock then, that is the likelier story. Either way nothing of anyone else's
            // was touched. A lock already known lost stays reported as lost.
            Released::NotOurs if reply_lost && was_held => {
                log::debug!(
                    "fencelock: released {user:?} (token {}) on a retry",
                    grant.token
                );
                Ok(())
            }
            Released::NotOurs => {
                if grant.mark_lost("it was no longer ours at release") {
                    log::warn!(
                        "fencelock: {user:?} (token {}) was no longer ours at release",
                        grant.token
                    );
                }
                let lost = Error::LockLost {
                    key: user.to_owned(),
                };
                metrics::failed(grant.keys.namespace(), Op::Unlock, &lost);
                Err(lost)
            }
        }
    }

    /// Runs the release script for `owner` (a holder's release, or with `QueueAndLock` a waiter
    /// leaving the queue), naming this client's next waiter for the key, and tells that waiter
    /// what became of it. Returns what the script found for `owner`, and whether its first
    /// reply was lost to a broken connection (so it ran again).
    pub(crate) fn hand_over(
        &self,
        keys: &LockKeys,
        owner: &str,
        leaving: Leaving,
        local_run: u32,
    ) -> Result<(Released, bool)> {
        self.hand_over_until(keys, owner, leaving, local_run, None)
    }

    /// [`hand_over`](Locks::hand_over) whose replies are awaited no later than `until` (see
    /// [`Pool::run_as`](crate::net::pool::Pool::run_as)); sent alone, not with other unlocks.
    pub(crate) fn hand_over_until(
        &self,
        keys: &LockKeys,
        owner: &str,
        leaving: Leaving,
        local_run: u32,
        until: Option<Instant>,
    ) -> Result<(Released, bool)> {
        // Each later run gives back a handoff to a waiter of ours that left before hearing of
        // it, or takes such a waiter out of Redis' queue, in its name; those serve Redis' queue
        // first. One that fails leaves the handoff to expire with its waiter's lease.
        let mut runs = Vec::new();
        let first = self.release_once(keys, owner, leaving, local_run, until, &mut runs)?;
        for _ in 1..MAX_HANDOVERS {
            let Some((owner, leaving, local_run)) = runs.pop() else {
                break;
            };
            if let Err(e) = self.release_once(keys, &owner, leaving, local_run, until, &mut runs) {
                log::warn!("fencelock: giving back a handoff failed: {e}");
                break;
            }
        }
        Ok(first)
    }

    /// One run of the release script for `owner`; see [`hand_over`](Locks::hand_over). Pushes
    /// onto `runs` the releases a waiter of ours that left now needs in its name.
    fn release_once(
        &self,
        keys: &LockKeys,
        owner: &str,
        leaving: Leaving,
        local_run: u32,
        until: Option<Instant>,
        runs: &mut Vec<(String, Leaving, u32)>,
    ) -> Result<(Released, bool)> {
        let next = self.waiters.next(keys.tag());
        // Our own waiter goes before other clients' only so many times in a row.
        let ahead = local_run < LOCAL_RUN;
        let next_ref = next.as_ref().map(|n| OwnNext {
            owner: n.owner(),
            lease: n.lease(),
            ahead,
        });
        let sent = Instant::now();
        let mut reply_lost = false;
        let released = if leaving == Leaving::Forced {
            // Run once, never again on a fresh connection: a second run would take the lock
            // from the waiter the first one handed it to.
            self.router.run_once(keys.lock(), |con| {
                scripts::release(con, keys, owner, leaving, next_ref)
            })
        } else if until.is_some() {
            self.router.run_until(keys.lock(), until, |con, run| {
                reply_lost |= run == Run::Retry;
                scripts::release(con, keys, owner, leaving, next_ref)
            })
        } else {
            self.router.run_combined(
                keys.lock(),
                scripts::pack_release(keys, owner, leaving, next_ref),
                |reply| scripts::released(reply, keys),
                |con, run| {
                    reply_lost |= run == Run::Retry;
                    scripts::release(con, keys, owner, leaving, next_ref)
                },
            )
        };
        let released = match released {
            Ok(released) => released,
            Err(e) => {
                // Whatever happened, the key may be free for our next waiter.
                self.waiters.wake_head(keys.tag());
                return Err(e);
            }
        };
        metrics::released(keys, &released, |to| to.starts_with(&self.owner_prefix));
        match (&released, next) {
            (
                Released::HandedOver {
                    token,
                    owner: to,
                    lease,
                },
                Some(next),
            ) if to == next.owner() => {
                let wake = Wake::Granted {
                    token: *token,
                    since: Some(sent),
                    lease: *lease,
                    // Without the go-ahead, Redis' queue was empty: nobody was passed over.
                    local_run: if ahead { local_run + 1 } else { 0 },
                };
                match self.waiters.deliver_to(&next, wake) {
                    // The lock is the scarce resource: let its new holder run now rather
                    // than queue behind the rest of our unlock on this core (on a busy
                    // machine the scheduler tends to put a woken thread there).
                    Ok(()) => thread::yield_now(),
                    // It left, maybe after leaving Redis' queue too: give the lock back.
                    Err(Left::WithoutGrant) => runs.push((to.clone(), Leaving::Lock, LOCAL_RUN)),
                    Err(Left::WithGrant) => {}
                }
            }
            (
                Released::HandedOver {
                    token,
                    owner: to,
                    lease,
                },
                next,
            ) => {
                if to.starts_with(&self.owner_prefix) {
                    // One of ours that queued in Redis: if it left meanwhile, its leaving
                    // gives the lock back.
                    let wake = Wake::Granted {
                        token: *token,
                        since: Some(sent),
                        lease: *lease,
                        local_run: 0,
                    };
                    self.waiters.deliver(keys.tag(), to, wake);
                }
                if let Some(next) = next {
                    // The script put it in Redis' queue behind `to`.
                    let wake = Wake::Queued {
                        retry_after: *lease,
                        since: sent,
                    };
                    if let Err(Left::WithoutGrant) = self.waiters.deliver_to(&next, wake) {
                        runs.push((next.owner().to_owned(), Leaving::QueueAndLock, LOCAL_RUN));
                    }
                }
            }
            (Released::NotOurs | Released::Freed, next) => {
                if next.is_some() {
                    self.waiters.wake_head(keys.tag());
                }
            }
        }
        Ok((released, reply_lost))
    }
}

/// What [`Locks::later`] hands to the background thread: work, and the client it is for.
pub(crate) struct Later {
    locks: Arc<Locks>,
    work: Work,
}

enum Work {
    Release { grant: Arc<Grant>, was_held: bool },
    Leave { keys: LockKeys },
}

/// Bounds the rounds of one release: see [`Locks::hand_over`].
const MAX_HANDOVERS: usize = 64;
