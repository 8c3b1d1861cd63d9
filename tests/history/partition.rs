//! Network partitions (tests/support/netns.rs): every server and every client process in a
//! network namespace of its own, and cuts between chosen nodes that drop packets silently, so
//! that clients see real timeouts, not resets. Each test records a history and has the checker
//! judge it.
//!
//! - The harness: a cut is silence (a read and a new connection time out; no reset, no
//!   unreachable error), other pairs pass, and a heal delivers what TCP still retransmits.
//! - One server: a holder cut from the server learns of the loss (`is_held()` false, `lost()`
//!   fired) before a client still reaching the server is granted the lock.
//! - One server, the locked-set workload: a nemesis cuts a holder from the lock's server (not
//!   from the counters' server) right after it read its counter, for four leases. Without a
//!   fence its write-back loses updates (the canary); through `FencedRedis` none is lost. The
//!   same on a quorum of five (the holder cut from three masters) and on Sentinel (cut from
//!   the master, the sentinels in reach).
//! - A quorum of five masters: a split into a majority and a minority side. Clients on the
//!   minority side cannot lock, those on the majority side can; a hold on the minority side is
//!   reported lost within about a lease; tokens rise. Two rounds, each with other masters on
//!   the minority side; `FENCELOCK_PARTITION_ROUNDS` for more.
//! - Sentinel: the master and one client cut from the replicas, the sentinels and the other
//!   client. Without `min_replica_acks` the isolated master goes on renewing and granting (two
//!   holders at once, which the checker reports) and `FencedRedis` refuses the old holder's
//!   write; with it, the old holder loses its lock within about a lease and the isolated master
//!   grants nothing.
//! - Cluster (`partition_cluster.rs`): the master of the lock's slot and one client cut from the
//!   other masters, the replicas and the other client. The old master stops taking writes once
//!   it sees itself in the minority, and the old holder learns of its loss before the replica
//!   that takes over grants the lock; with `min_replica_acks`, within about a lease.
//!
//! `FENCELOCK_HISTORY_DIR` keeps the histories (in a directory per test and seed);
//! `FENCELOCK_HISTORY_SECS` and `FENCELOCK_HISTORY_SEED` lengthen and repeat the partitioned
//! locked set. Needs root and `ip` (iproute2), and the feature `partition-tests`; see
//! tests/support/netns.rs.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient, LockGuard};

use super::recorder::{monotonic_ns, outcome_of, Event, Recorder, Type};
use super::support::netns::{Network, Node, NsRedis};
use super::support::{self, ms, unique_temp_dir, Rng, NAMESPACE};
use super::{check, counter_key, key_name, Store, Verdict, Worker, KEYS, LEASE_MS, PROCESSES};

// A Cluster master cut from the others.
#[path = "partition_cluster.rs"]
mod cluster;

const AGENT_ENV: &str = "FENCELOCK_PARTITION_AGENT";
/// How much later than the event itself an agent may stamp a loss (its watcher woken late by a
/// busy machine), in ns. The checker's verdict on the same holds allows none: it compares the
/// last time a guard said held, stamped before the look, with the other grant.
const NOTICED_LATE: u64 = 30_000_000;

// ---------------------------------------------------------------------------
// An agent: a client process inside a namespace, driven line by line
// ---------------------------------------------------------------------------

/// A client process in a node, running [`partition_agent`]: one `LockClient` on `url` that
/// takes and releases locks when told, records every call, and says when a lock it holds is
/// lost.
struct Agent {
    worker: Worker,
    name: String,
    /// Lines received but not yet asked for (a loss reported while waiting for a reply).
    pending: Vec<String>,
}

impl Agent {
    fn spawn(network: &Network, node: &Node, url: &str, lease: Duration, dir: &Path) -> Agent {
        Agent::spawn_with(network, node, url, lease, dir, &[])
    }

    /// [`Agent::spawn`] with more of its environment: `FENCELOCK_AGENT_ACKS` (`N:MS`, the
    /// client's `min_replica_acks`), `FENCELOCK_AGENT_STORE_URL` (the counters' `FencedRedis`).
    fn spawn_with(
        network: &Network,
        node: &Node,
        url: &str,
        lease: Duration,
        dir: &Path,
        more: &[(&str, String)],
    ) -> Agent {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut env = vec![
            ("REDIS_URL", url.to_owned()),
            ("FENCELOCK_AGENT_LEASE_MS", lease.as_millis().to_string()),
            ("FENCELOCK_HISTORY_FILE_DIR", dir.display().to_string()),
        ];
        env.extend(more.iter().cloned());
        let mut cmd = network.command(node, exe);
        cmd.env(AGENT_ENV, &node.name);
        Agent {
            worker: Worker::spawn_as_test("partition::partition_agent", &env, cmd),
            name: node.name.clone(),
            pending: Vec::new(),
        }
    }

    fn send(&mut self, line: &str) {
        self.worker.send(line);
    }

