//! Sentinel with credentials and TLS, against real processes: data servers that want a password
//! or an ACL user, sentinels that want a password of their own, and (the `tls` feature) data
//! servers and sentinels that speak TLS only. Each way of giving the credentials (on the
//! `Topology`, in the URL form) takes and releases a lock on the real master, with its tokens
//! rising; wrong credentials fail at once, with an error that says what was refused; and a
//! client follows a failover with the passwords on.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, FencedRedis, FencingToken, LockClient, LockGuard, Topology};

use crate::support;
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::{lock_exists, ms, NAMESPACE};

const DATA_PASSWORD: &str = "data-secret";
const SENTINEL_PASSWORD: &str = "sentinel-secret";

/// The connection timeout of every client: a set-up error must come well before it.
const PATIENT: Duration = Duration::from_secs(5);
/// How soon a set-up error must be reported.
const AT_ONCE: Duration = Duration::from_secs(2);
/// How long a client may take to grant again after the sentinels named a new master.
const FOLLOW: Duration = Duration::from_secs(15);

fn client(topology: impl Into<Topology>) -> LockClient {
    LockClient::builder(topology)
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(10))
        .connection_timeout(PATIENT)
        .response_timeout(ms(2000))
        .build()
        .unwrap()
}

/// Locks `key` with `client`, checks that the lock is on the master the sentinels name now
/// (read there with the test's own credentials) and that its token is above `after`, then
/// unlocks it and checks that it is gone. Returns the token.
fn lock_on_master(
    set: &SentinelSet,
    client: &LockClient,
    key: &str,
    after: Option<FencingToken>,
) -> FencingToken {
    let guard = client
        .lock(key)
        .unwrap_or_else(|e| panic!("lock {key:?}: {e}\n{}", set.logs()));
    assert!(guard.is_held());
    unlock_on_master(set, guard, key, after)
}

/// [`lock_on_master`] for a guard already taken.
fn unlock_on_master(
    set: &SentinelSet,
    guard: LockGuard,
    key: &str,
    after: Option<FencingToken>,
) -> FencingToken {
    let token = guard.token();
    if let Some(after) = after {
        assert!(token > after, "token {token} after {after}");
    }
    let mut master = set.servers()[set.master_index()].connection();
    assert!(
        lock_exists(&mut master, key),
        "{key:?} is locked, but not on the master"
    );
    guard.unlock().unwrap();
    assert!(!lock_exists(&mut master, key), "{key:?} still locked");
    token
}

/// One attempt at a lock that must fail with `Error::Rejected`, at once: a set-up error, not
/// retried for the call's 5 s as an outage would be. Its message.
fn rejected(client: &LockClient) -> String {
    support::rejected_at_once(client, "refused", PATIENT, AT_ONCE)
}

/// Whether `message` says that a password was refused (redis-rs reports `WRONGPASS` as
/// "Password authentication failed").
fn says_authentication(message: &str) -> bool {
    message.contains("WRONGPASS") || message.contains("authentication failed")
}

/// [`rejected`] for the master's refusal of the data nodes' credentials: the message says so
/// (`NOAUTH` when `noauth`, else a failed authentication), and neither blames the sentinels, which
/// named the master, nor shows the wrong password.
fn master_refused(client: &LockClient, noauth: bool) {
    let message = rejected(client);
    if noauth {
        assert!(message.contains("NOAUTH"), "{message}");
    } else {
        assert!(says_authentication(&message), "{message}");
    }
    assert!(
        !message.contains("sentinel"),
        "blames the sentinels: {message}"
    );
    assert!(
        !message.contains("nope"),
        "the password is shown: {message}"
    );
}

/// `SENTINEL FAILOVER`, then `key` locked and unlocked by each client on the new master, with
/// a token above `after`: the clients follow the master, logging in to the sentinels and to
/// the new master with their credentials.
fn failover_and_follow(
    set: &SentinelSet,
    clients: &[&LockClient],
    key: &str,
    after: FencingToken,
) -> FencingToken {
    let old = set.master_port();
    let new = set.failover();
    assert_ne!(old, new);
    let mut last = after;
    for client in clients {
        let guard = lock_on(set, client, key, new, FOLLOW);
        last = unlock_on_master(set, guard, key, Some(last));
    }
    last
}

