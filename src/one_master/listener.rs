//! The release channel: one pub/sub connection and one thread per client, that hear handoffs
//! by other clients' releases to this client's waiters and deliver them.
//!
//! A release that hands the lock to a waiter of another client publishes `"<token> <owner>
//! <tag>"` on that client's own channel, `<namespace>:released:<client id>`, so a handoff wakes
//! one process. While the connection is down, messages are lost: every (re)subscription wakes
//! every head of a local queue to attempt again, and an attempt that finds the lock already its
//! own takes it.

mod sharded;

pub(crate) use sharded::{wake, Sharded};

use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::wait::Waiters;
use crate::net::connector::{Connector, Node};
use crate::token::FencingToken;

/// How often an idle pub/sub connection is checked with a PING, and how often the listener
/// notices that its client is gone.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How often the listener looks whether the master moved, where it can (Sentinel): releases
/// published on the new master go unheard until it subscribes there.
const FOLLOW: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

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
            let listener = Listener {
                connector: &connector,
                channel: &channel,
                prefix: &prefix,
                connection_timeout,
                waiters: &waiters,
            };
            listener.dispatch();
        })
        .map(drop)
}

struct Listener<'a> {
    connector: &'a Connector,
    channel: &'a str,
    /// This client's owner ids start with it. Releases publish on our channel only handoffs to
    /// our waiters, but a message for another owner (a `PUBLISH` by hand) is not ours to take.
    prefix: &'a str,
    connection_timeout: Duration,
    waiters: &'a Weak<Waiters>,
}

impl Listener<'_> {
    fn dispatch(&self) {
        let channel = self.channel;
        let mut backoff = Duration::from_millis(10);
        let mut warned = false;
        while self.waiters.strong_count() > 0 {
            let Err(e) = self.listen(&mut backoff) else {
                return;
            };
            // A configuration error, not an outage: say so once, loudly. Waiters still get the
            // lock, a lease late, when they look again.
            if e.code() == Some("NOPERM") && !std::mem::replace(&mut warned, true) {
                log::warn!(
                    "fencelock: may not subscribe to {channel:?}, so handoffs go unheard \
                     (the ACL user needs the channel pattern '&<namespace>:released:*'): {e}"
                );
            } else {
                log::debug!("fencelock: release channel {channel:?} down, reconnecting: {e}");
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Subscribes and dispatches until the client is gone (`Ok`) or the connection fails (`Err`).
    fn listen(&self, backoff: &mut Duration) -> redis::RedisResult<()> {
        let Listener {
            connector,
            channel,
            connection_timeout,
            waiters,
            ..
        } = *self;
        // Bounded so that, with Redis unreachable, the thread still notices its client is gone.
        let connect_timeout = connection_timeout.min(Duration::from_secs(5));
        let epoch = connector.epoch(Node::SINGLE);
        let mut con = connector.subscriber(connect_timeout, HEARTBEAT)?;
        subscribe(&mut con, channel)?;
        // Wait for messages in steps of `poll`; the PING and its reply keep the heartbeat.
        let poll = if connector.moves() { FOLLOW } else { HEARTBEAT };
        con.set_read_timeout(Some(poll))?;
        let mut pubsub = con.as_pubsub();
        *backoff = Duration::from_millis(10);
        match waiters.upgrade() {
            Some(w) => w.wake_all_heads(),
            None => return Ok(()),
        }
        let mut heard = Instant::now();
        loop {
            let quiet = match pubsub.get_message() {
                Ok(msg) => {
                    heard = Instant::now();
                    match waiters.upgrade() {
                        Some(w) => deliver(&w, self.prefix, msg.get_payload_bytes()),
                        None => return Ok(()),
                    }
                    false
                }
                Err(e) if e.is_timeout() => heard.elapsed() >= HEARTBEAT,
                // A signal cut the read short; redis-rs keeps what it had read of the message.
                // Signals coming faster than the heartbeat must not put off the heartbeat.
                Err(e) if crate::net::wire::interrupted(&e) => heard.elapsed() >= HEARTBEAT,
                Err(e) => return Err(e),
            };
            if connector.epoch(Node::SINGLE) != epoch {
                // The master moved: releases publish on the new one now.
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the master moved",
                )));
            }
            if quiet {
                heard = Instant::now();
                if waiters.strong_count() == 0 {
                    return Ok(());
                }
                // A half-open connection would otherwise swallow every release silently.
                pubsub.set_read_timeout(Some(HEARTBEAT))?;
                pubsub.ping::<()>()?;
                pubsub.set_read_timeout(Some(poll))?;
            }
        }
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

/// Subscribes `con` to `channel`. redis-rs' `PubSub::subscribe` takes an error reply (NOPERM,
/// say) for the confirmation and returns `Ok`, and the connection then waits, silent, for
/// messages that never come; here an error reply is the error.
fn subscribe(con: &mut redis::Connection, channel: &str) -> redis::RedisResult<()> {
    con.send_packed_command(&redis::cmd("SUBSCRIBE").arg(channel).get_packed_command())?;
    // The confirmation (an array, or a push under RESP3) or an error: the first reply either way.
    con.recv_response()?.extract_error().map(drop)
}