    /// The next line starting with `prefix` (others skipped), within `limit`.
    fn expect(&mut self, prefix: &str, limit: Duration) -> String {
        if let Some(i) = self.pending.iter().position(|l| l.starts_with(prefix)) {
            return self.pending.remove(i);
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.worker.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) => self.pending.push(line),
                Err(e) => panic!(
                    "agent {}: no {prefix:?} within {limit:?} ({e}); lines not asked for: {:?}",
                    self.name, self.pending
                ),
            }
        }
    }

    /// `try KEY MS`: the token, or `None` (not granted, or an error), and when the call returned.
    fn try_lock(&mut self, key: &str, wait: Duration) -> (Option<u64>, u64, String) {
        self.send(&format!("try {key} {}", wait.as_millis()));
        let line = self.expect("acquire ", wait + Duration::from_secs(10));
        // "acquire KEY granted TOKEN AT" | "acquire KEY none AT" | "acquire KEY error AT WHY"
        let f: Vec<&str> = line.splitn(5, ' ').collect();
        let at = f[3].parse().expect("a time");
        let token = (f[2] == "granted").then(|| f[4].parse().expect("a token"));
        (token, at, line)
    }

    /// `unlock KEY`: what unlock said (`ok`, `lost`, `error ...`).
    fn unlock(&mut self, key: &str) -> String {
        self.send(&format!("unlock {key}"));
        let line = self.expect(&format!("released {key} "), Duration::from_secs(10));
        line[format!("released {key} ").len()..].to_owned()
    }

    /// `held KEY`: whether its guard says held now.
    fn is_held(&mut self, key: &str) -> bool {
        self.send(&format!("held {key}"));
        let line = self.expect(&format!("held {key} "), Duration::from_secs(10));
        line.ends_with(" true")
    }

    /// `incr KEY`: claim with the key's token, read, write the value plus one; what it said
    /// (`ok READ`, `refused WHY`, `unknown WHY`).
    fn incr(&mut self, key: &str) -> String {
        self.send(&format!("incr {key}"));
        let line = self.expect(&format!("incr {key} "), Duration::from_secs(10));
        line[format!("incr {key} ").len()..].to_owned()
    }

    /// Waits up to `limit` for the agent to say it lost `key`: (when `is_held()` was first seen
    /// false, when `lost()` fired).
    fn await_loss(&mut self, key: &str, limit: Duration) -> (u64, u64) {
        let line = self.expect(&format!("lost {key} "), limit);
        let f: Vec<&str> = line.split(' ').collect();
        (f[2].parse().expect("a time"), f[3].parse().expect("a time"))
    }
}

/// The body of an agent process (a no-op in an ordinary test run). Commands on stdin, one a line:
/// `try KEY MS` (try_lock), `unlock KEY`; EOF ends it. Answers on stdout: `acquire KEY granted AT
/// TOKEN`, `acquire KEY none AT`, `acquire KEY error AT WHY`, `released KEY ok|lost|error WHY`,
/// and, unasked, `lost KEY NOT_HELD_AT LOST_AT` once a held lock's `is_held()` turned false and
/// its `lost()` fired (CLOCK_MONOTONIC ns).
#[test]
fn partition_agent() {
    let Ok(name) = std::env::var(AGENT_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let url = var("REDIS_URL");
    let lease = ms(var("FENCELOCK_AGENT_LEASE_MS").parse().expect("ms"));
    let dir = PathBuf::from(var("FENCELOCK_HISTORY_FILE_DIR"));
    let recorder = Arc::new(Recorder::create(&dir.join(format!("agent-{name}.jsonl"))));
    let mut builder = LockClient::builder(url.as_str())
        .namespace(NAMESPACE)
        .lease(lease)
        .response_timeout(ms(300))
        .connection_timeout(ms(300));
    if let Ok(acks) = std::env::var("FENCELOCK_AGENT_ACKS") {
        let (n, wait) = acks.split_once(':').expect("N:MS");
        builder = builder.min_replica_acks(n.parse().expect("N"), ms(wait.parse().expect("MS")));
    }
    let client = builder.build().expect("a client");
    let store = std::env::var("FENCELOCK_AGENT_STORE_URL").ok().map(|url| {
        FencedRedis::builder(url.as_str())
            .namespace(NAMESPACE)
            .response_timeout(ms(300))
            .connection_timeout(ms(300))
            .build()
            .expect("a store")
    });
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = {
        let out = Arc::clone(&out);
        move |line: String| {
            let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    let mut held: BTreeMap<String, Watched> = BTreeMap::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["try", key, wait] => {
                let wait = ms(wait.parse().expect("ms"));
                recorder.invoke(&name, "acquire", key);
                let result = client.try_lock(key, wait);
                let at = monotonic_ns();
                match result {
                    Ok(Some(guard)) => {
                        let token = guard.token().as_u64();
                        recorder.record(
                            &Event::new(&name, Type::Ok, "acquire", Some(key))
                                .at(at)
                                .token(token),
                        );
                        held.insert(
                            (*key).to_owned(),
                            Watched::start(guard, at, (*key).to_owned(), say.clone()),
                        );
                        say(format!("acquire {key} granted {at} {token}"));
                    }
                    Ok(None) => {
                        recorder
                            .record(&Event::new(&name, Type::Fail, "acquire", Some(key)).at(at));
                        say(format!("acquire {key} none {at}"));
                    }
                    Err(e) => {
                        recorder.record(
                            &Event::new(&name, outcome_of(&e), "acquire", Some(key))
                                .at(at)
                                .error(&e),
                        );
                        say(format!("acquire {key} error {at} {e}"));
                    }
                }
            }
            ["held", key] => {
                let held = held.get(*key).is_some_and(|w| w.is_held());
                say(format!("held {key} {held}"));
            }
            ["incr", key] => {
                let token = held.get(*key).expect("incr of a key not held").token;
                let store = store.as_ref().expect("FENCELOCK_AGENT_STORE_URL not set");
                recorder.invoke(&name, "incr", key);
                let read = store
                    .claim(key, token)
                    .and_then(|()| store.get_i64(key))
                    .map(|v| v.unwrap_or(0));
                let (event, said) = match read {
                    // Nothing written yet: an error is a failure.
                    Err(e) => (
                        Event::new(&name, Type::Fail, "incr", Some(key)).error(&e),
                        format!("refused {e}"),
                    ),
                    Ok(value) => match store.set(key, token, (value + 1).to_string()) {
                        Ok(()) => (
                            Event::new(&name, Type::Ok, "incr", Some(key))
                                .read(value)
                                .value(value + 1),
                            format!("ok {value}"),
                        ),
                        Err(e) if outcome_of(&e) == Type::Unknown => (
                            Event::new(&name, Type::Unknown, "incr", Some(key)).error(&e),
                            format!("unknown {e}"),
                        ),
                        Err(e) => (
                            Event::new(&name, Type::Fail, "incr", Some(key)).error(&e),
                            format!("refused {e}"),
                        ),
                    },
                };
                recorder.record(&event);
                say(format!("incr {key} {said}"));
            }
            ["unlock", key] => {
                let watched = held.remove(*key).expect("unlock of a key not held");
                let (guard, last_held) = watched.stop();
                recorder.record(
                    &Event::new(&name, Type::Invoke, "release", Some(key)).last_held(last_held),
                );
                let (kind, said) = match guard.unlock() {
                    Ok(()) => (Type::Ok, "ok".to_owned()),
                    Err(e) if e.is_lock_lost() => (Type::Fail, "lost".to_owned()),
                    Err(e) => (outcome_of(&e), format!("error {e}")),
                };
                recorder.record(&Event::new(&name, kind, "release", Some(key)));
                say(format!("released {key} {said}"));
            }
            other => panic!("agent {name}: unknown command {other:?}"),
        }
    }
}

/// A held guard and the thread watching it: every millisecond a look at `is_held()` (the time
/// before the last true one is the hold's end) and at `lost()`.
struct Watched {
    token: fencelock::FencingToken,
    /// Whether the last look at `is_held()` said true.
    held_now: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    last_held: Arc<AtomicU64>,
    thread: thread::JoinHandle<LockGuard>,
}

impl Watched {
    fn start(
        guard: LockGuard,
        granted: u64,
        key: String,
        say: impl Fn(String) + Send + 'static,
    ) -> Watched {
        let token = guard.token();
        let stop = Arc::new(AtomicBool::new(false));
        let held_now = Arc::new(AtomicBool::new(true));
        let last_held = Arc::new(AtomicU64::new(granted));
        // A thread of its own blocks on lost(), so that it wakes as the signal fires (a watcher
        // looking now and then would stamp it late).
        let lost_at = Arc::new(AtomicU64::new(0));
        {
            let (lost, lost_at, stop) = (
                guard.lost().clone(),
                Arc::clone(&lost_at),
                Arc::clone(&stop),
            );
            thread::spawn(move || loop {
                match lost.recv_timeout(ms(50)) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                    // A value or a disconnection: lost (or released, once stopped).
                    _ => {
                        lost_at.store(monotonic_ns(), Ordering::SeqCst);
                        break;
                    }
                }
            });
        }
        let thread = {
            let (stop, last_held) = (Arc::clone(&stop), Arc::clone(&last_held));
            let held_now = Arc::clone(&held_now);
            thread::spawn(move || {
                let mut not_held = None;
                let mut reported = false;
                while !stop.load(Ordering::SeqCst) {
                    let now = monotonic_ns();
                    if guard.is_held() {
                        last_held.store(now, Ordering::SeqCst);
                    } else if not_held.is_none() {
                        held_now.store(false, Ordering::SeqCst);
                        not_held = Some(monotonic_ns());
                    }
                    let lost = lost_at.load(Ordering::SeqCst);
                    if let (Some(n), false, true) = (not_held, reported, lost != 0) {
                        say(format!("lost {key} {n} {lost}"));
                        reported = true;
                    }
                    thread::sleep(ms(1));
                }
                guard
            })
        };
        Watched {
            token,
            held_now,
            stop,
            last_held,
            thread,
        }
    }

    fn is_held(&self) -> bool {
        self.held_now.load(Ordering::SeqCst)
    }

    /// Stops the watcher: the guard and the last time it was seen held.
    fn stop(self) -> (LockGuard, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let guard = self.thread.join().expect("the watcher panicked");
        (guard, self.last_held.load(Ordering::SeqCst))
    }
}

