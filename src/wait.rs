//! Waiting without polling: local FIFO queues per key, a queue per key in Redis, and handoff.
//!
//! Threads of one client that wait for one key queue here in arrival order, and only the head of
//! the queue talks to Redis. A refused attempt puts the head's owner id in the key's queue in
//! Redis (one entry per waiting client), and a release grants the lock straight to the oldest
//! entry there, in the same script: the waiter learns its token without another round trip.
//! A release by this client hands the lock to its own next waiter itself (when Redis' queue is
//! empty; otherwise that waiter joins the back of it), so threads of one process pass a lock
//! from one to the next with one script call per acquisition. A handoff to another client's
//! waiter is published on that client's own channel, `"<token> <owner> <tag>"`, so it wakes no
//! other process; the client's listener thread (`listener.rs`), subscribed to it, delivers it to
//! the waiter.
//!
//! No handoff can be missed for good: while the pub/sub connection is down messages are lost, so
//! every (re)subscription wakes every head to attempt again, and an attempt that finds the lock
//! already its own takes it. Since a crashed holder releases nothing, the head also attempts
//! when the holder's lease (as Redis reported it) runs out. A waiter that gives up leaves the
//! queue in Redis, releasing the lock if a handoff reached it meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};

use crate::scripts::HANDOFF_LEASE;
use crate::token::FencingToken;

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The key may be free: try now.
    Attempt,
    /// A release by this client served another client's waiter and put this one in Redis' queue
    /// behind it. `retry_after`: the new holder's lease. `since`: when that release was sent.
    Queued {
        retry_after: Duration,
        since: Instant,
    },
    /// The lock was handed to this waiter with `token`, and Redis set its lease to `lease`. The
    /// lease started no earlier than `since`, when the handing release was sent; `None` when
    /// another client's release did it. `local_run`: see `Grant::local_run`.
    Granted {
        token: FencingToken,
        since: Option<Instant>,
        lease: Duration,
        local_run: u32,
    },
}

/// How a wait ended.
pub(crate) enum Waited {
    /// Every wake that had piled up, oldest first.
    Woken(Vec<Wake>),
    TimedOut,
    Cancelled,
}

struct Slot {
    tx: Sender<Wake>,
    owner: String,
    lease: Duration,
    /// Set when a release of this client may have put `owner` in Redis' queue: leaving without
    /// a grant must then take it out again.
    named: AtomicBool,
    /// How the waiter left the queue; changed only under the queues' lock.
    left: Mutex<Option<Left>>,
}

/// How a waiter left its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// With a grant: whatever else was meant for it is not needed.
    WithGrant,
    /// Without one: a handoff that reaches it later must be given back.
    WithoutGrant,
}

/// A waiter named in a release: the head of its key's queue at the time.
pub(crate) struct Head {
    slot: Arc<Slot>,
}

/// How many times in a row a client hands a lock to its own next waiter while other clients'
/// waiters may be queued in Redis. A local handoff costs no pub/sub message and no thread of
/// another process, so under contention it keeps the lock busy more of the time; the bound
/// keeps other clients from waiting longer than this many holds for their turn. The count
/// travels with the lock (`Grant::local_run`): threads that take turns empty the key's local
/// queue between turns, so a count kept there would start again each time.
pub(crate) const LOCAL_RUN: u32 = 8;

impl Head {
    pub(crate) fn owner(&self) -> &str {
        &self.slot.owner
    }

    pub(crate) fn lease(&self) -> Duration {
        self.slot.lease
    }
}

/// Every queue of one client, by escaped key.
#[derive(Default)]
pub(crate) struct Waiters {
    queues: Mutex<HashMap<String, KeyQueue>>,
}

/// One key's waiters, oldest first.
#[derive(Default)]
struct KeyQueue {
    slots: VecDeque<Arc<Slot>>,
}

impl Waiters {
    fn queues(&self) -> MutexGuard<'_, HashMap<String, KeyQueue>> {
        // The map stays consistent even if a holder of the mutex panicked mid-way.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the queue of `tag` as `owner`, wanting `lease`; the returned ticket leaves the
    /// queue when dropped.
    pub(crate) fn join(self: &Arc<Self>, tag: &str, owner: &str, lease: Duration) -> Ticket {
        let (tx, rx) = crossbeam_channel::unbounded();
        let slot = Arc::new(Slot {
            tx,
            owner: owner.to_owned(),
            lease,
            named: AtomicBool::new(false),
            left: Mutex::new(None),
        });
        self.queues()
            .entry(tag.to_owned())
            .or_default()
            .slots
            .push_back(Arc::clone(&slot));
        Ticket {
            waiters: Arc::clone(self),
            tag: tag.to_owned(),
            slot,
            rx,
            granted: false,
            left: false,
        }
    }

    /// The head of `tag`'s queue, to be named in a release.
    pub(crate) fn next(&self, tag: &str) -> Option<Head> {
        let queues = self.queues();
        let queue = queues.get(tag)?;
        let head = queue.slots.front()?;
        head.named.store(true, Ordering::SeqCst);
        Some(Head {
            slot: Arc::clone(head),
        })
    }

