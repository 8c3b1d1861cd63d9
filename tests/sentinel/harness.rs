//! The Sentinel test set-up itself works: a forced failover promotes the replica and demotes the
//! old master, a SIGSTOPped master is failed over and rejoins as a replica once resumed, and the
//! master's address is still answered with two of three sentinels gone. Plain redis-rs only.
//!
//! Each test prints how long its switch took
//! (`cargo test --test sentinel -- harness:: --nocapture`).

use std::time::{Duration, Instant};

use crate::support::sentinel::SentinelSet;

/// How long a demoted or resumed old master may take to become a synced replica: Sentinel
/// reconfigures it on its 10 s INFO period, 8 s after it last saw the role change.
const SETTLE: Duration = Duration::from_secs(40);

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

fn set(con: &mut redis::Connection, key: &str, value: &str) {
    let () = redis::cmd("SET").arg(key).arg(value).query(con).unwrap();
}

/// `WAIT replicas 5000` on `con`: how many replicas acknowledged the writes so far.
fn wait_acks(con: &mut redis::Connection, replicas: usize) -> usize {
    redis::cmd("WAIT")
        .arg(replicas)
        .arg(5000)
        .query(con)
        .unwrap()
}

/// `(role, master_port)` from the server's `INFO replication`.
fn role(con: &mut redis::Connection) -> (String, Option<u16>) {
    let info: String = redis::cmd("INFO").arg("replication").query(con).unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
    (
        field("role").unwrap_or_default(),
        field("master_port").and_then(|p| p.parse().ok()),
    )
}

#[test]
fn forced_failover_promotes_the_replica_and_demotes_the_old_master() {
    let sentinels = SentinelSet::start(1);
    assert_eq!(sentinels.master_index(), 0);
    let (old, replica) = (&sentinels.servers()[0], &sentinels.servers()[1]);

    let mut master = old.connection();
    set(&mut master, "before", "failover");
    assert_eq!(
        wait_acks(&mut master, 1),
        1,
        "the replica never acknowledged"
    );
    assert_eq!(
        get(&mut replica.connection(), "before").as_deref(),
        Some("failover")
    );

    let started = Instant::now();
    let new_port = sentinels.failover();
    println!("forced failover: new address after {:?}", started.elapsed());
    assert_eq!(
        new_port,
        replica.port(),
        "the only replica was not promoted"
    );
    assert_eq!(sentinels.master_index(), 1);
    let mut new_master = replica.connection();
    assert_eq!(get(&mut new_master, "before").as_deref(), Some("failover"));

    let demoting = Instant::now();
    sentinels.wait_settled(SETTLE);
    println!(
        "forced failover: old master a synced replica after {:?} more",
        demoting.elapsed()
    );
    assert_eq!(
        role(&mut old.connection()),
        ("slave".to_string(), Some(new_port))
    );
    set(&mut new_master, "after", "failover");
    assert_eq!(wait_acks(&mut new_master, 1), 1);
    assert_eq!(
        get(&mut old.connection(), "after").as_deref(),
        Some("failover")
    );
}

#[test]
fn a_stopped_master_is_failed_over_and_rejoins_as_a_replica() {
    let sentinels = SentinelSet::start(2);
    let old_port = sentinels.master_port();
    let old = &sentinels.servers()[sentinels.server_by_port(old_port)];

    old.pause();
    let stopped = Instant::now();
    let new_port = sentinels.wait_for_switch(old_port, Duration::from_secs(15));
    println!("SIGSTOP master: new address after {:?}", stopped.elapsed());
    assert_ne!(
        sentinels.server_by_port(new_port),
        sentinels.server_by_port(old_port)
    );
    old.resume();

    let resumed = Instant::now();
    sentinels.wait_settled(SETTLE);
    println!(
        "SIGSTOP master: rejoined as a synced replica {:?} after SIGCONT",
        resumed.elapsed()
    );
    assert_eq!(
        role(&mut old.connection()),
        ("slave".to_string(), Some(new_port))
    );
    let mut new_master = sentinels.servers()[sentinels.master_index()].connection();
    set(&mut new_master, "after", "pause");
    assert_eq!(wait_acks(&mut new_master, 2), 2);
}

#[test]
fn the_master_address_survives_losing_two_of_three_sentinels() {
    let mut sentinels = SentinelSet::start(1);
    let master = sentinels.servers()[0].port();

    sentinels.pause_sentinel(0);
    assert_eq!(
        sentinels.master_port(),
        master,
        "asked with sentinel 0 stopped"
    );
    sentinels.resume_sentinel(0);

    sentinels.kill_sentinel(0);
    sentinels.kill_sentinel(1);
    assert_eq!(
        sentinels.master_port(),
        master,
        "asked with sentinels 0 and 1 killed"
    );
    assert_eq!(sentinels.sentinel_ports().len(), 3);
    assert_eq!(
        sentinels.sentinel_urls()[2],
        format!("redis://127.0.0.1:{}/", sentinels.sentinel_ports()[2])
    );
    let mut con = sentinels.servers()[0].connection();
    set(&mut con, "still", "serving");
    assert_eq!(get(&mut con, "still").as_deref(), Some("serving"));
}
