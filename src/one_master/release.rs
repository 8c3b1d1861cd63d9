//! Giving a lock up on one master: compare-and-delete, or compare-and-hand-over to the next
//! waiter, in one script.
//!
//! ```text
//! OneMaster::release ─► release ─► hand_over ─► release.lua ─► the next waiter:
//!                                                              ours: a wake on its ticket (wait.rs)
//!                                                              another client's: PUBLISH (listener.rs),
//!                                                              on a cluster SPUBLISH (listener/sharded.rs)
//! ```

use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::wait::{Left, Wake, MAX_LOCAL_RUN};
use super::OneMaster;
use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::key::LockKeys;
use crate::metrics::{self, Op};
use crate::net::pool::{self, Run};
use crate::scripts::{self, Leaving, OwnNext, Released};

/// A release for a guard's drop, which must not wait for a Redis that stopped answering.
/// The grant stopped already (its renewal); its release goes to the
/// background thread when the client last failed to reach Redis, when the lock is already
/// known lost (renewal failed, maybe against a frozen Redis: nobody waits on this release
/// here), or when it was not sent because the unlocks just ahead of it got no reply (see
/// [`Unsent`](crate::net::pool::Unsent)). Failures are logged, never returned.
pub(super) fn release_detached(m: &Arc<OneMaster>, grant: &Arc<Grant>, was_held: bool) {
    let work = || Task::Release {
        grant: Arc::clone(grant),
        was_held,
    };
    if m.router.unreachable(grant.keys.lock()) || !was_held {
        in_background(m, work());
    } else if let Err(e) = release(m, grant, was_held) {
        if pool::unsent(&e) {
            in_background(m, work());
        }
    }
}

/// Gives up a waiter's place in Redis' queue (and a lock handed to it meanwhile) from a
/// background thread; see [`release_detached`].
pub(super) fn leave_later(m: &Arc<OneMaster>, keys: LockKeys) {
    in_background(m, Task::Leave { keys });
}

/// Runs `work` on the background thread of [`release_detached`] (a shared lock's grant,
/// `shared_lock.rs`, releases and leaves its queue through it); `work` logs what fails.
pub(super) fn later(m: &Arc<OneMaster>, work: impl FnOnce(&OneMaster) + Send + 'static) {
    in_background(m, Task::Run(Box::new(work)));
}

fn in_background(m: &Arc<OneMaster>, task: Task) {
    let sender = m.background.get_or_init(|| {
        let (sender, jobs) = crossbeam_channel::unbounded::<Job>();
        let spawned = thread::Builder::new()
            .name("fencelock-release".into())
            .spawn(move || {
                // Ends when the client is gone: the last share of it may be in a job.
                for Job { engine, task } in jobs {
                    run(&engine, task);
                }
            });
        spawned.ok().map(|_| sender)
    });
    let job = Job {
        engine: Arc::clone(m),
        task,
    };
    match sender {
        Some(sender) => {
            if let Err(unsent) = sender.send(job) {
                run(m, unsent.into_inner().task);
            }
        }
        // No thread could be started: do it now rather than not at all.
        None => run(m, job.task),
    }
}

fn run(m: &OneMaster, task: Task) {
    match task {
        // Failures are logged where they happen.
        Task::Release { grant, was_held } => {
            if let Err(e) = release(m, &grant, was_held) {
                if pool::unsent(&e) {
                    log::warn!(
                        "fencelock: releasing {:?} failed, it expires with its lease: {e}",
                        grant.keys.user()
                    );
                }
            }
        }
        Task::Run(work) => work(m),
        Task::Leave { keys } => {
            if let Err(e) = hand_over(
                m,
                &keys,
                keys.owner(),
                Leaving::QueueAndLock,
                MAX_LOCAL_RUN,
                None,
            ) {
                log::warn!(
                    "fencelock: leaving the queue of {:?} failed: {e}",
                    keys.user()
                );
            }
        }
    }
}

