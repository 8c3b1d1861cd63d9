//! What the Redis and PostgreSQL stores' tests share: a holder process frozen past its lease, and
//! many writers whose late writes race fresh ones.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencingToken, LockClient, LockGuard};

use crate::support::{example_bin, lock_client, ms, Child, RedisServer, NAMESPACE};

/// Lease of the holder that gets frozen.
const FROZEN_LEASE: Duration = Duration::from_millis(500);
/// How long a child may take to print a line.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// Holder A, an `examples/fenced_writer.rs` process frozen with SIGSTOP, and holder B, the test,
/// which took A's lock over once A's lease ran out.
pub struct Takeover {
    a: Child,
    /// A's token.
    pub token_a: u64,
    /// B's grant: a higher token.
    pub b: LockGuard,
}

impl Takeover {
    /// Starts `fenced_writer STORE KEY 500` with `env`, freezes it once it holds the lock, and
    /// takes the lock in this process.
    pub fn start(server: &RedisServer, store: &str, key: &str, env: &[(&str, &str)]) -> Takeover {
        let mut cmd = Command::new(example_bin("fenced_writer"));
        cmd.args([store, key, &FROZEN_LEASE.as_millis().to_string()])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", NAMESPACE)
            .envs(env.iter().copied());
        let a = Child::spawn(cmd);
        let line = a.expect_line("token ", CHILD_TIMEOUT);
        let token_a: u64 = line["token ".len()..]
            .parse()
            .unwrap_or_else(|e| panic!("{line:?}: {e}"));

        a.pause();
        let frozen = Instant::now();
        let b = lock_client(server, 5_000)
            .try_lock(key, Duration::from_secs(5))
            .unwrap()
            .expect("B gets the lock once A's lease ran out");
        // A's last renewal (every lease/3) came at most a third of a lease before the freeze.
        assert!(
            frozen.elapsed() >= FROZEN_LEASE / 2,
            "B got the lock {:?} into A's {FROZEN_LEASE:?} lease",
            frozen.elapsed()
        );
        assert!(b.token().as_u64() > token_a, "{} vs {token_a}", b.token());
        Takeover { a, token_a, b }
    }

    /// Resumes A and has it write `value` with its old token; returns what A printed about the
    /// write (`accepted` or `rejected: ...`), after checking that A found its lock lost.
    pub fn resume_a_and_write(mut self, value: &str) -> String {
        self.a.resume();
        self.a.send_line(value);
        let outcome = self.a.expect_line("", CHILD_TIMEOUT);
        self.a.expect_line("lost", CHILD_TIMEOUT);
        let status = self.a.wait_exit(CHILD_TIMEOUT);
        assert!(status.is_some_and(|s| s.success()), "A ended {status:?}");
        self.b.unlock().unwrap();
        outcome
    }
}

/// How long the writers run, and at most how many rounds each.
const RUN_FOR: Duration = Duration::from_secs(2);
const MAX_ROUNDS: usize = 2_000;

/// One write of [`run_writers`].
#[derive(Debug)]
pub struct Write<R> {
    pub token: u64,
    /// Made after the lock was released, standing in for a holder that stalled past its lease.
    pub late: bool,
    /// What the store answered.
    pub outcome: R,
}

/// Runs one writer thread per element of `states` (its own connection, say), on `clients` in
/// turn, for two seconds: each round takes the lock on `key` and calls `write(state, value,
/// token)`, with a value naming the writer and round. Every third write is late: the writer
/// releases the lock first and sleeps a little, so that others take over and write meanwhile.
pub fn run_writers<S: Send, R: Send>(
    clients: &[LockClient],
    key: &str,
    states: Vec<S>,
    write: impl Fn(&mut S, &str, FencingToken) -> R + Sync,
) -> Vec<Write<R>> {
    let started = Instant::now();
    let write = &write;
    thread::scope(|scope| {
        let writers: Vec<_> = states
            .into_iter()
            .enumerate()
            .map(|(writer, mut state)| {
                let client = &clients[writer % clients.len()];
                scope.spawn(move || {
                    let mut writes = Vec::new();
                    for round in 0..MAX_ROUNDS {
                        if started.elapsed() >= RUN_FOR {
                            break;
                        }
                        let guard = client.lock(key).unwrap();
                        let token = guard.token();
                        let late = round % 3 == 2;
                        let guard = if late {
                            guard.unlock().unwrap();
                            thread::sleep(ms(1 + (writer + round) as u64 % 3));
                            None
                        } else {
                            Some(guard)
                        };
                        let value = format!("writer {writer} round {round} token {token}");
                        let outcome = write(&mut state, &value, token);
                        if let Some(guard) = guard {
                            guard.unlock().unwrap();
                        }
                        writes.push(Write {
                            token: token.as_u64(),
                            late,
                            outcome,
                        });
                    }
                    writes
                })
            })
            .collect();
        writers
            .into_iter()
            .flat_map(|w| w.join().expect("writer panicked"))
            .collect()
    })
}

/// The checker: `history` is the tokens of the accepted writes in the order the store applied
/// them; no token may come after a higher one.
pub fn assert_never_decreasing(history: &[u64]) {
    for (i, pair) in history.windows(2).enumerate() {
        assert!(
            pair[0] <= pair[1],
            "write {} of the store's history has token {} after token {}",
            i + 1,
            pair[1],
            pair[0]
        );
    }
}

/// Only late writes may be refused (a holder always has the newest token while it holds the
/// lock), and some must have been, or the check was never exercised.
pub fn assert_only_late_writes_refused<R: std::fmt::Debug>(
    writes: &[Write<R>],
    accepted: impl Fn(&R) -> bool,
) {
    let refused: Vec<&Write<R>> = writes.iter().filter(|w| !accepted(&w.outcome)).collect();
    if let Some(w) = refused.iter().find(|w| !w.late) {
        panic!("a write was refused while its writer held the lock: {w:?}");
    }
    assert!(
        !refused.is_empty(),
        "no late write was overtaken in {} writes: the check was never exercised",
        writes.len()
    );
}
