//! Handoff wake-ups on a Redis Cluster through sharded pub/sub: a channel per waited key and
//! client, in the key's hash slot, subscribed on the master that serves the slot.
//!
//! A classic `PUBLISH` in a cluster reaches every node over the cluster bus, so each handoff costs
//! every node some CPU, and each node added costs more (docs/benchmarks.md, "Redis Cluster"). A
//! release on a cluster therefore `SPUBLISH`es a handoff to one of our waiters on
//! `<namespace>:released:{<tag>}:<client id>`, a channel in the lock's own slot, which only the
//! slot's master and its replicas see. The price is paid here: this client subscribes once per
//! key it waits on, on that key's master, and follows the slot when it moves.
//!
//! One thread and one connection per master with waited keys. A node's thread:
//!
//! | event | what it does |
//! |---|---|
//! | [`Sharded::watch`] of a key new to us (a waiter of ours was refused) | `SSUBSCRIBE` its channel; if the thread waits for messages only (below), the waiter wakes it with an empty message on a channel it listens to |
//! | waiting for messages | up to a [`HEARTBEAT`], or until a confirmation or a retry is due |
//! | `ssubscribe` confirmed | wakes the key's head: a handoff published before went unheard |
//! | `smessage` | delivers the handoff to the waiter it names |
//! | `sunsubscribe` not asked for (the slot left the node) | map suspect; subscribes where the slot is now |
//! | `MOVED` for an `SSUBSCRIBE` | the map learns; subscribes on the node named |
//! | no confirmation in a second, or the response timeout if shorter (`TRYAGAIN`, `CLUSTERDOWN`, an unseen error) | map suspect; subscribes where it names, after a growing pause if that is here |
//! | the map names another master for a key (checked every [`HEARTBEAT`]) | unsubscribes; subscribes there |
//! | connection lost, or a quiet [`HEARTBEAT`] and a subscription confirmed again not answered in the response timeout | map suspect; subscribes every key again, each where the map has it |
//! | no waiter of ours for a key for [`LINGER`] | `SUNSUBSCRIBE` |
//! | no key left | closes the connection; the thread ends after a [`HEARTBEAT`] without requests |
//!
//! Every (re)subscription wakes the key's head, so a message lost while no subscription stood
//! costs a waiter one attempt, never its wake-up. A server older than Redis 7.0 has no sharded
//! pub/sub and runs release scripts that `PUBLISH` classically (`release.lua` asks the
//! server's version), which the client's classic listener hears: nothing is subscribed here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use redis::{PushKind, RedisError, Value};

use crate::net::connector::{Connector, Node, Redirect};
use crate::net::subscriber::{Backoff, HEARTBEAT, LINGER};
use crate::one_master::wait::Waiters;

// A node's thread checks its keys' routes and lingering, and probes a quiet connection, every
// [`HEARTBEAT`]; a thread without keys waits that long for one before it ends. A key with no
// waiter of ours keeps its subscription for [`LINGER`], so that a key contended now and then
// does not subscribe and unsubscribe every time. A thread reconnects after a [`Backoff`], which
// also paces a subscription sent again after it went unconfirmed. The same as the other
// subscriptions' (`net/subscriber.rs`), whose loop this thread does not use: it holds many
// subscriptions on one connection, each confirmed, routed and dropped on its own.

/// The shortest wait for a message, and the wait while new keys are queued. Otherwise a node's
/// thread waits until something is due, up to a [`HEARTBEAT`], and a key new to it comes with a
/// message on one of its channels (see [`Sharded::watch`]) to wake it.
const POLL: Duration = Duration::from_millis(10);
/// A subscription not confirmed by then was refused (or its node is slow): the map is asked for
/// again, and it goes where the map says (the response timeout, if shorter).
const CONFIRM_WITHIN: Duration = Duration::from_secs(1);
/// The longest pause before a subscription that went unconfirmed is sent again (a user whose
/// ACL lacks `SSUBSCRIBE`: releases then publish classically, as nobody hears them sharded).
const MAX_UNCONFIRMED_PAUSE: Duration = Duration::from_secs(10);
/// How long a master found older than Redis 7.0 goes without shard subscriptions.
const RECHECK_OLD: Duration = Duration::from_secs(60);

/// The client's subscriptions to its keys' shard channels. Cheap to call for a key already
/// watched: one map lookup under a mutex.
pub(crate) struct Sharded {
    channels: Arc<Channels>,
}

