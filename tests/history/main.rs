//! Recorded histories checked by an independent checker (`tests/checker/check.py`, Python,
//! sharing no code with fencelock): mutual exclusion in the manner of Jepsen's mutex model,
//! fencing tokens that rise in the order the holds happened, and the lost updates of a
//! locked-set workload, without a fence, through `FencedRedis` and through PostgreSQL.
//!
//! The checker is first shown to fail on crafted histories (an overlap, a token that goes back,
//! a lost update). Then client processes (this test binary started again as a worker) hold
//! locks on one redis-server and read-modify-write a counter under them, while a nemesis
//! freezes client processes past their lease and the server for less and more than a lease.
//! Without a fence, updates are lost (the canary: the nemesis bites); with one, none are.
//!
//! `partition.rs` does the same under network partitions (Linux network namespaces, root):
//! a holder cut from its server, a quorum split, a Sentinel master cut from its replicas and
//! sentinels, and the locked set with a holder cut from the lock's server.
//!
//! `models.rs` shows the checker's semaphore and read-write models failing on crafted histories;
//! `shared.rs` records semaphores and read-write locks held by worker processes while a nemesis
//! freezes and kills holders, restarts the server (with and without AOF) and fails Sentinel over.
//!
//! A longer run: `FENCELOCK_HISTORY_SECS=120 cargo test --release --test history -- --nocapture
//! locked_set`, with `FENCELOCK_HISTORY_SEED` to repeat a seed (printed),
//! `FENCELOCK_HISTORY_NEMESIS` to choose faults (`none`, or some of `pause-client`,
//! `pause-server-short`, `pause-server-long`, comma-separated; all three by default) and
//! `FENCELOCK_HISTORY_DIR` to keep the history files (docs/reliability.md). The same variables
//! (but the nemesis) lengthen the partitioned locked set: `-- partitioned_set`.
//!
//! Needs python3 and PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`).

#[path = "../support/recorder.rs"]
mod recorder;
#[path = "../support/mod.rs"]
mod support;

// Network namespaces need root: a feature of their own, so that a plain `cargo test` runs
// anywhere (CI runs `--all-features`).
#[cfg(all(target_os = "linux", feature = "partition-tests"))]
mod partition;

mod models;
mod shared;
// The locked set on every deployment under clock faults, crashes and client faults.
mod deployments;
// A holder's CPU throttled by a cgroup quota: root, so under the same feature.
#[cfg(all(target_os = "linux", feature = "partition-tests"))]
mod throttle;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use fencelock::{FencedRedis, LockClient, LockGuard};

use recorder::{monotonic_ns, outcome_of, Event, Recorder, Type};
use support::{database_url, ms, unique_temp_dir, RedisServer, Rng, NAMESPACE};

const PYTHON_HINT: &str = "the history checker needs python3 (standard library only): \
     `sudo apt-get install -y python3` on Debian/Ubuntu, `brew install python` on macOS";

// ---------------------------------------------------------------------------
// Running the checker
// ---------------------------------------------------------------------------

/// What the checker said about a history.
struct Verdict {
    /// Exit code: 0 clean, 1 violations, 2 malformed.
    code: i32,
    output: String,
    /// The `summary` line's counts.
    counts: BTreeMap<String, u64>,
}

impl Verdict {
    fn count(&self, name: &str) -> u64 {
        *self
            .counts
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in the checker's summary:\n{}", self.output))
    }
}

fn checker_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/checker/check.py")
}

/// Runs the checker on the history files in `dir`.
fn check(dir: &Path) -> Verdict {
    let output = Command::new("python3")
        .arg(checker_script())
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3: {e}\n{PYTHON_HINT}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let code = output
        .status
        .code()
        .unwrap_or_else(|| panic!("the checker died: {}\n{text}", output.status));
    let mut counts = BTreeMap::new();
    if let Some(line) = text.lines().find(|l| l.starts_with("summary ")) {
        for field in line["summary ".len()..].split_whitespace() {
            if let Some((name, value)) = field.split_once('=') {
                if let Ok(n) = value.parse() {
                    counts.insert(name.to_owned(), n);
                }
            }
        }
    }
    Verdict {
        code,
        output: text,
        counts,
    }
}

// ---------------------------------------------------------------------------
// The checker fails on crafted histories, and passes a clean one with unknowns
// ---------------------------------------------------------------------------

/// Milliseconds as the recorder's nanoseconds, from an arbitrary origin.
fn at(ms: u64) -> u64 {
    1_000_000_000 + ms * 1_000_000
}

