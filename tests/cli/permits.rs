//! `fencelock run --permits N`: a permit of a counting semaphore instead of the lock. N + 1 runs
//! of one key never run more than N commands at once, and the last runs once one ends; each
//! command gets its permit's token and the key; a count other than the one in force is refused
//! (exit 2) with a message naming both; all permits held and `--timeout 0s` exits 75; a signal
//! ends a wait; a permit lost while CMD runs is handled as a lost lock (exit 76).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::support::{self, lock_client, ms, Child, RedisServer};
use super::{code, fencelock, finish, send_signal, sh, text, CALL_TIMEOUT, TRAPS_TERM};

/// Polls (bounded: 10 s) until semaphore `name` (of `n` permits) has `held` permits held and
/// `waiters` clients waiting, as `Semaphore::status` reads it.
fn await_semaphore(client: &fencelock::LockClient, name: &str, n: u32, held: u64, waiters: u64) {
    let semaphore = client.semaphore(name, n).unwrap();
    let started = Instant::now();
    loop {
        let status = semaphore.status().unwrap();
        if (status.held, status.waiters) == (held, waiters) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "semaphore {name:?} never had {held} held and {waiters} waiting: {status:?}"
        );
        std::thread::sleep(ms(5));
    }
}

/// The log's lines `start ID TOKEN KEY` and `end ID`, in order: the most commands that ran at
/// once, the ids in the order they started, and the tokens.
fn replay(log: &str) -> (usize, Vec<String>, Vec<u64>) {
    let (mut running, mut most) = (BTreeSet::new(), 0);
    let (mut started, mut tokens) = (Vec::new(), Vec::new());
    for line in log.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[..] {
            ["start", id, token, key] => {
                assert_eq!(key, "pool", "FENCELOCK_KEY in {line:?}");
                assert!(running.insert(id.to_owned()), "{id} started twice: {log}");
                most = most.max(running.len());
                started.push(id.to_owned());
                tokens.push(token.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")));
            }
            ["end", id] => assert!(running.remove(id), "{id} ended unstarted: {log}"),
            _ => panic!("unexpected line {line:?} in {log}"),
        }
    }
    (most, started, tokens)
}

