//! Semaphores and read-write locks under faults, recorded and checked by the independent checker:
//! several worker processes (this test binary started again), several threads each, take
//! permits of a semaphore of two and read or write grants of a read-write lock, hold them for
//! a while looking at `is_held()`, and release them. A nemesis freezes a holder process past its
//! lease (SIGSTOP), kills one (SIGKILL, and starts another in its place), and kills and restarts
//! the redis-server.
//!
//! With AOF (`appendfsync always`) every check must pass: never more than two permits held,
//! never a writer beside another holder, tokens rising. Then each check is shown to bite on the
//! same history, edited: three holds stretched to the end of the run (more holders than
//! permits), a write's hold stretched (a writer beside later holders), a late grant's token set
//! to zero (a token going back). Without persistence a restart loses the grants: tokens still
//! rise (the clock floor), while holders that have not yet learnt of the loss may overlap new
//! ones, which is counted, not forbidden.
//!
//! Longer: `FENCELOCK_HISTORY_SECS=60 cargo test --release --test history -- --nocapture shared_`
//! (`FENCELOCK_HISTORY_SEED`, `FENCELOCK_HISTORY_DIR` as for the locked set).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, Permit, ReadGuard, WriteGuard};

use super::{check, Verdict, Worker};
use crate::recorder::{monotonic_ns, outcome_of, Event, Recorder, Type};
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::{ms, unique_temp_dir, RedisServer, Rng, NAMESPACE};

const WORKER_ENV: &str = "FENCELOCK_SHARED_WORKER";
const LEASE_MS: u64 = 300;
const PROCESSES: usize = 3;
const THREADS: usize = 3;
/// The semaphore's name and count, and the read-write lock's name.
const SEMAPHORE: &str = "s0";
const PERMITS: u32 = 2;
const RW: &str = "rw0";
/// One grant of the read-write lock in this many is a write.
const WRITE_ONE_IN: u64 = 4;
const SHORT_RUN: Duration = Duration::from_secs(10);

/// The nemesis's faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP of a worker for four leases, right after one of its threads was granted.
    PauseHolder,
    /// SIGKILL of a worker right after one of its threads was granted; another takes its place.
    KillHolder,
    /// SIGKILL of the redis-server and a restart on the same port and dir.
    RestartServer,
    /// On Sentinel: `SENTINEL FAILOVER`, then waiting until the set has settled.
    Failover,
}

/// Where the workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deployment {
    /// One redis-server, with AOF (`appendfsync always`) or without persistence.
    Single { persistence: bool },
    /// A master, a replica (both with AOF) and three sentinels.
    Sentinel,
}

