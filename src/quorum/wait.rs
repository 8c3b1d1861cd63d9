//! How a quorum client's waiters learn that a lock was released: a local queue per key, and a
//! subscription per master to the namespace's release messages while anyone waits.
//!
//! A quorum has no queue in Redis and no handoff: a release deletes its key on every master and
//! publishes the released owner id on `<namespace>:freed:{<tag>}` there (quorum_release.lua).
//! While a thread of this client waits after a refusal, one thread per master holds a pattern
//! subscription to `<namespace>:freed:*`, and the first message of a release wakes the head of
//! that key's local queue, which attempts again (the same release heard from the other masters
//! wakes nobody). Only the head attempts, so threads of one client never split a majority among
//! themselves. A head that leaves without the lock wakes the next; one that leaves with it does
//! not, since its release will.
//!
//! | event | what wakes the head |
//! |---|---|
//! | a release by another client | its message, from every master it reached and we subscribe to |
//! | a release by this client | the releasing thread, at once |
//! | a subscription confirmed (first, or after a reconnection) | the listener wakes every head: a release may have come before it |
//! | the head left without the lock | the next in the queue, at once |
//! | the head left with the lock, and it was lost, not released | the next, within a second: a thread that is not the head looks again every second |
//! | no message (subscriptions down, a holder that died) | the head's own timer: 20 ms after a refusal, doubling to 2 s, never past the holder's remaining lease as the refusals reported it; with jitter |
//!
//! A listener connects only while someone waits after a refusal, and lets go of its subscription
//! 5 s after the last such waiter left, so a client whose locks are granted at once costs the
//! masters nothing: a release reaches only the clients waiting in the namespace.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::net::connector::Connector;

/// How long a listener waits for a message before it checks its connection and its waiters.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a subscription outlives the last waiter: a busy key's waiters come and go.
const LINGER: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The local queues of one quorum client, and what its listeners need.
pub(crate) struct Waiters {
    queues: Mutex<HashMap<String, Queue>>,
    /// How many threads wait, for the listeners; they sleep on `someone` while it is 0.
    waiting: Mutex<usize>,
    someone: Condvar,
    next_slot: AtomicU64,
    /// `<namespace>:freed:`: the channels' common prefix.
    prefix: String,
    started: Mutex<bool>,
}

#[derive(Default)]
struct Queue {
    slots: VecDeque<Arc<Slot>>,
    /// The owner id of the last release that woke the head: the same release heard from
    /// another master wakes nobody.
    last_released: String,
}

struct Slot {
    id: u64,
    tx: Sender<()>,
    rx: Receiver<()>,
    /// Counted among the waiters the listeners serve (after its first refusal).
    listening: std::sync::atomic::AtomicBool,
}

/// The channel a release of the key `tag` publishes on.
pub(crate) fn channel(namespace: &str, tag: &str) -> String {
    format!("{namespace}:freed:{{{tag}}}")
}