/// What the sharded listener's threads share with the client: the channels' names, where to
/// deliver, and which master serves which key.
struct Channels {
    connector: Arc<Connector>,
    /// `<namespace>:released:{` and `}:<client id>`: every channel of ours is these around a tag.
    head: String,
    tail: String,
    /// This client's owner ids start with it.
    prefix: String,
    connection_timeout: Duration,
    response_timeout: Duration,
    waiters: Weak<Waiters>,
    routes: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// Each watched key's node: the node whose thread holds (or is making) its subscription.
    keys: HashMap<String, Node>,
    /// The thread of each node with watched keys, by the sending end of its requests.
    threads: HashMap<Node, Sender<String>>,
    /// A confirmed channel of each node's thread, while it waits long for messages: a message
    /// on it wakes the thread.
    wakes: HashMap<Node, String>,
    /// Masters found older than Redis 7.0 (no sharded pub/sub), and when: their releases
    /// publish classically, so their keys are not subscribed to for [`RECHECK_OLD`] (a rolling
    /// upgrade may replace them).
    old: HashMap<Node, Instant>,
    /// A subscription went unconfirmed again and again, and that was reported.
    warned: bool,
}

impl Sharded {
    pub(crate) fn new(
        connector: Arc<Connector>,
        namespace: &str,
        client_id: &str,
        prefix: String,
        connection_timeout: Duration,
        response_timeout: Duration,
        waiters: Weak<Waiters>,
    ) -> Sharded {
        Sharded {
            channels: Arc::new(Channels {
                connector,
                head: format!("{namespace}:released:{{"),
                tail: format!("}}:{client_id}"),
                prefix,
                connection_timeout,
                response_timeout,
                waiters,
                routes: Mutex::new(Routes::default()),
            }),
        }
    }

    /// A waiter of ours for `tag` was refused and waits for a handoff: subscribe to the key's
    /// channel if we do not already. The subscription's confirmation wakes the key's head, which
    /// attempts again: a handoff published before the subscription stood is found that way.
    ///
    /// Returns a channel to [`wake`] the master's thread on, if it may be waiting for messages
    /// and not for keys: the caller sends that, so that the subscription goes out at once.
    pub(crate) fn watch(&self, tag: &str) -> Option<String> {
        let channels = &self.channels;
        let mut routes = channels.routes();
        if routes.keys.contains_key(tag) {
            return None;
        }
        let node = channels.node_of(tag);
        if routes
            .old
            .get(&node)
            .is_some_and(|at| at.elapsed() < RECHECK_OLD)
        {
            return None;
        }
        let wake = routes.wakes.get(&node).cloned();
        channels.assign(&mut routes, tag.to_owned(), node);
        wake
    }
}

/// Wakes the thread listening on `channel` (from [`Sharded::watch`]) with an empty message,
/// which it takes for nothing else.
pub(crate) fn wake(con: &mut redis::Connection, channel: &str) -> redis::RedisResult<()> {
    redis::cmd("SPUBLISH").arg(channel).arg("").query(con)
}

impl Channels {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn channel(&self, tag: &str) -> String {
        format!("{}{tag}{}", self.head, self.tail)
    }

    /// The master of `tag`'s slot, as the map has it.
    fn node_of(&self, tag: &str) -> Node {
        self.connector.node_of_key(&self.channel(tag))
    }

    fn slot(&self, tag: &str) -> u16 {
        crate::net::connector::slot(self.channel(tag).as_bytes())
    }

    fn tag_of<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel
            .strip_prefix(self.head.as_str())?
            .strip_suffix(self.tail.as_str())
    }

    /// Hands `tag` to `node`'s thread, starting one if it has none.
    fn assign(self: &Arc<Self>, routes: &mut Routes, tag: String, node: Node) {
        routes.keys.insert(tag.clone(), node);
        let tag = match routes.threads.get(&node) {
            Some(tx) => match tx.send(tag) {
                Ok(()) => return,
                // Its thread ended without saying so: only when the client is gone.
                Err(e) => e.into_inner(),
            },
            None => tag,
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let _ = tx.send(tag.clone());
        let thread = NodeThread {
            channels: Arc::clone(self),
            node,
            rx,
            con: None,
            subs: HashMap::new(),
            heard: Instant::now(),
            probe: None,
            checked: Instant::now(),
            pause: Backoff::new(),
            read_timeout: POLL,
        };
        match thread::Builder::new()
            .name("fencelock-shard".to_owned())
            .spawn(move || thread.run())
        {
            Ok(_) => {
                routes.threads.insert(node, tx);
            }
            Err(e) => {
                // The waiter still gets the lock, a lease late at most, when it looks again.
                log::warn!("fencelock: cannot start a thread to hear handoffs: {e}");
                routes.keys.remove(&tag);
            }
        }
    }
}

