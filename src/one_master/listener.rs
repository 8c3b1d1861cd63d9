//! The release channel: one pub/sub connection and one thread per client, that hear handoffs
//! by other clients' releases to this client's waiters and deliver them.
//!
//! A release that hands the lock to a waiter of another client publishes `"<token> <owner>
//! <tag>"` on that client's own channel, `<namespace>:released:<client id>`, so a handoff wakes
//! one process. While the connection is down, messages are lost: every (re)subscription wakes
//! every head of a local queue to attempt again, and an attempt that finds the lock already its
//! own takes it.
//!
//! The subscription's loop (heartbeat, reconnection, the NOPERM warning) is `net/subscriber.rs`;
//! this file says what to subscribe to and where, follows the master when Sentinel moves it,
//! and delivers the handoffs it hears. On a Cluster, `listener/sharded.rs` hears the handoffs
//! published on the keys' shard channels.

mod sharded;

pub(crate) use sharded::{wake, Sharded};

use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use super::wait::Waiters;
use crate::net::connector::{Connector, Node};
use crate::net::subscriber::{self, Need, Subscriber, HEARTBEAT};
use crate::token::FencingToken;

/// How often the listener looks whether the master moved, where it can (Sentinel): releases
/// published on the new master go unheard until it subscribes there.
const FOLLOW: Duration = Duration::from_millis(100);

/// Starts the listener: one thread and one pub/sub connection per client. It holds only a
/// `Weak` to the queues, and exits within a heartbeat of the client being dropped.
pub(crate) fn spawn(
    connector: Arc<Connector>,
    channel: String,
    prefix: String,
    connection_timeout: Duration,
    waiters: Weak<Waiters>,
) -> std::io::Result<()> {
    thread::Builder::new()
        .name("fencelock-wake".to_owned())
        .spawn(move || {
            let mut listener = Listener {
                connector,
                channel,
                prefix,
                connection_timeout,
                waiters,
                epoch: 0,
            };
            subscriber::run(&mut listener);
        })
        .map(drop)
}

/// The release channel's subscription.
struct Listener {
    connector: Arc<Connector>,
    channel: String,
    /// This client's owner ids start with it. Releases publish on our channel only handoffs to
    /// our waiters, but a message for another owner (a `PUBLISH` by hand) is not ours to take.
    prefix: String,
    connection_timeout: Duration,
    waiters: Weak<Waiters>,
    /// The master's epoch when the connection was made: a failover changes it (Sentinel).
    epoch: u64,
}

impl Subscriber for Listener {
    fn wait_until_needed(&mut self) -> bool {
        self.waiters.strong_count() > 0
    }

    fn needed(&mut self) -> Need {
        if self.waiters.strong_count() > 0 {
            Need::Now
        } else {
            Need::Never
        }
    }

    fn connect(&mut self) -> redis::RedisResult<redis::Connection> {
        // Bounded so that, with Redis unreachable, the thread still notices its client is gone.
        let connect_timeout = self.connection_timeout.min(Duration::from_secs(5));
        self.epoch = self.connector.epoch(Node::SINGLE);
        self.connector.subscriber(connect_timeout, HEARTBEAT)
    }

    fn subscribe(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("SUBSCRIBE");
        cmd.arg(&self.channel);
        cmd
    }

    fn poll(&self) -> Duration {
        if self.connector.moves() {
            FOLLOW
        } else {
            HEARTBEAT
        }
    }

    /// The master moved: releases publish on the new one now.
    fn moved(&self) -> bool {
        self.connector.epoch(Node::SINGLE) != self.epoch
    }

    fn subscribed(&mut self) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.wake_all_heads();
        }
    }

    fn message(&mut self, msg: &redis::Msg) {
        if let Some(waiters) = self.waiters.upgrade() {
            deliver(&waiters, &self.prefix, msg.get_payload_bytes());
        }
    }

    /// Waiters still get the lock, a lease late, when they look again.
    fn not_permitted(&self, e: &redis::RedisError) {
        log::warn!(
            "fencelock: may not subscribe to {:?}, so handoffs go unheard (the ACL user needs \
             the channel pattern '&<namespace>:released:*'): {e}",
            self.channel
        );
    }

    fn name(&self) -> String {
        format!("release channel {:?}", self.channel)
    }
}

/// Delivers a handoff `"<token> <owner> <tag>"` if `owner` is one of ours. A waiter that left
/// meanwhile took itself out of Redis' queue, releasing what reached it, so an undeliverable
/// handoff needs nothing more.
fn deliver(waiters: &Waiters, prefix: &str, payload: &[u8]) {
    let Ok(message) = std::str::from_utf8(payload) else {
        log::debug!("fencelock: ignoring a non-UTF-8 release message");
        return;
    };
    let mut parts = message.splitn(3, ' ');
    let (Some(token), Some(owner), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
        log::debug!("fencelock: ignoring a malformed release message");
        return;
    };
    if !owner.starts_with(prefix) {
        return;
    }
    let Some(token) = token.parse().ok().filter(|t| *t > 0) else {
        log::debug!("fencelock: ignoring a release message without a token");
        return;
    };
    if !waiters.deliver_handoff(tag, owner, FencingToken::new(token)) {
        log::debug!("fencelock: a handoff reached a waiter that had left");
    }
}
