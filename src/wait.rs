//! Waiting without polling: local FIFO queues per key, woken by one pub/sub connection.
//!
//! Threads of one client that wait for one key queue here in arrival order, and only the head of
//! the queue talks to Redis. The release script publishes the escaped key on the namespace's
//! release channel; this client's dispatcher thread, subscribed to that channel, wakes the head
//! of that key's queue, which retries at once. Nobody else in the queue is woken: only one can win.
//!
//! No release can slip between a failed attempt and the wait for its message: a waiter joins its
//! queue *before* its first attempt, so a message arriving after the attempt finds it. While the
//! pub/sub connection is down messages are lost, so every (re)subscription wakes every head to
//! retry. And since a crashed holder publishes nothing, the head also retries when the holder's
//! lease (as the acquire script reported it) runs out.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Wake {
    /// It is now the head, behind a holder in this same process that was just granted the lock
    /// with this lease: wait for that holder's release rather than asking Redis now, and look
    /// again unprompted once that lease could have run out.
    HeadBehindLocalHolder(Duration),
    /// The key may be free: try now.
    Attempt,
}

/// How a wait ended.
pub(crate) enum Waited {
    Woken(Wake),
    TimedOut,
    Cancelled,
}

struct Slot {
    tx: Sender<Wake>,
}

/// Every queue of one client, by escaped key.
#[derive(Default)]
pub(crate) struct Waiters {
    queues: Mutex<HashMap<String, VecDeque<Arc<Slot>>>>,
}

impl Waiters {
    fn queues(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Arc<Slot>>>> {
        // The map stays consistent even if a holder of the mutex panicked mid-way.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the queue of `tag`; the returned ticket leaves it when dropped.
    pub(crate) fn join(self: &Arc<Self>, tag: &str) -> Ticket {
        let (tx, rx) = crossbeam_channel::unbounded();
        let slot = Arc::new(Slot { tx });
        self.queues()
            .entry(tag.to_owned())
            .or_default()
            .push_back(Arc::clone(&slot));
        Ticket {
            waiters: Arc::clone(self),
            tag: tag.to_owned(),
            slot,
            rx,
            granted: None,
        }
    }

    /// `tag` came free: wake the head of its queue, if any.
    pub(crate) fn released(&self, tag: &str) {
        if let Some(head) = self.queues().get(tag).and_then(VecDeque::front) {
            let _ = head.tx.send(Wake::Attempt);
        }
    }

    /// Releases may have gone unheard: wake every head.
    fn wake_all_heads(&self) {
        for head in self.queues().values().filter_map(VecDeque::front) {
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
    /// The lease of our grant, once granted.
    granted: Option<Duration>,
}

impl Ticket {
    pub(crate) fn is_head(&self) -> bool {
        self.waiters
            .queues()
            .get(&self.tag)
            .and_then(VecDeque::front)
            .is_some_and(|head| Arc::ptr_eq(head, &self.slot))
    }

    /// Blocks until woken, until `until`, or until `cancel` is ready (a message or its
    /// disconnection). Several wakes that piled up count as the strongest of them.
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
            Ok(first) => Waited::Woken(self.rx.try_iter().fold(first, Wake::max)),
            // The sender lives in our own slot, so the channel cannot disconnect.
            Err(_) => Waited::TimedOut,
        }
    }

    /// Leaves the queue as the winner: the next in line waits for our release.
    pub(crate) fn leave_granted(mut self, lease: Duration) {
        self.granted = Some(lease);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.waiters.queues();
        let Some(queue) = queues.get_mut(&self.tag) else {
            return;
        };
        let was_head = queue.front().is_some_and(|h| Arc::ptr_eq(h, &self.slot));
        queue.retain(|s| !Arc::ptr_eq(s, &self.slot));
        match queue.front() {
            None => {
                queues.remove(&self.tag);
            }
            Some(next) if was_head => {
                let wake = match self.granted {
                    Some(lease) => Wake::HeadBehindLocalHolder(lease),
                    None => Wake::Attempt,
                };
                let _ = next.tx.send(wake);
            }
            Some(_) => {}
        }
    }
}

/// How often an idle pub/sub connection is checked with a PING, and how often the dispatcher
/// notices that its client is gone.
const HEARTBEAT: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Starts the dispatcher: one thread and one pub/sub connection per client. It holds only a
/// `Weak` to the queues, and exits within a heartbeat of the client being dropped.
pub(crate) fn spawn_dispatcher(
    client: redis::Client,
    channel: String,
    connection_timeout: Duration,
    waiters: Weak<Waiters>,
) -> std::io::Result<()> {
    thread::Builder::new()
        .name("fencelock-wake".to_owned())
        .spawn(move || dispatch(&client, &channel, connection_timeout, &waiters))
        .map(drop)
}

fn dispatch(
    client: &redis::Client,
    channel: &str,
    connection_timeout: Duration,
    waiters: &Weak<Waiters>,
) {
    let mut backoff = Duration::from_millis(10);
    while waiters.strong_count() > 0 {
        match listen(client, channel, connection_timeout, waiters, &mut backoff) {
            Ok(()) => return,
            Err(e) => {
                log::debug!("fencelock: release channel {channel:?} down, reconnecting: {e}");
                thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Subscribes and dispatches until the client is gone (`Ok`) or the connection fails (`Err`).
fn listen(
    client: &redis::Client,
    channel: &str,
    connection_timeout: Duration,
    waiters: &Weak<Waiters>,
    backoff: &mut Duration,
) -> redis::RedisResult<()> {
    // Bounded so that, with Redis unreachable, the thread still notices its client is gone.
    let connect_timeout = connection_timeout.min(Duration::from_secs(5));
    let mut con = crate::pool::connect(client, connect_timeout, HEARTBEAT)?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(channel)?;
    *backoff = Duration::from_millis(10);
    match waiters.upgrade() {
        Some(w) => w.wake_all_heads(),
        None => return Ok(()),
    }
    loop {
        match pubsub.get_message() {
            Ok(msg) => match waiters.upgrade() {
                Some(w) => match std::str::from_utf8(msg.get_payload_bytes()) {
                    Ok(tag) => w.released(tag),
                    Err(_) => log::debug!("fencelock: ignoring a non-UTF-8 release message"),
                },
                None => return Ok(()),
            },
            Err(e) if e.is_timeout() => {
                if waiters.strong_count() == 0 {
                    return Ok(());
                }
                // A half-open connection would otherwise swallow every release silently.
                pubsub.ping::<()>()?;
            }
            Err(e) => return Err(e),
        }
    }
}