/// One subscription of a node's thread.
struct Sub {
    /// When its `SSUBSCRIBE` went out on the current connection, if it did.
    sent: Option<Instant>,
    /// The server confirmed it.
    confirmed: bool,
    /// Not to be sent before this (after it went unconfirmed).
    not_before: Option<Instant>,
    /// How many times in a row it went unconfirmed.
    unconfirmed: u32,
    /// Since when no waiter of ours waits for the key.
    idle_since: Option<Instant>,
}

impl Sub {
    fn new() -> Sub {
        Sub {
            sent: None,
            confirmed: false,
            not_before: None,
            unconfirmed: 0,
            idle_since: None,
        }
    }
}

/// A node's thread. Its connection speaks RESP3: everything the thread waits for (messages,
/// confirmations) is a push message there, and redis-rs skips the next reply after every read
/// that timed out, but never a push. An error reply, then, may go unseen: a subscription not
/// confirmed within the response timeout counts as refused.
struct NodeThread {
    channels: Arc<Channels>,
    node: Node,
    rx: Receiver<String>,
    con: Option<redis::Connection>,
    /// By tag.
    subs: HashMap<String, Sub>,
    /// When the connection last said anything.
    heard: Instant,
    /// When a subscription was confirmed again to show the connection alive, if unanswered.
    probe: Option<Instant>,
    /// When routes and lingering were last looked at.
    checked: Instant,
    /// Before the next connection, after one failed.
    pause: Backoff,
    /// The connection's read timeout: [`POLL`] or [`HEARTBEAT`].
    read_timeout: Duration,
}

