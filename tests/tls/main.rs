//! TLS (`rediss://`, the `tls` feature) against real `redis-server`s serving certificates of a
//! private CA made at test time: locks, renewal and wake-ups work over it, and every way the
//! handshake can fail is reported at once as a configuration error, not as an outage.

#[path = "../support/mod.rs"]
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, FencedRedis, LockClient};
use support::tls::{Ca, ClientCerts, Leaf, TlsServer};
use support::{await_queue_len, lock_pttl, ms, NAMESPACE};

/// The connection timeout of the failing clients: a failure must come well before it.
const PATIENT: Duration = Duration::from_secs(10);
/// How soon a failed handshake must be reported.
const AT_ONCE: Duration = Duration::from_secs(3);

/// A client for `url` that trusts `ca` and shows `identity`, if given.
fn client(url: &str, ca: Option<&Ca>, identity: Option<&Leaf>, lease: Duration) -> LockClient {
    let mut builder = LockClient::builder(url)
        .namespace(NAMESPACE)
        .lease(lease)
        .connection_timeout(PATIENT);
    if let Some(ca) = ca {
        builder = builder.tls_root_certificates(ca.pem());
    }
    if let Some(id) = identity {
        builder = builder.tls_client_certificate(id.cert_pem.as_str(), id.key_pem.as_str());
    }
    builder.build().unwrap()
}

/// One attempt at a lock that must fail with `Error::Rejected` within [`AT_ONCE`]; its message.
fn rejected(client: &LockClient) -> String {
    support::rejected_at_once(client, "k", Duration::ZERO, AT_ONCE)
}

#[test]
fn locks_renew_and_hand_over_over_tls_with_a_private_ca() {
    let ca = Ca::new("fencelock test CA");
    let server = TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::Required);
    let identity = ca.client("fencelock test client");
    let url = server.tls_url("127.0.0.1");
    let mut plain = server.connection();

    // Renewal: a 300 ms lease held for 1.2 s stays held, renewed over TLS.
    let short = client(&url, Some(&ca), Some(&identity), ms(300));
    let renewed = short.lock("renewed").unwrap();
    thread::sleep(ms(1200));
    assert!(renewed.is_held());
    assert!(renewed.lost().try_recv().is_err(), "reported lost");
    let pttl = lock_pttl(&mut plain, "renewed");
    assert!(pttl > 0, "the lease in Redis ran out: PTTL {pttl}");
    renewed.unlock().unwrap();

    // A handoff to a waiter of another client, by its pub/sub connection over TLS: with a 30 s
    // lease nothing else would wake it in time. The waiter listens for longer than the
    // listener's 1 s heartbeat first, so its TLS connection has timed out reads and sent PINGs.
    let holder = client(&url, Some(&ca), Some(&identity), Duration::from_secs(30));
    let waiter = client(&url, Some(&ca), Some(&identity), Duration::from_secs(30));
    for round in 0..2 {
        let guard = holder.lock("handoff").unwrap();
        let (tx, rx) = mpsc::channel();
        let waiting = waiter.clone();
        let t = thread::spawn(move || {
            let got = waiting.lock("handoff").unwrap();
            tx.send((Instant::now(), got.token())).unwrap();
            got.unlock().unwrap();
        });
        await_queue_len(&mut plain, "handoff", 1);
        thread::sleep(ms(1500));
        let released = Instant::now();
        let first = guard.token();
        guard.unlock().unwrap();
        let (granted, token) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiter never woke");
        let latency = granted.duration_since(released);
        assert!(
            latency < Duration::from_secs(2),
            "round {round}: woke {latency:?} after the release"
        );
        assert!(token > first, "round {round}: {token} after {first}");
        t.join().unwrap();
    }

    // Fenced storage on its own TLS connections, and on the client's.
    let store = FencedRedis::builder(&url)
        .namespace(NAMESPACE)
        .tls_root_certificates(ca.pem())
        .tls_client_certificate(identity.cert_pem.as_str(), identity.key_pem.as_str())
        .build()
        .unwrap();
    let guard = holder.lock("doc").unwrap();
    store.set("doc", guard.token(), "v1").unwrap();
    assert_eq!(
        FencedRedis::from(&holder).get("doc").unwrap(),
        Some(b"v1".to_vec())
    );
    guard.unlock().unwrap();
}