/// `key` locked by `client` on the master at `port` within `timeout` (at most 100 attempts),
/// through the errors of a master that is moving. Until the client hears of the failover
/// (its watcher asks twice a second) it may still grant on the old master, which takes writes
/// until Sentinel demotes it (about 10 s): such a grant is released and tried again.
fn lock_on(
    set: &SentinelSet,
    client: &LockClient,
    key: &str,
    port: u16,
    timeout: Duration,
) -> LockGuard {
    let deadline = Instant::now() + timeout;
    let mut master = set.servers()[set.server_by_port(port)].connection();
    let mut misses = Vec::new();
    for _ in 0..100 {
        match client.try_lock(key, ms(500)) {
            Ok(Some(guard)) if lock_exists(&mut master, key) => return guard,
            Ok(Some(guard)) => {
                misses.push(format!("granted {} elsewhere", guard.token()));
                let _ = guard.unlock();
            }
            Ok(None) => misses.push("not granted within 500 ms".to_owned()),
            Err(e @ (Error::Connection(_) | Error::Timeout(_))) => misses.push(e.to_string()),
            Err(e) => panic!("lock {key:?} after the failover: {e}\n{}", set.logs()),
        }
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(ms(100));
    }
    panic!(
        "no grant of {key:?} on the new master {port} within {timeout:?}: {misses:#?}\n{}",
        set.logs()
    )
}

#[test]
fn a_data_password_on_the_topology_in_the_url_and_for_fenced_writes() {
    let set = SentinelSet::builder()
        .replicas(1)
        .data_password(DATA_PASSWORD)
        .start();
    let by_topology =
        client(Topology::sentinel(set.sentinel_urls(), MASTER_NAME).master_password(DATA_PASSWORD));
    let first = lock_on_master(&set, &by_topology, "a", None);
    let url = format!(
        "redis+sentinel://:{DATA_PASSWORD}@{}/{MASTER_NAME}",
        set.sentinel_hosts()
    );
    let by_url = client(url.as_str());
    let second = lock_on_master(&set, &by_url, "a", Some(first));
    // One master for both: a guard of one keeps the other out.
    let guard = by_url.lock("shared").unwrap();
    assert!(by_topology.try_lock("shared", ms(100)).unwrap().is_none());
    unlock_on_master(&set, guard, "shared", Some(second));

    // A fenced store opened on the topology writes there, and refuses an older token.
    let locks = LockClient::builder(url.as_str()).build().unwrap();
    let store = FencedRedis::open(
        Topology::sentinel(set.sentinel_urls(), MASTER_NAME).master_password(DATA_PASSWORD),
    )
    .unwrap();
    let old = locks.lock("report").unwrap();
    let old_token = old.token();
    old.unlock().unwrap();
    let new = locks.lock("report").unwrap();
    store.set("report", new.token(), "new").unwrap();
    let stale = store.set("report", old_token, "old").unwrap_err();
    assert!(stale.is_stale_token(), "{stale}");
    assert_eq!(store.get("report").unwrap().as_deref(), Some(&b"new"[..]));
    new.unlock().unwrap();

    // A wrong password, or none, is the data node's refusal, not "no sentinel answered".
    let wrong =
        client(Topology::sentinel(set.sentinel_urls(), MASTER_NAME).master_password("nope"));
    master_refused(&wrong, false);
    let none = client(Topology::sentinel(set.sentinel_urls(), MASTER_NAME));
    master_refused(&none, true);
}

#[test]
fn an_acl_user_on_the_data_nodes() {
    let set = SentinelSet::builder()
        .data_user("locker")
        .data_password(DATA_PASSWORD)
        .start();
    let by_topology = client(
        Topology::sentinel(set.sentinel_urls(), MASTER_NAME)
            .master_username("locker")
            .master_password(DATA_PASSWORD),
    );
    let first = lock_on_master(&set, &by_topology, "a", None);
    let by_url = client(format!(
        "redis+sentinel://locker:{DATA_PASSWORD}@{}/{MASTER_NAME}",
        set.sentinel_hosts()
    ));
    lock_on_master(&set, &by_url, "a", Some(first));
    // The password without its user is the `default` user's, which is off.
    let no_user =
        client(Topology::sentinel(set.sentinel_urls(), MASTER_NAME).master_password(DATA_PASSWORD));
    master_refused(&no_user, false);
    let other_user = client(
        Topology::sentinel(set.sentinel_urls(), MASTER_NAME)
            .master_username("someone")
            .master_password(DATA_PASSWORD),
    );
    master_refused(&other_user, false);
}

