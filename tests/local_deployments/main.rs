//! The try-it-locally scripts the README points to (`examples/local-sentinel/start.sh`,
//! `examples/local-cluster/start.sh`) start what they say, print a URL that fencelock takes as it
//! is, and stop everything they started. Each run's processes are stopped even when the test
//! fails: the scripts write their stop script before they start anything, in a temporary
//! directory this test owns.

#[path = "../support/mod.rs"]
mod support;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient};
use support::ms;

/// Bound on a script's start (each of its waits is bounded at 30 s; a start takes 5-10 s).
const START_LIMIT: Duration = Duration::from_secs(180);

/// A port range where `offsets` above a base are all free: below the ephemeral range (32768 and
/// up on Linux), where the other tests' servers get their ports, so nothing else takes them
/// between this check and the script's start. Each test searches its own `range`.
fn free_base(range: std::ops::Range<u16>, offsets: &[u16]) -> u16 {
    let span = range.end - range.start;
    let seed = (std::process::id() % u32::from(span)) as u16;
    for attempt in 0..span / 16 {
        let base = range.start + (seed + attempt * 16) % span;
        let free = offsets
            .iter()
            .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no free ports in {range:?} for offsets {offsets:?}");
}

/// One run of a start script, in a temporary directory of its own (`TMPDIR`). Dropped, it runs
/// every stop script there (the script writes it before it starts anything) and removes the
/// directory.
struct Deployment {
    tmp: PathBuf,
    url: String,
    stop: PathBuf,
}

impl Deployment {
    fn start(script: &str, base: u16) -> Deployment {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
        let tmp = support::unique_temp_dir("fencelock-try");
        let (out, err) = (tmp.join("start.out"), tmp.join("start.err"));
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(base.to_string())
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("bash {script:?}: {e}"));
        // From here on, a panic stops whatever the script started.
        let mut deployment = Deployment {
            tmp,
            url: String::new(),
            stop: PathBuf::new(),
        };
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > START_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{script:?} did not finish within {START_LIMIT:?}: {}",
                    fs::read_to_string(&err).unwrap_or_default()
                );
            }
            thread::sleep(ms(50));
        };
        let stdout = fs::read_to_string(&out).unwrap_or_default();
        let stderr = fs::read_to_string(&err).unwrap_or_default();
        assert!(
            status.success(),
            "{script:?} {base} failed ({status}):\n{stdout}\n{stderr}"
        );
        let field = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= line in the script's output:\n{stdout}"))
                .to_string()
        };
        deployment.url = field("FENCELOCK_URL");
        deployment.stop = PathBuf::from(field("FENCELOCK_STOP"));
        println!("{script:?} {base}: started in {:?}", started.elapsed());
        deployment
    }

    /// Runs the stop script the start printed.
    fn stop(&self) {
        let status = Command::new(&self.stop)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("{:?}: {e}", self.stop));
        assert!(status.success(), "{:?}: {status}", self.stop);
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        // Every run's directory under TMPDIR holds a stop script from before its first server.
        if let Ok(entries) = fs::read_dir(&self.tmp) {
            for entry in entries.flatten() {
                let stop = entry.path().join("stop");
                if stop.is_file() {
                    let _ = Command::new(&stop).stdin(Stdio::null()).status();
                }
            }
        }
        let _ = fs::remove_dir_all(&self.tmp);
    }
}

/// Takes and releases a lock through `url`, and writes with its token through a fenced store.
fn lock_and_release(url: &str) {
    let client = LockClient::builder(url)
        .namespace("first-try")
        .build()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let guard = client.lock("report").unwrap();
    assert!(guard.is_held());
    let store = FencedRedis::builder(url)
        .namespace("first-try")
        .build()
        .unwrap();
    store.set("report", guard.token(), b"done").unwrap();
    assert_eq!(store.get("report").unwrap().as_deref(), Some(&b"done"[..]));
    let first = guard.token();
    guard.unlock().unwrap();
    let again = client.try_lock("report", Duration::ZERO).unwrap().unwrap();
    assert!(again.token() > first);
    again.unlock().unwrap();
}

/// Whether anything still listens on 127.0.0.1:`port`.
fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), ms(500)).is_ok()
}

#[test]
fn the_local_sentinel_script_serves_locks_and_stops() {
    let offsets = [0, 1, 2, 10, 11, 12];
    let base = free_base(10_000..15_000, &offsets);
    let deployment = Deployment::start("examples/local-sentinel/start.sh", base);
    assert!(
        deployment.url.starts_with("redis+sentinel://127.0.0.1:"),
        "{}",
        deployment.url
    );
    lock_and_release(&deployment.url);
    deployment.stop();
    for o in offsets {
        assert!(!listening(base + o), "port {} still listens", base + o);
    }
}

#[test]
fn the_local_cluster_script_serves_locks_and_stops() {
    // Six nodes and their cluster bus ports, 10000 above each.
    let offsets: Vec<u16> = (0..6).chain(10_000..10_006).collect();
    let base = free_base(15_000..22_000, &offsets);
    let deployment = Deployment::start("examples/local-cluster/start.sh", base);
    assert!(
        deployment.url.starts_with("redis+cluster://127.0.0.1:"),
        "{}",
        deployment.url
    );
    lock_and_release(&deployment.url);
    deployment.stop();
    for o in offsets {
        assert!(!listening(base + o), "port {} still listens", base + o);
    }
}
