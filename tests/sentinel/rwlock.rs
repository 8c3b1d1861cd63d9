//! Read-write locks on Sentinel and replication: readers holding across a failover stay held and
//! keep a writer out on the new master, and tokens granted after it are larger; with replica
//! acknowledgement, a grant no replica acknowledged is never reported held.

use std::time::Duration;

use fencelock::{LockClient, Topology};

use crate::support::proxy::{Mode, Proxy};
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::{ms, poll_until, RedisServer, NAMESPACE};

fn client(set: &SentinelSet) -> LockClient {
    LockClient::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace("sentinel")
        .lease(ms(3000))
        .connection_timeout(ms(1000))
        .response_timeout(ms(1000))
        .build()
        .unwrap()
}

#[test]
fn readers_held_across_a_failover_stay_held_and_keep_a_writer_out() {
    let set = SentinelSet::start(1);
    let (a, b) = (client(&set), client(&set));
    let first = a.read_lock("config").unwrap();
    let second = b.read_lock("config").unwrap();
    let before = first.token().max(second.token());

    let old = set.master_port();
    let new = set.failover();
    assert_ne!(old, new);
    // Renewal follows the master: after a lease's worth on the new one, both still hold, and a
    // writer is kept out there.
    let writer = b.try_write_lock("config", ms(3500)).unwrap();
    assert!(
        writer.is_none(),
        "a writer beside two readers after the failover"
    );
    assert!(first.is_held() && second.is_held());

    first.unlock().unwrap();
    second.unlock().unwrap();
    let writer = a
        .try_write_lock("config", Duration::from_secs(5))
        .unwrap()
        .expect("the lock, once the readers left");
    assert!(writer.token() > before);
}

/// A master and a replica that replicates it through a fault proxy.
fn pair() -> (RedisServer, Proxy, RedisServer) {
    let master = RedisServer::start();
    let link = Proxy::start(master.port());
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &link.port().to_string(),
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let mut con = master.connection();
    poll_until(Duration::from_secs(10), ms(50), || {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if acked >= 1 {
            Ok(())
        } else {
            Err("the replica never caught up".to_owned())
        }
    })
    .unwrap();
    (master, link, replica)
}

#[test]
fn with_replica_acks_an_unreplicated_grant_is_never_reported_held() {
    let (master, link, _replica) = pair();
    let acked = LockClient::builder(master.url())
        .namespace(NAMESPACE)
        .lease(ms(30_000))
        .min_replica_acks(1, ms(1_000))
        .build()
        .unwrap();
    let plain = LockClient::builder(master.url())
        .namespace(NAMESPACE)
        .lease(ms(30_000))
        .build()
        .unwrap();
    acked.write_lock("acked").unwrap().unlock().unwrap();

    link.set_mode(Mode::Blackhole);
    let err = acked.try_write_lock("acked", Duration::ZERO).unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    let err = acked.read_lock("acked").unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    // The unacknowledged grants were given back, not left to expire.
    let w = plain.try_write_lock("acked", Duration::ZERO).unwrap();
    assert!(w.is_some(), "an unacknowledged grant was left behind");
}