// ---------------------------------------------------------------------------
// A history directory and its verdict
// ---------------------------------------------------------------------------

/// A history directory: temporary (kept, and named, if the test fails), or under
/// `FENCELOCK_HISTORY_DIR`, kept.
struct History {
    dir: PathBuf,
    keep: bool,
    nemesis: Recorder,
}

impl History {
    fn new(name: &str) -> History {
        let (dir, keep) = match std::env::var("FENCELOCK_HISTORY_DIR") {
            Ok(base) => {
                let dir = Path::new(&base).join(format!("partition-{name}-{}", monotonic_ns()));
                std::fs::create_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
                (dir, true)
            }
            Err(_) => (
                unique_temp_dir(&format!("fencelock-partition-{name}")),
                false,
            ),
        };
        let nemesis = Recorder::create(&dir.join("nemesis.jsonl"));
        History { dir, keep, nemesis }
    }

    /// Records a partition's start; `what` says who was cut from whom.
    fn partition(&self, what: &str, planned: Duration) {
        self.nemesis.record(
            &Event::new("nemesis", Type::Invoke, "partition", None)
                .value(planned.as_millis() as i64)
                .target(what),
        );
    }

    fn healed(&self) {
        self.nemesis
            .record(&Event::new("nemesis", Type::Ok, "partition", None));
    }

    fn check(&self) -> Verdict {
        let verdict = check(&self.dir);
        println!("{}", verdict.output);
        verdict
    }
}

