//! A client's local queues: for each key, the client's threads that wait for its lock, in
//! arrival order.
//!
//! Only the head of a key's queue talks to Redis; the others wait for their turn, so threads of
//! one client never compete with each other for a lock, and the one that came first is served
//! first. Both engines queue their waiters here, and keep beside each what they need of it:
//! `one_master/wait.rs` a waiter's state and the handoffs sent to it, `quorum/wait.rs` whether
//! its subscriptions serve it and which release last woke its key.
//!
//! | event | what the queue does |
//! |---|---|
//! | a thread joins | puts it at the back of its key's queue, made at the key's first waiter |
//! | the key may be free (a release, a lost grant) | wakes the head |
//! | messages may have gone unheard (a subscription made or made again) | wakes every key's head |
//! | the head leaves without the lock | wakes the next, the new head |
//! | the head leaves with the lock | wakes nobody: its release, or the loss of its grant, will |
//! | a waiter behind the head leaves | wakes nobody |
//! | the last waiter leaves | drops the key's queue |
//!
//! A waiter's wakes pile up in its own channel until it waits, and a wait takes them all, oldest
//! first. The queues' mutex is taken before anything an engine keeps in a waiter, and is held
//! while a waiter leaves: so a waiter an engine finds in a queue, under [`Queues::lock`], has not
//! left, and one that left is in no queue.

use std::collections::{HashMap, VecDeque};
use std::ops::Deref;
use std::sync::{Arc, PoisonError};
#[cfg(not(test))]
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crossbeam_channel::{Receiver, Select, Sender, TryIter};

#[cfg(test)]
use crate::model::{Mutex, MutexGuard};

/// What a waiter is woken with. The queue sends [`Wake::ATTEMPT`] by itself; an engine may send
/// more (a handoff).
pub(crate) trait Wake: Send {
    /// The key may be free: attempt now.
    const ATTEMPT: Self;
}

/// A wake that says nothing more than to attempt.
impl Wake for () {
    const ATTEMPT: Self = ();
}

/// How a waiter left its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// With a grant: whatever else was meant for it is not needed, and its next is not woken.
    WithGrant,
    /// Without one: its next, if it was the head, is woken; a handoff that reaches it later must
    /// be given back.
    WithoutGrant,
}

/// How a wait ended.
pub(crate) enum Waited<W> {
    /// Every wake that had piled up, oldest first.
    Woken(Vec<W>),
    TimedOut,
    Cancelled,
}

/// Every local queue of one client, by key tag. `E`: what the engine keeps of each waiter; `W`:
/// what a waiter is woken with; `K`: what the engine keeps of each key while it has waiters.
pub(crate) struct Queues<E, W, K = ()> {
    queues: Mutex<HashMap<String, Queue<E, W, K>>>,
}

/// One key's waiters, oldest first.
pub(crate) struct Queue<E, W, K> {
    waiters: VecDeque<Arc<Waiter<E, W>>>,
    /// What the engine keeps of the key.
    pub(crate) per_key: K,
}

/// One waiting thread, as its key's queue holds it: where to wake it, and what the engine keeps
/// of it, which the waiter derefs to.
pub(crate) struct Waiter<E, W> {
    tx: Sender<W>,
    entry: E,
}

/// The queues, locked: see the module's header for what that holds off.
pub(crate) struct Locked<'a, E, W, K> {
    queues: MutexGuard<'a, HashMap<String, Queue<E, W, K>>>,
}

/// One thread's place in one key's queue. Only [`Place::leave`] takes it out: an engine's ticket
/// calls it as it leaves, and when dropped.
pub(crate) struct Place<E, W, K = ()> {
    queues: Arc<Queues<E, W, K>>,
    tag: String,
    waiter: Arc<Waiter<E, W>>,
    rx: Receiver<W>,
}

impl<E, W, K> Default for Queues<E, W, K> {
    fn default() -> Self {
        Queues {
            queues: Mutex::new(HashMap::new()),
        }
    }
}

