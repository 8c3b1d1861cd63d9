//! Redis Cluster under a partition: the master of the lock's slot, with one client, cut from the
//! other masters, the replicas and another client (network namespaces, as in `partition.rs`).
//!
//! Redis Cluster is built for this case: a master that cannot reach a majority of the masters
//! for the node timeout stops taking writes (`CLUSTERDOWN`), and the majority side promotes its
//! replica only after that timeout and an election. So the old holder's renewals are refused
//! before the new master exists, and its `is_held()` turns false before the other client can be
//! granted the lock there. The test records the history and has the checker judge it: no
//! overlap, tokens rise, and the old holder's late increment is refused by the fence. It also
//! reports the moments (the old holder's loss and the new grant, after the cut).

use std::thread;
use std::time::Duration;

use fencelock::FencedRedis;

use super::super::recorder::{monotonic_ns, Event, Type};
use super::super::support::cluster::ClusterSet;
use super::super::support::netns::{Network, NsRedis};
use super::super::support::{self, ms, NAMESPACE};
use super::{secs, Agent, History};

/// `cluster-node-timeout` of every node, in ms.
const NODE_TIMEOUT_MS: u64 = 1000;

fn cluster(node: &NsRedis, args: &[&str]) -> Result<String, String> {
    let mut cmd = redis::cmd("CLUSTER");
    for arg in args {
        cmd.arg(*arg);
    }
    let reply: redis::Value = cmd
        .query(&mut node.connection())
        .map_err(|e| format!("CLUSTER {}: {e}", args.join(" ")))?;
    Ok(match reply {
        redis::Value::SimpleString(s) => s,
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::Okay => "OK".to_owned(),
        other => format!("{other:?}"),
    })
}

/// `field:value` of `CLUSTER INFO` or `INFO replication`.
fn field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// What a Cluster partition run saw.
struct ClusterRun {
    verdict: super::Verdict,
    old_held_after_failover: bool,
    old_incr: String,
    /// The old holder's loss (`lost()` fired) and the new grant, ns after the cut.
    old_lost_after: Option<u64>,
    new_granted_after: u64,
    tokens: (u64, u64),
    _history: History,
}

/// Three masters `m0`..`m2` with a replica each (`r0`..`r2`) and m0 a second one (`r3`), node
/// timeout 1 s, m0 owning the slot of `k`; a `FencedRedis` store of its own. Client `old` takes `k` and increments; then
/// `m0` and `old` are cut from everyone else (the store excepted); `new` takes `k` once `r0`
/// took over, and increments; `old` increments again. `acks`: the clients' `min_replica_acks`.
fn run_cluster_partition(acks: Option<(u32, u64)>) -> ClusterRun {
    let lease = ms(600);
    let names = [
        "m0", "m1", "m2", "r0", "r1", "r2", "r3", "store", "old", "new",
    ];
    let network = Network::new(&names);
    let node = |n: &str| network.node(n);
    let timeout = NODE_TIMEOUT_MS.to_string();
    let args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &timeout,
        "--repl-diskless-sync-delay",
        "0",
    ];
    let servers: Vec<NsRedis> = names[..7]
        .iter()
        .map(|n| NsRedis::start(&network, node(n), &args))
        .collect();
    let (masters, replicas) = servers.split_at(3);
    // m0 owns the lock's slot: the slot ranges go round so that it gets the one holding it.
    let slot = usize::from(ClusterSet::slot_of("{k}"));
    let third = 16384 / 3;
    let first = (slot / third).min(2);
    for (i, master) in masters.iter().enumerate() {
        let range = (first + i) % 3;
        let (lo, hi) = (
            range * third,
            if range == 2 {
                16383
            } else {
                (range + 1) * third - 1
            },
        );
        cluster(master, &["SET-CONFIG-EPOCH", &(i + 1).to_string()]).expect("epoch");
        cluster(master, &["ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()]).expect("slots");
    }
    for (i, server) in servers.iter().enumerate().skip(1) {
        if i >= 3 {
            cluster(server, &["SET-CONFIG-EPOCH", &(i + 1).to_string()]).expect("epoch");
        }
        let port = NsRedis::PORT.to_string();
        cluster(&servers[0], &["MEET", &server.node().addr(), &port]).expect("MEET");
    }
    let settle = |what: &str, check: &dyn Fn() -> Result<(), String>| {
        support::poll_until(Duration::from_secs(30), ms(100), check)
            .unwrap_or_else(|why| panic!("{what}: {why}\n{}", servers[0].logs()));
    };
    settle("every node knows every other", &|| {
        for s in &servers {
            let info = cluster(s, &["INFO"])?;
            let known = field(&info, "cluster_known_nodes");
            if known != "7" {
                return Err(format!("{}: {known} known", s.node().name));
            }
        }
        Ok(())
    });
    // r3 is m0's second replica: the one that does not take over follows the one that does, so
    // that with replica acks the new master can be acknowledged.
    for (replica, master) in replicas.iter().zip(masters.iter().cycle()) {
        let id = cluster(master, &["MYID"]).expect("MYID");
        settle("CLUSTER REPLICATE", &|| {
            cluster(replica, &["REPLICATE", &id]).map(|_| ())
        });
    }
    settle("the cluster is ok and its replicas in sync", &|| {
        for s in &servers {
            let info = cluster(s, &["INFO"])?;
            if field(&info, "cluster_state") != "ok" {
                return Err(format!("{}: {info}", s.node().name));
            }
        }
        for r in replicas {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut r.connection())
                .map_err(|e| e.to_string())?;
            if field(&info, "master_link_status") != "up" {
                return Err(format!(
                    "{}: link {}",
                    r.node().name,
                    field(&info, "master_link_status")
                ));
            }
        }
        Ok(())
    });

    let store = NsRedis::start(&network, node("store"), &[]);
    let url = format!(
        "redis+cluster://{}",
        servers
            .iter()
            .map(NsRedis::host)
            .collect::<Vec<_>>()
            .join(",")
    );
    let history = History::new(if acks.is_some() {
        "cluster-acks"
    } else {
        "cluster-no-acks"
    });
    let read_counter = || {
        let url = store.url();
        let value = store.node().run(|| {
            FencedRedis::builder(url.as_str())
                .namespace(NAMESPACE)
                .build()
                .and_then(|s| s.get_i64("k"))
                .expect("the counter")
                .unwrap_or(0)
        });
        history.nemesis.invoke("test", "read", "k");
        history
            .nemesis
            .record(&Event::new("test", Type::Ok, "read", Some("k")).value(value));
    };
    read_counter();
    let mut more = vec![("FENCELOCK_AGENT_STORE_URL", store.url())];
    if let Some((n, wait)) = acks {
        more.push(("FENCELOCK_AGENT_ACKS", format!("{n}:{wait}")));
    }
    let spawn =
        |name: &str| Agent::spawn_with(&network, node(name), &url, lease, &history.dir, &more);
    let (mut old, mut new) = (spawn("old"), spawn("new"));

    let (first, _, line) = old.try_lock("k", ms(5000));
    let first = first.unwrap_or_else(|| panic!("old was not granted k: {line}"));
    let said = old.incr("k");
    assert!(said.starts_with("ok"), "old's first increment: {said}");
    thread::sleep(lease / 2);

    history.partition(
        "m0 and old from m1, m2, r0, r1, r2, r3, new",
        Duration::ZERO,
    );
    let cut_at = monotonic_ns();
    network.split(
        &[node("m0"), node("old")],
        &[
            node("m1"),
            node("m2"),
            node("r0"),
            node("r1"),
            node("r2"),
            node("r3"),
            node("new"),
        ],
    );
    // The replica takes over after the node timeout and an election: a few seconds.
    let (second, granted_at, line) = new.try_lock("k", Duration::from_secs(30));
    let second = second.unwrap_or_else(|| {
        panic!(
            "new was not granted k after the failover: {line}\n{}",
            replicas[0].logs()
        )
    });
    let said = new.incr("k");
    assert!(said.starts_with("ok"), "new's increment: {said}");
    let old_held_after_failover = old.is_held("k");
    let old_incr = old.incr("k");
    let old_lost_after = (!old_held_after_failover).then(|| {
        let (_, lost_at) = old.await_loss("k", Duration::from_secs(5));
        lost_at - cut_at
    });
    network.heal_all();
    history.healed();
    let _ = old.unlock("k");
    let released = new.unlock("k");
    assert_eq!(released, "ok", "new's unlock");
    drop((old, new));
    read_counter();

    ClusterRun {
        verdict: history.check(),
        old_held_after_failover,
        old_incr,
        old_lost_after,
        new_granted_after: granted_at - cut_at,
        tokens: (first, second),
        _history: history,
    }
}