/// A crafted history: `lines` written to one file of a fresh directory.
struct Crafted {
    dir: PathBuf,
    recorder: Recorder,
}

impl Crafted {
    fn new() -> Crafted {
        let dir = unique_temp_dir("fencelock-history-crafted");
        let recorder = Recorder::create(&dir.join("crafted.jsonl"));
        Crafted { dir, recorder }
    }

    /// A hold of `key` by `process`: acquire invoked at `inv`, granted `token` at `ok`, seen
    /// held last at `held`, released at `held + 1`.
    fn hold(&self, process: &str, key: &str, token: u64, inv: u64, ok: u64, held: u64) {
        let r = &self.recorder;
        r.record(&Event::new(process, Type::Invoke, "acquire", Some(key)).at(at(inv)));
        r.record(
            &Event::new(process, Type::Ok, "acquire", Some(key))
                .at(at(ok))
                .token(token),
        );
        r.record(
            &Event::new(process, Type::Invoke, "release", Some(key))
                .at(at(held))
                .last_held(at(held)),
        );
        r.record(&Event::new(process, Type::Ok, "release", Some(key)).at(at(held + 1)));
    }

    /// An increment of `key` by `process` between `inv` and `end` that read `read`, with the
    /// outcome `kind` (ok: it wrote `read + 1`).
    fn incr(&self, process: &str, key: &str, inv: u64, end: u64, read: i64, kind: Type) {
        let r = &self.recorder;
        r.record(&Event::new(process, Type::Invoke, "incr", Some(key)).at(at(inv)));
        let mut done = Event::new(process, kind, "incr", Some(key)).at(at(end));
        if kind == Type::Ok {
            done = done.read(read).value(read + 1);
        }
        r.record(&done);
    }

    fn read(&self, key: &str, time: u64, value: i64) {
        let r = &self.recorder;
        r.record(&Event::new("final", Type::Invoke, "read", Some(key)).at(at(time)));
        r.record(
            &Event::new("final", Type::Ok, "read", Some(key))
                .at(at(time + 1))
                .value(value),
        );
    }