    /// Delivers `wake` to a waiter named in a release; how it left if it no longer waits.
    pub(crate) fn deliver_to(&self, next: &Head, wake: Wake) -> Result<(), Left> {
        let _queues = self.queues();
        match *lock_left(&next.slot) {
            Some(left) => Err(left),
            None => {
                let _ = next.slot.tx.send(wake);
                Ok(())
            }
        }
    }

    /// Delivers `wake` to the waiter `owner` of `tag`; `false` if it is no longer waiting.
    pub(crate) fn deliver(&self, tag: &str, owner: &str, wake: Wake) -> bool {
        self.queues()
            .get(tag)
            .and_then(|q| q.slots.iter().find(|s| s.owner == owner))
            .is_some_and(|slot| slot.tx.send(wake).is_ok())
    }

    /// Delivers a handoff by another client's release to our waiter `owner` of `tag`: Redis
    /// set its lease to its own, capped at [`HANDOFF_LEASE`]. `false` if it is no longer
    /// waiting.
    pub(crate) fn deliver_handoff(&self, tag: &str, owner: &str, token: FencingToken) -> bool {
        let queues = self.queues();
        let Some(slot) = queues
            .get(tag)
            .and_then(|q| q.slots.iter().find(|s| s.owner == owner))
        else {
            return false;
        };
        let wake = Wake::Granted {
            token,
            since: None,
            lease: slot.lease.min(HANDOFF_LEASE),
            local_run: 0,
        };
        slot.tx.send(wake).is_ok()
    }

    /// `tag` may be free: wake the head of its queue, if any.
    pub(crate) fn wake_head(&self, tag: &str) {
        if let Some(head) = self.queues().get(tag).and_then(|q| q.slots.front()) {
            let _ = head.tx.send(Wake::Attempt);
        }
    }

    /// Handoffs may have gone unheard: wake every head.
    pub(crate) fn wake_all_heads(&self) {
        for head in self.queues().values().filter_map(|q| q.slots.front()) {
            let _ = head.tx.send(Wake::Attempt);
        }
    }
}

/// One thread's place in one key's queue.
pub(crate) struct Ticket {
    waiters: Arc<Waiters>,
    tag: String,
    slot: Arc<Slot>,
    rx: Receiver<Wake>,
    granted: bool,
    left: bool,
}

impl Ticket {
    pub(crate) fn is_head(&self) -> bool {
        self.waiters
            .queues()
            .get(&self.tag)
            .and_then(|q| q.slots.front())
            .is_some_and(|head| Arc::ptr_eq(head, &self.slot))
    }

    /// Blocks until woken, until `until`, or until `cancel` is ready (a message or its
    /// disconnection).
    pub(crate) fn wait(&self, until: Option<Instant>, cancel: Option<&Receiver<()>>) -> Waited {
        let mut select = Select::new();
        let wake = select.recv(&self.rx);
        if let Some(cancel) = cancel {
            select.recv(cancel);
        }
        let op = match until {
            Some(until) => match select.select_deadline(until) {
                Ok(op) => op,
                Err(_) => return Waited::TimedOut,
            },
            None => select.select(),
        };
        if op.index() != wake {
            if let Some(cancel) = cancel {
                let _ = op.recv(cancel);
            }
            return Waited::Cancelled;
        }
        match op.recv(&self.rx) {
            Ok(first) => Waited::Woken(std::iter::once(first).chain(self.rx.try_iter()).collect()),
            // The sender lives in our own slot, so the channel cannot disconnect.
            Err(_) => Waited::TimedOut,
        }
    }

    /// Whether a release has named this waiter (and so may have put it in Redis' queue).
    pub(crate) fn named(&self) -> bool {
        self.slot.named.load(Ordering::SeqCst)
    }

    /// Leaves the queue as the winner. The next in line is not woken: our release hands the
    /// lock to it, and should we lose the lock instead, the loss wakes it (see `Grant`).
    pub(crate) fn leave_granted(mut self) {
        self.granted = true;
    }

    /// Leaves the queue without a grant. Returns a grant that arrived meanwhile, if any (a
    /// [`Wake::Granted`]), and whether a release of this client may have put us in Redis'
    /// queue.
    pub(crate) fn leave(mut self) -> (Option<Wake>, bool) {
        self.remove();
        // Nobody can send after the removal, so this sees every wake there will ever be.
        let granted = self
            .rx
            .try_iter()
            .find(|w| matches!(w, Wake::Granted { .. }));
        (granted, self.slot.named.load(Ordering::SeqCst))
    }

    fn remove(&mut self) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        let mut queues = self.waiters.queues();
        *lock_left(&self.slot) = Some(if self.granted {
            Left::WithGrant
        } else {
            Left::WithoutGrant
        });
        let Some(queue) = queues.get_mut(&self.tag).map(|q| &mut q.slots) else {
            return;
        };
        let was_head = queue.front().is_some_and(|h| Arc::ptr_eq(h, &self.slot));
        queue.retain(|s| !Arc::ptr_eq(s, &self.slot));
        match queue.front() {
            None => {
                queues.remove(&self.tag);
            }
            Some(next) if was_head && !self.granted => {
                let _ = next.tx.send(Wake::Attempt);
            }
            Some(_) => {}
        }
    }
}

fn lock_left(slot: &Slot) -> MutexGuard<'_, Option<Left>> {
    slot.left.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.remove();
    }
}
