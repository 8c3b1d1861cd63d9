//! Fenced storage on Redis: writes with a token lower than one already accepted are refused and
//! change nothing; equal and higher tokens are applied.

use std::time::Duration;

use fencelock::{Error, FencedRedis, FencingToken};

use crate::support;
use crate::support::{lock_client, RedisServer, NAMESPACE};
use crate::takeover::{
    assert_never_decreasing, assert_only_late_writes_refused, run_writers, Takeover,
};

fn store(server: &RedisServer) -> FencedRedis {
    FencedRedis::open(server.url())
        .and_then(|store| store.with_namespace(NAMESPACE))
        .unwrap_or_else(|e| panic!("FencedRedis for {}: {e}", server.url()))
}

fn t(n: u64) -> FencingToken {
    FencingToken::from(n)
}

/// The tokens of a refused write: (the write's, the highest accepted).
fn refused(result: fencelock::Result<impl std::fmt::Debug>) -> (u64, u64) {
    match result {
        Err(Error::StaleToken { token, highest, .. }) => (token.as_u64(), highest.as_u64()),
        other => panic!("expected a stale-token refusal, got {other:?}"),
    }
}

fn text(store: &FencedRedis, resource: &str) -> Option<String> {
    store
        .get(resource)
        .unwrap()
        .map(|bytes| String::from_utf8(bytes).unwrap())
}

#[test]
fn equal_and_higher_tokens_are_applied_and_lower_ones_refused_with_both_tokens() {
    let server = RedisServer::start();
    let store = store(&server);

    assert_eq!(store.highest_token("doc").unwrap(), None);
    store.set("doc", t(5), "five").unwrap();
    store.set("doc", t(5), "five again").unwrap();
    assert_eq!(text(&store, "doc").as_deref(), Some("five again"));

    let err = store.set("doc", t(4), "four").unwrap_err();
    assert!(err.is_stale_token(), "{err:?}");
    assert_eq!(refused(Err::<(), _>(err)), (4, 5));
    assert_eq!(text(&store, "doc").as_deref(), Some("five again"));
    assert_eq!(store.highest_token("doc").unwrap(), Some(t(5)));

    store.set("doc", t(9), "nine").unwrap();
    assert_eq!(refused(store.set("doc", t(5), "five")), (5, 9));
    assert_eq!(text(&store, "doc").as_deref(), Some("nine"));
    assert_eq!(store.highest_token("doc").unwrap(), Some(t(9)));

    // Records are per resource.
    store.set("other", t(1), "one").unwrap();
    assert_eq!(store.highest_token("other").unwrap(), Some(t(1)));
}

#[test]
fn delete_keeps_the_accepted_token_so_a_stale_writer_cannot_write_again() {
    let server = RedisServer::start();
    let store = store(&server);

    store.set("session", t(3), "alive").unwrap();
    assert_eq!(refused(store.delete("session", t(2))), (2, 3));
    assert_eq!(text(&store, "session").as_deref(), Some("alive"));

    assert!(store.delete("session", t(4)).unwrap());
    assert_eq!(store.get("session").unwrap(), None);
    assert_eq!(store.highest_token("session").unwrap(), Some(t(4)));
    assert!(
        !store.delete("session", t(4)).unwrap(),
        "nothing left to delete"
    );

    assert_eq!(refused(store.set("session", t(3), "revived")), (3, 4));
    assert_eq!(store.get("session").unwrap(), None);
    store.set("session", t(4), "new").unwrap();
    assert_eq!(text(&store, "session").as_deref(), Some("new"));
}