#[test]
fn a_sentinel_password_apart_from_the_data_password_and_a_failover() {
    let set = SentinelSet::builder()
        .replicas(1)
        .data_password(DATA_PASSWORD)
        .sentinel_password(SENTINEL_PASSWORD)
        .start();
    let hosts = set.sentinel_hosts();
    let by_url = client(format!(
        "redis+sentinel://:{DATA_PASSWORD}@{hosts}/{MASTER_NAME}\
         ?sentinel_password={SENTINEL_PASSWORD}"
    ));
    let first = lock_on_master(&set, &by_url, "a", None);
    // By hand: each sentinel's URL carries its own password.
    let with_password = |password: &str| -> Vec<String> {
        set.sentinel_ports()
            .iter()
            .map(|port| format!("redis://:{password}@127.0.0.1:{port}/"))
            .collect()
    };
    let by_topology = client(
        Topology::sentinel(with_password(SENTINEL_PASSWORD), MASTER_NAME)
            .master_password(DATA_PASSWORD),
    );
    let second = lock_on_master(&set, &by_topology, "a", Some(first));

    // The sentinels' password wrong, missing, or the data nodes' given to them: refused by
    // every sentinel, and the message names each.
    let wrong = client(
        Topology::sentinel(with_password("nope"), MASTER_NAME).master_password(DATA_PASSWORD),
    );
    let missing =
        client(Topology::sentinel(set.sentinel_urls(), MASTER_NAME).master_password(DATA_PASSWORD));
    let swapped = client(format!(
        "redis+sentinel://:{DATA_PASSWORD}@{hosts}/{MASTER_NAME}?sentinel_password={DATA_PASSWORD}"
    ));
    for (what, refused) in [
        ("wrong", &wrong),
        ("missing", &missing),
        ("the data nodes'", &swapped),
    ] {
        let message = rejected(refused);
        assert!(
            message.contains("no sentinel named the master"),
            "{what}: {message}"
        );
        if what == "missing" {
            assert!(message.contains("NOAUTH"), "{what}: {message}");
            assert!(!message.contains("Incompatible type"), "{what}: {message}");
        } else {
            assert!(says_authentication(&message), "{what}: {message}");
        }
        for port in set.sentinel_ports() {
            assert!(
                message.contains(&format!("127.0.0.1:{port}")),
                "{what}: sentinel {port} not named: {message}"
            );
        }
        assert!(
            !message.contains("nope"),
            "the password is shown: {message}"
        );
    }
    // The data nodes' password wrong, the sentinels' right: the master's refusal.
    let wrong_data = client(format!(
        "redis+sentinel://:nope@{hosts}/{MASTER_NAME}?sentinel_password={SENTINEL_PASSWORD}"
    ));
    master_refused(&wrong_data, false);

    // Both clients follow a failover, logging in to the new master and the sentinels.
    failover_and_follow(&set, &[&by_url, &by_topology], "a", second);
}

#[cfg(feature = "tls")]
#[test]
fn tls_only_sentinels_and_data_nodes_with_passwords_and_a_failover() {
    let set = SentinelSet::builder()
        .replicas(1)
        .data_password(DATA_PASSWORD)
        .sentinel_password(SENTINEL_PASSWORD)
        .tls()
        .start();
    let url = format!(
        "rediss+sentinel://:{DATA_PASSWORD}@{}/{MASTER_NAME}?sentinel_password={SENTINEL_PASSWORD}",
        set.sentinel_hosts()
    );
    let tls_client = |topology: Topology| {
        LockClient::builder(topology)
            .namespace(NAMESPACE)
            .lease(Duration::from_secs(10))
            .connection_timeout(PATIENT)
            .response_timeout(ms(2000))
            .tls_root_certificates(set.ca_pem())
            .build()
            .unwrap()
    };
    let by_url = tls_client(url.parse().unwrap());
    let first = lock_on_master(&set, &by_url, "a", None);
    let urls: Vec<String> = set
        .sentinel_ports()
        .iter()
        .map(|port| format!("rediss://:{SENTINEL_PASSWORD}@127.0.0.1:{port}/"))
        .collect();
    let by_topology =
        tls_client(Topology::sentinel(urls, MASTER_NAME).master_password(DATA_PASSWORD));
    let second = lock_on_master(&set, &by_topology, "a", Some(first));

    // Without the CA, the sentinels' certificates are not trusted: a TLS refusal, at once.
    let untrusting = client(url.as_str());
    let message = rejected(&untrusting);
    assert!(message.contains("invalid peer certificate"), "{message}");
    // Told as a TLS failure, with what to check, not as wrong credentials.
    assert!(message.contains("the TLS handshake failed"), "{message}");
    assert!(!message.contains("credentials"), "{message}");
    for port in set.sentinel_ports() {
        assert!(
            message.contains(&format!("127.0.0.1:{port}")),
            "sentinel {port} not named: {message}"
        );
    }
    // Plain TCP to TLS-only sentinels reaches none of them.
    let plain = client(format!(
        "redis+sentinel://:{DATA_PASSWORD}@{}/{MASTER_NAME}?sentinel_password={SENTINEL_PASSWORD}",
        set.sentinel_hosts()
    ));
    assert!(plain.try_lock("plain", ms(500)).is_err());

    failover_and_follow(&set, &[&by_url, &by_topology], "a", second);
}
