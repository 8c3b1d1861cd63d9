//! The `fencelock` command-line tool, end to end: the built binary against real redis-servers.
//! `run` passes the token and key to CMD and exits with CMD's status; a wait that times out
//! exits 75; a lock lost while CMD runs gets CMD SIGTERM (SIGKILL after the grace period) and
//! exits 76; signals to fencelock reach CMD; `status` shows held, free and waiters as text and
//! JSON; `release --force` lets a waiting `run` in; a wait on a terminal says what it waits for;
//! against a Redis that does not answer, `run --timeout` ends in time with exit 1, and `status`
//! and `release --force` within `--connect-timeout` and `--response-timeout`. `elect` gives CMD
//! the epoch and the election's name, runs candidates one after another with rising epochs,
//! hands over after a killed leader's lease, and treats a lost leadership as `run` a lost lock;
//! `leader` shows the leader or exits 3, and `--watch` prints every change. `run --permits N`
//! takes a permit of a semaphore instead (`permits.rs`).
//!
//! Needs the `cli` feature: `cargo test --all-features` (or `--features cli`).

#[path = "../support/mod.rs"]
mod support;

mod permits;

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::{await_queue_len, lock_client, lock_exists, ms, queue_len, Child, RedisServer};

/// The most any one call of the binary may take here; a hung binary fails the test instead of
/// hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The built binary, pointed at `server` under the tests' namespace, with nothing taken from
/// the environment the tests run in.
fn fencelock(server: &RedisServer) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    cmd.env_remove("REDIS_URL")
        .env_remove("FENCELOCK_NAMESPACE")
        .args(["--url", &server.url(), "--namespace", support::NAMESPACE]);
    cmd
}

/// Runs `cmd` to its end (at most [`CALL_TIMEOUT`], else it is killed and the test fails).
fn finish(mut cmd: Command) -> Output {
    let program = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {program}: {e}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + CALL_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} did not finish within {CALL_TIMEOUT:?}");
        }
        thread::sleep(ms(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| panic!("fencelock itself ended by a signal: {status:?}"))
}

/// `sh -c SCRIPT`, as the command of `fencelock run`.
fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

#[test]
fn run_gives_cmd_the_token_and_key_and_exits_with_its_status() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let mut con = server.connection();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "job:1", "--"])
        .args(sh(r#"echo "$FENCELOCK_KEY $FENCELOCK_TOKEN"; exit 7"#));
    let out = finish(cmd);
    assert_eq!(code(out.status), 7, "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (key, token) = stdout
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("CMD printed {stdout:?}"));
    assert_eq!(key, "job:1");
    let token: u64 = token
        .parse()
        .unwrap_or_else(|e| panic!("token {token:?}: {e}"));
    assert!(!lock_exists(&mut con, "job:1"), "not released after CMD");
    // The token was a real grant's: the next one is higher.
    let next = client.lock("job:1").unwrap();
    assert!(
        next.token().as_u64() > token,
        "{} after {token}",
        next.token()
    );
    next.unlock().unwrap();

    // Killed by a signal: 128 + N. And REDIS_URL stands in for --url.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    cmd.env("REDIS_URL", server.url())
        .env("FENCELOCK_NAMESPACE", support::NAMESPACE)
        .args(["run", "job:1", "--"])
        .args(sh("kill -TERM $$"));
    let out = finish(cmd);
    assert_eq!(code(out.status), 128 + 15, "stderr: {}", text(&out.stderr));

    // A command that is not there: 127, and the lock is released.
    let mut cmd = fencelock(&server);
    cmd.args(["run", "job:1", "--", "/nonexistent/fencelock-test"]);
    let out = finish(cmd);
    assert_eq!(code(out.status), 127, "stderr: {}", text(&out.stderr));
    assert!(!lock_exists(&mut con, "job:1"));
}

#[test]
fn run_exits_75_when_the_lock_is_not_granted_in_time() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 10_000);
    let mut con = server.connection();
    let held = holder.lock("busy").unwrap();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "--timeout", "300ms", "busy", "--", "echo", "ran"]);
    let started = Instant::now();
    let out = finish(cmd);
    let took = started.elapsed();
    assert_eq!(code(out.status), 75, "stderr: {}", text(&out.stderr));
    assert!(
        took >= ms(300) && took < Duration::from_secs(10),
        "gave up after {took:?}"
    );
    assert_eq!(text(&out.stdout), "", "CMD ran without the lock");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not granted within 300ms"), "{stderr}");
    // Not a terminal: no progress line.
    assert!(!stderr.contains("waiting"), "{stderr}");
    assert_eq!(
        queue_len(&mut con, "busy"),
        0,
        "the wait left its queue entry"
    );

    // 0s: one attempt.
    let mut cmd = fencelock(&server);
    cmd.args(["run", "--timeout", "0s", "busy", "--", "echo", "ran"]);
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 75, "stderr: {stderr}");
    assert_eq!(
        stderr,
        "fencelock: \"busy\" is held by another holder; not run\n"
    );
    assert!(held.is_held());
    held.unlock().unwrap();
}