    fn check(self) -> Verdict {
        let verdict = check(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
        verdict
    }
}

#[test]
fn the_checker_passes_a_clean_history_with_unknown_outcomes_either_way() {
    let h = Crafted::new();
    h.read("k", 0, 0);
    h.hold("a", "k", 1, 10, 12, 30);
    h.incr("a", "k", 13, 29, 0, Type::Ok);
    // An acquire whose reply never came: it may have been granted, unseen, meanwhile.
    h.recorder
        .record(&Event::new("b", Type::Invoke, "acquire", Some("k")).at(at(20)));
    h.recorder.record(
        &Event::new("b", Type::Unknown, "acquire", Some("k"))
            .at(at(60))
            .error("timed out"),
    );
    h.hold("c", "k", 3, 25, 40, 55);
    // An increment whose write timed out (applied, as it happens) and a refused one.
    h.incr("c", "k", 41, 54, 1, Type::Unknown);
    h.hold("a", "k", 4, 56, 57, 70);
    h.incr("a", "k", 58, 69, 2, Type::Ok);
    h.incr("a", "k", 58, 69, 3, Type::Fail);
    // A hold on another key overlapping them is no violation.
    h.hold("d", "other", 1, 10, 11, 80);
    h.read("k", 100, 3);
    let v = h.check();
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(
        (
            v.count("grants"),
            v.count("unknown"),
            v.count("mutex_violations")
        ),
        (4, 2, 0),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_reports_two_holds_that_overlap() {
    let h = Crafted::new();
    h.hold("a", "k", 1, 0, 1, 50);
    // Granted while a still saw its lock held, and with a higher token: only the mutex fails.
    h.hold("b", "k", 2, 5, 40, 60);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(v.count("mutex_violations"), 1, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert!(
        v.output.contains("a holds it [0.001s .. 0.050s]"),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_reports_a_token_that_goes_back() {
    let h = Crafted::new();
    h.hold("a", "k", 7, 0, 1, 20);
    h.hold("b", "k", 8, 2, 21, 40);
    // Granted after both ended, with a token below b's.
    h.hold("c", "k", 8, 30, 41, 60);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 1, "{}", v.output);
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert!(v.output.contains("c is granted token 8"), "{}", v.output);
}

#[test]
fn the_checker_reports_a_lost_update() {
    let h = Crafted::new();
    h.read("k", 0, 0);
    // a reads 0, b reads 0 after a's hold ended (a was paused), both write 1: one is lost.
    h.hold("a", "k", 1, 1, 2, 10);
    h.incr("a", "k", 3, 50, 0, Type::Ok);
    h.hold("b", "k", 2, 11, 20, 40);
    h.incr("b", "k", 21, 39, 0, Type::Ok);
    h.hold("c", "k", 3, 41, 60, 80);
    h.incr("c", "k", 61, 79, 1, Type::Ok);
    h.read("k", 100, 2);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(v.count("lost_updates"), 1, "{}", v.output);
    assert_eq!(
        (v.count("mutex_violations"), v.count("token_regressions")),
        (0, 0),
        "{}",
        v.output
    );
    assert!(
        v.output
            .contains("3 increments succeeded but the value rose by 2"),
        "{}",
        v.output
    );
    assert!(
        v.output.contains("2 successful increments all wrote 1"),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_rejects_a_malformed_history() {
    let h = Crafted::new();
    h.recorder
        .record(&Event::new("a", Type::Ok, "acquire", Some("k")).token(1));
    let v = h.check();
    assert_eq!(v.code, 2, "{}", v.output);
    assert!(v.output.contains("did not invoke"), "{}", v.output);
}

// ---------------------------------------------------------------------------
// The locked-set workload
// ---------------------------------------------------------------------------

/// Where each increment's counter lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    /// A plain GET and SET on a Redis key: no fence.
    Unfenced,
    /// `FencedRedis`: claim, get, set with the token.
    FencedRedis,
    /// A PostgreSQL row with a `fence` column: claim, select, update with the token condition.
    Postgres,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Unfenced => "unfenced",
            Store::FencedRedis => "fenced-redis",
            Store::Postgres => "postgres",
        }
    }

    fn parse(name: &str) -> Store {
        match name {
            "unfenced" => Store::Unfenced,
            "fenced-redis" => Store::FencedRedis,
            "postgres" => Store::Postgres,
            other => panic!("unknown store {other:?}"),
        }
    }
}

const WORKER_ENV: &str = "FENCELOCK_HISTORY_WORKER";
const LEASE_MS: u64 = 300;
const PROCESSES: usize = 3;
const THREADS: usize = 2;
const KEYS: usize = 2;
/// Client pauses a run makes at least, given twice its time.
const MIN_CLIENT_PAUSES: u64 = 3;
/// Per store, unless `FENCELOCK_HISTORY_SECS` says otherwise.
const SHORT_RUN: Duration = Duration::from_secs(8);

fn key_name(i: usize) -> String {
    format!("k{i}")
}

/// The unfenced counter of `key`.
fn counter_key(key: &str) -> String {
    format!("{NAMESPACE}:counter:{key}")
}

fn pg_connect() -> postgres::Client {
    let url = database_url();
    postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
        let cause = std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
        panic!(
            "PostgreSQL is not reachable at {url}: {e}{cause}\n\
             This test needs it. Start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
             (`.ci/run` does, and installs it if missing), or set DATABASE_URL to one that runs."
        )
    })
}

/// A table of counters, one row per key, dropped on drop.
struct CounterTable {
    name: String,
}

impl CounterTable {
    fn create(db: &mut postgres::Client) -> CounterTable {
        let name = format!(
            "locked_set_{}_{}",
            std::process::id(),
            monotonic_ns() % 1_000_000
        );
        let mut sql = format!(
            "CREATE TABLE {name} (id text PRIMARY KEY, value bigint NOT NULL, \
             fence bigint NOT NULL DEFAULT 0);"
        );
        for k in 0..KEYS {
            sql.push_str(&format!(
                "INSERT INTO {name} (id, value) VALUES ('{}', 0);",
                key_name(k)
            ));
        }
        db.batch_execute(&sql)
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        CounterTable { name }
    }
}

impl Drop for CounterTable {
    fn drop(&mut self) {
        if let Ok(mut db) = postgres::Client::connect(&database_url(), postgres::NoTls) {
            let _ = db.batch_execute(&format!("DROP TABLE IF EXISTS {}", self.name));
        }
    }
}

/// The faults the nemesis injects: pauses (SIGSTOP, then SIGCONT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// SIGSTOP of a client process, for four leases, right after one of its threads read.
    Client,
    /// SIGSTOP of the server for a third of a lease.
    ServerShort,
    /// SIGSTOP of the server for two leases.
    ServerLong,
}

impl Pause {
    fn name(self) -> &'static str {
        match self {
            Pause::Client => "pause-client",
            Pause::ServerShort => "pause-server-short",
            Pause::ServerLong => "pause-server-long",
        }
    }
}

