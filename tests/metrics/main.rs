//! The metrics (feature `metrics`) count what happened, against a real redis-server.
//!
//! The renewal thread records from a thread of its own, so a thread-local recorder would miss
//! it: this binary installs one global recorder (and so is a binary of its own). Each test uses
//! a namespace of its own and reads only the series labelled with it, so the tests can run side
//! by side.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use support::{free_port, ms, RedisServer};

/// Series by name and labels (sorted).
type Series = (String, Vec<(String, String)>);

/// The recorder's values so far. A snapshot drains what it reads (counters back to 0, histograms
/// emptied), and every test takes snapshots, so each adds what it drained to one store that all
/// of them read.
struct Recorded {
    snapshotter: Snapshotter,
    counters: HashMap<Series, u64>,
    histograms: HashMap<Series, Vec<f64>>,
}

fn recorded() -> &'static Mutex<Recorded> {
    static RECORDED: OnceLock<Mutex<Recorded>> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        Mutex::new(Recorded {
            snapshotter,
            counters: HashMap::new(),
            histograms: HashMap::new(),
        })
    })
}

/// Installs the recorder; call before making a client, so that it describes its metrics there.
fn install() {
    let _ = recorded();
}

fn take_snapshot() -> std::sync::MutexGuard<'static, Recorded> {
    let mut recorded = recorded().lock().unwrap_or_else(|e| e.into_inner());
    for (key, _, _, value) in recorded.snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.name().to_owned(), labels);
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                *recorded.counters.entry(series).or_default() += n;
            }
            (MetricKind::Histogram, DebugValue::Histogram(values)) => recorded
                .histograms
                .entry(series)
                .or_default()
                .extend(values.into_iter().map(|v| v.into_inner())),
            _ => {}
        }
    }
    recorded
}

fn matches(series: &Series, name: &str, labels: &[(&str, &str)]) -> bool {
    series.0 == name
        && labels
            .iter()
            .all(|(k, v)| series.1.iter().any(|(sk, sv)| sk == k && sv == v))
}

/// The sum of the counters `name` that carry all of `labels`.
fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let recorded = take_snapshot();
    let sum = recorded
        .counters
        .iter()
        .filter(|(s, _)| matches(s, name, labels));
    sum.map(|(_, n)| n).sum()
}

/// Every sample of the histograms `name` that carry all of `labels`.
fn histogram(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let recorded = take_snapshot();
    let all = recorded
        .histograms
        .iter()
        .filter(|(s, _)| matches(s, name, labels));
    all.flat_map(|(_, v)| v.iter().copied()).collect()
}

/// Every series recorded with namespace `ns`, for failure messages.
fn everything(ns: &str) -> String {
    let recorded = take_snapshot();
    let mut lines: Vec<String> = recorded
        .counters
        .iter()
        .filter(|(s, _)| s.1.iter().any(|(k, v)| k == "namespace" && v == ns))
        .map(|(s, n)| format!("{} {:?} = {n}", s.0, s.1))
        .chain(
            recorded
                .histograms
                .iter()
                .filter(|(s, _)| s.1.iter().any(|(k, v)| k == "namespace" && v == ns))
                .map(|(s, v)| format!("{} {:?}: {} samples", s.0, s.1, v.len())),
        )
        .collect();
    lines.sort();
    lines.join("\n")
}

fn client(url: &str, ns: &str, lease: Duration) -> LockClient {
    install();
    LockClient::builder(url)
        .namespace(ns)
        .lease(lease)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|e| panic!("client for {url}: {e}"))
}

/// Polls (bounded: 10 s) until `key`'s queue in Redis holds `n` waiting clients.
fn await_queue_len(con: &mut redis::Connection, ns: &str, key: &str, n: u64) {
    let start = Instant::now();
    loop {
        let len: u64 = redis::cmd("LLEN")
            .arg(format!("{ns}:queue:{{{key}}}"))
            .query(con)
            .unwrap();
        if len == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the queue of {key:?} never held {n} waiters"
        );
        thread::sleep(ms(5));
    }
}

/// Polls (bounded: 10 s) until `counter(name, labels)` reaches `n`.
fn await_counter(name: &str, labels: &[(&str, &str)], n: u64) -> u64 {
    let start = Instant::now();
    loop {
        let got = counter(name, labels);
        if got >= n || start.elapsed() > Duration::from_secs(10) {
            return got;
        }
        thread::sleep(ms(10));
    }
}