/// CMD that reports SIGTERM on stdout and then exits 3, or ignores it.
const TRAPS_TERM: &str = r#"trap 'echo got-term; exit 3' TERM; echo started; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
const IGNORES_TERM: &str = r#"trap 'echo ignoring-term' TERM; echo started; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;

#[test]
fn a_lock_lost_while_cmd_runs_sends_it_sigterm_and_exits_76() {
    let server = RedisServer::start();
    let operator = lock_client(&server, 10_000);

    // Forced away by an operator: CMD hears SIGTERM at the holder's next renewal (lease / 3).
    let mut cmd = fencelock(&server);
    cmd.args(["run", "--lease", "600ms", "forced", "--"])
        .args(sh(TRAPS_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    let forced = Instant::now();
    assert!(operator.force_unlock("forced").unwrap());
    child.expect_line("got-term", Duration::from_secs(5));
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(76), "{status:?}");
    eprintln!(
        "CMD got SIGTERM {:?} after the forced release",
        forced.elapsed()
    );

    // The key deleted, and CMD ignores SIGTERM: SIGKILL after the grace period.
    let mut con = server.connection();
    let mut cmd = fencelock(&server);
    cmd.args([
        "run", "--lease", "600ms", "--grace", "300ms", "deleted", "--",
    ])
    .args(sh(IGNORES_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    let deleted = Instant::now();
    let _: () = redis::cmd("DEL")
        .arg(support::lock_key("deleted"))
        .query(&mut con)
        .unwrap();
    child.expect_line("ignoring-term", Duration::from_secs(5));
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    let took = deleted.elapsed();
    assert_eq!(status.code(), Some(76), "{status:?}");
    // Loss noticed within a renewal (200 ms) or so, then 300 ms of grace.
    assert!(took >= ms(300), "SIGKILL before the grace period: {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn signals_to_fencelock_reach_cmd_and_the_lock_is_released_when_it_exits() {
    let server = RedisServer::start();
    let mut con = server.connection();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "signalled", "--"]).args(sh(TRAPS_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    assert!(lock_exists(&mut con, "signalled"));
    send_signal(child.pid(), libc::SIGTERM);
    child.expect_line("got-term", Duration::from_secs(5));
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(3), "not CMD's status: {status:?}");
    assert!(!lock_exists(&mut con, "signalled"), "not released");

    // While waiting: the wait ends, its queue entry goes, CMD never runs; 128 + SIGINT.
    let holder = lock_client(&server, 10_000);
    let held = holder.lock("signalled").unwrap();
    let mut cmd = fencelock(&server);
    cmd.args(["run", "signalled", "--", "echo", "ran"]);
    let mut child = Child::spawn(cmd);
    await_queue_len(&mut con, "signalled", 1);
    send_signal(child.pid(), libc::SIGINT);
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert_eq!(queue_len(&mut con, "signalled"), 0);
    assert!(held.is_held());
    held.unlock().unwrap();
}

/// fencelock killed outright (SIGKILL: nothing of it runs any more) must not leave CMD running
/// without the lock, whose lease then runs out: the kernel sends CMD SIGTERM (Linux).
#[cfg(target_os = "linux")]
#[test]
fn cmd_gets_sigterm_when_fencelock_is_killed() {
    let server = RedisServer::start();
    let mut cmd = fencelock(&server);
    cmd.args(["run", "orphan", "--"]).args(sh(TRAPS_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    child.kill();
    // CMD writes to the same pipe, which the reader still reads.
    child.expect_line("got-term", Duration::from_secs(5));
}

fn send_signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    assert!(pid > 0);
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `pid` is positive and
    // names our own child, still running (the test waits for it afterwards).
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// `fencelock status` (and `--json`), checked against what the library says.
fn status(server: &RedisServer, key: &str, json: bool) -> String {
    let mut cmd = fencelock(server);
    cmd.arg("status");
    if json {
        cmd.arg("--json");
    }
    cmd.arg(key);
    let out = finish(cmd);
    assert_eq!(code(out.status), 0, "stderr: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn status_shows_held_free_and_waiters_as_text_and_json() {
    let server = RedisServer::start();
    let mut con = server.connection();

    assert_eq!(
        status(&server, "report", false),
        "key      \"report\"\nstate    free\nwaiters  0\n"
    );
    assert_eq!(
        status(&server, "report", true),
        "{\"key\":\"report\",\"held\":false,\"token\":null,\"remaining_lease_ms\":null,\"waiters\":0}\n"
    );

    let holder = lock_client(&server, 10_000);
    let held = holder.lock("report").unwrap();
    let waiter = lock_client(&server, 10_000);
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let got = waiter.try_lock("report", Duration::from_secs(30));
        let _ = tx.send(());
        got.map(|g| g.map(|g| g.unlock()))
    });
    await_queue_len(&mut con, "report", 1);

    let shown = status(&server, "report", false);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "key      \"report\"",
            "state    held",
            &format!("token    {}", held.token())
        ],
        "{shown}"
    );
    assert!(
        lines[3].starts_with("lease    ") && lines[3].ends_with("s left"),
        "{shown}"
    );
    assert_eq!(lines[4..], ["waiters  1"], "{shown}");

    let json = status(&server, "report", true);
    let prefix = format!(
        "{{\"key\":\"report\",\"held\":true,\"token\":{},\"remaining_lease_ms\":",
        held.token()
    );
    let lease = json
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(",\"waiters\":1}\n"))
        .unwrap_or_else(|| panic!("{json}"));
    let lease: u64 = lease.parse().unwrap_or_else(|e| panic!("{json}: {e}"));
    assert!(lease > 5_000 && lease <= 10_000, "{json}");

    held.unlock().unwrap();
    rx.recv_timeout(CALL_TIMEOUT).unwrap();
    t.join().unwrap().unwrap().unwrap().unwrap();
}

#[test]
fn release_force_lets_a_waiting_run_in() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // A long lease: the waiting run would otherwise look again only after 5 s.
    let holder = lock_client(&server, 20_000);
    let held = holder.lock("stuck").unwrap();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "stuck", "--"])
        .args(sh(r#"echo "ran $FENCELOCK_TOKEN""#));
    let mut waiting = Child::spawn(cmd);
    await_queue_len(&mut con, "stuck", 1);

    // Without --force: refused, nothing changes.
    let mut cmd = fencelock(&server);
    cmd.args(["release", "stuck"]);
    let out = finish(cmd);
    assert_eq!(code(out.status), 2, "stderr: {}", text(&out.stderr));
    assert!(held.is_held());

    let mut cmd = fencelock(&server);
    cmd.args(["release", "--force", "stuck"]);
    let forced = Instant::now();
    let out = finish(cmd);
    assert_eq!(code(out.status), 0, "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("released \"stuck\""),
        "{}",
        text(&out.stdout)
    );

    let line = waiting.expect_line("ran ", Duration::from_secs(10));
    let latency = forced.elapsed();
    let token: u64 = line["ran ".len()..].parse().unwrap();
    assert!(
        token > held.token().as_u64(),
        "{token} after {}",
        held.token()
    );
    assert!(
        latency < Duration::from_secs(3),
        "the waiting run got in {latency:?} after"
    );
    let status = waiting.wait_exit(CALL_TIMEOUT).expect("run exited");
    assert_eq!(status.code(), Some(0), "{status:?}");

    // Nothing held any more: still a success, and says so.
    let mut cmd = fencelock(&server);
    cmd.args(["release", "--force", "stuck"]);
    let out = finish(cmd);
    assert_eq!(code(out.status), 0);
    assert_eq!(text(&out.stdout), "\"stuck\" was not held\n");
    assert!(held.unlock().unwrap_err().is_lock_lost());
}