/// What a run gave.
struct Run {
    verdict: Verdict,
    dir: PathBuf,
    keep: bool,
    pauses: u64,
    kills: u64,
    restarts: u64,
    failovers: u64,
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if thread::panicking() {
            eprintln!("the history stays in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn run_seconds() -> u64 {
    std::env::var("FENCELOCK_HISTORY_SECS")
        .ok()
        .map(|s| s.parse().expect("FENCELOCK_HISTORY_SECS: whole seconds"))
        .unwrap_or(SHORT_RUN.as_secs())
}

/// Runs the workload on `deployment` under `faults`, in turn, then the checker.
fn run_shared(name: &str, deployment: Deployment, faults: &[Fault]) -> Run {
    let secs = run_seconds();
    let duration = Duration::from_secs(secs);
    let seed: u64 = std::env::var("FENCELOCK_HISTORY_SEED")
        .ok()
        .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("a hex seed"))
        .unwrap_or_else(|| monotonic_ns() | 1);
    let keep = std::env::var("FENCELOCK_HISTORY_DIR")
        .ok()
        .map(PathBuf::from);
    let dir = match &keep {
        Some(base) => {
            let dir = base.join(format!("{name}-{seed:x}"));
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            dir
        }
        None => unique_temp_dir(&format!("fencelock-history-{name}")),
    };
    println!(
        "{name}: {secs} s, seed {seed:x}, faults {faults:?}, {deployment:?}, history in {}",
        dir.display()
    );
    const AOF: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];
    let (mut server, set) = match deployment {
        Deployment::Single { persistence: true } => (Some(RedisServer::start_with(&AOF)), None),
        Deployment::Single { persistence: false } => (Some(RedisServer::start()), None),
        Deployment::Sentinel => (None, Some(SentinelSet::start_with(1, &AOF))),
    };
    let parent = Recorder::create(&dir.join("test.jsonl"));
    // The same port across restarts; the sentinels' addresses across failovers.
    let url = match (&server, &set) {
        (Some(server), _) => server.url(),
        (_, Some(set)) => format!("redis+sentinel://{}/{MASTER_NAME}", set.sentinel_hosts()),
        _ => unreachable!("a deployment"),
    };
    let env = |_: usize| -> Vec<(&str, String)> {
        vec![
            ("REDIS_URL", url.clone()),
            ("FENCELOCK_SHARED_DIR", dir.display().to_string()),
            ("FENCELOCK_SHARED_SEED", format!("{seed:x}")),
            ("FENCELOCK_SHARED_LIMIT", (secs * 3 + 60).to_string()),
        ]
    };
    let spawn = |index: usize| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = std::process::Command::new(exe);
        cmd.env(WORKER_ENV, index.to_string());
        Worker::spawn_as_test("shared::shared_worker", &env(index), cmd)
    };
    let mut workers: Vec<Worker> = (0..PROCESSES).map(spawn).collect();
    let mut next_index = PROCESSES;

    let mut rng = Rng(seed);
    let lease = ms(LEASE_MS);
    let started = Instant::now();
    let (mut pauses, mut kills, mut restarts, mut failovers) = (0u64, 0u64, 0u64, 0u64);
    let mut n = 0;
    // A short run goes on (up to three times its time) until each fault bit at least once.
    let missing = |p: u64, k: u64, r: u64, f: u64| {
        faults.iter().any(|fault| match fault {
            Fault::PauseHolder => p == 0,
            Fault::KillHolder => k == 0,
            Fault::RestartServer => r == 0,
            Fault::Failover => f == 0,
        })
    };
    while started.elapsed() < duration
        || (missing(pauses, kills, restarts, failovers) && started.elapsed() < duration * 3)
    {
        thread::sleep(lease * 2 + ms(rng.below(LEASE_MS)));
        if faults.is_empty() {
            continue;
        }
        let fault = faults[n % faults.len()];
        n += 1;
        match fault {
            Fault::PauseHolder | Fault::KillHolder => {
                let target = rng.below(workers.len() as u64) as usize;
                if !await_grant(&workers[target], lease * 4) {
                    continue;
                }
                if fault == Fault::PauseHolder {
                    let pause = lease * 4;
                    parent.record(
                        &Event::new("nemesis", Type::Invoke, "pause-client", None)
                            .value(pause.as_millis() as i64)
                            .target(&format!("worker {target}")),
                    );
                    workers[target].signal(libc::SIGSTOP);
                    thread::sleep(pause);
                    workers[target].signal(libc::SIGCONT);
                    parent.record(&Event::new("nemesis", Type::Ok, "pause-client", None));
                    pauses += 1;
                } else {
                    parent.record(
                        &Event::new("nemesis", Type::Invoke, "kill-client", None)
                            .target(&format!("worker {target}")),
                    );
                    // Dropping it kills and reaps it; another takes its place.
                    let replacement = spawn(next_index);
                    next_index += 1;
                    drop(std::mem::replace(&mut workers[target], replacement));
                    parent.record(&Event::new("nemesis", Type::Ok, "kill-client", None));
                    kills += 1;
                }
            }
            Fault::RestartServer => {
                let server = server.as_mut().expect("one server to restart");
                parent.record(&Event::new("nemesis", Type::Invoke, "restart-server", None));
                server.kill();
                thread::sleep(lease / 2);
                server.restart();
                parent.record(&Event::new("nemesis", Type::Ok, "restart-server", None));
                restarts += 1;
            }
            Fault::Failover => {
                let set = set.as_ref().expect("a Sentinel set to fail over");
                parent.record(&Event::new("nemesis", Type::Invoke, "failover", None));
                set.failover();
                parent.record(&Event::new("nemesis", Type::Ok, "failover", None));
                failovers += 1;
                // The old master rejoins as a replica before the next failover can pick it.
                set.wait_settled(Duration::from_secs(30));
            }
        }
    }
    for (i, worker) in workers.iter_mut().enumerate() {
        worker.signal(libc::SIGCONT);
        if let Err(e) = worker.finish(Duration::from_secs(30)) {
            panic!("worker {i}: {e}");
        }
    }
    let verdict = check(&dir);
    println!("{}", verdict.output);
    println!("pauses {pauses}, kills {kills}, restarts {restarts}, failovers {failovers}");
    drop((server, set));
    Run {
        verdict,
        dir,
        keep: keep.is_some(),
        pauses,
        kills,
        restarts,
        failovers,
    }
}