fn faults_from_env() -> Vec<Pause> {
    let spec = std::env::var("FENCELOCK_HISTORY_NEMESIS")
        .unwrap_or_else(|_| "pause-client,pause-server-short,pause-server-long".to_owned());
    if spec == "none" {
        return Vec::new();
    }
    spec.split(',')
        .map(|f| {
            [Pause::Client, Pause::ServerShort, Pause::ServerLong]
                .into_iter()
                .find(|p| p.name() == f.trim())
                .unwrap_or_else(|| panic!("FENCELOCK_HISTORY_NEMESIS: unknown fault {f:?}"))
        })
        .collect()
}

/// A worker process: this test binary running [`locked_set_worker`]. Its stdout lines arrive on
/// `lines`; closing its stdin stops it. SIGCONT, SIGKILL and reaped on drop.
struct Worker {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: Receiver<String>,
}

impl Worker {
    fn spawn(index: usize, env: &[(&str, String)]) -> Worker {
        let exe = std::env::current_exe().expect("the test binary's path");
        Worker::spawn_as(index, env, Command::new(exe))
    }

    /// [`Worker::spawn`], with `cmd` running the test binary (inside a network namespace, say).
    fn spawn_as(index: usize, env: &[(&str, String)], mut cmd: Command) -> Worker {
        cmd.env(WORKER_ENV, index.to_string());
        Worker::spawn_as_test("locked_set_worker", env, cmd)
    }