/// Three `run --permits 2` of one key: two commands run at once, the third waits in the
/// semaphore's queue and starts only once one of the two has ended. The commands log their
/// start (with FENCELOCK_TOKEN and FENCELOCK_KEY) and end to one file, whose order tells how
/// many ran at once.
#[test]
fn n_plus_one_runs_with_n_permits_never_run_more_than_n_commands_at_once() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let dir = support::unique_temp_dir("fencelock-permits");
    let log = dir.join("log");
    let log = log.to_str().unwrap().to_owned();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Each CMD runs until a line comes on its standard input (fencelock's).
    let mut runs: Vec<Child> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            let mut cmd = fencelock(&server);
            cmd.args(["run", "--permits", "2", "pool", "--"])
                .args(sh(&format!(
                    r#"echo "start {id} $FENCELOCK_TOKEN $FENCELOCK_KEY" >> '{log}'; echo started; read line; echo "end {id}" >> '{log}'"#
                )));
            Child::spawn(cmd)
        })
        .collect();
    // Until two commands run and the third run waits in Redis' queue, or all three started.
    let semaphore = client.semaphore("pool", 2).unwrap();
    let started = Instant::now();
    loop {
        let starts = replay(&read_log()).1.len();
        let status = semaphore.status().unwrap();
        if starts >= 3 || (starts == 2 && (status.held, status.waiters) == (2, 1)) {
            break;
        }
        assert!(
            started.elapsed() < CALL_TIMEOUT,
            "{status:?}, log: {}",
            read_log()
        );
        std::thread::sleep(ms(5));
    }
    let (most, first_two, _) = replay(&read_log());
    assert_eq!(
        (most, first_two.len()),
        (2, 2),
        "not two commands at once: log {}",
        read_log()
    );
    let index = |id: &str| ["a", "b", "c"].iter().position(|x| *x == id).unwrap();
    let waiting = ["a", "b", "c"]
        .into_iter()
        .find(|id| !first_two.iter().any(|s| s == id))
        .unwrap();

    // One of the two ends: the third starts, and only then.
    let ended = &mut runs[index(&first_two[0])];
    ended.send_line("done");
    let status = ended.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
    runs[index(waiting)].expect_line("started", Duration::from_secs(10));
    for id in [&first_two[1], &waiting.to_owned()] {
        let run = &mut runs[index(id)];
        run.send_line("done");
        let status = run.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
        assert_eq!(status.code(), Some(0), "{id}: {status:?}");
    }

    let log_text = read_log();
    let (most, order, tokens) = replay(&log_text);
    assert_eq!(
        most, 2,
        "more than 2 commands at once, or fewer: {log_text}"
    );
    assert_eq!(order.len(), 3, "{log_text}");
    assert_eq!(order[2], waiting, "{log_text}");
    assert!(
        log_text.find(&format!("end {}", first_two[0]))
            < log_text.find(&format!("start {waiting}")),
        "the third started before one ended: {log_text}"
    );
    // Real grants' tokens: distinct, the third's above the first two's (which were granted
    // together, so their commands may start in either order), all below the next grant's.
    assert!(
        tokens[0] != tokens[1] && tokens[2] > tokens[0].max(tokens[1]),
        "tokens {tokens:?}"
    );
    let next = semaphore.acquire().unwrap();
    assert!(
        next.token().as_u64() > tokens[2],
        "{} after {tokens:?}",
        next.token()
    );
    next.release().unwrap();
    // Every permit was released when its CMD exited.
    await_semaphore(&client, "pool", 2, 0, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A count other than the one in force is refused before CMD runs, with both counts; with
/// every permit held, `--timeout 0s` exits 75 and a signal ends a wait (128 + N), neither
/// running CMD nor leaving a queue entry.
#[test]
fn a_count_mismatch_exits_2_and_a_full_semaphore_75() {
    let server = RedisServer::start();
    let client = lock_client(&server, 10_000);
    let semaphore = client.semaphore("full", 1).unwrap();
    let held = semaphore.acquire().unwrap();

    let mut cmd = fencelock(&server);
    cmd.args(["run", "--permits", "3", "full", "--", "echo", "ran"]);
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 2, "stderr: {stderr}");
    assert_eq!(text(&out.stdout), "", "CMD ran");
    assert!(
        stderr.starts_with("fencelock: --permits 3 does not match: semaphore \"full\" is in use with 1 permits, not 3")
            && stderr.ends_with("; not run\n"),
        "{stderr}"
    );

    let mut cmd = fencelock(&server);
    cmd.args(["run", "--permits", "0", "full", "--", "echo", "ran"]);
    let out = finish(cmd);
    assert_eq!(code(out.status), 2, "stderr: {}", text(&out.stderr));

    let mut cmd = fencelock(&server);
    cmd.args([
        "run",
        "--permits",
        "1",
        "--timeout",
        "0s",
        "full",
        "--",
        "echo",
        "ran",
    ]);
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 75, "stderr: {stderr}");
    assert_eq!(
        stderr,
        "fencelock: all 1 permits of semaphore \"full\" are held; not run\n"
    );

    let mut cmd = fencelock(&server);
    cmd.args([
        "run",
        "--permits",
        "1",
        "--timeout",
        "300ms",
        "full",
        "--",
        "echo",
        "ran",
    ]);
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    assert_eq!(code(out.status), 75, "stderr: {stderr}");
    assert!(
        stderr.contains("no permit of semaphore \"full\" was granted within 300ms"),
        "{stderr}"
    );

    // A signal ends a wait without a timeout.
    let mut cmd = fencelock(&server);
    cmd.args(["run", "--permits", "1", "full", "--", "echo", "ran"]);
    let mut child = Child::spawn(cmd);
    await_semaphore(&client, "full", 1, 1, 1);
    send_signal(child.pid(), libc::SIGINT);
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(130), "{status:?}");
    await_semaphore(&client, "full", 1, 1, 0);
    assert!(held.is_held());
    held.release().unwrap();
}

/// A permit lost while CMD runs (its keys deleted by hand): CMD gets SIGTERM and fencelock
/// exits 76, as for a lock.
#[test]
fn a_permit_lost_while_cmd_runs_sends_it_sigterm_and_exits_76() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let mut cmd = fencelock(&server);
    cmd.args(["run", "--permits", "2", "--lease", "600ms", "lost", "--"])
        .args(sh(TRAPS_TERM));
    let mut child = Child::spawn(cmd);
    child.expect_line("started", CALL_TIMEOUT);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*%semaphore:lost*", support::NAMESPACE))
        .query(&mut con)
        .unwrap();
    assert!(
        keys.iter().any(|k| k.contains(":permit:")),
        "no permit key among {keys:?}"
    );
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut con).unwrap();
    child.expect_line("got-term", Duration::from_secs(5));
    let status = child.wait_exit(CALL_TIMEOUT).expect("fencelock exited");
    assert_eq!(status.code(), Some(76), "{status:?}");
}