#[test]
fn each_lock_and_unlock_counts_a_grant_a_wait_and_a_hold() {
    const N: usize = 20;
    let ns = "m-grants";
    let server = RedisServer::start();
    let client = client(&server.url(), ns, Duration::from_secs(10));
    for i in 0..N {
        client.lock(&format!("k{i}")).unwrap().unlock().unwrap();
    }
    // One more, held for a while: its hold time shows.
    let held = client.lock("held").unwrap();
    thread::sleep(ms(50));
    held.unlock().unwrap();

    let namespace = [("namespace", ns)];
    let attempt = [("namespace", ns), ("how", "attempt")];
    let all = everything(ns);
    assert_eq!(
        counter("fencelock_grants_total", &attempt),
        N as u64 + 1,
        "{all}"
    );
    assert_eq!(
        counter("fencelock_grants_total", &namespace),
        N as u64 + 1,
        "{all}"
    );
    let waits = histogram("fencelock_wait_seconds", &namespace);
    let holds = histogram("fencelock_hold_seconds", &namespace);
    assert_eq!(waits.len(), N + 1, "{all}");
    assert_eq!(holds.len(), N + 1, "{all}");
    // Seconds, not milliseconds: nothing here waits or holds for anywhere near 10 s.
    assert!(waits.iter().all(|w| (0.0..10.0).contains(w)), "{waits:?}");
    assert!(holds.iter().all(|h| (0.0..10.0).contains(h)), "{holds:?}");
    assert!(
        holds.iter().any(|h| *h >= 0.05),
        "the held lock's hold: {holds:?}"
    );
    assert_eq!(counter("fencelock_errors_total", &namespace), 0, "{all}");
    assert_eq!(counter("fencelock_losses_total", &namespace), 0, "{all}");

    // A try_lock that times out is not a grant.
    let other = client.lock("busy").unwrap();
    let second = client_for(&server, ns);
    assert!(second.try_lock("busy", ms(50)).unwrap().is_none());
    assert!(second.try_lock("busy", Duration::ZERO).unwrap().is_none());
    other.unlock().unwrap();
    assert_eq!(counter("fencelock_lock_timeouts_total", &namespace), 2);
    assert_eq!(counter("fencelock_grants_total", &namespace), N as u64 + 2);
    assert_eq!(histogram("fencelock_wait_seconds", &namespace).len(), N + 2);
}

fn client_for(server: &RedisServer, ns: &str) -> LockClient {
    client(&server.url(), ns, Duration::from_secs(10))
}

#[test]
fn handoffs_are_counted_on_both_sides_and_told_apart() {
    let ns = "m-handoff";
    let server = RedisServer::start();
    let mut con = server.connection();
    let a = client_for(&server, ns);
    let b = client_for(&server, ns);
    let labels = |k: &'static str, v: &'static str| [("namespace", ns), (k, v)];

    // To a waiter of another client.
    let held = a.lock("remote").unwrap();
    let waiter = {
        let b = b.clone();
        thread::spawn(move || b.lock("remote").map(|g| g.unlock()))
    };
    await_queue_len(&mut con, ns, "remote", 1);
    held.unlock().unwrap();
    waiter.join().unwrap().unwrap().unwrap();
    let all = everything(ns);
    assert_eq!(
        counter("fencelock_handoffs_total", &labels("to", "remote")),
        1,
        "{all}"
    );
    let remote = labels("how", "remote_handoff");
    assert_eq!(counter("fencelock_grants_total", &remote), 1, "{all}");

    // To another thread of the same client.
    let held = a.lock("local").unwrap();
    let waiter = {
        let a = a.clone();
        thread::spawn(move || a.lock("local").map(|g| g.unlock()))
    };
    await_queue_len(&mut con, ns, "local", 1);
    held.unlock().unwrap();
    waiter.join().unwrap().unwrap().unwrap();
    let all = everything(ns);
    assert_eq!(
        counter("fencelock_handoffs_total", &labels("to", "local")),
        1,
        "{all}"
    );
    let local = labels("how", "local_handoff");
    assert_eq!(counter("fencelock_grants_total", &local), 1, "{all}");
    // Two handoffs, two grants by attempt (the holders), and every grant waited and held.
    let namespace = [("namespace", ns)];
    assert_eq!(counter("fencelock_handoffs_total", &namespace), 2, "{all}");
    assert_eq!(
        counter("fencelock_grants_total", &labels("how", "attempt")),
        2
    );
    assert_eq!(histogram("fencelock_wait_seconds", &namespace).len(), 4);
    assert_eq!(histogram("fencelock_hold_seconds", &namespace).len(), 4);
}