impl Waiters {
    pub(crate) fn new(namespace: &str) -> Waiters {
        Waiters {
            queues: Mutex::default(),
            waiting: Mutex::new(0),
            someone: Condvar::new(),
            next_slot: AtomicU64::new(0),
            prefix: format!("{namespace}:freed:"),
            started: Mutex::new(false),
        }
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the local queue of `tag`.
    pub(crate) fn join(self: &Arc<Self>, tag: &str) -> Ticket {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let slot = Arc::new(Slot {
            id: self.next_slot.fetch_add(1, Ordering::Relaxed),
            tx,
            rx,
            listening: std::sync::atomic::AtomicBool::new(false),
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
            granted: false,
        }
    }

    /// Wakes the thread at the head of `tag`'s queue, if any.
    pub(crate) fn wake_head(&self, tag: &str) {
        if let Some(head) = self.queues().get(tag).and_then(|q| q.slots.front()) {
            let _ = head.tx.try_send(());
        }
    }

    /// Wakes the head of `tag`'s queue for the release of `owner`, unless that release already
    /// woke it (heard from another master).
    fn wake_head_for(&self, tag: &str, owner: &str) {
        let mut queues = self.queues();
        let Some(queue) = queues.get_mut(tag) else {
            return;
        };
        if !owner.is_empty() && queue.last_released == owner {
            return;
        }
        owner.clone_into(&mut queue.last_released);
        if let Some(head) = queue.slots.front() {
            let _ = head.tx.try_send(());
        }
    }

    fn wake_all_heads(&self) {
        for queue in self.queues().values() {
            if let Some(head) = queue.slots.front() {
                let _ = head.tx.try_send(());
            }
        }
    }

    fn waiting(&self) -> usize {
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Delivers a message on `channel`: wakes the head of its key.
    fn heard(&self, channel: &[u8], owner: &[u8]) {
        let Some(tag) = std::str::from_utf8(channel)
            .ok()
            .and_then(|c| c.strip_prefix(self.prefix.as_str()))
            .and_then(|c| c.strip_prefix('{'))
            .and_then(|c| c.strip_suffix('}'))
        else {
            return;
        };
        self.wake_head_for(tag, std::str::from_utf8(owner).unwrap_or(""));
    }

    fn start_listeners(self: &Arc<Self>, connector: &Arc<Connector>, connection_timeout: Duration) {
        let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        if *started {
            return;
        }
        *started = true;
        for index in 0..connector.masters() {
            let listener = Listener {
                index,
                connector: Arc::clone(connector),
                waiters: Arc::downgrade(self),
                pattern: format!("{}*", self.prefix),
                connect_timeout: connection_timeout.min(Duration::from_secs(5)),
            };
            let spawned = thread::Builder::new()
                .name(format!("fencelock-freed-{index}"))
                .spawn(move || listener.run());
            if let Err(e) = spawned {
                // Waiters still learn of releases by their timers, a little later.
                log::warn!("fencelock: could not start a quorum listener: {e}");
            }
        }
    }
}

/// A waiter's place in its key's local queue; leaving it (on drop) without the lock wakes the
/// next.
pub(crate) struct Ticket {
    waiters: Arc<Waiters>,
    tag: String,
    slot: Arc<Slot>,
    granted: bool,
}

impl Ticket {
    pub(crate) fn is_head(&self) -> bool {
        self.waiters
            .queues()
            .get(&self.tag)
            .and_then(|q| q.slots.front())
            .is_some_and(|head| head.id == self.slot.id)
    }

    /// The head was refused: from now on the listeners serve it (they subscribe, started at the
    /// client's first refusal).
    pub(crate) fn refused(&self, connector: &Arc<Connector>, connection_timeout: Duration) {
        if self.slot.listening.swap(true, Ordering::Relaxed) {
            return;
        }
        self.waiters.start_listeners(connector, connection_timeout);
        *self
            .waiters
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        self.waiters.someone.notify_all();
    }

    /// Leaves with the lock: the next waiter is woken by its release, not now.
    pub(crate) fn granted(mut self) {
        self.granted = true;
    }

    /// Waits for a wake until `until`, or for `cancel`; returns what came.
    pub(crate) fn wait(&self, until: Instant, cancel: Option<&Receiver<()>>) -> Waited {
        let never = crossbeam_channel::never();
        let cancel = cancel.unwrap_or(&never);
        let timeout = crossbeam_channel::at(until);
        crossbeam_channel::select! {
            recv(self.slot.rx) -> _ => Waited::Woken,
            recv(cancel) -> _ => Waited::Cancelled,
            recv(timeout) -> _ => Waited::Timer,
        }
    }

    /// Whether a release of `owner` was heard (and its repeats are being dropped).
    pub(crate) fn heard_release_of(&self, owner: &str) -> bool {
        self.waiters
            .queues()
            .get(&self.tag)
            .is_some_and(|q| !owner.is_empty() && q.last_released == owner)
    }

    /// Drops a wake that came meanwhile (a message about the release our own attempt raced).
    pub(crate) fn clear(&self) {
        let _ = self.slot.rx.try_recv();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.waiters.queues();
        if let Some(queue) = queues.get_mut(&self.tag) {
            queue.slots.retain(|s| s.id != self.slot.id);
            match queue.slots.front() {
                Some(next) if !self.granted => {
                    let _ = next.tx.try_send(());
                }
                Some(_) => {}
                None => {
                    queues.remove(&self.tag);
                }
            }
        }
        drop(queues);
        if self.slot.listening.load(Ordering::Relaxed) {
            let mut waiting = self
                .waiters
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *waiting = waiting.saturating_sub(1);
        }
    }
}

pub(crate) enum Waited {
    Woken,
    Timer,
    Cancelled,
}

/// One master's subscription, held while the client has waiters (and `LINGER` after).
struct Listener {
    index: usize,
    connector: Arc<Connector>,
    waiters: Weak<Waiters>,
    pattern: String,
    connect_timeout: Duration,
}

impl Listener {
    fn run(self) {
        let mut backoff = Duration::from_millis(10);
        let mut warned = false;
        loop {
            // Idle until someone waits; ends with the client.
            loop {
                let Some(waiters) = self.waiters.upgrade() else {
                    return;
                };
                let waiting = waiters
                    .waiting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if *waiting > 0 {
                    break;
                }
                let _ = waiters
                    .someone
                    .wait_timeout(waiting, HEARTBEAT)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            match self.listen(&mut backoff) {
                Ok(()) => {}
                Err(e) => {
                    if e.code() == Some("NOPERM") && !std::mem::replace(&mut warned, true) {
                        log::warn!(
                            "fencelock: may not subscribe to {:?} on quorum master {}, so \
                             waiters learn of releases only when the holder's lease ends (the \
                             ACL user needs the channel pattern '&<namespace>:freed:*'): {e}",
                            self.pattern,
                            self.index
                        );
                    } else {
                        log::debug!(
                            "fencelock: quorum master {} subscription down: {e}",
                            self.index
                        );
                    }
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Subscribes and delivers until nobody has waited for `LINGER` or the client is gone
    /// (`Ok`), or the connection fails (`Err`).
    fn listen(&self, backoff: &mut Duration) -> redis::RedisResult<()> {
        let mut con = self
            .connector
            .master(self.index, self.connect_timeout, HEARTBEAT)?;
        con.send_packed_command(
            &redis::cmd("PSUBSCRIBE")
                .arg(&self.pattern)
                .get_packed_command(),
        )?;
        con.recv_response()?.extract_error()?;
        *backoff = Duration::from_millis(10);
        match self.waiters.upgrade() {
            Some(waiters) => waiters.wake_all_heads(),
            None => return Ok(()),
        }
        let mut pubsub = con.as_pubsub();
        let mut heard = Instant::now();
        let mut idle_since: Option<Instant> = None;
        loop {
            let quiet = match pubsub.get_message() {
                Ok(msg) => {
                    heard = Instant::now();
                    match self.waiters.upgrade() {
                        Some(waiters) => {
                            waiters
                                .heard(msg.get_channel_name().as_bytes(), msg.get_payload_bytes());
                        }
                        None => return Ok(()),
                    }
                    false
                }
                Err(e) if e.is_timeout() || crate::net::wire::interrupted(&e) => {
                    heard.elapsed() >= HEARTBEAT
                }
                Err(e) => return Err(e),
            };
            let Some(waiters) = self.waiters.upgrade() else {
                return Ok(());
            };
            if waiters.waiting() == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= LINGER {
                    return Ok(());
                }
            } else {
                idle_since = None;
            }
            if quiet {
                heard = Instant::now();
                // A half-open connection would otherwise swallow every release silently.
                pubsub.ping::<()>()?;
            }
        }
    }
}