/// A pseudo-terminal: (master, slave).
fn openpty() -> (File, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes the two descriptors it opens into the two integers we pass; the
    // name, termios and window-size pointers may be null. Each descriptor is then owned once.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and nothing else owns them.
    unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

#[test]
fn a_wait_on_a_terminal_shows_the_key_the_holders_token_and_the_time() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 10_000);
    let held = holder.lock("shown").unwrap();
    let (mut master, slave) = openpty();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "--timeout", "2500ms", "shown", "--", "echo", "ran"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave));
    let mut child = cmd.spawn().unwrap();
    // Our copy of the slave went into `cmd`; dropped with it, so the master reads EOF (EIO)
    // once fencelock exits.
    drop(cmd);
    let reader = thread::spawn(move || {
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        // Ends at EOF or EIO (the slave closed); bounded by the child's life.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            shown.extend_from_slice(&buf[..n]);
        }
        shown
    });
    let deadline = Instant::now() + CALL_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "fencelock did not give up");
        thread::sleep(ms(20));
    };
    assert_eq!(status.code(), Some(75), "{status:?}");
    let shown = text(&reader.join().unwrap());
    let line = format!(
        "\r\x1b[2Kfencelock: waiting for \"shown\", held with token {}",
        held.token()
    );
    for seconds in ["(0s)", "(1s)", "(2s)"] {
        assert!(
            shown.contains(&format!("{line} {seconds}")),
            "no {seconds} line on the terminal: {shown:?}"
        );
    }
    assert!(shown.contains("not granted within 2.5s"), "{shown:?}");
    held.unlock().unwrap();
}