#[test]
fn permits_reads_and_writes_are_counted_as_grants_of_their_own() {
    let ns = "m-shared";
    let server = RedisServer::start();
    let mut con = server.connection();
    let a = client_for(&server, ns);
    let b = client_for(&server, ns);
    let of = |grant: &'static str| [("namespace", ns), ("grant", grant)];
    let by = |grant: &'static str, k: &'static str, v: &'static str| {
        [("namespace", ns), ("grant", grant), (k, v)]
    };

    // A semaphore of one: a holds, b's try gives up, b waits, a's release hands the permit over.
    let mine = a.semaphore("slots", 1).unwrap();
    let theirs = b.semaphore("slots", 1).unwrap();
    let held = mine.acquire().unwrap();
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());
    let waiter = thread::spawn(move || theirs.acquire().map(|p| p.release()));
    await_queue_len(&mut con, ns, "%semaphore:slots", 1);
    held.release().unwrap();
    waiter.join().unwrap().unwrap().unwrap();
    let all = everything(ns);
    assert_eq!(
        counter("fencelock_grants_total", &by("permit", "how", "attempt")),
        1,
        "{all}"
    );
    let handed = by("permit", "how", "remote_handoff");
    assert_eq!(counter("fencelock_grants_total", &handed), 1, "{all}");
    let remote = by("permit", "to", "remote");
    assert_eq!(counter("fencelock_handoffs_total", &remote), 1, "{all}");
    assert_eq!(
        counter("fencelock_lock_timeouts_total", &of("permit")),
        1,
        "{all}"
    );
    assert_eq!(
        histogram("fencelock_wait_seconds", &of("permit")).len(),
        2,
        "{all}"
    );
    assert_eq!(
        histogram("fencelock_hold_seconds", &of("permit")).len(),
        2,
        "{all}"
    );

    // A read-write lock: a reads, b's writer waits, a's release admits it.
    let reading = a.read_lock("config").unwrap();
    let writer = {
        let b = b.clone();
        thread::spawn(move || b.write_lock("config").map(|w| w.unlock()))
    };
    await_queue_len(&mut con, ns, "%rwlock:config", 1);
    reading.unlock().unwrap();
    writer.join().unwrap().unwrap().unwrap();
    let all = everything(ns);
    assert_eq!(
        counter("fencelock_grants_total", &by("read", "how", "attempt")),
        1,
        "{all}"
    );
    let handed = by("write", "how", "remote_handoff");
    assert_eq!(counter("fencelock_grants_total", &handed), 1, "{all}");
    // A handoff is labelled with the grant released, here the read that admitted the writer.
    let remote = by("read", "to", "remote");
    assert_eq!(counter("fencelock_handoffs_total", &remote), 1, "{all}");
    assert_eq!(
        histogram("fencelock_hold_seconds", &of("read")).len(),
        1,
        "{all}"
    );
    assert_eq!(
        histogram("fencelock_hold_seconds", &of("write")).len(),
        1,
        "{all}"
    );

    // A permit whose key is gone: one loss, and its release an unlock error.
    let permit = mine.acquire().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{ns}:permit:{{%semaphore:slots}}:*"))
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut con).unwrap();
    assert!(permit.release().unwrap_err().is_lock_lost());
    let all = everything(ns);
    assert_eq!(counter("fencelock_losses_total", &of("permit")), 1, "{all}");
    let unlock = [("namespace", ns), ("op", "unlock"), ("kind", "lock_lost")];
    assert_eq!(counter("fencelock_errors_total", &unlock), 1, "{all}");

    // A plain lock's series say so too.
    a.lock("plain").unwrap().unlock().unwrap();
    assert_eq!(
        counter("fencelock_grants_total", &of("lock")),
        1,
        "{}",
        everything(ns)
    );
    assert_eq!(histogram("fencelock_hold_seconds", &of("lock")).len(), 1);
}