#[test]
fn a_server_whose_certificate_is_not_trusted_is_rejected_at_once() {
    let ca = Ca::new("fencelock test CA");
    let server = TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::NotAsked);
    let url = server.tls_url("127.0.0.1");

    // The default roots do not hold a private CA.
    let message = rejected(&client(&url, None, None, Duration::from_secs(30)));
    assert!(message.contains("tls_root_certificates"), "{message}");
    assert!(message.contains("retrying will not help"), "{message}");

    // Nor does another CA.
    let other = Ca::new("another CA");
    let message = rejected(&client(&url, Some(&other), None, Duration::from_secs(30)));
    assert!(message.contains("tls_root_certificates"), "{message}");

    // The right CA, but a host the certificate does not name.
    let by_name = client(
        &server.tls_url("localhost"),
        Some(&ca),
        None,
        Duration::from_secs(30),
    );
    let message = rejected(&by_name);
    assert!(
        message.contains("does not name the URL's host"),
        "{message}"
    );

    // A store reports it the same way.
    let store = FencedRedis::builder(&url)
        .connection_timeout(PATIENT)
        .tls_root_certificates(other.pem())
        .build()
        .unwrap();
    let started = Instant::now();
    let err = store.get("doc").unwrap_err();
    assert!(err.is_rejected(), "{err:?}");
    assert!(started.elapsed() < AT_ONCE);

    // The same client settings work against the name the certificate carries.
    let good = client(&url, Some(&ca), None, Duration::from_secs(30));
    good.lock("k").unwrap().unlock().unwrap();
}

#[test]
fn an_expired_server_certificate_is_rejected_at_once() {
    let ca = Ca::new("fencelock test CA");
    let server = TlsServer::start(
        &ca,
        &ca.expired_server(&["127.0.0.1"]),
        ClientCerts::NotAsked,
    );
    let message = rejected(&client(
        &server.tls_url("127.0.0.1"),
        Some(&ca),
        None,
        Duration::from_secs(30),
    ));
    assert!(message.contains("validity period"), "{message}");
}

#[test]
fn a_server_that_wants_a_client_certificate_rejects_clients_without_a_trusted_one() {
    let ca = Ca::new("fencelock test CA");
    let server = TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::Required);
    let url = server.tls_url("127.0.0.1");

    let message = rejected(&client(&url, Some(&ca), None, Duration::from_secs(30)));
    assert!(message.contains("tls_client_certificate"), "{message}");

    let stranger = Ca::new("another CA").client("stranger");
    let message = rejected(&client(
        &url,
        Some(&ca),
        Some(&stranger),
        Duration::from_secs(30),
    ));
    assert!(message.contains("tls_client_certificate"), "{message}");

    let member = ca.client("member");
    let good = client(&url, Some(&ca), Some(&member), Duration::from_secs(30));
    good.lock("k").unwrap().unlock().unwrap();
}

#[test]
fn tls_and_plain_ports_mixed_up_fail_within_the_connection_timeout() {
    let ca = Ca::new("fencelock test CA");
    let server = TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::NotAsked);
    let timeout = ms(1000);

    // rediss:// to the plain port: Redis takes the ClientHello for the start of a command and
    // waits for the rest, so the handshake gets no answer: the connection timeout ends it.
    let tls = LockClient::builder(format!("rediss://127.0.0.1:{}/", server.port()))
        .tls_root_certificates(ca.pem())
        .connection_timeout(timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = tls.try_lock("k", Duration::ZERO).unwrap_err();
    let took = started.elapsed();
    assert!(err.is_connection(), "{err:?}");
    assert!(took < timeout + AT_ONCE, "{took:?}: {err}");

    // redis:// to the TLS port: the server closes a connection that does not start with a TLS
    // handshake. The client cannot tell that from a dropped connection, but it is told at once.
    let plain = LockClient::builder(format!("redis://127.0.0.1:{}/", server.tls_port()))
        .connection_timeout(PATIENT)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = plain.try_lock("k", Duration::ZERO).unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    assert!(started.elapsed() < AT_ONCE, "{:?}", started.elapsed());
}