fn report(run: &ClusterRun) {
    println!(
        "new granted {} after the cut; old lost k {} after it; old still held then: {}; old's \
         increment: {}; tokens {:?}",
        secs(run.new_granted_after, 0),
        run.old_lost_after
            .map_or("never".to_owned(), |t| secs(t, 0)),
        run.old_held_after_failover,
        run.old_incr,
        run.tokens
    );
}

/// Without replica acks the old master takes renewals until it sees itself in the minority
/// (about the node timeout), and they never reach the replica that takes over: how the old
/// holder's last deadline and the new grant fall is a race, which the history records. The
/// fence keeps the data either way.
#[test]
fn cluster_master_cut_from_the_others_without_replica_acks_the_fence_keeps_the_data() {
    let run = run_cluster_partition(None);
    report(&run);
    let v = &run.verdict;
    assert!(run.tokens.1 > run.tokens.0, "tokens {:?}", run.tokens);
    assert!(
        run.old_incr.starts_with("refused"),
        "old's increment: {}",
        run.old_incr
    );
    assert_eq!(v.count("lost_updates"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}

/// With `min_replica_acks(1)` a renewal the replica did not acknowledge does not count: the old
/// holder loses the lock within about a lease of the cut, before the replica takes over.
#[test]
fn cluster_master_cut_from_the_others_with_replica_acks_loses_the_lock_first() {
    let run = run_cluster_partition(Some((1, 150)));
    report(&run);
    let v = &run.verdict;
    assert_eq!(v.code, 0, "{}", v.output);
    assert!(!run.old_held_after_failover, "{}", v.output);
    assert!(run.tokens.1 > run.tokens.0, "tokens {:?}", run.tokens);
    let lost = run.old_lost_after.expect("old lost k");
    // Within about a lease of the cut (loose: two); without acks it takes the node timeout
    // and a lease more.
    assert!(
        lost <= 2 * 600_000_000,
        "old lost k {} after the cut (lease 600 ms)",
        secs(lost, 0)
    );
    assert!(
        lost <= run.new_granted_after,
        "old lost k {} after the cut, new was granted it {} after",
        secs(lost, 0),
        secs(run.new_granted_after, 0)
    );
}