impl<E, W: Wake, K: Default> Queues<E, W, K> {
    pub(crate) fn lock(&self) -> Locked<'_, E, W, K> {
        Locked {
            // The map stays consistent even if a holder of the mutex panicked mid-way.
            queues: self.queues.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Joins the back of `tag`'s queue as `entry`.
    pub(crate) fn join(self: &Arc<Self>, tag: &str, entry: E) -> Place<E, W, K> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let waiter = Arc::new(Waiter { tx, entry });
        self.lock()
            .queues
            .entry(tag.to_owned())
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                per_key: K::default(),
            })
            .waiters
            .push_back(Arc::clone(&waiter));
        Place {
            queues: Arc::clone(self),
            tag: tag.to_owned(),
            waiter,
            rx,
        }
    }

    /// `tag` may be free: wakes the head of its queue, if any.
    pub(crate) fn wake_head(&self, tag: &str) {
        if let Some(head) = self.lock().head(tag) {
            head.wake(W::ATTEMPT);
        }
    }

    /// Messages may have gone unheard: wakes the head of every queue.
    pub(crate) fn wake_all_heads(&self) {
        for queue in self.lock().queues.values() {
            if let Some(head) = queue.head() {
                head.wake(W::ATTEMPT);
            }
        }
    }

    /// Whether a thread waits for `tag`.
    pub(crate) fn waits_on(&self, tag: &str) -> bool {
        self.lock().queues.contains_key(tag)
    }
}

impl<E, W, K> Locked<'_, E, W, K> {
    /// The head of `tag`'s queue.
    pub(crate) fn head(&self, tag: &str) -> Option<&Arc<Waiter<E, W>>> {
        self.queues.get(tag)?.head()
    }

    /// The first waiter in `tag`'s queue that `which` picks.
    pub(crate) fn find(&self, tag: &str, which: impl Fn(&E) -> bool) -> Option<&Arc<Waiter<E, W>>> {
        self.queues
            .get(tag)?
            .waiters
            .iter()
            .find(|w| which(&w.entry))
    }

    /// `tag`'s queue, if it has waiters.
    pub(crate) fn get(&self, tag: &str) -> Option<&Queue<E, W, K>> {
        self.queues.get(tag)
    }

    /// `tag`'s queue, if it has waiters.
    pub(crate) fn get_mut(&mut self, tag: &str) -> Option<&mut Queue<E, W, K>> {
        self.queues.get_mut(tag)
    }

    /// The keys with waiters.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> std::collections::hash_map::Keys<'_, String, Queue<E, W, K>> {
        self.queues.keys()
    }

    /// How many wait for `tag`.
    #[cfg(test)]
    pub(crate) fn len(&self, tag: &str) -> usize {
        self.queues.get(tag).map_or(0, |q| q.waiters.len())
    }
}

impl<E, W, K> Queue<E, W, K> {
    pub(crate) fn head(&self) -> Option<&Arc<Waiter<E, W>>> {
        self.waiters.front()
    }
}

impl<E, W> Waiter<E, W> {
    /// Sends `wake`, to be taken at the waiter's next wait; `false` if the waiter is gone.
    pub(crate) fn wake(&self, wake: W) -> bool {
        self.tx.send(wake).is_ok()
    }
}

impl<E, W> Deref for Waiter<E, W> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.entry
    }
}

impl<E, W: Wake, K: Default> Place<E, W, K> {
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// The waiter, as its queue holds it.
    pub(crate) fn waiter(&self) -> &Waiter<E, W> {
        &self.waiter
    }

    pub(crate) fn is_head(&self) -> bool {
        self.queues
            .lock()
            .head(&self.tag)
            .is_some_and(|head| Arc::ptr_eq(head, &self.waiter))
    }

    /// Blocks until woken, until `until`, or until `cancel` is ready (a message or its
    /// disconnection).
    pub(crate) fn wait(&self, until: Option<Instant>, cancel: Option<&Receiver<()>>) -> Waited<W> {
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
            // The sender lives in our own waiter, so the channel cannot disconnect.
            Err(_) => Waited::TimedOut,
        }
    }

    /// The wakes sent and not yet taken, oldest first. After [`Place::leave`] nothing more can
    /// come: these are all there will ever be.
    pub(crate) fn pending(&self) -> TryIter<'_, W> {
        self.rx.try_iter()
    }

    /// Takes the waiter out of its queue, as `how` says, if `leaving` says it is still there.
    /// `leaving` runs first, with the queues' lock held, so that the engine marks the waiter
    /// gone in the same step. Returns whether it left now.
    pub(crate) fn leave(&self, how: Left, leaving: impl FnOnce(&E) -> bool) -> bool {
        let mut locked = self.queues.lock();
        if !leaving(&self.waiter.entry) {
            return false;
        }
        let queues = &mut locked.queues;
        let Some(queue) = queues.get_mut(&self.tag).map(|q| &mut q.waiters) else {
            return true;
        };
        let was_head = queue.front().is_some_and(|h| Arc::ptr_eq(h, &self.waiter));
        queue.retain(|w| !Arc::ptr_eq(w, &self.waiter));
        match queue.front() {
            None => {
                queues.remove(&self.tag);
            }
            Some(next) if was_head && how == Left::WithoutGrant => {
                next.wake(W::ATTEMPT);
            }
            Some(_) => {}
        }
        true
    }
}
