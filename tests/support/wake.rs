//! Wake-ups on a Redis Cluster: clients, and where their waiters' shard subscriptions stand.

use std::collections::HashSet;
use std::time::Duration;

use fencelock::{LockClient, Topology};

use super::cluster::ClusterSet;
use super::{ms, poll_until};

pub const NAMESPACE: &str = "wake";

/// A waiter that hears nothing attempts again this long after it was refused at the latest (a
/// handoff's lease), so a wake-up sooner than this was heard.
pub const UNHEARD: Duration = Duration::from_secs(5);

pub fn client(seeds: Vec<String>) -> LockClient {
    LockClient::builder(Topology::cluster(seeds))
        .namespace(NAMESPACE)
        // Long enough that nothing expires on its own within a test.
        .lease(Duration::from_secs(30))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

pub fn lock_key(key: &str) -> String {
    format!("{NAMESPACE}:lock:{{{key}}}")
}

/// The shard channels with a subscriber on node `i`.
pub fn shard_channels_on(set: &ClusterSet, i: usize) -> HashSet<String> {
    let mut con = set.connection(i);
    redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{NAMESPACE}:released:*"))
        .query(&mut con)
        .unwrap()
}

/// Whether a subscription for `key` stands on the node at `port`.
pub fn subscribed_on(set: &ClusterSet, key: &str, port: u16) -> bool {
    shard_channels_on(set, set.index_of_port(port))
        .iter()
        .any(|c| c.contains(&format!("{{{key}}}")))
}

/// Every node's shard channels, for messages.
pub fn all_channels(set: &ClusterSet) -> String {
    format!(
        "{:?}",
        (0..set.node_ports().len())
            .map(|i| (set.port_of(i), shard_channels_on(set, i)))
            .collect::<Vec<_>>()
    )
}

/// Waits until a subscription for `key` stands on the master at `port`, whatever else stands.
pub fn await_subscription_of(set: &ClusterSet, key: &str, port: u16, within: Duration) {
    let found = poll_until(within, ms(5), || {
        if subscribed_on(set, key, port) {
            Ok(())
        } else {
            Err(all_channels(set))
        }
    });
    if let Err(channels) = found {
        panic!("no subscription for {key:?} on {port} within {within:?}: {channels}");
    }
}

/// Waits until `n` waiters stand in `key`'s queue on its master (they attempted, were refused,
/// and wait for a wake-up).
pub fn await_queued(set: &ClusterSet, key: &str, n: u64, within: Duration) {
    let master = set.index_of_port(set.master_of_slot(ClusterSet::slot_of(&lock_key(key))));
    let found = poll_until(within, ms(5), || {
        let queued: u64 = redis::cmd("LLEN")
            .arg(format!("{NAMESPACE}:queue:{{{key}}}"))
            .query(&mut set.connection(master))
            .map_err(|e| e.to_string())?;
        if queued == n {
            Ok(())
        } else {
            Err(format!("{queued} queued"))
        }
    });
    if let Err(why) = found {
        panic!("{key:?}'s queue never held {n} waiter(s) within {within:?}: {why}");
    }
}