impl Drop for History {
    fn drop(&mut self) {
        if self.keep {
            println!("the history is in {}", self.dir.display());
        } else if thread::panicking() {
            eprintln!("the history stays in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn secs(ns: u64, origin: u64) -> String {
    format!("{:.3}s", ns.saturating_sub(origin) as f64 / 1e9)
}

// ---------------------------------------------------------------------------
// The harness: a cut is silence, a heal delivers what TCP still retransmits
// ---------------------------------------------------------------------------

#[test]
fn a_cut_drops_silently_and_a_heal_delivers_what_was_buffered() {
    let network = Network::new(&["server", "a", "c"]);
    let server = NsRedis::start(&network, network.node("server"), &[]);
    let url = server.url();
    let connect = |node: &Node, timeout: Duration| {
        let url = url.clone();
        node.run(move || {
            let started = Instant::now();
            let con = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(timeout))
                .and_then(|con| {
                    con.set_read_timeout(Some(timeout))?;
                    Ok(con)
                });
            (con, started.elapsed())
        })
    };
    let (con, _) = connect(network.node("a"), ms(500));
    let mut con = con.expect("a connects before the cut");
    let _: () = redis::cmd("SET")
        .arg("x")
        .arg(1)
        .query(&mut con)
        .expect("SET before the cut");

    network.cut(network.node("a"), server.node());
    // The connection a had: the write goes out into the void, and no reply comes (no reset).
    let started = Instant::now();
    let err = redis::cmd("SET")
        .arg("x")
        .arg(2)
        .query::<()>(&mut con)
        .expect_err("a reply across a cut");
    assert!(err.is_timeout(), "not a timeout across the cut: {err}");
    assert!(
        started.elapsed() >= ms(450),
        "answered in {:?}",
        started.elapsed()
    );
    // A new connection: the SYN goes unanswered until the caller gives up.
    let (fresh, took) = connect(network.node("a"), ms(500));
    let err = fresh.err().expect("a connection across a cut");
    assert!(
        err.is_timeout() || err.to_string().contains("timed out"),
        "not a timeout connecting across the cut: {err}"
    );
    assert!(
        took >= ms(450),
        "a connection across the cut failed in {took:?}: {err}"
    );
    // Other pairs are not cut.
    let (other, _) = connect(network.node("c"), ms(2000));
    other.expect("c reaches the server during a's cut");

    network.heal(network.node("a"), server.node());
    assert_eq!(network.cuts(), 0);
    // The SET that went out during the cut is retransmitted and applied: TCP gave up on nothing.
    let mut check = server.connection();
    support::poll_until(Duration::from_secs(20), ms(20), || {
        let x: Option<i64> = redis::cmd("GET")
            .arg("x")
            .query(&mut check)
            .map_err(|e| e.to_string())?;
        (x == Some(2)).then_some(()).ok_or(format!("x = {x:?}"))
    })
    .unwrap_or_else(|why| panic!("the write buffered during the cut never arrived: {why}"));
    drop(con);
}

// ---------------------------------------------------------------------------
// One server: the cut holder learns of its loss before another is granted
// ---------------------------------------------------------------------------

#[test]
fn a_holder_cut_from_its_server_learns_of_the_loss_before_another_is_granted() {
    let lease = ms(500);
    let network = Network::new(&["server", "a", "b"]);
    let server = NsRedis::start(&network, network.node("server"), &[]);
    let history = History::new("cut-holder");
    let mut a = Agent::spawn(
        &network,
        network.node("a"),
        &server.url(),
        lease,
        &history.dir,
    );
    let mut b = Agent::spawn(
        &network,
        network.node("b"),
        &server.url(),
        lease,
        &history.dir,
    );

    let (first, _, line) = a.try_lock("k", ms(2000));
    let first = first.unwrap_or_else(|| panic!("a was not granted k: {line}"));
    // Renewal runs a few rounds before the cut.
    thread::sleep(lease);

    history.partition("a from the server", lease * 4);
    let cut_at = monotonic_ns();
    network.cut(network.node("a"), server.node());
    let (second, granted_at, line) = b.try_lock("k", lease * 6);
    let second = second.unwrap_or_else(|| panic!("b was not granted k while a was cut: {line}"));
    let (not_held_at, lost_at) = a.await_loss("k", lease * 4);
    network.heal(network.node("a"), server.node());
    history.healed();

    println!(
        "cut at 0: a saw is_held() false at {}, lost() fired at {}, b granted at {} \
         (token {first} then {second})",
        secs(not_held_at, cut_at),
        secs(lost_at, cut_at),
        secs(granted_at, cut_at)
    );
    assert_eq!(a.unlock("k"), "lost", "a's unlock after the heal");
    assert_eq!(b.unlock("k"), "ok", "b's unlock");
    drop((a, b));

    // The checker first: a's hold, as a saw it, must end before b's begins.
    let v = history.check();
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(v.count("grants"), 2, "{}", v.output);
    assert!(second > first, "tokens: {first} then {second}");
    // That a's guard never said held after b's grant, the checker saw above, exactly. Here the
    // moments a's agent noticed the loss, which a loaded machine can delay by a scheduling slice.
    assert!(
        not_held_at <= granted_at + NOTICED_LATE && lost_at <= granted_at + NOTICED_LATE,
        "a learned of its loss (is_held() false at {}, lost() at {}) after b was granted at {}",
        secs(not_held_at, cut_at),
        secs(lost_at, cut_at),
        secs(granted_at, cut_at)
    );
    // Within about a lease of the cut: the last renewal before it was at most a third of a
    // lease earlier. Loose: twice that.
    assert!(
        lost_at - cut_at <= 2 * lease.as_nanos() as u64,
        "lost() fired {} after the cut, lease {lease:?}",
        secs(lost_at, cut_at)
    );
}

// ---------------------------------------------------------------------------
// A quorum of five: a majority side and a minority side
// ---------------------------------------------------------------------------

#[test]
fn quorum_split_minority_cannot_lock_and_loses_its_holds_majority_can() {
    let lease = ms(600);
    let names = ["m0", "m1", "m2", "m3", "m4", "maj", "min"];
    let network = Network::new(&names);
    let masters: Vec<NsRedis> = names[..5]
        .iter()
        .map(|m| NsRedis::start(&network, network.node(m), &[]))
        .collect();
    let url = format!(
        "redis+quorum://{}",
        masters
            .iter()
            .map(NsRedis::host)
            .collect::<Vec<_>>()
            .join(",")
    );
    let history = History::new("quorum-split");
    let mut maj = Agent::spawn(&network, network.node("maj"), &url, lease, &history.dir);
    let mut min = Agent::spawn(&network, network.node("min"), &url, lease, &history.dir);
    let node = |n: &str| network.node(n);
    // Two rounds by default; FENCELOCK_PARTITION_ROUNDS for a longer run.
    let rounds: usize = std::env::var("FENCELOCK_PARTITION_ROUNDS").map_or(2, |r| {
        r.parse().expect("FENCELOCK_PARTITION_ROUNDS: a count")
    });

    let mut tokens = Vec::new();
    for round in 0..rounds {
        // The minority's two masters change from round to round: m3 and m4, then m0 and m1, ...
        let minority_masters = [(2 * round + 3) % 5, (2 * round + 4) % 5];
        let mut majority = vec![node("maj")];
        let mut minority = vec![node("min")];
        for m in 0..5 {
            let side = if minority_masters.contains(&m) {
                &mut minority
            } else {
                &mut majority
            };
            side.push(node(&format!("m{m}")));
        }
        let sides = |side: &[&Node]| {
            side.iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let what = format!("{} from {}", sides(&minority), sides(&majority));
        // Before the split, the client of the minority side takes the lock.
        let (held, _, line) = min.try_lock("q", ms(3000));
        let held = held.unwrap_or_else(|| panic!("round {round}: min was not granted q: {line}"));
        tokens.push(held);
        thread::sleep(lease / 2);

        history.partition(&what, lease * 4);
        let cut_at = monotonic_ns();
        network.split(&majority, &minority);
        let split_in = monotonic_ns() - cut_at;
        // The majority side is granted the lock once the minority's hold ran out...
        let (taken, granted_at, line) = maj.try_lock("q", lease * 6);
        let taken = taken.unwrap_or_else(|| panic!("round {round}: maj was not granted q: {line}"));
        tokens.push(taken);
        // ...and the minority's holder was told before.
        let (not_held_at, lost_at) = min.await_loss("q", lease * 4);
        // A fresh key: the majority side gets it, the minority side gets nothing.
        let (fresh, _, line) = maj.try_lock(&format!("r{round}"), ms(2000));
        assert!(fresh.is_some(), "round {round}: maj, fresh key: {line}");
        let started = Instant::now();
        let (refused, _, line) = min.try_lock(&format!("s{round}"), ms(1000));
        assert!(
            refused.is_none(),
            "round {round}: min was granted a key with three masters out of reach: {line}"
        );
        let refused_in = started.elapsed();
        network.heal_all();
        history.healed();

        println!(
            "round {round}: {what}: split at 0 (made in {:.3}s): min saw is_held() false at {}, \
             lost() at {}; maj granted at {}; min's try_lock(1 s) answered {line:?} after \
             {refused_in:?}",
            split_in as f64 / 1e9,
            secs(not_held_at, cut_at),
            secs(lost_at, cut_at),
            secs(granted_at, cut_at)
        );
        assert!(
            lost_at <= granted_at + NOTICED_LATE && not_held_at <= granted_at + NOTICED_LATE,
            "round {round}: min learned of its loss after maj was granted"
        );
        assert!(
            lost_at - cut_at <= 2 * lease.as_nanos() as u64,
            "round {round}: lost() fired {} after the split (lease {lease:?})",
            secs(lost_at, cut_at)
        );
        assert!(
            refused_in < ms(1000) + ms(1500),
            "round {round}: min's try_lock(1 s) took {refused_in:?}"
        );
        // Right after the heal, min's connections to m0..m2 still wait out TCP's retransmission
        // backoff: its release may time out (an unknown outcome) rather than say lost.
        let released = min.unlock("q");
        assert!(
            released == "lost" || released.contains("did not reply in time"),
            "round {round}: min's unlock after the heal: {released}"
        );
        assert_eq!(maj.unlock("q"), "ok", "round {round}: maj's unlock of q");
        assert_eq!(maj.unlock(&format!("r{round}")), "ok", "round {round}");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens do not rise: {tokens:?}"
    );
    drop((maj, min));

    let v = history.check();
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(v.count("grants"), 3 * rounds as u64, "{}", v.output);
}

// ---------------------------------------------------------------------------
// Sentinel: the master cut from its replicas and sentinels, but not from one client
// ---------------------------------------------------------------------------

const MASTER_NAME: &str = "mymaster";

/// What a Sentinel partition run saw.
struct SentinelRun {
    verdict: Verdict,
    /// The old client's hold, seen held by its guard after the new client was granted.
    old_held_after_failover: bool,
    /// What the old client's increment said after the new client's.
    old_incr: String,
    /// Whether the old client was granted a fresh key on the isolated old master.
    old_fresh_granted: bool,
    /// The old client's loss (`lost()` fired) and the new client's grant, ns after the cut.
    old_lost_after: Option<u64>,
    new_granted_after: u64,
    tokens: (u64, u64),
    _history: History,
}

/// A Sentinel set in the nodes `m` (the master), `r1`, `r2` (replicas) and `s1`..`s3`
/// (sentinels: quorum 2, down after 1 s), returned once the replicas are online and every
/// sentinel sees them and the others.
fn start_sentinel_set(network: &Network) -> (NsRedis, [NsRedis; 2], Vec<NsRedis>) {
    let node = |n: &str| network.node(n);
    let master = NsRedis::start(network, node("m"), &["--repl-diskless-sync-delay", "0"]);
    let replicas = [
        NsRedis::start_replica(network, node("r1"), &master),
        NsRedis::start_replica(network, node("r2"), &master),
    ];
    support::poll_until(Duration::from_secs(20), ms(50), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut master.connection())
            .map_err(|e| e.to_string())?;
        let online = info.lines().filter(|l| l.contains("state=online")).count();
        (online == 2).then_some(()).ok_or(info)
    })
    .unwrap_or_else(|info| panic!("the replicas did not come online:\n{info}"));
    let config = format!(
        "sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
         sentinel failover-timeout {MASTER_NAME} 5000\n\
         sentinel parallel-syncs {MASTER_NAME} 1"
    );
    let sentinels: Vec<NsRedis> = ["s1", "s2", "s3"]
        .iter()
        .map(|s| NsRedis::start_sentinel(network, node(s), &master, MASTER_NAME, 2, &config))
        .collect();
    for sentinel in &sentinels {
        support::poll_until(Duration::from_secs(30), ms(50), || {
            let fields: Vec<String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(MASTER_NAME)
                .query(&mut sentinel.connection())
                .map_err(|e| e.to_string())?;
            let get = |name: &str| {
                fields
                    .iter()
                    .position(|f| f == name)
                    .and_then(|i| fields.get(i + 1))
                    .cloned()
                    .unwrap_or_default()
            };
            let (replicas, others) = (get("num-slaves"), get("num-other-sentinels"));
            (replicas == "2" && others == "2")
                .then_some(())
                .ok_or(format!("{replicas} replicas, {others} other sentinels"))
        })
        .unwrap_or_else(|why| panic!("a sentinel did not see the set: {why}"));
    }
    (master, replicas, sentinels)
}

/// A master `m`, replicas `r1` and `r2`, sentinels `s1`..`s3` (quorum 2, down after 1 s), and
/// a `FencedRedis` store on a server of its own. Client `old` takes `k` and increments its
/// counter; then `m` and `old` are cut from everyone else (the store excepted). The sentinels
/// promote a replica; client `new` takes `k` there and increments; `old` increments again and
/// tries a fresh key on `m`. `acks`: the clients' `min_replica_acks`.
fn run_sentinel_partition(acks: Option<(u32, u64)>) -> SentinelRun {
    let lease = ms(600);
    let names = ["m", "r1", "r2", "s1", "s2", "s3", "store", "old", "new"];
    let network = Network::new(&names);
    let node = |n: &str| network.node(n);
    let (_master, replicas, sentinels) = start_sentinel_set(&network);
    let store = NsRedis::start(&network, node("store"), &[]);
    let url = format!(
        "redis+sentinel://{}/{MASTER_NAME}",
        sentinels
            .iter()
            .map(NsRedis::host)
            .collect::<Vec<_>>()
            .join(",")
    );
    let history = History::new(&format!(
        "sentinel-{}",
        if acks.is_some() { "acks" } else { "no-acks" }
    ));
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

    let (first, _, line) = old.try_lock("k", ms(3000));
    let first = first.unwrap_or_else(|| panic!("old was not granted k: {line}"));
    let said = old.incr("k");
    assert!(said.starts_with("ok"), "old's first increment: {said}");
    thread::sleep(lease / 2);

    history.partition("m and old from r1, r2, s1, s2, s3, new", Duration::ZERO);
    let cut_at = monotonic_ns();
    network.split(
        &[node("m"), node("old")],
        &[
            node("r1"),
            node("r2"),
            node("s1"),
            node("s2"),
            node("s3"),
            node("new"),
        ],
    );
    // A failover takes the sentinels a few seconds: down after 1 s, then an election.
    let (second, granted_at, line) = new.try_lock("k", Duration::from_secs(20));
    let second = second.unwrap_or_else(|| {
        panic!(
            "new was not granted k after the failover: {line}\n{}",
            sentinels[0].logs()
        )
    });
    let said = new.incr("k");
    assert!(said.starts_with("ok"), "new's increment: {said}");
    let old_held_after_failover = old.is_held("k");
    let old_incr = old.incr("k");
    let (fresh, _, _) = old.try_lock("fresh", ms(1000));
    let old_lost_after = (!old_held_after_failover).then(|| {
        let (_, lost_at) = old.await_loss("k", Duration::from_secs(5));
        lost_at - cut_at
    });
    network.heal_all();
    history.healed();

    // old's releases go to m, which may still be a master or is being turned into a replica:
    // any outcome will do.
    let _ = old.unlock("k");
    if fresh.is_some() {
        let _ = old.unlock("fresh");
    }
    let released = new.unlock("k");
    assert_eq!(released, "ok", "new's unlock");
    drop((old, new));
    read_counter();
    drop(replicas);
    SentinelRun {
        verdict: history.check(),
        old_held_after_failover,
        old_incr,
        old_fresh_granted: fresh.is_some(),
        old_lost_after,
        new_granted_after: granted_at - cut_at,
        tokens: (first, second),
        _history: history,
    }
}

#[test]
fn sentinel_partition_without_replica_acks_two_holders_fencing_keeps_the_data() {
    let run = run_sentinel_partition(None);
    let v = &run.verdict;
    println!(
        "new granted {} after the cut; old still held: {}; old's increment: {}; old granted a \
         fresh key on the isolated master: {}; tokens {:?}",
        secs(run.new_granted_after, 0),
        run.old_held_after_failover,
        run.old_incr,
        run.old_fresh_granted,
        run.tokens
    );
    // The isolated master goes on renewing and granting for the client that reaches it: two
    // holders of k at once, which the checker must see.
    assert!(run.old_held_after_failover, "{}", v.output);
    assert!(run.old_fresh_granted, "{}", v.output);
    assert!(v.count("mutex_violations") >= 1, "{}", v.output);
    // The fence keeps the data: old's increment with its older token is refused.
    assert!(run.tokens.1 > run.tokens.0, "tokens {:?}", run.tokens);
    assert!(
        run.old_incr.starts_with("refused"),
        "old's increment: {}",
        run.old_incr
    );
    assert_eq!(v.count("lost_updates"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}

#[test]
fn sentinel_partition_with_replica_acks_the_isolated_master_grants_nothing() {
    let run = run_sentinel_partition(Some((1, 200)));
    let v = &run.verdict;
    println!(
        "new granted {} after the cut; old lost k {} after the cut; old's increment: {}; old \
         granted a fresh key on the isolated master: {}; tokens {:?}",
        secs(run.new_granted_after, 0),
        run.old_lost_after
            .map_or("never".to_owned(), |t| secs(t, 0)),
        run.old_incr,
        run.old_fresh_granted,
        run.tokens
    );
    assert_eq!(v.code, 0, "{}", v.output);
    assert!(!run.old_held_after_failover, "{}", v.output);
    assert!(!run.old_fresh_granted, "{}", v.output);
    let lost = run.old_lost_after.expect("old lost k");
    assert!(
        lost <= run.new_granted_after,
        "old lost k {} after the cut, new was granted it {} after",
        secs(lost, 0),
        secs(run.new_granted_after, 0)
    );
    assert!(run.tokens.1 > run.tokens.0, "tokens {:?}", run.tokens);
}

// ---------------------------------------------------------------------------
// The locked-set workload with a holder cut from the lock's server
// ---------------------------------------------------------------------------

/// What a partitioned run gave.
struct Partitioned {
    verdict: Verdict,
    cuts: u64,
    _history: History,
}

/// The locked set of tests/history on one lock server, with the counters on a second server,
/// each worker process in its own node; the nemesis cuts a worker that just read a counter from
/// the lock's server (not from the counters') for four leases.
fn run_partitioned_set(store: Store) -> Partitioned {
    run_partitioned_set_on(store, SetLocks::One)
}

/// Where the partitioned set's locks live, and whom a cut separates the worker from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetLocks {
    /// One server (`lock`): from it.
    One,
    /// A quorum of five (`m0`..`m4`): from a majority of the masters, other ones each time.
    Quorum,
    /// Sentinel (`m`, replicas `r1`, `r2`, sentinels `s1`..`s3`): from the master, the sentinels
    /// still in reach (so no failover).
    Sentinel,
}

/// [`run_partitioned_set`] on the lock servers `locks` says.
fn run_partitioned_set_on(store: Store, locks: SetLocks) -> Partitioned {
    assert!(
        store != Store::Postgres,
        "the counters live on a redis-server of the network"
    );
    let secs_run: u64 = std::env::var("FENCELOCK_HISTORY_SECS")
        .ok()
        .map(|s| s.parse().expect("FENCELOCK_HISTORY_SECS: whole seconds"))
        .unwrap_or(8);
    let duration = Duration::from_secs(secs_run);
    let seed: u64 = std::env::var("FENCELOCK_HISTORY_SEED")
        .ok()
        .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hexadecimal"))
        .unwrap_or_else(|| monotonic_ns() | 1);
    let lock_names: Vec<String> = match locks {
        SetLocks::One => vec!["lock".to_owned()],
        SetLocks::Quorum => (0..5).map(|m| format!("m{m}")).collect(),
        SetLocks::Sentinel => ["m", "r1", "r2", "s1", "s2", "s3"]
            .map(str::to_owned)
            .to_vec(),
    };
    let mut names = lock_names.clone();
    names.push("store".to_owned());
    names.extend((0..PROCESSES).map(|i| format!("c{i}")));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let network = Network::new(&names);
    // The servers a cut separates a worker from (the masters), and the others of the set.
    let mut masters: Vec<NsRedis> = Vec::new();
    let mut others: Vec<NsRedis> = Vec::new();
    let lock_url = match locks {
        SetLocks::One | SetLocks::Quorum => {
            masters = lock_names
                .iter()
                .map(|n| NsRedis::start(&network, network.node(n), &[]))
                .collect();
            let hosts: Vec<String> = masters.iter().map(NsRedis::host).collect();
            if locks == SetLocks::One {
                masters[0].url()
            } else {
                format!("redis+quorum://{}", hosts.join(","))
            }
        }
        SetLocks::Sentinel => {
            let (master, replicas, sentinels) = start_sentinel_set(&network);
            let hosts: Vec<String> = sentinels.iter().map(NsRedis::host).collect();
            masters.push(master);
            others.extend(replicas);
            others.extend(sentinels);
            format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
        }
    };
    let data = NsRedis::start(&network, network.node("store"), &[]);
    let history = History::new(&format!("set-{}-{locks:?}", store.name()));
    println!(
        "partitioned locked set through {}: {secs_run} s, seed {seed:x}, history in {}",
        store.name(),
        history.dir.display()
    );

    let test = Recorder::create(&history.dir.join("test.jsonl"));
    let read_counters = || {
        let url = data.url();
        data.node().run(|| {
            let fenced = FencedRedis::builder(url.as_str())
                .namespace(NAMESPACE)
                .build()
                .expect("a store");
            let mut con = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
                .expect("a connection to the counters");
            for k in 0..KEYS {
                let key = key_name(k);
                test.invoke("test", "read", &key);
                let value: i64 = match store {
                    Store::Unfenced => redis::cmd("GET")
                        .arg(counter_key(&key))
                        .query::<Option<i64>>(&mut con)
                        .expect("GET counter")
                        .unwrap_or(0),
                    _ => fenced.get_i64(&key).expect("get counter").unwrap_or(0),
                };
                test.record(&Event::new("test", Type::Ok, "read", Some(&key)).value(value));
            }
        });
    };
    read_counters();

    let env: Vec<(&str, String)> = vec![
        ("REDIS_URL", lock_url),
        ("FENCELOCK_HISTORY_STORE_URL", data.url()),
        ("FENCELOCK_HISTORY_STORE", store.name().to_owned()),
        (
            "FENCELOCK_HISTORY_FILE_DIR",
            history.dir.display().to_string(),
        ),
        ("FENCELOCK_HISTORY_SEED", format!("{seed:x}")),
        ("FENCELOCK_HISTORY_LIMIT", (secs_run + 60).to_string()),
        // Work of up to three leases between a read and its write: a holder cut right after
        // its read is still working when its lease has run out and another holder has written.
        ("FENCELOCK_HISTORY_WORK_MS", (LEASE_MS * 3).to_string()),
        ("FENCELOCK_HISTORY_TABLE", String::new()),
    ];
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let node = network.node(&format!("c{i}"));
            Worker::spawn_as(i, &env, network.command(node, &exe))
        })
        .collect();

