//! A watch on one pub/sub channel: a thread that holds a subscription to it while its owner
//! lives, and passes on what it hears, and each (re)subscription, to the owner's inbox.
//!
//! An election's observer watches its channel this way: on one master through the deployment's
//! subscriber node (following the master when Sentinel moves it), on a quorum once per master.
//! The loop itself (heartbeat, reconnection, the NOPERM warning) is [`subscriber::run`].

use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::connector::{Connector, Node};
use super::subscriber::{self, Need, Subscriber, HEARTBEAT};

/// What a watch passes on.
#[derive(Debug)]
pub(crate) enum Heard {
    /// The subscription stands, first or again: what was published while none stood is lost.
    Subscribed,
    /// A message's payload.
    Message(Vec<u8>),
}

/// Where a watch subscribes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum On {
    /// The deployment's subscriber node: the single server, the master Sentinel names, any node
    /// of a Cluster (a `PUBLISH` reaches every node).
    Deployment,
    /// Master `n` of a quorum.
    Master(usize),
}

/// How often a watch looks whether the master moved, where it can (Sentinel).
const FOLLOW: Duration = Duration::from_millis(100);

/// Starts a watch on `channel`. It ends within a heartbeat once `alive` has no strong count
/// left or `inbox` has no receiver.
pub(crate) fn spawn(
    connector: Arc<Connector>,
    on: On,
    channel: String,
    connection_timeout: Duration,
    inbox: Sender<Heard>,
    alive: Weak<()>,
) -> std::io::Result<()> {
    thread::Builder::new()
        .name("fencelock-watch".to_owned())
        .spawn(move || {
            let mut watch = Watch {
                connector,
                on,
                channel,
                connection_timeout,
                inbox,
                alive,
                epoch: 0,
            };
            subscriber::run(&mut watch);
        })
        .map(drop)
}

struct Watch {
    connector: Arc<Connector>,
    on: On,
    channel: String,
    connection_timeout: Duration,
    inbox: Sender<Heard>,
    alive: Weak<()>,
    /// The master's epoch when the connection was made: a failover changes it (Sentinel).
    epoch: u64,
}

impl Watch {
    fn pass(&self, heard: Heard) {
        // A closed inbox means the owner is gone: `needed` says so at the next read.
        let _ = self.inbox.send(heard);
    }
}

impl Subscriber for Watch {
    fn wait_until_needed(&mut self) -> bool {
        self.alive.strong_count() > 0
    }

    fn needed(&mut self) -> Need {
        if self.alive.strong_count() > 0 {
            Need::Now
        } else {
            Need::Never
        }
    }

    fn connect(&mut self) -> redis::RedisResult<redis::Connection> {
        // Bounded so that, with Redis unreachable, the thread still notices its owner is gone.
        let connect_timeout = self.connection_timeout.min(Duration::from_secs(5));
        match self.on {
            On::Deployment => {
                self.epoch = self.connector.epoch(Node::SINGLE);
                self.connector.subscriber(connect_timeout, HEARTBEAT)
            }
            On::Master(n) => self.connector.master(n, connect_timeout, HEARTBEAT),
        }
    }

    fn subscribe(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("SUBSCRIBE");
        cmd.arg(&self.channel);
        cmd
    }

    fn poll(&self) -> Duration {
        if matches!(self.on, On::Deployment) && self.connector.moves() {
            FOLLOW
        } else {
            HEARTBEAT
        }
    }

    /// The master moved: messages are published on the new one now.
    fn moved(&self) -> bool {
        matches!(self.on, On::Deployment) && self.connector.epoch(Node::SINGLE) != self.epoch
    }

    fn subscribed(&mut self) {
        self.pass(Heard::Subscribed);
    }

    fn message(&mut self, msg: &redis::Msg) {
        self.pass(Heard::Message(msg.get_payload_bytes().to_vec()));
    }

    /// The owner still learns of changes, late, when it next reads.
    fn not_permitted(&self, e: &redis::RedisError) {
        log::warn!(
            "fencelock: may not subscribe to {:?}, so changes are heard late (the ACL user \
             needs the channel pattern '&<namespace>:leader:*'): {e}",
            self.channel
        );
    }

    fn name(&self) -> String {
        format!("watch on {:?}", self.channel)
    }
}
