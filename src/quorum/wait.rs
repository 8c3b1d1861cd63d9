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
//! The local queue itself (arrival order, who is head, who wakes whom as waiters leave) is the
//! one both engines share, `queue.rs`; this file keeps beside it which release last woke a key,
//! and how many waiters the listeners serve.
//!
//! A listener connects only while someone waits after a refusal, and lets go of its subscription
//! 5 s after the last such waiter left, so a client whose locks are granted at once costs the
//! masters nothing: a release reaches only the clients waiting in the namespace. The
//! subscription's loop (heartbeat, reconnection, linger) is `net/subscriber.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::net::connector::Connector;
use crate::net::subscriber::{self, Need, Subscriber, HEARTBEAT};
use crate::queue::{self, Left, Place, Queues};

/// The local queues of one quorum client, and what its listeners need.
pub(crate) struct Waiters {
    queues: Arc<Queues<Entry, (), PerKey>>,
    /// How many threads wait, for the listeners; they sleep on `someone` while it is 0.
    waiting: Mutex<usize>,
    someone: Condvar,
    /// `<namespace>:freed:`: the channels' common prefix.
    prefix: String,
    started: Mutex<bool>,
}

/// What this engine keeps of each key while it has waiters.
#[derive(Default)]
struct PerKey {
    /// The owner id of the last release that woke the head: the same release heard from
    /// another master wakes nobody.
    last_released: String,
}

/// What this engine keeps of each waiter in its key's queue.
struct Entry {
    /// Counted among the waiters the listeners serve (after its first refusal).
    listening: AtomicBool,
}

/// How a wait ended.
pub(crate) type Waited = queue::Waited<()>;

/// The channel a release of the key `tag` publishes on.
pub(crate) fn channel(namespace: &str, tag: &str) -> String {
    format!("{namespace}:freed:{{{tag}}}")
}

impl Waiters {
    pub(crate) fn new(namespace: &str) -> Waiters {
        Waiters {
            queues: Arc::default(),
            waiting: Mutex::new(0),
            someone: Condvar::new(),
            prefix: format!("{namespace}:freed:"),
            started: Mutex::new(false),
        }
    }

    /// Joins the local queue of `tag`.
    pub(crate) fn join(self: &Arc<Self>, tag: &str) -> Ticket {
        let entry = Entry {
            listening: AtomicBool::new(false),
        };
        Ticket {
            waiters: Arc::clone(self),
            place: self.queues.join(tag, entry),
            granted: false,
        }
    }

    /// Wakes the thread at the head of `tag`'s queue, if any.
    pub(crate) fn wake_head(&self, tag: &str) {
        self.queues.wake_head(tag);
    }

    /// Wakes the head of `tag`'s queue for the release of `owner`, unless that release already
    /// woke it (heard from another master).
    fn wake_head_for(&self, tag: &str, owner: &str) {
        let mut queues = self.queues.lock();
        let Some(queue) = queues.get_mut(tag) else {
            return;
        };
        if !owner.is_empty() && queue.per_key.last_released == owner {
            return;
        }
        owner.clone_into(&mut queue.per_key.last_released);
        if let Some(head) = queue.head() {
            head.wake(());
        }
    }

    fn wake_all_heads(&self) {
        self.queues.wake_all_heads();
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
            let mut listener = Listener {
                index,
                connector: Arc::clone(connector),
                waiters: Arc::downgrade(self),
                pattern: format!("{}*", self.prefix),
                connect_timeout: connection_timeout.min(Duration::from_secs(5)),
            };
            let spawned = thread::Builder::new()
                .name(format!("fencelock-freed-{index}"))
                .spawn(move || subscriber::run(&mut listener));
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
    place: Place<Entry, (), PerKey>,
    granted: bool,
}

impl Ticket {
    pub(crate) fn is_head(&self) -> bool {
        self.place.is_head()
    }

    /// The head was refused: from now on the listeners serve it (they subscribe, started at the
    /// client's first refusal).
    pub(crate) fn refused(&self, connector: &Arc<Connector>, connection_timeout: Duration) {
        if self.place.waiter().listening.swap(true, Ordering::Relaxed) {
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
        self.place.wait(Some(until), cancel)
    }

    /// Whether a release of `owner` was heard (and its repeats are being dropped).
    pub(crate) fn heard_release_of(&self, owner: &str) -> bool {
        self.waiters
            .queues
            .lock()
            .get(self.place.tag())
            .is_some_and(|q| !owner.is_empty() && q.per_key.last_released == owner)
    }

    /// Drops the wakes that came meanwhile (a message about the release our own attempt raced).
    pub(crate) fn clear(&self) {
        self.place.pending().for_each(drop);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let how = if self.granted {
            Left::WithGrant
        } else {
            Left::WithoutGrant
        };
        self.place.leave(how, |_| true);
        if self.place.waiter().listening.load(Ordering::Relaxed) {
            let mut waiting = self
                .waiters
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *waiting = waiting.saturating_sub(1);
        }
    }
}

/// One master's subscription, held while the client has waiters (and a linger after).
struct Listener {
    index: usize,
    connector: Arc<Connector>,
    waiters: Weak<Waiters>,
    pattern: String,
    connect_timeout: Duration,
}

impl Subscriber for Listener {
    /// Idle until someone waits; ends with the client.
    fn wait_until_needed(&mut self) -> bool {
        loop {
            let Some(waiters) = self.waiters.upgrade() else {
                return false;
            };
            let waiting = waiters
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *waiting > 0 {
                return true;
            }
            let _ = waiters
                .someone
                .wait_timeout(waiting, HEARTBEAT)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn needed(&mut self) -> Need {
        match self.waiters.upgrade() {
            None => Need::Never,
            Some(waiters) if waiters.waiting() == 0 => Need::NotNow,
            Some(_) => Need::Now,
        }
    }

    fn connect(&mut self) -> redis::RedisResult<redis::Connection> {
        self.connector
            .master(self.index, self.connect_timeout, HEARTBEAT)
    }

    fn subscribe(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("PSUBSCRIBE");
        cmd.arg(&self.pattern);
        cmd
    }

    fn subscribed(&mut self) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.wake_all_heads();
        }
    }

    fn message(&mut self, msg: &redis::Msg) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.heard(msg.get_channel_name().as_bytes(), msg.get_payload_bytes());
        }
    }

    fn not_permitted(&self, e: &redis::RedisError) {
        log::warn!(
            "fencelock: may not subscribe to {:?} on quorum master {}, so waiters learn of \
             releases only when the holder's lease ends (the ACL user needs the channel pattern \
             '&<namespace>:freed:*'): {e}",
            self.pattern,
            self.index
        );
    }

    fn name(&self) -> String {
        format!("quorum master {}'s subscription", self.index)
    }
}