/// Waits up to `wait` for a line saying one of the worker's threads was just granted.
fn await_grant(worker: &Worker, wait: Duration) -> bool {
    while worker.lines.try_recv().is_ok() {}
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match worker.lines.recv_timeout(left) {
            Ok(line) if line.starts_with("held ") => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

// ---------------------------------------------------------------------------
// Editing a recorded history (the broken variants)
// ---------------------------------------------------------------------------

/// The value of the integer field `name` of a recorder line.
fn int_field(line: &str, name: &str) -> Option<i64> {
    let at = line.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = &line[at..];
    let end = rest
        .find(|c: char| c != '-' && !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The value of the string field `name` (the recorder's names and modes need no escapes).
fn str_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let rest = &line[at..];
    Some(&rest[..rest.find('"')?])
}

fn set_int_field(line: &str, name: &str, value: i64) -> String {
    let old = int_field(line, name).expect("the field to edit");
    line.replacen(
        &format!("\"{name}\":{old}"),
        &format!("\"{name}\":{value}"),
        1,
    )
}

/// The history's lines, file by file.
fn history_files(dir: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the history directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a history file");
            (p, text.lines().map(str::to_owned).collect())
        })
        .collect()
}

/// The history of `run`, edited by `edit` (which gets every line with its file's index and the
/// latest time of the history, and returns the line to write), checked again.
fn edited(run: &Run, mut edit: impl FnMut(usize, &str, i64) -> String) -> Verdict {
    let files = history_files(&run.dir);
    let end = files
        .iter()
        .flat_map(|(_, lines)| lines.iter().filter_map(|l| int_field(l, "time")))
        .max()
        .expect("a history with lines");
    let out = unique_temp_dir("fencelock-history-edited");
    for (i, (path, lines)) in files.iter().enumerate() {
        let text: String = lines.iter().map(|l| edit(i, l, end) + "\n").collect();
        std::fs::write(out.join(path.file_name().expect("a file name")), text)
            .expect("writing the edited history");
    }
    let verdict = check(&out);
    let _ = std::fs::remove_dir_all(&out);
    verdict
}

/// The release invocations (file index, line) that end a hold of `key` taken as `mode` (`None`:
/// any), in the order of their `last_held`.
fn releases_of(run: &Run, key: &str, mode: Option<&str>) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, (_, lines)) in history_files(&run.dir).into_iter().enumerate() {
        let mut granted: std::collections::HashMap<String, Option<String>> = Default::default();
        for l in lines {
            let (Some(process), Some(kind), Some(f)) = (
                str_field(&l, "process"),
                str_field(&l, "type"),
                str_field(&l, "f"),
            ) else {
                continue;
            };
            if str_field(&l, "key") != Some(key) {
                continue;
            }
            if f == "acquire" && kind == "ok" {
                granted.insert(process.to_owned(), str_field(&l, "mode").map(str::to_owned));
            } else if f == "release" && kind == "invoke" {
                if let Some(m) = granted.remove(process) {
                    if mode.is_none() || m.as_deref() == mode {
                        found.push((i, l));
                    }
                }
            }
        }
    }
    found.sort_by_key(|(_, l)| int_field(l, "last_held"));
    found
}

/// Each check bites on the run's own history, edited.
fn assert_checks_bite(run: &Run) {
    // More holders than permits: the first three holds of the semaphore seen through to a
    // release, stretched to the end of the run, all hold at the third one's grant.
    let stretch: Vec<(usize, String)> = releases_of(run, SEMAPHORE, None)
        .into_iter()
        .take(PERMITS as usize + 1)
        .collect();
    assert_eq!(
        stretch.len(),
        PERMITS as usize + 1,
        "too few semaphore holds"
    );
    let v = edited(run, |i, l, end| {
        if stretch.iter().any(|(j, s)| *j == i && s == l) {
            set_int_field(l, "last_held", end)
        } else {
            l.to_owned()
        }
    });
    assert!(
        v.count("semaphore_violations") >= 1,
        "three holds stretched to the end, and no semaphore violation:\n{}",
        v.output
    );

    // A writer beside later holders: the first write seen through to a release, stretched.
    let write = releases_of(run, RW, Some("write"))
        .into_iter()
        .next()
        .expect("a write released");
    let v = edited(run, |i, l, end| {
        if i == write.0 && l == write.1 {
            set_int_field(l, "last_held", end)
        } else {
            l.to_owned()
        }
    });
    assert!(
        v.count("rw_violations") >= 1,
        "a write stretched to the end, and no read-write violation:\n{}",
        v.output
    );

    assert_token_check_bites(run);
}