    /// `cmd`, the test binary, running only the test `test` (the body of a worker process).
    fn spawn_as_test(test: &str, env: &[(&str, String)], mut cmd: Command) -> Worker {
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .envs(env.iter().map(|(k, v)| (k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a worker ({test}): {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = crossbeam_channel::unbounded();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            child,
            stdin,
            lines,
        }
    }

    fn signal(&mut self, sig: libc::c_int) {
        if let Ok(None) = self.child.try_wait() {
            let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
            // SAFETY: kill(2) on the pid of our own unreaped child (try_wait says it runs), so
            // it names no other process; it touches no memory of ours.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Writes `line` to its stdin (the partition tests steer their workers so).
    #[cfg_attr(not(feature = "partition-tests"), allow(dead_code))]
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the worker's stdin is open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("writing to a worker: {e}"));
    }

    /// Waits up to `wait` for a line saying one of its threads just read a counter.
    fn await_read(&self, wait: Duration) -> bool {
        while self.lines.try_recv().is_ok() {}
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("read ") => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// Closes stdin and waits up to `limit` for a clean exit.
    fn finish(&mut self, limit: Duration) -> Result<(), String> {
        self.stdin.take();
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("worker exited with {status}")),
                Ok(None) if Instant::now() >= deadline => {
                    return Err(format!("worker still running after {limit:?}"))
                }
                Ok(None) => thread::sleep(ms(20)),
                Err(e) => return Err(format!("try_wait: {e}")),
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stdin.take();
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// What a run of the workload gave.
struct Run {
    verdict: Verdict,
    /// The faults the nemesis was given.
    faults: Vec<Pause>,
    client_pauses: u64,
    /// The history's temporary directory, removed on drop.
    dir: Option<PathBuf>,
}

/// Runs the locked-set workload on `store` against one redis-server under the nemesis, then the
/// checker on its history.
fn run_locked_set(store: Store) -> Run {
    let secs: u64 = std::env::var("FENCELOCK_HISTORY_SECS")
        .ok()
        .map(|s| s.parse().expect("FENCELOCK_HISTORY_SECS: whole seconds"))
        .unwrap_or(SHORT_RUN.as_secs());
    let duration = Duration::from_secs(secs);
    let seed: u64 = std::env::var("FENCELOCK_HISTORY_SEED")
        .ok()
        .map(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).expect("FENCELOCK_HISTORY_SEED: hexadecimal")
        })
        .unwrap_or_else(|| monotonic_ns() | 1);
    let faults = faults_from_env();
    let keep = std::env::var("FENCELOCK_HISTORY_DIR")
        .ok()
        .map(PathBuf::from);
    let dir = match &keep {
        Some(base) => {
            let names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
            let nemesis = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join("+")
            };
            let dir = base.join(format!("{}-{nemesis}-{seed:x}", store.name()));
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            dir
        }
        None => unique_temp_dir(&format!("fencelock-history-{}", store.name())),
    };
    let names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    println!(
        "locked set through {}: {secs} s, seed {seed:x}, faults {names:?}, history in {}",
        store.name(),
        dir.display()
    );

    let server = RedisServer::start();
    let mut db = (store == Store::Postgres).then(pg_connect);
    let table = db.as_mut().map(CounterTable::create);
    let parent = Recorder::create(&dir.join("test.jsonl"));
    let read_counters = |parent: &Recorder, db: &mut Option<postgres::Client>| {
        let fenced = FencedRedis::from(&support::lock_client(&server, LEASE_MS));
        let mut con = server.connection();
        for k in 0..KEYS {
            let key = key_name(k);
            parent.invoke("test", "read", &key);
            let value: i64 = match store {
                Store::Unfenced => redis::cmd("GET")
                    .arg(counter_key(&key))
                    .query::<Option<i64>>(&mut con)
                    .expect("GET counter")
                    .unwrap_or(0),
                Store::FencedRedis => fenced.get_i64(&key).expect("get counter").unwrap_or(0),
                Store::Postgres => db
                    .as_mut()
                    .expect("a database connection")
                    .query_one(
                        &format!(
                            "SELECT value FROM {} WHERE id = $1",
                            table.as_ref().expect("a table").name
                        ),
                        &[&key],
                    )
                    .expect("SELECT counter")
                    .get(0),
            };
            parent.record(&Event::new("test", Type::Ok, "read", Some(&key)).value(value));
        }
    };
    read_counters(&parent, &mut db);

    let env: Vec<(&str, String)> = vec![
        ("REDIS_URL", server.url()),
        ("FENCELOCK_HISTORY_STORE", store.name().to_owned()),
        ("FENCELOCK_HISTORY_FILE_DIR", dir.display().to_string()),
        ("FENCELOCK_HISTORY_SEED", format!("{seed:x}")),
        ("FENCELOCK_HISTORY_LIMIT", (secs + 60).to_string()),
        ("DATABASE_URL", database_url()),
        (
            "FENCELOCK_HISTORY_TABLE",
            table.as_ref().map_or_else(String::new, |t| t.name.clone()),
        ),
    ];
    let workers: Vec<Arc<Mutex<Worker>>> = (0..PROCESSES)
        .map(|i| Arc::new(Mutex::new(Worker::spawn(i, &env))))
        .collect();

    // The nemesis, on this thread, until the run's time is up.
    let mut rng = Rng(seed);
    let mut client_pauses = 0;
    let started = Instant::now();
    let lease = ms(LEASE_MS);
    let mut n = 0;
    // A short run goes on (up to twice its time) until it paused clients a few times: the
    // canary needs them to bite.
    let more_pauses = |pauses: u64| faults.contains(&Pause::Client) && pauses < MIN_CLIENT_PAUSES;
    while started.elapsed() < duration
        || (more_pauses(client_pauses) && started.elapsed() < duration * 2)
    {
        thread::sleep(lease * 2 + ms(rng.below(LEASE_MS)));
        if faults.is_empty() {
            continue;
        }
        let fault = faults[n % faults.len()];
        n += 1;
        match fault {
            Pause::Client => {
                let target = rng.below(PROCESSES as u64) as usize;
                let mut worker = workers[target].lock().unwrap();
                if !worker.await_read(lease * 4) {
                    continue; // none of its threads read meanwhile: no pause this time
                }
                let pause = lease * 4;
                parent.record(
                    &Event::new("nemesis", Type::Invoke, "pause-client", None)
                        .value(pause.as_millis() as i64)
                        .target(&format!("worker {target}")),
                );
                worker.signal(libc::SIGSTOP);
                thread::sleep(pause);
                worker.signal(libc::SIGCONT);
                parent.record(&Event::new("nemesis", Type::Ok, "pause-client", None));
                client_pauses += 1;
            }
            Pause::ServerShort | Pause::ServerLong => {
                let pause = if fault == Pause::ServerShort {
                    lease / 3
                } else {
                    lease * 2
                };
                parent.record(
                    &Event::new("nemesis", Type::Invoke, "pause-server", None)
                        .value(pause.as_millis() as i64),
                );
                server.pause();
                thread::sleep(pause);
                server.resume();
                parent.record(&Event::new("nemesis", Type::Ok, "pause-server", None));
            }
        }
    }

    for (i, worker) in workers.iter().enumerate() {
        let mut worker = worker.lock().unwrap();
        worker.signal(libc::SIGCONT);
        if let Err(e) = worker.finish(Duration::from_secs(30)) {
            panic!("worker {i}: {e}");
        }
    }
    read_counters(&parent, &mut db);
    drop(table);

    let verdict = check(&dir);
    println!("{}", verdict.output);
    Run {
        verdict,
        faults,
        client_pauses,
        dir: keep.is_none().then_some(dir),
    }
}

impl Drop for Run {
    /// Removes a temporary history, unless the test failed: then it stays for a look.
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            if thread::panicking() {
                eprintln!("the history stays in {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// The counts every run of the workload must reach to mean something.
fn assert_busy(run: &Run) {
    let v = &run.verdict;
    assert!(v.count("grants") >= 20, "too few grants:\n{}", v.output);
    assert!(
        v.count("increments") >= 10,
        "too few increments:\n{}",
        v.output
    );
    if run.faults.contains(&Pause::Client) {
        assert!(run.client_pauses >= 1, "no client pause:\n{}", v.output);
    }
}

#[test]
fn locked_set_without_a_fence_loses_updates_when_holders_pause() {
    let run = run_locked_set(Store::Unfenced);
    let v = &run.verdict;
    assert_busy(&run);
    // The lock itself held: no overlap among holds seen through is_held(), tokens rise...
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    // ...and yet updates were lost: the nemesis bites, so the fenced runs' zeros mean something.
    // (Without client pauses, as a longer run may choose, losses are counted, not required.)
    if !run.faults.contains(&Pause::Client) {
        return;
    }
    assert!(
        v.count("lost_updates") >= 1,
        "no update lost without a fence under {} client pauses: the nemesis did not bite\n{}",
        run.client_pauses,
        v.output
    );
}

#[test]
fn locked_set_through_fenced_redis_loses_no_update() {
    let run = run_locked_set(Store::FencedRedis);
    assert_busy(&run);
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}

#[test]
fn locked_set_through_postgres_loses_no_update() {
    let run = run_locked_set(Store::Postgres);
    assert_busy(&run);
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}

// ---------------------------------------------------------------------------
// The worker process
// ---------------------------------------------------------------------------

/// The body of a worker process (a no-op in an ordinary test run): `THREADS` threads of one
/// client taking locks on `KEYS` keys and incrementing the key's counter under each, until stdin
/// closes.
#[test]
fn locked_set_worker() {
    let Ok(index) = std::env::var(WORKER_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let store = Store::parse(&var("FENCELOCK_HISTORY_STORE"));
    let url = var("REDIS_URL");
    let seed = u64::from_str_radix(&var("FENCELOCK_HISTORY_SEED"), 16).expect("a hex seed");
    let limit = Duration::from_secs(var("FENCELOCK_HISTORY_LIMIT").parse().expect("seconds"));
    let dir = PathBuf::from(var("FENCELOCK_HISTORY_FILE_DIR"));
    let table = var("FENCELOCK_HISTORY_TABLE");
    let index: u64 = index.parse().expect("a worker index");
    // The counters' server: the lock's unless the test puts them elsewhere (a partition cuts a
    // holder from the lock's server, not from its data).
    let store_url = std::env::var("FENCELOCK_HISTORY_STORE_URL").unwrap_or_else(|_| url.clone());
    let work = std::env::var("FENCELOCK_HISTORY_WORK_MS").map_or(LEASE_MS, |w| {
        w.parse().expect("FENCELOCK_HISTORY_WORK_MS: milliseconds")
    });

    let recorder = Arc::new(Recorder::create(&dir.join(format!("client-{index}.jsonl"))));
    let client = LockClient::builder(url.clone())
        .namespace(NAMESPACE)
        .lease(ms(LEASE_MS))
        .response_timeout(ms(LEASE_MS))
        .connection_timeout(ms(LEASE_MS))
        .build()
        .expect("a client");
    hold_until_stopped(
        client, recorder, store, &store_url, work, table, index, seed, limit,
    );
}

/// The holders of one worker process: `THREADS` threads of `client` taking locks on `KEYS` keys
/// and incrementing the key's counter (on `store_url`, through `store`) under each, until stdin
/// closes or `limit` passes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn hold_until_stopped(
    client: LockClient,
    recorder: Arc<Recorder>,
    store: Store,
    store_url: &str,
    work: u64,
    table: String,
    index: u64,
    seed: u64,
    limit: Duration,
) {
    let fenced = FencedRedis::builder(store_url)
        .namespace(NAMESPACE)
        .response_timeout(ms(LEASE_MS))
        .connection_timeout(ms(LEASE_MS))
        .build()
        .expect("a store");
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let deadline = Instant::now() + limit;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let holder = Holder {
                process: format!("c{index}t{t}"),
                recorder: Arc::clone(&recorder),
                client: client.clone(),
                fenced: fenced.clone(),
                store,
                url: store_url.to_string(),
                work,
                table: table.clone(),
                rng: Rng(seed ^ (index * 1000 + t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                con: None,
                db: None,
            };
            let stop = Arc::clone(&stop);
            thread::spawn(move || holder.run(&stop, deadline))
        })
        .collect();
    for t in threads {
        t.join().expect("a holder thread panicked");
    }
}

/// One client thread of a worker.
struct Holder {
    process: String,
    recorder: Arc<Recorder>,
    client: LockClient,
    /// The counters' store when fenced through Redis.
    fenced: FencedRedis,
    store: Store,
    /// The counters' server (unfenced and FencedRedis).
    url: String,
    /// The longest "work" between a read and its write, in ms.
    work: u64,
    table: String,
    rng: Rng,
    /// The unfenced store's connection, made again after an error.
    con: Option<redis::Connection>,
    db: Option<postgres::Client>,
}

/// The outcome of one increment.
struct Incr {
    kind: Type,
    read: Option<i64>,
    error: Option<String>,
}

impl Incr {
    fn failed(kind: Type, error: impl std::fmt::Display) -> Incr {
        Incr {
            kind,
            read: None,
            error: Some(error.to_string()),
        }
    }
}

impl Holder {
    fn run(mut self, stop: &AtomicBool, deadline: Instant) {
        let keys: Vec<String> = (0..KEYS).map(key_name).collect();
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let key = keys[self.rng.below(KEYS as u64) as usize].clone();
            self.recorder.invoke(&self.process, "acquire", &key);
            let guard = match self.client.try_lock(&key, ms(LEASE_MS * 3)) {
                Ok(Some(guard)) => guard,
                Ok(None) => {
                    self.record(Event::new(&self.process, Type::Fail, "acquire", Some(&key)));
                    continue;
                }
                Err(e) => {
                    self.record(
                        Event::new(&self.process, outcome_of(&e), "acquire", Some(&key)).error(&e),
                    );
                    thread::sleep(ms(20));
                    continue;
                }
            };
            let granted = Event::new(&self.process, Type::Ok, "acquire", Some(&key))
                .token(guard.token().as_u64());
            let mut last_held = granted.time;
            self.record(granted);

            self.recorder.invoke(&self.process, "incr", &key);
            let incr = self.increment(&key, &guard, &mut last_held);
            let mut done = Event::new(&self.process, incr.kind, "incr", Some(&key));
            if let Some(read) = incr.read {
                done = done.read(read).value(read + 1);
            }
            if let Some(error) = incr.error {
                done = done.error(error);
            }
            self.record(done);

            observe(&guard, &mut last_held);
            self.record(
                Event::new(&self.process, Type::Invoke, "release", Some(&key)).last_held(last_held),
            );
            let released = match guard.unlock() {
                Ok(()) => Event::new(&self.process, Type::Ok, "release", Some(&key)),
                Err(e) if e.is_lock_lost() => {
                    Event::new(&self.process, Type::Fail, "release", Some(&key)).error(&e)
                }
                Err(e) => {
                    Event::new(&self.process, outcome_of(&e), "release", Some(&key)).error(&e)
                }
            };
            self.record(released);
        }
    }

    fn record(&self, event: Event) {
        self.recorder.record(&event);
    }

    /// Reads the key's counter, waits up to a lease (watching `is_held()`), and writes it back
    /// plus one, through the store; fenced stores claim the token before reading.
    fn increment(&mut self, key: &str, guard: &LockGuard, last_held: &mut u64) -> Incr {
        observe(guard, last_held);
        let token = guard.token();
        let fenced = self.fenced.clone();
        // Claim (fenced stores) and read. Nothing is written yet: an error is a failure.
        let read = match self.store {
            Store::Unfenced => self.redis_con().and_then(|con| {
                redis::cmd("GET")
                    .arg(counter_key(key))
                    .query::<Option<i64>>(con)
                    .map(|v| v.unwrap_or(0))
                    .map_err(|e| e.to_string())
            }),
            Store::FencedRedis => fenced
                .claim(key, token)
                .and_then(|()| fenced.get_i64(key))
                .map(|v| v.unwrap_or(0))
                .map_err(|e| e.to_string()),
            Store::Postgres => {
                let table = self.table.clone();
                let fence = token.as_i64().expect("a granted token fits a bigint");
                self.pg().and_then(|db| {
                    let claimed = db
                        .execute(
                            &format!("UPDATE {table} SET fence = $2 WHERE id = $1 AND fence <= $2"),
                            &[&key, &fence],
                        )
                        .map_err(|e| e.to_string())?;
                    if claimed == 0 {
                        return Err(format!("claim refused: a newer token than {fence} wrote"));
                    }
                    db.query_one(&format!("SELECT value FROM {table} WHERE id = $1"), &[&key])
                        .map(|row| row.get::<_, i64>(0))
                        .map_err(|e| e.to_string())
                })
            }
        };
        let value = match read {
            Ok(value) => value,
            Err(e) => {
                self.con = None;
                self.db = None;
                return Incr::failed(Type::Fail, e);
            }
        };
        // "Work" for up to a lease (or FENCELOCK_HISTORY_WORK_MS), looking at is_held() now and
        // then as a careful holder would, but writing anyway: a pause can fall after any check.
        let work_ms = self.rng.below(self.work + 1);
        // Tell the nemesis a read happened, and how long the work will take: a pause or a
        // partition now falls between the read and the write.
        let _ = writeln!(std::io::stdout(), "read {} {key} {work_ms}", self.process);
        let work = Instant::now() + ms(work_ms);
        while Instant::now() < work {
            observe(guard, last_held);
            thread::sleep(ms(5).min(work.saturating_duration_since(Instant::now())));
        }

        let written = value + 1;
        let outcome: Result<(), (Type, String)> = match self.store {
            Store::Unfenced => match self.redis_con() {
                Err(e) => Err((Type::Fail, e)),
                Ok(con) => redis::cmd("SET")
                    .arg(counter_key(key))
                    .arg(written)
                    .query::<()>(con)
                    .map_err(|e| {
                        let kind = if e.is_timeout() || e.is_io_error() || e.is_connection_dropped()
                        {
                            Type::Unknown
                        } else {
                            Type::Fail
                        };
                        (kind, e.to_string())
                    }),
            },
            Store::FencedRedis => fenced
                .set(key, token, written.to_string())
                .map_err(|e| (outcome_of(&e), e.to_string())),
            Store::Postgres => {
                let table = self.table.clone();
                let fence = token.as_i64().expect("a granted token fits a bigint");
                match self.pg() {
                    Err(e) => Err((Type::Fail, e)),
                    Ok(db) => match db.execute(
                        &format!(
                            "UPDATE {table} SET value = $3, fence = $2 \
                             WHERE id = $1 AND fence <= $2"
                        ),
                        &[&key, &fence, &written],
                    ) {
                        Ok(1) => Ok(()),
                        Ok(_) => Err((Type::Fail, format!("stale token {fence}: refused"))),
                        // The statement may have committed before the error.
                        Err(e) => Err((Type::Unknown, e.to_string())),
                    },
                }
            }
        };
        match outcome {
            Ok(()) => Incr {
                kind: Type::Ok,
                read: Some(value),
                error: None,
            },
            Err((kind, e)) => {
                self.con = None;
                self.db = None;
                Incr::failed(kind, e)
            }
        }
    }

    fn redis_con(&mut self) -> Result<&mut redis::Connection, String> {
        if self.con.is_none() {
            let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
            let con = client
                .get_connection_with_timeout(ms(LEASE_MS * 3))
                .map_err(|e| e.to_string())?;
            let timeout = Some(ms(LEASE_MS * 3));
            con.set_read_timeout(timeout).map_err(|e| e.to_string())?;
            con.set_write_timeout(timeout).map_err(|e| e.to_string())?;
            self.con = Some(con);
        }
        Ok(self.con.as_mut().expect("just made"))
    }

    fn pg(&mut self) -> Result<&mut postgres::Client, String> {
        if self.db.is_none() {
            let db = postgres::Client::connect(&database_url(), postgres::NoTls)
                .map_err(|e| e.to_string())?;
            self.db = Some(db);
        }
        Ok(self.db.as_mut().expect("just made"))
    }
}

/// Looks at `is_held()`; if true, `last_held` becomes the time taken just before the look (so
/// the recorded hold lies inside the real one).
fn observe(guard: &LockGuard, last_held: &mut u64) {
    let now = monotonic_ns();
    if guard.is_held() {
        *last_held = now;
    }
}