#[test]
fn incr_by_applies_current_tokens_only_and_an_error_changes_nothing() {
    let server = RedisServer::start();
    let store = store(&server);

    assert_eq!(store.incr_by("stock", t(1), 10).unwrap(), 10);
    assert_eq!(store.incr_by("stock", t(1), -3).unwrap(), 7);
    assert_eq!(store.incr_by("stock", t(2), 1).unwrap(), 8);
    assert_eq!(refused(store.incr_by("stock", t(1), 100)), (1, 2));
    assert_eq!(text(&store, "stock").as_deref(), Some("8"));
    assert_eq!(store.get_i64("stock").unwrap(), Some(8));
    assert_eq!(store.get_i64("never-counted").unwrap(), None);

    // INCRBY fails before the token is recorded: a failed write must not fence anyone out.
    store.set("label", t(1), "not a number").unwrap();
    let err = store.incr_by("label", t(2), 1).unwrap_err();
    assert!(!err.is_stale_token() && err.is_redis(), "{err:?}");
    assert_eq!(store.highest_token("label").unwrap(), Some(t(1)));
    assert_eq!(text(&store, "label").as_deref(), Some("not a number"));
    // Read as a counter, a value that is not one is an error, not a number made up.
    let err = store.get_i64("label").unwrap_err();
    assert!(err.is_redis(), "{err:?}");

    // The whole i64 range reads back exactly (no detour through a double).
    for extreme in [i64::MIN, i64::MAX] {
        store.delete("edge", t(3)).unwrap();
        assert_eq!(store.incr_by("edge", t(3), extreme).unwrap(), extreme);
        assert_eq!(store.get_i64("edge").unwrap(), Some(extreme));
    }
    store.delete("edge", t(3)).unwrap();
    assert_eq!(store.get_i64("edge").unwrap(), None);
}

/// The value an increment returns is the value Redis stored, exactly, over the whole i64 range:
/// Lua numbers are doubles, so a value beyond 2^53 taken from INCRBY's reply inside the script
/// comes back rounded (i64::MAX even wraps to i64::MIN).
#[test]
fn incr_by_returns_the_stored_value_exactly_beyond_two_to_the_53() {
    let server = RedisServer::start();
    let store = store(&server);
    let two_53: i64 = 1 << 53;
    for (start, delta) in [
        (0, i64::MAX),
        (i64::MAX, -1),
        (two_53, 1),
        (two_53 - 1, 2),
        (-two_53, -1),
        (0, i64::MIN),
        (i64::MIN, 1),
        (two_53 - 2, 1),
    ] {
        store.delete("edge", t(1)).unwrap();
        if start != 0 {
            store.incr_by("edge", t(1), start).unwrap();
        }
        let returned = store.incr_by("edge", t(1), delta).unwrap();
        let stored: i64 = text(&store, "edge").unwrap().parse().unwrap();
        assert_eq!(
            (returned, stored),
            (start + delta, start + delta),
            "(returned, stored) after {start} + {delta}"
        );
    }
}

#[test]
fn a_claim_fences_out_older_writers_and_leaves_the_value() {
    let server = RedisServer::start();
    let store = store(&server);

    store.set("profile", t(1), "by 1").unwrap();
    store.claim("profile", t(2)).unwrap();
    assert_eq!(text(&store, "profile").as_deref(), Some("by 1"));
    assert_eq!(store.highest_token("profile").unwrap(), Some(t(2)));
    assert_eq!(refused(store.set("profile", t(1), "late 1")), (1, 2));
    assert_eq!(refused(store.claim("profile", t(1))), (1, 2));
    store.claim("profile", t(2)).unwrap();
    store.set("profile", t(2), "by 2").unwrap();
    assert_eq!(text(&store, "profile").as_deref(), Some("by 2"));

    store.claim("fresh", t(7)).unwrap();
    assert_eq!(store.get("fresh").unwrap(), None);
    assert_eq!(refused(store.incr_by("fresh", t(6), 1)), (6, 7));
}

#[test]
fn tokens_compare_exactly_beyond_two_to_the_53() {
    // As Lua numbers (doubles) 2^53 and 2^53 + 1 are equal, so a numeric comparison would
    // accept the lower one.
    let server = RedisServer::start();
    let store = store(&server);
    let big = 1u64 << 53;

    store.set("big", t(big + 1), "newer").unwrap();
    assert_eq!(refused(store.set("big", t(big), "older")), (big, big + 1));
    store.set("big", t(u64::MAX), "max").unwrap();
    assert_eq!(store.highest_token("big").unwrap(), Some(t(u64::MAX)));
    assert_eq!(
        refused(store.set("big", t(u64::MAX - 1), "x")),
        (u64::MAX - 1, u64::MAX)
    );
    assert_eq!(refused(store.set("big", t(99), "x")), (99, u64::MAX));
    assert_eq!(text(&store, "big").as_deref(), Some("max"));
}

#[test]
fn a_corrupt_accepted_token_record_refuses_every_write() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg("test:accepted:{doc}")
        .arg("12abc")
        .query(&mut con)
        .unwrap();

    let err = store.set("doc", t(99), "x").unwrap_err();
    assert!(err.is_redis() && !err.is_stale_token(), "{err:?}");
    assert_eq!(store.get("doc").unwrap(), None);
}