/// The token check bites on the run's own history, edited: the latest grant of each key gets
/// token 0.
fn assert_token_check_bites(run: &Run) {
    for key in [SEMAPHORE, RW] {
        let mut latest: Option<(usize, String)> = None;
        for (i, (_, lines)) in history_files(&run.dir).into_iter().enumerate() {
            for l in lines {
                if str_field(&l, "key") == Some(key)
                    && str_field(&l, "f") == Some("acquire")
                    && str_field(&l, "type") == Some("ok")
                    && latest
                        .as_ref()
                        .is_none_or(|(_, m)| int_field(&l, "time") > int_field(m, "time"))
                {
                    latest = Some((i, l));
                }
            }
        }
        let (j, last) = latest.expect("a grant");
        let v = edited(run, |i, l, _| {
            if i == j && l == last {
                set_int_field(l, "token", 0)
            } else {
                l.to_owned()
            }
        });
        assert!(
            v.count("token_regressions") >= 1,
            "the last grant of {key} given token 0, and no regression:\n{}",
            v.output
        );
    }
}

/// Lines of the history of `kind` `f` (`"fail"`, `"release"`), counted.
fn count_lines(run: &Run, kind: &str, f: &str) -> usize {
    history_files(&run.dir)
        .iter()
        .flat_map(|(_, lines)| lines.iter())
        .filter(|l| str_field(l, "type") == Some(kind) && str_field(l, "f") == Some(f))
        .count()
}

#[test]
fn shared_grants_hold_under_holder_pauses_kills_and_restarts_with_aof() {
    let run = run_shared(
        "shared-aof",
        Deployment::Single { persistence: true },
        &[Fault::PauseHolder, Fault::KillHolder, Fault::RestartServer],
    );
    let v = &run.verdict;
    assert!(v.count("grants") >= 40, "too few grants:\n{}", v.output);
    assert!(
        run.pauses >= 1 && run.kills >= 1 && run.restarts >= 1,
        "a fault never bit: {} pauses, {} kills, {} restarts\n{}",
        run.pauses,
        run.kills,
        run.restarts,
        v.output
    );
    // A holder frozen past its lease was told, on waking, that its grant was gone.
    assert!(
        count_lines(&run, "fail", "release") >= 1,
        "no release refused as lost after {} pauses:\n{}",
        run.pauses,
        v.output
    );
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(
        (
            v.count("semaphore_violations"),
            v.count("rw_violations"),
            v.count("token_regressions")
        ),
        (0, 0, 0),
        "{}",
        v.output
    );
    assert_checks_bite(&run);
}

#[test]
fn shared_grants_without_persistence_a_restart_keeps_tokens_rising() {
    let run = run_shared(
        "shared-empty-restart",
        Deployment::Single { persistence: false },
        &[Fault::RestartServer],
    );
    let v = &run.verdict;
    assert!(v.count("grants") >= 40, "too few grants:\n{}", v.output);
    assert!(run.restarts >= 2, "{} restarts\n{}", run.restarts, v.output);
    // The restart forgets every grant: its holders learn of it at their next renewal, and until
    // then may hold beside new grants (counted, printed above, not forbidden). Tokens rise.
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert_ne!(v.code, 2, "{}", v.output);
    assert_token_check_bites(&run);
}

/// On Sentinel, across coordinated failovers (and a holder frozen past its lease between them):
/// tokens rise (each grant's counter write replicated, the clock floor for what was not). For a
/// moment after a failover the old master still grants while clients that already follow the
/// new one are granted there (docs/design.md, "Running on Sentinel"): holds beside each other
/// are counted, not forbidden, as for locks.
#[test]
fn shared_grants_on_sentinel_across_failovers_keep_tokens_rising() {
    let run = run_shared(
        "shared-sentinel",
        Deployment::Sentinel,
        &[Fault::Failover, Fault::PauseHolder],
    );
    let v = &run.verdict;
    assert!(v.count("grants") >= 40, "too few grants:\n{}", v.output);
    assert!(run.failovers >= 1, "no failover\n{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert_ne!(v.code, 2, "{}", v.output);
    assert_token_check_bites(&run);
}

// ---------------------------------------------------------------------------
// The worker process
// ---------------------------------------------------------------------------

/// A grant a worker thread holds.
enum Held {
    Permit(Permit),
    Read(ReadGuard),
    Write(WriteGuard),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Permit(p) => p.token().as_u64(),
            Held::Read(g) => g.token().as_u64(),
            Held::Write(g) => g.token().as_u64(),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Held::Permit(p) => p.is_held(),
            Held::Read(g) => g.is_held(),
            Held::Write(g) => g.is_held(),
        }
    }

    fn release(self) -> Result<(), fencelock::Error> {
        match self {
            Held::Permit(p) => p.release(),
            Held::Read(g) => g.unlock(),
            Held::Write(g) => g.unlock(),
        }
    }
}