    let mut rng = Rng(seed);
    let lease = ms(LEASE_MS);
    let started = Instant::now();
    let mut cuts = 0;
    const MIN_CUTS: u64 = 3;
    while started.elapsed() < duration || (cuts < MIN_CUTS && started.elapsed() < duration * 2) {
        thread::sleep(lease * 2 + ms(rng.below(LEASE_MS)));
        // A read whose holder then works for two leases or more: cut now, it is still working
        // when its lease has run out and another holder may have read and written.
        let Some(target) = await_long_read(&workers, lease * 4, lease * 2) else {
            continue;
        };
        let node = network.node(&format!("c{target}"));
        // One server, Sentinel: the master. A quorum: a majority of the masters, from `cuts` on.
        let cut_from: Vec<&Node> = if locks == SetLocks::Quorum {
            (0..masters.len() / 2 + 1)
                .map(|k| masters[(cuts as usize + k) % masters.len()].node())
                .collect()
        } else {
            vec![masters[0].node()]
        };
        let whom: Vec<&str> = cut_from.iter().map(|n| n.name.as_str()).collect();
        history.partition(
            &format!("worker {target} from {}", whom.join(", ")),
            lease * 4,
        );
        for from in &cut_from {
            network.cut(node, from);
        }
        thread::sleep(lease * 4);
        for from in &cut_from {
            network.heal(node, from);
        }
        history.healed();
        cuts += 1;
    }
    for (i, worker) in workers.iter_mut().enumerate() {
        if let Err(e) = worker.finish(Duration::from_secs(30)) {
            panic!("worker {i}: {e}");
        }
    }
    read_counters();
    drop(workers);
    Partitioned {
        verdict: history.check(),
        cuts,
        _history: history,
    }
}