impl NodeThread {
    fn run(mut self) {
        while self.channels.waiters.strong_count() > 0 {
            if self.subs.is_empty() {
                // Nothing to hear: wait for a key, and end when none comes.
                self.con = None;
                match self.rx.recv_timeout(HEARTBEAT) {
                    Ok(tag) => self.add(tag),
                    Err(RecvTimeoutError::Timeout) => {
                        if self.retire() {
                            return;
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(tag) = self.rx.try_recv() {
                self.add(tag);
            }
            if let Err(e) = self.step() {
                self.lost(&e);
            }
        }
    }

    fn add(&mut self, tag: String) {
        self.subs.entry(tag).or_insert_with(Sub::new);
    }

    /// Connects if need be, sends what is due, reads one message (or waits [`POLL`] for one).
    fn step(&mut self) -> redis::RedisResult<()> {
        let now = Instant::now();
        let response_timeout = self.channels.response_timeout;
        let heartbeat = now.duration_since(self.checked) >= HEARTBEAT;
        if heartbeat {
            // Connected or not: keys whose waiters left, or that moved, go all the same.
            self.checked = now;
            self.check_routes();
            self.linger(now);
            if self.subs.is_empty() {
                return Ok(());
            }
        }
        if self.con.is_none() && !self.connect()? {
            return Ok(());
        }
        if heartbeat && self.probe.is_none() && now.duration_since(self.heard) >= HEARTBEAT {
            // Confirming a subscription again answers with a push, as a PING would not.
            if let Some(tag) = self.subs.iter().find(|(_, s)| s.confirmed).map(|(t, _)| t) {
                let tag = tag.clone();
                self.send("SSUBSCRIBE", &tag)?;
                self.probe = Some(now);
            }
        }
        if self
            .probe
            .is_some_and(|at| now.duration_since(at) >= response_timeout)
        {
            return Err(RedisError::from((
                redis::ErrorKind::Io,
                "no answer on a shard subscription's connection",
            )));
        }
        // A live node confirms at once; an error reply may have gone unseen (see the type).
        let confirm_within = response_timeout.min(CONFIRM_WITHIN);
        let unconfirmed: Vec<String> = self
            .subs
            .iter()
            .filter(|(_, s)| {
                !s.confirmed
                    && s.sent
                        .is_some_and(|at| now.duration_since(at) >= confirm_within)
            })
            .map(|(tag, _)| tag.clone())
            .collect();
        if !unconfirmed.is_empty() {
            self.unconfirmed(unconfirmed);
        }
        let due: Vec<String> = self
            .subs
            .iter()
            .filter(|(_, s)| s.sent.is_none() && s.not_before.is_none_or(|t| t <= now))
            .map(|(tag, _)| tag.clone())
            .collect();
        for tag in due {
            self.send("SSUBSCRIBE", &tag)?;
            if let Some(sub) = self.subs.get_mut(&tag) {
                sub.sent = Some(now);
                sub.not_before = None;
            }
        }
        self.choose_read_timeout()?;
        let Some(con) = self.con.as_mut() else {
            return Ok(());
        };
        match con.recv_response() {
            Ok(Value::Push { kind, data }) => {
                self.heard();
                self.push(&kind, data);
                Ok(())
            }
            Ok(reply) => {
                self.heard();
                if let Err(e) = reply.extract_error() {
                    self.refused(&e);
                }
                Ok(())
            }
            Err(e) if e.is_timeout() || crate::net::wire::interrupted(&e) => Ok(()),
            Err(e) if e.code().is_some() && !e.is_io_error() => {
                self.heard();
                self.refused(&e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Connects, and checks that the server knows sharded pub/sub: `false` if it does not.
    fn connect(&mut self) -> redis::RedisResult<bool> {
        let channels = &self.channels;
        let connect_timeout = channels.connection_timeout.min(Duration::from_secs(5));
        let mut con = channels.connector.connect_pushing(
            self.node,
            connect_timeout,
            channels.response_timeout,
        )?;
        // Asked before any read has timed out: no reply is skipped yet. A user that may not ask
        // (an ACL without INFO) is taken to have a server that knows sharded pub/sub.
        let info = match redis::cmd("INFO").arg("server").query::<String>(&mut con) {
            Ok(info) => info,
            Err(e) if e.code().is_some() && !e.is_io_error() => String::new(),
            Err(e) => return Err(e),
        };
        let major = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .and_then(|v| v.split('.').next()?.trim().parse::<u32>().ok());
        if major.is_some_and(|m| m < 7) {
            // Releases on such a server publish classically: nothing to subscribe to.
            let mut routes = channels.routes();
            routes.old.insert(self.node, Instant::now());
            for tag in self.subs.keys() {
                routes.keys.remove(tag);
            }
            self.subs.clear();
            return Ok(false);
        }
        con.set_read_timeout(Some(POLL))?;
        self.read_timeout = POLL;
        self.con = Some(con);
        self.heard();
        for sub in self.subs.values_mut() {
            sub.sent = None;
            sub.confirmed = false;
        }
        Ok(true)
    }

    /// How long the next read waits: until something is due (a subscription to send again, a
    /// confirmation's deadline, the next heartbeat), at most a [`HEARTBEAT`]; [`POLL`] while new
    /// keys wait in the queue. Says where a message wakes the thread meanwhile.
    fn choose_read_timeout(&mut self) -> redis::RedisResult<()> {
        let now = Instant::now();
        let confirm_within = self.channels.response_timeout.min(CONFIRM_WITHIN);
        let due = self
            .subs
            .values()
            .filter_map(|s| match s.sent {
                None => Some(s.not_before.unwrap_or(now)),
                Some(at) if !s.confirmed => Some(at + confirm_within),
                Some(_) => None,
            })
            .chain([self.checked + HEARTBEAT])
            .min()
            .unwrap_or(now);
        let timeout = {
            let mut routes = self.channels.routes();
            // Keys are sent under this lock: one sent before a channel was named to wake us on
            // is in the queue now, and keeps the wait short.
            let timeout = if self.rx.is_empty() {
                due.saturating_duration_since(now).clamp(POLL, HEARTBEAT)
            } else {
                POLL
            };
            let current = routes
                .wakes
                .get(&self.node)
                .and_then(|c| self.channels.tag_of(c));
            let valid = current.is_some_and(|t| self.subs.get(t).is_some_and(|s| s.confirmed));
            if !valid {
                match self.subs.iter().find(|(_, s)| s.confirmed) {
                    Some((tag, _)) => {
                        let channel = self.channels.channel(tag);
                        routes.wakes.insert(self.node, channel);
                    }
                    None => {
                        routes.wakes.remove(&self.node);
                    }
                }
            }
            timeout
        };
        if timeout != self.read_timeout {
            if let Some(con) = &self.con {
                con.set_read_timeout(Some(timeout))?;
            }
            self.read_timeout = timeout;
        }
        Ok(())
    }

    fn heard(&mut self) {
        self.heard = Instant::now();
        self.probe = None;
        self.pause.reset();
    }

    fn send(&mut self, command: &str, tag: &str) -> redis::RedisResult<()> {
        let Some(con) = self.con.as_mut() else {
            return Ok(());
        };
        let cmd = redis::cmd(command)
            .arg(self.channels.channel(tag))
            .get_packed_command();
        con.send_packed_command(&cmd)
    }

    /// A push message: a handoff, or a (un)subscription.
    fn push(&mut self, kind: &PushKind, data: Vec<Value>) {
        let mut data = data.into_iter();
        let channel = match data.next() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            _ => return,
        };
        let Some(tag) = self.channels.tag_of(&channel).map(str::to_owned) else {
            return;
        };
        match kind {
            PushKind::SMessage => {
                let (Some(Value::BulkString(payload)), Some(waiters)) =
                    (data.next(), self.channels.waiters.upgrade())
                else {
                    return;
                };
                // An empty one only woke us (see `wake`).
                if !payload.is_empty() {
                    super::deliver(&waiters, &self.channels.prefix, &payload);
                }
            }
            PushKind::SSubscribe => {
                let Some(sub) = self.subs.get_mut(&tag) else {
                    return;
                };
                sub.unconfirmed = 0;
                if !std::mem::replace(&mut sub.confirmed, true) {
                    if let Some(waiters) = self.channels.waiters.upgrade() {
                        waiters.wake_head(&tag);
                    }
                }
            }
            // Replies come in order: a subscription not confirmed yet was sent after an
            // unsubscribe whose reply this is. A confirmed one was dropped by the server: its
            // slot left this node.
            PushKind::SUnsubscribe if self.subs.get(&tag).is_some_and(|s| s.confirmed) => {
                self.subs.remove(&tag);
                // The map asked of the other masters first: the one that answers first may not
                // know of the move yet, and a MOVED to our SSUBSCRIBE here may go unseen.
                let _ = self.channels.connector.still_serves(
                    &channel,
                    self.node,
                    self.channels.connection_timeout,
                    None,
                );
                self.reroute(vec![tag], None);
            }
            _ => {}
        }
    }

    /// An error reply we did see: a `MOVED` names the slot of the subscriptions it refused.
    fn refused(&mut self, e: &RedisError) {
        let Some(Redirect::Moved(to)) = self.channels.connector.redirect(e, self.node) else {
            log::debug!("fencelock: a shard subscription's connection said: {e}");
            return;
        };
        let Some((_, slot)) = e.redirect_node() else {
            return;
        };
        let moved: Vec<String> = self
            .subs
            .iter()
            .filter(|(tag, s)| !s.confirmed && self.channels.slot(tag) == slot)
            .map(|(tag, _)| tag.clone())
            .collect();
        for tag in &moved {
            self.subs.remove(tag);
        }
        self.reroute(moved, Some(to));
    }

    /// Subscriptions the node did not confirm in time (refused, as a slot moving or the cluster
    /// down would, or lost): the map is asked for again, and they go where it says, at once if
    /// that is another node, after a growing pause if it is this one.
    fn unconfirmed(&mut self, tags: Vec<String>) {
        self.channels.connector.map_suspect();
        self.channels
            .connector
            .refresh(self.channels.connection_timeout);
        let now = Instant::now();
        let mut elsewhere = Vec::new();
        for tag in tags {
            if self.channels.node_of(&tag) != self.node {
                self.subs.remove(&tag);
                elsewhere.push(tag);
            } else if let Some(sub) = self.subs.get_mut(&tag) {
                sub.sent = None;
                sub.unconfirmed += 1;
                let pause = Backoff::FIRST * 2u32.saturating_pow(sub.unconfirmed.min(12));
                sub.not_before = Some(now + pause.min(MAX_UNCONFIRMED_PAUSE));
                if sub.unconfirmed == 3
                    && !std::mem::replace(&mut self.channels.routes().warned, true)
                {
                    log::warn!(
                        "fencelock: the server does not confirm the subscription to {:?}, so \
                         handoffs to this client are published to every node of the cluster \
                         (does the ACL user lack SSUBSCRIBE, or the channel pattern \
                         '&<namespace>:released:*'?)",
                        self.channels.channel(&tag)
                    );
                }
            }
        }
        self.reroute(elsewhere, None);
    }

    /// Hands the subscriptions of `tags`, already taken out of ours, to the node the map names
    /// now (or `to`), or keeps them to send again here.
    fn reroute(&mut self, tags: Vec<String>, to: Option<Node>) {
        let channels = Arc::clone(&self.channels);
        let mut routes = channels.routes();
        for tag in tags {
            // A key dropped meanwhile is not ours to move.
            if routes.keys.get(&tag) != Some(&self.node) {
                continue;
            }
            let node = to.unwrap_or_else(|| channels.node_of(&tag));
            if node == self.node {
                self.subs.insert(tag, Sub::new());
            } else {
                channels.assign(&mut routes, tag, node);
            }
        }
    }

    /// Moves the keys whose slot the map gives to another master now.
    fn check_routes(&mut self) {
        self.channels
            .connector
            .refresh(self.channels.connection_timeout);
        let moved: Vec<String> = self
            .subs
            .keys()
            .filter(|tag| self.channels.node_of(tag) != self.node)
            .cloned()
            .collect();
        if moved.is_empty() {
            return;
        }
        for tag in &moved {
            if self.subs.remove(tag).is_some_and(|s| s.sent.is_some()) {
                // A failure shows at the next read.
                let _ = self.send("SUNSUBSCRIBE", tag);
            }
        }
        self.reroute(moved, None);
    }

    /// Unsubscribes from keys nobody of ours has waited for since [`LINGER`].
    fn linger(&mut self, now: Instant) {
        let Some(waiters) = self.channels.waiters.upgrade() else {
            return;
        };
        let mut gone = Vec::new();
        {
            // Decided under the routes' lock, which `watch` takes: a waiter that found its key
            // watched is in the local queue then, so its key is never unsubscribed under it.
            let mut routes = self.channels.routes();
            for (tag, sub) in &mut self.subs {
                if waiters.waits_on(tag) {
                    sub.idle_since = None;
                } else if now.duration_since(*sub.idle_since.get_or_insert(now)) >= LINGER {
                    if routes.keys.get(tag) == Some(&self.node) {
                        routes.keys.remove(tag);
                    }
                    gone.push(tag.clone());
                }
            }
        }
        for tag in gone {
            if self.subs.remove(&tag).is_some_and(|s| s.sent.is_some()) {
                // A failure shows at the next read.
                let _ = self.send("SUNSUBSCRIBE", &tag);
            }
        }
    }

    /// The connection failed: the map is suspect, every key is subscribed again where the map
    /// has it after a pause, and each (re)subscription wakes its key's head.
    fn lost(&mut self, e: &RedisError) {
        log::debug!("fencelock: a shard subscription's connection failed: {e}");
        self.con = None;
        self.probe = None;
        self.channels.connector.failed(self.node, 0, e);
        self.pause.sleep();
        // Keys that stay here (lingering as they were) are subscribed again on the next
        // connection; the heads of the others are woken by their new node's confirmation.
        for sub in self.subs.values_mut() {
            sub.sent = None;
            sub.confirmed = false;
        }
        self.check_routes();
    }

    /// Ends the thread if no key came for it meanwhile.
    fn retire(&mut self) -> bool {
        let channels = Arc::clone(&self.channels);
        let mut routes = channels.routes();
        // Keys are sent under this lock: none can arrive between the look and the removal.
        if !self.rx.is_empty() {
            return false;
        }
        routes.threads.remove(&self.node);
        routes.wakes.remove(&self.node);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels() -> Arc<Channels> {
        let topology = crate::Topology::cluster(["redis://127.0.0.1:1"]);
        let connector = Connector::open(
            topology.resolve().unwrap(),
            &crate::net::tls::TlsSettings::default(),
            Duration::from_secs(1),
        )
        .unwrap();
        Sharded::new(
            Arc::new(connector),
            "ns:a",
            "s0123",
            "s0123:".to_owned(),
            Duration::from_secs(1),
            Duration::from_secs(1),
            Weak::new(),
        )
        .channels
    }

    #[test]
    fn a_channel_is_in_its_keys_slot_and_gives_its_tag_back() {
        let channels = channels();
        for tag in ["k", "a:b", "%7Bx%7D", "released:%25"] {
            let channel = channels.channel(tag);
            assert_eq!(channels.tag_of(&channel), Some(tag), "{channel}");
            assert_eq!(
                channels.slot(tag),
                crate::net::connector::slot(format!("ns:a:lock:{{{tag}}}").as_bytes()),
                "{channel}"
            );
        }
        assert_eq!(channels.tag_of("ns:a:released:{k}:s9999"), None);
        assert_eq!(channels.tag_of("ns:released:{k}:s0123"), None);
    }
}