/// A terminal's Ctrl-C goes to its whole foreground process group: CMD gets it from the
/// terminal, and fencelock must not send it a second one. CMD counts the SIGINTs it gets.
#[test]
fn a_terminals_ctrl_c_reaches_cmd_once_and_fencelock_exits_with_its_status() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;

    let server = RedisServer::start();
    let mut con = server.connection();
    let (mut master, slave) = openpty();
    let mut cmd = fencelock(&server);
    cmd.args(["run", "interactive", "--"])
        .args(sh(r#"n=0; trap 'n=$((n+1))' INT; echo started; i=0; while [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done; echo "interrupted $n"; exit 5"#))
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: runs in the child between fork and exec: setsid and ioctl are plain system calls,
    // async-signal-safe, and the error path allocates nothing. It makes the child the leader of
    // a new session whose controlling terminal is the pseudo-terminal on its stdin, so that the
    // terminal's foreground process group is fencelock's (and CMD's, which inherits it).
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut reading = master.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reading.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut shown = Vec::new();
    let deadline = Instant::now() + CALL_TIMEOUT;
    while !text(&shown).contains("started") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(bytes) => shown.extend(bytes),
            Err(e) => panic!("CMD never started ({e}): {:?}", text(&shown)),
        }
    }
    assert!(lock_exists(&mut con, "interactive"));
    master.write_all(b"\x03").unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "fencelock did not exit");
        thread::sleep(ms(20));
    };
    drop(master);
    reader.join().unwrap();
    shown.extend(rx.try_iter().flatten());
    let shown = text(&shown);
    assert_eq!(
        status.code(),
        Some(5),
        "not CMD's status: {status:?}; {shown:?}"
    );
    assert!(
        shown.contains("interrupted 1"),
        "CMD did not get exactly one SIGINT: {shown:?}"
    );
    assert!(!lock_exists(&mut con, "interactive"), "not released");
}