#[test]
fn keys_follow_the_documented_layout() {
    let server = RedisServer::start();
    let store = store(&server);
    store.set("a}b{c", t(5), "v").unwrap();

    let mut con = server.connection();
    let value: Option<String> = redis::cmd("GET")
        .arg("test:data:{a%7Db%7Bc}")
        .query(&mut con)
        .unwrap();
    let accepted: Option<String> = redis::cmd("GET")
        .arg("test:accepted:{a%7Db%7Bc}")
        .query(&mut con)
        .unwrap();
    assert_eq!(value.as_deref(), Some("v"));
    assert_eq!(accepted.as_deref(), Some("5"));

    let other = store.with_namespace("other").unwrap();
    assert_eq!(
        other.get("a}b{c").unwrap(),
        None,
        "namespaces must not share keys"
    );
}

#[test]
fn bad_input_is_rejected_before_any_network_call() {
    // Nothing listens on port 1: reaching the network would fail with a connection error.
    let store = FencedRedis::open("redis://127.0.0.1:1/").unwrap();
    let long = "r".repeat(fencelock::MAX_KEY_LEN + 1);
    for resource in ["", long.as_str()] {
        let errors = [
            store.set(resource, t(1), "v").unwrap_err(),
            store.get(resource).unwrap_err(),
            store.get_i64(resource).unwrap_err(),
            store.delete(resource, t(1)).unwrap_err(),
            store.incr_by(resource, t(1), 1).unwrap_err(),
            store.claim(resource, t(1)).unwrap_err(),
            store.highest_token(resource).unwrap_err(),
        ];
        for err in errors {
            assert!(
                matches!(
                    err,
                    Error::InvalidArgument {
                        what: "resource",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
    for namespace in ["", "a b", "a{b"] {
        assert!(store
            .with_namespace(namespace)
            .unwrap_err()
            .is_invalid_argument());
    }
    assert!(FencedRedis::open("nonsense://x")
        .unwrap_err()
        .is_invalid_argument());
    assert!(store.get("reachable?").unwrap_err().is_connection());
}

#[test]
fn after_a_redis_restart_reads_reconnect_and_a_write_reports_its_unknown_outcome() {
    let mut server = RedisServer::start();
    let store = store(&server);
    store.set("doc", t(1), "before").unwrap();

    server.restart(); // no persistence: the data is gone
    assert_eq!(
        store.get("doc").unwrap(),
        None,
        "a read is repeated on a fresh connection"
    );
    store.set("doc", t(2), "after").unwrap();

    server.restart();
    // The write went out on a connection made before the restart: it may or may not have been
    // applied, so it is reported, not repeated.
    let err = store.set("doc", t(3), "lost?").unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    store.set("doc", t(3), "again").unwrap();
    assert_eq!(text(&store, "doc").as_deref(), Some("again"));
}

#[test]
fn a_holder_frozen_past_its_lease_cannot_overwrite_the_next_holder() {
    let server = RedisServer::start();
    let store = store(&server);
    let takeover = Takeover::start(&server, "redis", "ledger", &[]);
    let (token_a, token_b) = (takeover.token_a, takeover.b.token());
    store.set("ledger", token_b, "by B").unwrap();

    let outcome = takeover.resume_a_and_write("by A");
    assert_eq!(
        outcome,
        format!(
            "rejected: stale fencing token {token_a} for \"ledger\": {token_b} was already accepted"
        ),
        "A's stale write went through"
    );
    assert_eq!(text(&store, "ledger").as_deref(), Some("by B"));
    assert_eq!(store.highest_token("ledger").unwrap(), Some(token_b));
}

/// What the store answered to one round of the many-writers test.
#[derive(Debug)]
struct Answers {
    /// The ledger's count after the increment, or the higher token that refused it.
    counted: Result<i64, u64>,
    /// The document's value this round set, if it was accepted.
    value: Option<String>,
}

#[test]
fn many_writers_never_see_an_older_token_accepted_after_a_newer_one() {
    let server = RedisServer::start();
    let clients = [lock_client(&server, 5_000), lock_client(&server, 5_000)];
    let store = store(&server);

    let writes = run_writers(
        &clients,
        "shared",
        vec![store.clone(); 8],
        |store, value, token| {
            // The ledger counts accepted increments; each one's count is the order in which Redis
            // applied it.
            let counted = match store.incr_by("ledger", token, 1) {
                Ok(count) => Ok(count),
                Err(Error::StaleToken { highest, .. }) => Err(highest.as_u64()),
                Err(e) => panic!("{e:?}"),
            };
            let value = match store.set("doc", token, value) {
                Ok(()) => Some(value.to_owned()),
                Err(e) if e.is_stale_token() => None,
                Err(e) => panic!("{e:?}"),
            };
            Answers { counted, value }
        },
    );

    let mut accepted: Vec<(i64, u64)> = writes
        .iter()
        .filter_map(|w| w.outcome.counted.ok().map(|count| (count, w.token)))
        .collect();
    accepted.sort();
    // Every accepted increment was applied exactly once, refused ones not at all.
    let counts: Vec<i64> = accepted.iter().map(|&(count, _)| count).collect();
    assert_eq!(counts, (1..=accepted.len() as i64).collect::<Vec<_>>());
    assert_eq!(
        store.get_i64("ledger").unwrap(),
        Some(accepted.len() as i64)
    );
    let history: Vec<u64> = accepted.iter().map(|&(_, token)| token).collect();
    assert_never_decreasing(&history);
    // Every refusal named a higher token that was accepted.
    for w in &writes {
        if let Err(highest) = w.outcome.counted {
            assert!(highest > w.token && history.contains(&highest), "{w:?}");
        }
    }
    assert_only_late_writes_refused(&writes, |answers| answers.counted.is_ok());
    assert_only_late_writes_refused(&writes, |answers| answers.value.is_some());

    // The document holds the value of the accepted write with the highest token.
    let last = writes
        .iter()
        .filter(|w| w.outcome.value.is_some())
        .max_by_key(|w| w.token)
        .expect("some document write was accepted");
    assert_eq!(text(&store, "doc"), last.outcome.value);
    assert_eq!(
        store
            .highest_token("doc")
            .unwrap()
            .map(FencingToken::as_u64),
        Some(last.token)
    );
}

#[test]
fn a_store_made_from_a_client_shares_its_connections_and_namespace() {
    let server = RedisServer::start();
    let client = fencelock::LockClient::builder(server.url())
        .namespace(NAMESPACE)
        .pool_size(1)
        .build()
        .unwrap();
    let store = FencedRedis::from(&client);
    assert_eq!(store.namespace(), NAMESPACE);
    let mut con = server.connection();

    let guard = client.lock("shared").unwrap();
    guard.unlock().unwrap();
    // The client's one pooled connection exists now; the store's writes and reads reuse it.
    let before = support::info_stat(&mut con, "total_connections_received");
    let guard = client.lock("shared").unwrap();
    store.set("shared", guard.token(), "v1").unwrap();
    assert_eq!(text(&store, "shared").as_deref(), Some("v1"));
    guard.unlock().unwrap();
    let after = support::info_stat(&mut con, "total_connections_received");
    assert_eq!(
        after, before,
        "the store opened connections of its own ({before} -> {after} received)"
    );

    // A store opened on its own makes its own connection, as the counter shows.
    let own = FencedRedis::builder(server.url())
        .namespace(NAMESPACE)
        .build()
        .unwrap();
    assert_eq!(text(&own, "shared").as_deref(), Some("v1"));
    assert!(support::info_stat(&mut con, "total_connections_received") > after);
}

#[test]
fn the_builder_validates_every_setting_and_its_store_works() {
    let server = RedisServer::start();
    let bad = [
        FencedRedis::builder(server.url()).pool_size(0).build(),
        FencedRedis::builder(server.url())
            .pool_size(100_000)
            .build(),
        FencedRedis::builder(server.url())
            .connection_timeout(Duration::ZERO)
            .build(),
        FencedRedis::builder(server.url())
            .response_timeout(Duration::from_secs(10 * 60 * 60))
            .build(),
        FencedRedis::builder(server.url())
            .namespace("no spaces")
            .build(),
        FencedRedis::builder("not a url").build(),
        FencedRedis::builder(server.url())
            .min_replica_acks(0, Duration::from_millis(100))
            .build(),
        FencedRedis::builder(server.url())
            .min_replica_acks(1, Duration::ZERO)
            .build(),
        // The WAIT shares the connection's reply budget: it must end within it.
        FencedRedis::builder(server.url())
            .response_timeout(Duration::from_secs(1))
            .min_replica_acks(1, Duration::from_secs(1))
            .build(),
    ];
    for result in bad {
        let err = result.unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
    }

    let store = FencedRedis::builder(server.url())
        .namespace(NAMESPACE)
        .pool_size(1)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    store.set("built", t(3), "x").unwrap();
    assert_eq!(refused(store.set("built", t(2), "y")), (2, 3));
    assert_eq!(text(&store, "built").as_deref(), Some("x"));
}

/// `(acked, required)` of a write reported not replicated; panics on any other outcome.
fn not_replicated(result: fencelock::Result<()>) -> (u32, u32) {
    match result {
        Err(Error::NotReplicated { acked, required }) => (acked, required),
        other => panic!("expected NotReplicated, got {other:?}"),
    }
}

/// On Sentinel, writes wait for the replica of whichever server is master: through a failover,
/// and with that replica frozen.
#[test]
fn on_sentinel_replica_acks_follow_the_master_through_a_failover() {
    use fencelock::Topology;
    use support::sentinel::{SentinelSet, MASTER_NAME};

    let set = SentinelSet::start(1);
    let store = FencedRedis::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .namespace(NAMESPACE)
        .min_replica_acks(1, support::ms(1_000))
        .build()
        .unwrap();
    store.set("doc", t(1), "one").unwrap();

    let new_master = set.failover();
    // The old master rejoins as the new one's replica after a while: until then, writes are
    // not replicated.
    support::poll_until(Duration::from_secs(30), support::ms(200), || {
        match store.set("doc", t(2), "two") {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_replicated() || e.is_connection() || e.is_timeout() => {
                Err(e.to_string())
            }
            Err(e) => panic!("{e:?}"),
        }
    })
    .unwrap_or_else(|why| panic!("no write acknowledged after the failover: {why}"));
    assert_eq!(refused(store.set("doc", t(1), "stale")), (1, 2));

    // The new master's replica (the old master) frozen: nothing acknowledges.
    let replica = set
        .servers()
        .iter()
        .find(|s| s.port() != new_master)
        .unwrap();
    replica.pause();
    let outcome = store.set("doc", t(3), "three");
    replica.resume();
    assert_eq!(not_replicated(outcome), (0, 1));
    let mut con = set.servers()[set.server_by_port(new_master)].connection();
    let on_master: Option<String> = redis::cmd("GET")
        .arg(format!("{NAMESPACE}:data:{{doc}}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(
        on_master.as_deref(),
        Some("three"),
        "not kept on the master"
    );
}

/// On Cluster, each write waits for a replica of the master of its resource's slot: a frozen
/// replica fails the writes of its master's slots only.
#[test]
fn on_cluster_replica_acks_are_counted_per_master() {
    use fencelock::Topology;
    use support::cluster::ClusterSet;

    let set = ClusterSet::start(2, 1);
    let store = FencedRedis::builder(Topology::cluster(set.seed_urls()))
        .namespace(NAMESPACE)
        .min_replica_acks(1, support::ms(1_000))
        .build()
        .unwrap();
    let master_of = |resource: &str| {
        set.master_of_slot(ClusterSet::slot_of(&format!(
            "{NAMESPACE}:data:{{{resource}}}"
        )))
    };
    let resources: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
    let a = resources[0].clone();
    let b = resources
        .iter()
        .find(|r| master_of(r) != master_of(&a))
        .expect("100 resources all on one master")
        .clone();
    // Both masters' replicas have caught up once a write is acknowledged.
    for r in [&a, &b] {
        support::poll_until(Duration::from_secs(20), support::ms(200), || {
            store.set(r, t(1), "one").map_err(|e| e.to_string())
        })
        .unwrap_or_else(|why| panic!("{r}: never acknowledged: {why}"));
    }

    let replica = set.index_of_port(set.replica_of(master_of(&a)));
    set.pause(replica);
    let on_a = store.set(&a, t(2), "two");
    let on_b = store.set(&b, t(2), "two");
    set.resume(replica);
    assert_eq!(not_replicated(on_a), (0, 1), "{a}");
    on_b.unwrap_or_else(|e| panic!("{b}, whose master's replica is up: {e:?}"));
    assert_eq!(
        text(&store, &a).as_deref(),
        Some("two"),
        "kept on the master"
    );
}