/// The body of a worker process (a no-op in an ordinary test run): `THREADS` threads of one
/// client taking permits and read-write grants until stdin closes.
#[test]
fn shared_worker() {
    let Ok(index) = std::env::var(WORKER_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let url = var("REDIS_URL");
    let dir = PathBuf::from(var("FENCELOCK_SHARED_DIR"));
    let seed = u64::from_str_radix(&var("FENCELOCK_SHARED_SEED"), 16).expect("a hex seed");
    let limit = Duration::from_secs(var("FENCELOCK_SHARED_LIMIT").parse().expect("seconds"));
    let index: u64 = index.parse().expect("a worker index");
    let recorder = Arc::new(Recorder::create(&dir.join(format!("client-{index}.jsonl"))));
    let client = LockClient::builder(url)
        .namespace(NAMESPACE)
        .lease(ms(LEASE_MS))
        .response_timeout(ms(LEASE_MS))
        .connection_timeout(ms(LEASE_MS))
        .build()
        .expect("a client");
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
            let process = format!("c{index}t{t}");
            let recorder = Arc::clone(&recorder);
            let client = client.clone();
            let stop = Arc::clone(&stop);
            let mut rng =
                Rng(seed ^ (index * 1000 + t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    hold_once(&process, &recorder, &client, &mut rng);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a holder thread panicked");
    }
}

/// One grant of the semaphore or the read-write lock (a coin decides), held for up to half a
/// lease while looking at `is_held()` every 5 ms, then released.
fn hold_once(process: &str, recorder: &Recorder, client: &LockClient, rng: &mut Rng) {
    let wait = ms(LEASE_MS * 3);
    let (key, mode) = if rng.below(2) == 0 {
        (SEMAPHORE, None)
    } else if rng.below(WRITE_ONE_IN) == 0 {
        (RW, Some("write"))
    } else {
        (RW, Some("read"))
    };
    // Every acquire line says what it takes.
    let tag = |e: Event| match mode {
        None => e.permits(PERMITS),
        Some(m) => e.mode(m),
    };
    recorder.record(&tag(Event::new(
        process,
        Type::Invoke,
        "acquire",
        Some(key),
    )));
    let taken = match mode {
        None => client
            .semaphore(SEMAPHORE, PERMITS)
            .and_then(|s| s.try_acquire(wait))
            .map(|p| p.map(Held::Permit)),
        Some("write") => client.try_write_lock(RW, wait).map(|g| g.map(Held::Write)),
        Some(_) => client.try_read_lock(RW, wait).map(|g| g.map(Held::Read)),
    };
    let held = match taken {
        Ok(Some(held)) => held,
        Ok(None) => {
            recorder.record(&tag(Event::new(process, Type::Fail, "acquire", Some(key))));
            return;
        }
        Err(e) => {
            recorder.record(&tag(Event::new(
                process,
                outcome_of(&e),
                "acquire",
                Some(key),
            )
            .error(&e)));
            thread::sleep(ms(20));
            return;
        }
    };
    let granted = tag(Event::new(process, Type::Ok, "acquire", Some(key))).token(held.token());
    let mut last_held = granted.time;
    recorder.record(&granted);
    // Tell the nemesis: a pause or a kill now falls within the hold.
    println!("held {process} {key}");
    let until = Instant::now() + ms(rng.below(LEASE_MS / 2 + 1));
    loop {
        let now = monotonic_ns();
        if held.is_held() {
            last_held = now;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        thread::sleep(ms(5).min(left));
    }
    recorder.record(&Event::new(process, Type::Invoke, "release", Some(key)).last_held(last_held));
    let released = match held.release() {
        Ok(()) => Event::new(process, Type::Ok, "release", Some(key)),
        Err(e) if e.is_lock_lost() => {
            Event::new(process, Type::Fail, "release", Some(key)).error(&e)
        }
        Err(e) => Event::new(process, outcome_of(&e), "release", Some(key)).error(&e),
    };
    recorder.record(&released);
}