/// Runs `cmd` to its end and returns its output and how long it took.
fn timed(cmd: Command) -> (Output, Duration) {
    let started = Instant::now();
    let out = finish(cmd);
    (out, started.elapsed())
}

/// `CLIENT PAUSE` for writes: connections are made and read-only commands answered, but a
/// script that writes (taking or forcing a lock) gets no reply until the pause ends.
fn pause_writes(con: &mut redis::Connection, pause: Duration) {
    let millis = u64::try_from(pause.as_millis()).unwrap();
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(millis)
        .arg("WRITE")
        .query(con)
        .unwrap();
}

/// The bounds below are loose (a loaded machine), but each is well under the 5 s that the
/// library's default connection and response timeouts would take.
#[test]
fn run_with_a_timeout_answers_in_time_when_redis_is_frozen() {
    let server = RedisServer::start();
    let mut con = server.connection();

    // Frozen: connections are accepted by the kernel, and nothing answers. The default
    // connection timeout (1 s) bounds a `--timeout 0s` run; that is an outage, not "held".
    server.pause();
    let mut cmd = fencelock(&server);
    cmd.args(["run", "--timeout", "0s", "frozen", "--", "echo", "ran"]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 1, "after {took:?}; stderr: {stderr}");
    assert!(
        took < Duration::from_secs(2),
        "answered after {took:?}: {stderr}"
    );
    assert_eq!(text(&out.stdout), "", "CMD ran without the lock");

    // A lower connection timeout and a longer --timeout: the run gives up within --timeout
    // plus the connection timeout.
    let mut cmd = fencelock(&server);
    cmd.args(["--connect-timeout", "200ms"]).args([
        "run",
        "--timeout",
        "500ms",
        "frozen",
        "--",
        "echo",
        "ran",
    ]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 1, "after {took:?}; stderr: {stderr}");
    assert!(
        took < Duration::from_millis(1_500),
        "answered after {took:?}: {stderr}"
    );
    server.resume();

    // Connected, and then no reply: writes are paused for longer than the response timeout
    // (5 s by default). --timeout bounds the wait for the reply too.
    pause_writes(&mut con, Duration::from_secs(8));
    for timeout in ["0s", "300ms"] {
        let mut cmd = fencelock(&server);
        cmd.args(["run", "--timeout", timeout, "paused", "--", "echo", "ran"]);
        let (out, took) = timed(cmd);
        let stderr = text(&out.stderr);
        assert_eq!(
            code(out.status),
            1,
            "--timeout {timeout}: after {took:?}; {stderr}"
        );
        assert!(
            took < Duration::from_secs(2),
            "--timeout {timeout}: answered after {took:?}: {stderr}"
        );
        assert!(stderr.contains("did not answer"), "{stderr}");
        assert_eq!(text(&out.stdout), "", "CMD ran without the lock");
    }
}