#[test]
fn bad_tls_settings_are_rejected_by_build() {
    let ca = Ca::new("fencelock test CA");
    let id = ca.client("client");
    let other = ca.client("other");
    let url = "rediss://127.0.0.1:6380/";
    let invalid = |result: Result<LockClient, Error>, what: &str, says: &str| match result {
        Err(Error::InvalidArgument { what: w, reason }) => {
            assert_eq!(w, what, "{reason}");
            assert!(reason.contains(says), "{what}: {reason}");
            assert!(!reason.contains("PRIVATE KEY"), "{reason}");
        }
        other => panic!("expected invalid {what}, got {other:?}"),
    };
    let b = || LockClient::builder(url);

    invalid(
        b().tls_root_certificates("").build(),
        "TLS root certificates",
        "no CERTIFICATE",
    );
    invalid(
        b().tls_root_certificates("/etc/redis/ca.crt").build(),
        "TLS root certificates",
        "not its path",
    );
    invalid(
        b().tls_root_certificates(id.key_pem.as_str()).build(),
        "TLS root certificates",
        "no CERTIFICATE",
    );
    invalid(
        b().tls_client_certificate("", id.key_pem.as_str()).build(),
        "TLS client certificate",
        "no CERTIFICATE",
    );
    invalid(
        b().tls_client_certificate(id.cert_pem.as_str(), "").build(),
        "TLS client key",
        "private key",
    );
    invalid(
        b().tls_client_certificate(id.cert_pem.as_str(), other.key_pem.as_str())
            .build(),
        "TLS client certificate",
        "private key",
    );
    // Certificates for a URL that would not use them: refused, not ignored.
    invalid(
        LockClient::builder("redis://127.0.0.1:6379/")
            .tls_root_certificates(ca.pem())
            .build(),
        "url",
        "not a rediss:// URL",
    );
    // Certificate checks cannot be turned off.
    invalid(
        LockClient::builder("rediss://127.0.0.1:6380/#insecure").build(),
        "url",
        "cannot be turned off",
    );
    invalid(
        LockClient::builder("rediss://bad..name:6380/").build(),
        "url",
        "cannot be checked against a certificate",
    );
    let store = FencedRedis::builder("redis://127.0.0.1:6379/")
        .tls_client_certificate(id.cert_pem.as_str(), id.key_pem.as_str())
        .build()
        .unwrap_err();
    assert!(store.is_invalid_argument(), "{store:?}");

    // Good settings build without touching the network; the key never shows in Debug.
    let builder = b()
        .tls_root_certificates(ca.pem())
        .tls_client_certificate(id.cert_pem.as_str(), id.key_pem.as_str());
    let shown = format!("{builder:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    builder.build().unwrap();
    LockClient::builder("rediss://[::1]:6380/0")
        .build()
        .unwrap();
    LockClient::builder("rediss://user:secret@redis.example.com/")
        .build()
        .unwrap();
}

/// A quorum of three masters over TLS (`rediss://` each, one set of TLS settings): a lock is
/// granted by a majority, renewed, and a waiter of another client subscribes over TLS and gets
/// the lock soon after the release.
#[test]
fn a_quorum_of_masters_locks_renews_and_wakes_over_tls() {
    let ca = Ca::new("fencelock test CA");
    let servers: Vec<TlsServer> = (0..3)
        .map(|_| TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::NotAsked))
        .collect();
    let urls: Vec<String> = servers.iter().map(|s| s.tls_url("127.0.0.1")).collect();
    let quorum = |lease: Duration| {
        LockClient::builder(fencelock::Topology::quorum(urls.clone()))
            .namespace(NAMESPACE)
            .lease(lease)
            .connection_timeout(PATIENT)
            .tls_root_certificates(ca.pem())
            .build()
            .unwrap()
    };
    let short = quorum(ms(300));
    let renewed = short.lock("renewed").unwrap();
    thread::sleep(ms(1200));
    assert!(
        renewed.is_held(),
        "a 300 ms lease held 1.2 s over TLS was lost"
    );
    let held_on = servers
        .iter()
        .filter(|s| lock_pttl(&mut s.connection(), "renewed") > 0)
        .count();
    assert!(held_on >= 2, "held on {held_on} of 3 masters");
    renewed.unlock().unwrap();

    // With a 30 s lease only the release message wakes the waiter within the bound below.
    let holder = quorum(ms(30_000));
    let waiter = quorum(ms(30_000));
    let guard = holder.lock("woken").unwrap();
    let (tx, rx) = mpsc::channel();
    let waiting = thread::spawn(move || {
        let got = waiter.lock("woken").map(|g| (g.token(), Instant::now()));
        tx.send(()).unwrap();
        got
    });
    // Past the refusal and its subscription, and past the first timers (20 ms, doubling).
    thread::sleep(ms(1500));
    assert!(rx.try_recv().is_err(), "the waiter got a held lock");
    // The waiter's pattern subscriptions stand, over TLS, on every master.
    for server in &servers {
        let patterns: i64 = redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(
            patterns, 1,
            "the waiter's subscription is missing on a master"
        );
    }
    let released = Instant::now();
    let token = guard.token();
    guard.unlock().unwrap();
    let (next, granted) = waiting.join().unwrap().unwrap();
    assert!(next > token);
    let took = granted.duration_since(released);
    assert!(took < ms(900), "the waiter took {took:?} after the release");
}