/// Waits up to `wait` for a worker to say one of its threads read a counter and will work for
/// `work` or more before writing it; which worker.
fn await_long_read(workers: &[Worker], wait: Duration, work: Duration) -> Option<usize> {
    for worker in workers {
        while worker.lines.try_recv().is_ok() {}
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        for (i, worker) in workers.iter().enumerate() {
            while let Ok(line) = worker.lines.try_recv() {
                // "read PROCESS KEY WORK_MS"
                let planned = line
                    .strip_prefix("read ")
                    .and_then(|rest| rest.split(' ').nth(2))
                    .and_then(|w| w.parse().ok());
                if planned.is_some_and(|w| ms(w) >= work) {
                    return Some(i);
                }
            }
        }
        thread::sleep(ms(2));
    }
    None
}

fn assert_busy(run: &Partitioned) {
    let v = &run.verdict;
    assert!(v.count("grants") >= 20, "too few grants:\n{}", v.output);
    assert!(
        v.count("increments") >= 10,
        "too few increments:\n{}",
        v.output
    );
    assert!(run.cuts >= 1, "no partition was made:\n{}", v.output);
}

#[test]
fn partitioned_set_without_a_fence_loses_updates() {
    let run = run_partitioned_set(Store::Unfenced);
    let v = &run.verdict;
    assert_busy(&run);
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert!(
        v.count("lost_updates") >= 1,
        "no update lost without a fence under {} partitions: the nemesis did not bite\n{}",
        run.cuts,
        v.output
    );
}