#[test]
fn status_and_release_against_a_frozen_redis_end_within_the_timeouts_given() {
    let server = RedisServer::start();
    let mut con = server.connection();

    server.pause();
    let mut cmd = fencelock(&server);
    cmd.args(["--connect-timeout", "200ms", "status", "k"]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 1, "after {took:?}; stderr: {stderr}");
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?}: {stderr}"
    );

    // The environment stands in for the flag.
    let mut cmd = fencelock(&server);
    cmd.env("FENCELOCK_CONNECT_TIMEOUT", "200ms")
        .args(["release", "--force", "k"]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 1, "after {took:?}; stderr: {stderr}");
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?}: {stderr}"
    );

    // The default connection timeout is short too: a command line tool fails fast.
    let mut cmd = fencelock(&server);
    cmd.args(["status", "k"]);
    let (out, took) = timed(cmd);
    assert_eq!(code(out.status), 1, "stderr: {}", text(&out.stderr));
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    server.resume();

    // Connected, and the reply withheld: the response timeout bounds it.
    pause_writes(&mut con, Duration::from_secs(8));
    let mut cmd = fencelock(&server);
    cmd.env("FENCELOCK_RESPONSE_TIMEOUT", "5s") // the flag wins over the environment
        .args(["--response-timeout", "300ms", "release", "--force", "k"]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 1, "after {took:?}; stderr: {stderr}");
    assert!(
        took < Duration::from_secs(2),
        "answered after {took:?}: {stderr}"
    );
    assert!(stderr.contains("may still have run"), "{stderr}");

    // Zero is refused as a bad command line.
    for flag in ["--connect-timeout", "--response-timeout"] {
        let mut cmd = fencelock(&server);
        cmd.args([flag, "0s", "status", "k"]);
        let out = finish(cmd);
        let stderr = text(&out.stderr);
        assert_eq!(code(out.status), 2, "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
}

/// The queue of election `name`'s lock in Redis: candidates waiting to lead.
fn candidates_waiting(con: &mut redis::Connection, name: &str) -> u64 {
    queue_len(con, &format!("%election:{name}"))
}

/// `fencelock leader [--json] NAME`: its exit status and what it printed.
fn leader(server: &RedisServer, name: &str, json: bool) -> (i32, String) {
    let mut cmd = fencelock(server);
    cmd.arg("leader");
    if json {
        cmd.arg("--json");
    }
    cmd.arg(name);
    let out = finish(cmd);
    (code(out.status), text(&out.stdout))
}

/// The epoch at the end of a line CMD printed: `<word> <epoch>`.
fn epoch_in(line: &str) -> u64 {
    let epoch = line.rsplit(' ').next().unwrap_or_default();
    epoch
        .parse()
        .unwrap_or_else(|e| panic!("no epoch at the end of {line:?}: {e}"))
}

#[test]
fn elect_gives_cmd_the_epoch_and_election_and_exits_with_its_status() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let election = client.election("sched").unwrap();
    let mut con = server.connection();

    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--value", "node-a", "sched", "--"])
        .args(sh(
            r#"echo "$FENCELOCK_ELECTION ${FENCELOCK_TOKEN:-no-token} $FENCELOCK_EPOCH"; exit 7"#,
        ));
    let out = finish(cmd);
    assert_eq!(code(out.status), 7, "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = stdout.trim();
    assert!(
        line.starts_with("sched no-token "),
        "CMD printed {stdout:?}"
    );
    let epoch = epoch_in(line);
    // Resigned when CMD exited: nobody leads, the lock is free.
    assert_eq!(election.leader().unwrap(), None);
    assert!(!lock_exists(&mut con, "%election:sched"), "not resigned");
    // The epoch was a real leadership's: the next one is higher.
    let next = election.campaign("library").unwrap();
    assert!(
        next.epoch().as_u64() > epoch,
        "{} after {epoch}",
        next.epoch()
    );

    // Another leads: 0s makes one attempt, 300ms waits and gives up; neither runs CMD nor
    // stays in the queue.
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--timeout", "0s", "sched", "--", "echo", "ran"]);
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 75, "stderr: {stderr}");
    assert_eq!(
        stderr,
        "fencelock: election \"sched\" is led by another candidate; not run\n"
    );
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--timeout", "300ms", "sched", "--", "echo", "ran"]);
    let (out, took) = timed(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 75, "stderr: {stderr}");
    assert!(
        took >= ms(300) && took < Duration::from_secs(10),
        "gave up after {took:?}"
    );
    assert!(stderr.contains("was not won within 300ms"), "{stderr}");
    assert_eq!(text(&out.stdout), "", "CMD ran without leading");
    assert_eq!(candidates_waiting(&mut con, "sched"), 0);

    // A signal while waiting ends the wait, leaves the queue, runs nothing: 128 + SIGINT.
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "sched", "--", "echo", "ran"]);
    let mut waiting = Child::spawn(cmd);
    await_candidates(&mut con, "sched", 1);
    send_signal(waiting.pid(), libc::SIGINT);
    let status = waiting.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert_eq!(candidates_waiting(&mut con, "sched"), 0);
    assert!(next.is_leader());
    next.resign().unwrap();

    // A command that is not there: 127, and the leadership is resigned.
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "sched", "--", "/nonexistent/fencelock-test"]);
    let out = finish(cmd);
    assert_eq!(code(out.status), 127, "stderr: {}", text(&out.stderr));
    assert_eq!(election.leader().unwrap(), None);
    assert!(!lock_exists(&mut con, "%election:sched"));
}