#[test]
fn a_lock_lost_is_counted_once_and_its_unlock_as_an_error() {
    let ns = "m-loss";
    let server = RedisServer::start();
    let mut con = server.connection();
    let client = client(&server.url(), ns, ms(300));
    let guard = client.lock("gone").unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:lock:{{gone}}"))
        .query(&mut con)
        .unwrap();
    assert!(guard.lost().recv_timeout(Duration::from_secs(2)).is_ok());
    assert!(!guard.is_held());
    let extended = guard.extend(Duration::from_secs(1)).unwrap_err();
    assert!(extended.is_lock_lost(), "{extended}");
    let unlocked = guard.unlock().unwrap_err();
    assert!(unlocked.is_lock_lost(), "{unlocked}");

    let all = everything(ns);
    assert_eq!(
        counter("fencelock_losses_total", &[("namespace", ns)]),
        1,
        "{all}"
    );
    let unlock = [("namespace", ns), ("op", "unlock"), ("kind", "lock_lost")];
    assert_eq!(counter("fencelock_errors_total", &unlock), 1, "{all}");
    let extend = [("namespace", ns), ("op", "extend"), ("kind", "lock_lost")];
    assert_eq!(counter("fencelock_errors_total", &extend), 1, "{all}");
}

#[test]
fn renewals_and_their_round_trips_are_counted() {
    let ns = "m-renewal";
    let server = RedisServer::start();
    // Renewed about every 100 ms.
    let client = client(&server.url(), ns, ms(300));
    let guards: Vec<_> = (0..3)
        .map(|i| client.lock(&format!("r{i}")).unwrap())
        .collect();
    let namespace = [("namespace", ns)];
    // Three leases, renewed at least three times each.
    let renewals = await_counter("fencelock_renewals_total", &namespace, 9);
    let all = everything(ns);
    assert!(renewals >= 9, "{all}");
    for guard in guards {
        assert!(guard.is_held());
        guard.unlock().unwrap();
    }
    let round_trips = histogram("fencelock_renewal_round_trip_seconds", &namespace);
    // One pipeline renews the three leases when they fall due together, so there are fewer
    // round trips than renewals, and at least one per third of them.
    assert!(!round_trips.is_empty(), "{all}");
    assert!(round_trips.len() as u64 <= renewals, "{all}");
    assert!(
        round_trips.iter().all(|t| (0.0..2.0).contains(t)),
        "{round_trips:?}"
    );
    assert_eq!(counter("fencelock_losses_total", &namespace), 0, "{all}");
}

#[test]
fn errors_are_counted_by_operation_and_kind() {
    let ns = "m-errors";
    let nobody = client(
        &format!("redis://127.0.0.1:{}/", free_port()),
        ns,
        Duration::from_secs(10),
    );
    assert!(nobody.lock("k").unwrap_err().is_connection());
    assert!(nobody.try_lock("k", ms(100)).unwrap_err().is_connection());
    assert!(nobody
        .try_lock("k", Duration::ZERO)
        .unwrap_err()
        .is_connection());
    assert!(nobody.lock("").unwrap_err().is_invalid_argument());

    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "sekrit"])
        .query(&mut server.connection())
        .unwrap();
    let url = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    assert!(client(&url, ns, Duration::from_secs(10))
        .lock("k")
        .unwrap_err()
        .is_rejected());

    let all = everything(ns);
    let lock = |kind| [("namespace", ns), ("op", "lock"), ("kind", kind)];
    assert_eq!(
        counter("fencelock_errors_total", &lock("connection")),
        3,
        "{all}"
    );
    assert_eq!(
        counter("fencelock_errors_total", &lock("invalid_argument")),
        1,
        "{all}"
    );
    assert_eq!(
        counter("fencelock_errors_total", &lock("rejected")),
        1,
        "{all}"
    );
    assert_eq!(
        counter("fencelock_errors_total", &[("namespace", ns)]),
        5,
        "{all}"
    );
    assert_eq!(
        counter("fencelock_grants_total", &[("namespace", ns)]),
        0,
        "{all}"
    );
    assert!(histogram("fencelock_wait_seconds", &[("namespace", ns)]).is_empty());
}

#[test]
fn a_renewal_that_cannot_reach_redis_counts_an_error_and_then_the_loss() {
    let ns = "m-renew-error";
    let mut server = RedisServer::start();
    let client = client(&server.url(), ns, ms(300));
    let guard = client.lock("k").unwrap();
    server.kill();
    assert!(guard.lost().recv_timeout(Duration::from_secs(2)).is_ok());
    let namespace = [("namespace", ns)];
    let renew = [("namespace", ns), ("op", "renew"), ("kind", "connection")];
    let errors = await_counter("fencelock_errors_total", &renew, 1);
    let all = everything(ns);
    assert!(errors >= 1, "{all}");
    assert_eq!(counter("fencelock_losses_total", &namespace), 1, "{all}");
    drop(guard);
}