/// The release in Redis of a grant already stopped here.
pub(super) fn release(m: &OneMaster, grant: &Grant, was_held: bool) -> Result<()> {
    let user = grant.keys.user();
    let (released, reply_lost) = match hand_over(
        m,
        &grant.keys,
        grant.keys.owner(),
        if grant.queued {
            Leaving::QueueAndLock
        } else {
            Leaving::Lock
        },
        grant.local_run,
        None,
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
///
/// With `until`, replies are awaited no later than then (see
/// [`Pool::run_as`](crate::net::pool::Pool::run_as)), and the call is sent alone, not with
/// other unlocks.
pub(super) fn hand_over(
    m: &OneMaster,
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
    let first = hand_over_once(m, keys, owner, leaving, local_run, until, &mut runs)?;
    for _ in 1..MAX_HANDOVERS {
        let Some((owner, leaving, local_run)) = runs.pop() else {
            break;
        };
        if let Err(e) = hand_over_once(m, keys, &owner, leaving, local_run, until, &mut runs) {
            log::warn!("fencelock: giving back a handoff failed: {e}");
            break;
        }
    }
    Ok(first)
}

/// One run of the release script for `owner`; see [`hand_over`]. Pushes
/// onto `runs` the releases a waiter of ours that left now needs in its name.
fn hand_over_once(
    m: &OneMaster,
    keys: &LockKeys,
    owner: &str,
    leaving: Leaving,
    local_run: u32,
    until: Option<Instant>,
    runs: &mut Vec<(String, Leaving, u32)>,
) -> Result<(Released, bool)> {
    let next = m.waiters.next(keys.tag());
    // Our own waiter goes before other clients' only so many times in a row.
    let ahead = local_run < MAX_LOCAL_RUN;
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
        m.router.run_once(keys.lock(), |con| {
            scripts::release(con, keys, owner, leaving, next_ref)
        })
    } else if until.is_some() {
        m.router.run_until(keys.lock(), until, |con, run| {
            reply_lost |= run == Run::Retry;
            scripts::release(con, keys, owner, leaving, next_ref)
        })
    } else {
        m.router.run_combined(
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
            m.waiters.wake_head(keys.tag());
            return Err(e);
        }
    };
    metrics::released(keys, &released, |to| to.starts_with(m.owners.prefix()));
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
            match m.waiters.deliver_to(&next, wake) {
                // The lock is the scarce resource: let its new holder run now rather
                // than queue behind the rest of our unlock on this core (on a busy
                // machine the scheduler tends to put a woken thread there).
                Ok(()) => thread::yield_now(),
                // It left, maybe after leaving Redis' queue too: give the lock back.
                Err(Left::WithoutGrant) => runs.push((to.clone(), Leaving::Lock, MAX_LOCAL_RUN)),
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
            if to.starts_with(m.owners.prefix()) {
                // One of ours that queued in Redis: if it left meanwhile, its leaving
                // gives the lock back.
                let wake = Wake::Granted {
                    token: *token,
                    since: Some(sent),
                    lease: *lease,
                    local_run: 0,
                };
                m.waiters.deliver(keys.tag(), to, wake);
            }
            if let Some(next) = next {
                // The script put it in Redis' queue behind `to`.
                let wake = Wake::Queued {
                    retry_after: *lease,
                    since: sent,
                };
                if let Err(Left::WithoutGrant) = m.waiters.deliver_to(&next, wake) {
                    runs.push((
                        next.owner().to_owned(),
                        Leaving::QueueAndLock,
                        MAX_LOCAL_RUN,
                    ));
                }
            }
        }
        (Released::NotOurs | Released::Freed, next) => {
            if next.is_some() {
                m.waiters.wake_head(keys.tag());
            }
        }
    }
    Ok((released, reply_lost))
}
/// What [`in_background`] hands to the background thread: a task, and the engine it is for.
pub(crate) struct Job {
    engine: Arc<OneMaster>,
    task: Task,
}

enum Task {
    Release { grant: Arc<Grant>, was_held: bool },
    Leave { keys: LockKeys },
    Run(Box<dyn FnOnce(&OneMaster) + Send>),
}

/// Bounds the rounds of one release: see [`hand_over`].
const MAX_HANDOVERS: usize = 64;