#[test]
fn partitioned_set_through_fenced_redis_loses_no_update() {
    let run = run_partitioned_set(Store::FencedRedis);
    assert_busy(&run);
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}

/// A quorum of five: a holder cut from three masters loses its lock (its renewals reach two);
/// without a fence its late write-back loses updates.
#[test]
fn quorum_partitioned_set_without_a_fence_loses_updates() {
    let run = run_partitioned_set_on(Store::Unfenced, SetLocks::Quorum);
    let v = &run.verdict;
    assert_busy(&run);
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert!(
        v.count("lost_updates") >= 1,
        "no update lost without a fence under {} partitions: the nemesis did not bite\n{}",
        run.cuts,
        v.output
    );
}

#[test]
fn quorum_partitioned_set_through_fenced_redis_loses_no_update() {
    let run = run_partitioned_set_on(Store::FencedRedis, SetLocks::Quorum);
    assert_busy(&run);
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}

/// Sentinel: a holder cut from the master (not from the sentinels, so nothing fails over) loses
/// its lock; without a fence its late write-back loses updates.
#[test]
fn sentinel_partitioned_set_without_a_fence_loses_updates() {
    let run = run_partitioned_set_on(Store::Unfenced, SetLocks::Sentinel);
    let v = &run.verdict;
    assert_busy(&run);
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert!(
        v.count("lost_updates") >= 1,
        "no update lost without a fence under {} partitions: the nemesis did not bite\n{}",
        run.cuts,
        v.output
    );
}

#[test]
fn sentinel_partitioned_set_through_fenced_redis_loses_no_update() {
    let run = run_partitioned_set_on(Store::FencedRedis, SetLocks::Sentinel);
    assert_busy(&run);
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}