/// Two `elect`s of one election: the second waits in the queue while the first's CMD runs, and
/// its CMD starts only after the first's exited, with a higher epoch. `leader` shows the first
/// (under its default value, HOST:PID) while it leads, and nobody once both are done. The CMDs
/// write to one file, whose order tells whether they overlapped.
#[test]
fn a_second_elect_runs_only_after_the_firsts_command_exits_with_a_higher_epoch() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let dir = support::unique_temp_dir("fencelock-elect");
    let log = dir.join("log");
    let log = log.to_str().unwrap();

    // The first's CMD runs until a line comes on its standard input (fencelock's).
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "queue", "--"]).args(sh(&format!(
        r#"echo first-start >> '{log}'; echo "first $FENCELOCK_EPOCH"; read line; echo first-end >> '{log}'"#
    )));
    let mut first = Child::spawn(cmd);
    let first_epoch = epoch_in(&first.expect_line("first ", CALL_TIMEOUT));

    let (status, shown) = leader(&server, "queue", false);
    assert_eq!(status, 0, "{shown}");
    let pid = first.pid();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert_eq!(lines[0], "election \"queue\"", "{shown}");
    assert!(
        lines[1].starts_with("leader   \"") && lines[1].ends_with(&format!(":{pid}\"")),
        "not HOST:PID of the elect process: {shown}"
    );
    assert_eq!(lines[2], format!("epoch    {first_epoch}"), "{shown}");
    let (status, json) = leader(&server, "queue", true);
    assert_eq!(status, 0, "{json}");
    assert!(
        json.starts_with("{\"election\":\"queue\",\"leader\":\"")
            && json.ends_with(&format!(":{pid}\",\"epoch\":{first_epoch}}}\n")),
        "{json}"
    );

    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--value", "second", "queue", "--"])
        .args(sh(&format!(
            r#"echo second-start >> '{log}'; echo "second $FENCELOCK_EPOCH""#
        )));
    let mut second = Child::spawn(cmd);
    await_candidates(&mut con, "queue", 1);

    first.send_line("done");
    let status = first
        .wait_exit(CALL_TIMEOUT)
        .expect("the first elect exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let second_epoch = epoch_in(&second.expect_line("second ", Duration::from_secs(10)));
    assert!(
        second_epoch > first_epoch,
        "epoch {second_epoch} after {first_epoch}"
    );
    let status = second
        .wait_exit(CALL_TIMEOUT)
        .expect("the second elect exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(
        std::fs::read_to_string(log).unwrap(),
        "first-start\nfirst-end\nsecond-start\n",
        "the CMDs overlapped"
    );

    assert_eq!(
        leader(&server, "queue", false),
        (3, "election \"queue\"\nleader   none\n".to_owned())
    );
    assert_eq!(
        leader(&server, "queue", true),
        (
            3,
            "{\"election\":\"queue\",\"leader\":null,\"epoch\":null}\n".to_owned()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls (bounded: 10 s) until `n` candidates wait in election `name`'s queue.
fn await_candidates(con: &mut redis::Connection, name: &str, n: u64) {
    await_queue_len(con, &format!("%election:{name}"), n);
}

/// An `elect` killed outright (SIGKILL) neither resigns nor renews: the next candidate leads
/// once the leadership's lease runs out, and its CMD gets a higher epoch. The killed one's CMD
/// got SIGTERM from the kernel.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_elect_hands_over_to_the_next_after_its_lease() {
    let server = RedisServer::start();
    let mut con = server.connection();

    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--lease", "600ms", "--value", "first", "crash", "--"])
        .args(sh(r#"echo "first $FENCELOCK_EPOCH"; trap 'echo first-got-term; exit 3' TERM; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#));
    let mut first = Child::spawn(cmd);
    let first_epoch = epoch_in(&first.expect_line("first ", CALL_TIMEOUT));

    let mut cmd = fencelock(&server);
    cmd.args([
        "elect", "--lease", "600ms", "--value", "second", "crash", "--",
    ])
    .args(sh(r#"echo "second $FENCELOCK_EPOCH""#));
    let mut second = Child::spawn(cmd);
    await_candidates(&mut con, "crash", 1);

    first.kill();
    let killed = Instant::now();
    first.expect_line("first-got-term", Duration::from_secs(5));
    let second_epoch = epoch_in(&second.expect_line("second ", Duration::from_secs(10)));
    let took = killed.elapsed();
    assert!(
        second_epoch > first_epoch,
        "epoch {second_epoch} after {first_epoch}"
    );
    // About the lease (600 ms) after its last renewal; loose for a loaded machine.
    assert!(took < Duration::from_secs(5), "took over after {took:?}");
    eprintln!("the next elect led {took:?} after the kill");
    let status = second
        .wait_exit(CALL_TIMEOUT)
        .expect("the second elect exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn a_leadership_lost_while_cmd_runs_sends_it_sigterm_and_exits_76() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--lease", "600ms", "--grace", "5s", "lost", "--"])
        .args(sh(TRAPS_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    let _: () = redis::cmd("DEL")
        .arg(support::lock_key("%election:lost"))
        .query(&mut con)
        .unwrap();
    child.expect_line("got-term", Duration::from_secs(5));
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(76), "{status:?}");
}

#[test]
fn leader_watch_prints_every_change_until_interrupted() {
    let server = RedisServer::start();
    let mut cmd = fencelock(&server);
    cmd.args(["leader", "--watch", "watched"]);
    let mut watch = Child::spawn(cmd);
    let mut cmd = fencelock(&server);
    cmd.args(["leader", "--watch", "--json", "watched"]);
    let mut watch_json = Child::spawn(cmd);
    watch.expect_line("leader none", CALL_TIMEOUT);
    watch_json.expect_line(
        "{\"election\":\"watched\",\"leader\":null,\"epoch\":null}",
        CALL_TIMEOUT,
    );

    let mut cmd = fencelock(&server);
    cmd.args(["elect", "--value", "node \"a\"", "watched", "--"])
        .args(sh(r#"echo "leading $FENCELOCK_EPOCH"; read line"#));
    let mut elect = Child::spawn(cmd);
    let epoch = epoch_in(&elect.expect_line("leading ", CALL_TIMEOUT));
    watch.expect_line(
        &format!("leader \"node \\\"a\\\"\" epoch {epoch}"),
        Duration::from_secs(10),
    );
    watch_json.expect_line(
        &format!("{{\"election\":\"watched\",\"leader\":\"node \\\"a\\\"\",\"epoch\":{epoch}}}"),
        Duration::from_secs(10),
    );

    elect.send_line("done");
    let status = elect.wait_exit(CALL_TIMEOUT).expect("elect exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
    // The resignation is heard at once (a message), not a lease later.
    watch.expect_line("leader none", Duration::from_secs(5));

    send_signal(watch.pid(), libc::SIGINT);
    let status = watch.wait_exit(CALL_TIMEOUT).expect("the watch ended");
    assert_eq!(status.code(), Some(0), "{status:?}");
    send_signal(watch_json.pid(), libc::SIGTERM);
    let status = watch_json.wait_exit(CALL_TIMEOUT).expect("the watch ended");
    assert_eq!(status.code(), Some(0), "{status:?}");
}
