//! Fault injection, typed errors: Redis error replies (NOSCRIPT, OOM, BUSY, NOREPLICAS, LOADING,
//! a fence key that cannot count) and the pool exhausted by the caller's own threads, or only
//! shared by them.
//!
//! An error must reach the caller as an error it can tell apart (`redis_code()`,
//! `is_pool_exhausted()`), at once: never as "held by someone" (`Ok(None)`) and never as a wait.
//! A caller told "held" backs off from a key nobody holds, or waits for a release that never
//! comes. NOSCRIPT is the one reply recovered transparently, everywhere a script runs.
//!
//! Each test names the protection it checks and why it fails without it. Servers are throw-away
//! `redis-server`s on loopback (tests/support), never one on 6379. Bounds are generous, since the
//! suite runs on small, busy machines, but each is far below what the broken behaviour would take.

use std::net::TcpStream;
use std::path::Path;
use std::process::{self, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::TryRecvError;
use fencelock::{LockClient, LockGuard};
use redis::Commands;

use crate::support;
use crate::support::faults::{builder, spawn_answer, within};
use crate::support::{fence_key, lock_client, lock_exists, lock_pttl, ms, RedisServer};

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

fn config_set(con: &mut redis::Connection, name: &str, value: &str) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
}

/// The code of a Redis error reply found behind `e`, whatever variant wraps it.
fn code_behind(e: &fencelock::Error) -> Option<&str> {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<redis::RedisError>())
        .and_then(redis::RedisError::code)
}

/// Waits (bounded: 10 s, five 2 s leases) until `key`'s lease is renewed: its PTTL goes up
/// between two readings. A renewal that fails leaves it running down.
fn await_renewal(con: &mut redis::Connection, key: &str, when: &str) {
    let mut last = lock_pttl(con, key);
    let renewed = support::poll_until(Duration::from_secs(10), ms(10), || {
        let now = lock_pttl(con, key);
        let before = std::mem::replace(&mut last, now);
        if now > before {
            Ok(())
        } else {
            Err(format!("PTTL {now} ms, {before} ms before"))
        }
    });
    if let Err(why) = renewed {
        panic!("no renewal of {key:?} {when}: {why}");
    }
}

/// `try_lock` (one attempt, and with a timeout) and `lock` on a free key all fail at once with
/// Redis' error `code`: never `Ok(None)` ("held by someone"), never a wait.
fn assert_refused_with(client: &LockClient, key: &str, code: &str) {
    let refused = |call: &str, outcome: fencelock::Result<Option<LockGuard>>| match outcome {
        Err(e) => assert_eq!(e.redis_code(), Some(code), "{call}: {e:?}"),
        Ok(Some(_)) => panic!("{call}: granted despite {code}"),
        Ok(None) => panic!("{call}: reported held instead of failing with {code}"),
    };
    refused("try_lock(ZERO)", client.try_lock(key, Duration::ZERO));
    let started = Instant::now();
    refused("try_lock(3 s)", client.try_lock(key, ms(3_000)));
    let waited = started.elapsed();
    assert!(waited < ms(1_500), "try_lock waited {waited:?} on {code}");
    let (lock_client, owned) = (client.clone(), key.to_owned());
    let outcome = within(ms(5_000), "lock() on a refused key", move || {
        lock_client.lock(&owned).map(Some)
    });
    refused("lock()", outcome);
}

// ---------------------------------------------------------------------------
// the pool exhausted by the caller's own threads
// ---------------------------------------------------------------------------

/// One pooled connection, busy with a command that Redis (paused) does not answer: a second
/// thread's `try_lock(ZERO)` fails with `is_pool_exhausted()` after about the 500 ms connection
/// timeout, rather than waiting for the busy command (10 s response timeout) or forever; the busy
/// command completes once Redis resumes.
///
/// Protection: checkout from the pool is bounded by the connection timeout and reported as pool
/// exhaustion. An unbounded checkout (or r2d2's default of 30 s) breaks the time bound; reporting
/// it as a connection error breaks the predicate.
#[test]
fn an_exhausted_pool_is_reported_after_the_connection_timeout() {
    let server = RedisServer::start();
    let client = builder(server.url(), ms(30_000))
        .pool_size(1)
        .connection_timeout(ms(500))
        .response_timeout(ms(10_000))
        .build()
        .unwrap();
    client.lock("warm").unwrap().unlock().unwrap(); // the one connection exists
    let pooled = {
        let mut con = server.connection();
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
        // The pool's one connection ran the lock's scripts.
        let id = list
            .lines()
            .filter(|l| l.split(' ').any(|f| f == "cmd=evalsha" || f == "cmd=eval"))
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .find_map(|id| id.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no pooled connection in CLIENT LIST:\n{list}"));
        support::client_port_in_list(&list, id)
    };

    server.pause();
    let (started_tx, started_rx) = mpsc::channel();
    let busy = client.clone();
    let answer = spawn_answer(move || {
        let _ = started_tx.send(());
        busy.try_lock("first", Duration::ZERO)
    });
    started_rx.recv_timeout(ms(5_000)).unwrap();
    // The first thread holds the connection, waiting for Redis: its request is in the socket.
    support::await_unread_bytes(server.port(), pooled, ms(30_000));

    let started = Instant::now();
    let other = client.clone();
    let second = within(
        ms(5_000),
        "try_lock(ZERO) on an exhausted pool",
        move || other.try_lock("second", Duration::ZERO).map(drop),
    );
    let waited = started.elapsed();
    server.resume();
    let err = second.expect_err("a second connection appeared in a pool of one");
    assert!(err.is_pool_exhausted(), "{err:?}");
    assert!(
        waited >= ms(450) && waited < ms(1_500),
        "gave up after {waited:?} (connection timeout 500 ms)"
    );

    let first = answer
        .recv_timeout(ms(5_000))
        .expect("the busy command never completed")
        .unwrap()
        .expect("the free key was not granted");
    first.unlock().unwrap();
    client
        .try_lock("second", Duration::ZERO)
        .unwrap()
        .expect("the pool did not recover")
        .unlock()
        .unwrap();
}

/// Eight threads on a pool of one connection, each locking and unlocking keys of its own 50
/// times: every call gets the connection as soon as another gives it back, and all 400 locks
/// finish within 4 s, against a 5 s connection timeout.
///
/// Protection: a connection given back wakes a thread waiting for one. The pool wakes a waiter
/// only when one has counted itself, so that the common case (nobody waits) makes no system
/// call; a wake-up missed by that count leaves the waiter asleep until its connection timeout,
/// which breaks the time bound (fails with a pool that never wakes a waiter).
#[test]
fn threads_waiting_for_a_pooled_connection_get_it_when_it_comes_back() {
    let server = RedisServer::start();
    let client = builder(server.url(), ms(30_000))
        .pool_size(1)
        .connection_timeout(ms(5_000))
        .build()
        .unwrap();
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            spawn_answer(move || {
                for i in 0..50 {
                    client.lock(&format!("pool-{t}-{i}"))?.unlock()?;
                }
                Ok::<(), fencelock::Error>(())
            })
        })
        .collect();
    for (t, answer) in workers.into_iter().enumerate() {
        answer
            .recv_timeout(ms(30_000))
            .unwrap_or_else(|e| panic!("worker {t} never finished: {e}"))
            .unwrap_or_else(|e| panic!("worker {t}: {e:?}"));
    }
    let took = started.elapsed();
    assert!(
        took < ms(4_000),
        "400 lock + unlock over one connection took {took:?}: a waiter slept until its timeout"
    );
}

// ---------------------------------------------------------------------------
// Redis error replies
// ---------------------------------------------------------------------------

/// `SCRIPT FLUSH` under a live client: acquire, release and renewal all reload their scripts on
/// NOSCRIPT. A guard is renewed after each of two flushes, and stays held.
///
/// Protection: the NOSCRIPT fallback, in the renewal thread's pipelines (EVALSHA only, reloaded by
/// hand) and in acquire/release. Without it in the renewal, every extend fails with NOSCRIPT and
/// the guard is marked lost within a lease; without it in acquire/release, those calls return a
/// NOSCRIPT error, which the unwraps catch.
#[test]
fn noscript_after_a_script_flush_is_recovered_everywhere() {
    let server = RedisServer::start();
    let client = lock_client(&server, 2_000);
    let mut con = server.connection();
    let flush = |con: &mut redis::Connection| {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(con).unwrap();
    };
    let guard = client.lock("flushed").unwrap();
    for _ in 0..2 {
        flush(&mut con);
        await_renewal(&mut con, "flushed", "after a script flush");
    }
    assert!(guard.is_held(), "renewal broke on a script flush");
    assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
    assert!(lock_pttl(&mut con, "flushed") > 0);

    flush(&mut con);
    let other = client
        .try_lock("flushed-2", Duration::ZERO)
        .unwrap()
        .expect("a free key after a flush");
    flush(&mut con);
    guard.unlock().unwrap();
    flush(&mut con);
    other.unlock().unwrap();
    assert!(!lock_exists(&mut con, "flushed"));
    assert!(!lock_exists(&mut con, "flushed-2"));
}

/// Redis out of memory (`maxmemory 1`, noeviction) refuses new grants with code OOM, never
/// "held"; locks held before keep renewing and release normally (their scripts write nothing that
/// allocates); with memory back, locking works again.
///
/// Protection: Redis error replies become `Error::Redis` with the code, never `Ok(None)`: the
/// acquire reply parser must not read an error as "held", and the wait loop must not retry it.
#[test]
fn oom_is_a_typed_error_and_spares_held_locks() {
    let server = RedisServer::start();
    let client = lock_client(&server, 2_000);
    let mut con = server.connection();
    let held = client.lock("held-before").unwrap();

    config_set(&mut con, "maxmemory-policy", "noeviction").unwrap();
    config_set(&mut con, "maxmemory", "1").unwrap();
    assert_refused_with(&client, "full", "OOM");
    assert!(!lock_exists(&mut con, "full"));
    await_renewal(&mut con, "held-before", "under OOM");
    assert!(held.is_held(), "renewal failed under OOM");
    held.unlock().unwrap();

    config_set(&mut con, "maxmemory", "0").unwrap();
    client
        .try_lock("full", Duration::ZERO)
        .unwrap()
        .expect("no grant with memory back")
        .unlock()
        .unwrap();
}

/// A fence key that is not a counter (written by someone else, or past `i64::MAX`) fails every
/// acquire with the Redis error, no lock is left behind without a token, and the fence key keeps
/// its value (a minting that wrote the clock reading over what it could not count on would
/// fail here).
///
/// Protection: the acquire script mints the token (INCR) before it sets the lock key; scripts do
/// not roll back, so the other order would leave the key locked for a lease with nobody holding
/// it (a variant that set the lock first fails here with "a lock was left behind").
#[test]
fn a_fence_that_cannot_count_fails_the_acquire_and_leaves_no_lock() {
    let server = RedisServer::start();
    let client = lock_client(&server, 2_000);
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg(fence_key("bad-fence"))
        .arg("not a number")
        .query(&mut con)
        .unwrap();
    let overflow = "over-fence";
    let _: () = redis::cmd("SET")
        .arg(fence_key(overflow))
        .arg(i64::MAX)
        .query(&mut con)
        .unwrap();
    for key in ["bad-fence", overflow] {
        match client.try_lock(key, Duration::ZERO) {
            Err(e) => assert!(e.redis_code().is_some(), "{key}: not a Redis error: {e:?}"),
            Ok(granted) => panic!("{key}: {granted:?} instead of an error"),
        }
        assert!(!lock_exists(&mut con, key), "{key}: a lock was left behind");
    }
    let kept: Vec<String> = ["bad-fence", overflow]
        .iter()
        .map(|key| con.get(fence_key(key)).unwrap())
        .collect();
    assert_eq!(
        kept,
        ["not a number".to_owned(), i64::MAX.to_string()],
        "the fence key lost its value"
    );
    // The other keys are untouched.
    client.lock("good").unwrap().unlock().unwrap();
}

/// A script on another connection runs past `busy-reply-threshold`: acquires get code BUSY at
/// once, not a wait; after `SCRIPT KILL` locking works again.
///
/// Protection: as for OOM: an error reply is an error, never "not acquired", in all three calls.
#[test]
fn busy_is_a_typed_error() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();
    if config_set(&mut con, "busy-reply-threshold", "100").is_err() {
        config_set(&mut con, "lua-time-limit", "100").unwrap(); // before Redis 7
    }

    // Read-only, so SCRIPT KILL may stop it; it ends by itself after 3 s.
    let mut busy_con = server.connection();
    let script = spawn_answer(move || {
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
                 while true do local n = redis.call('TIME') \
                 if n[1] * 1000000 + n[2] - start > 3000000 then return 1 end end",
            )
            .arg(0)
            .query::<i64>(&mut busy_con)
    });
    // Until the script is past the threshold, acquires of fresh keys are granted.
    let mut granted = Vec::new();
    let deadline = Instant::now() + ms(3_000);
    loop {
        assert!(Instant::now() < deadline, "never saw BUSY");
        match client.try_lock(&format!("before-busy-{}", granted.len()), Duration::ZERO) {
            Ok(Some(guard)) => granted.push(guard),
            Ok(None) => panic!("a fresh key was reported held"),
            Err(e) => {
                assert_eq!(e.redis_code(), Some("BUSY"), "{e:?}");
                break;
            }
        }
        thread::sleep(ms(10));
    }
    assert_refused_with(&client, "busy", "BUSY");

    let mut killer = server.connection();
    let killed: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("KILL").query(&mut killer);
    if let Err(e) = killed {
        assert_eq!(e.code(), Some("NOTBUSY"), "{e:?}");
    }
    let _ = script
        .recv_timeout(ms(5_000))
        .expect("the busy script never ended");
    client
        .try_lock("busy", ms(2_000))
        .unwrap()
        .expect("no grant after the script ended")
        .unlock()
        .unwrap();
    drop(granted);
}

/// `min-replicas-to-write 1` with no replica: acquires get code NOREPLICAS, never "held", as a
/// typed error whose message says what to do, without the script's hash and Lua line that
/// Redis' reply carries; an unlock too.
///
/// Protection: as for OOM.
#[test]
fn noreplicas_is_a_typed_error() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let held = client.lock("held-before").unwrap();
    config_set(&mut con, "min-replicas-to-write", "1").unwrap();
    assert_refused_with(&client, "unreplicated", "NOREPLICAS");
    assert!(!lock_exists(&mut con, "unreplicated"));
    let says_what_to_do = |call: &str, e: fencelock::Error| {
        assert!(e.is_not_writable(), "{call}: {e:?}");
        assert_eq!(e.redis_code(), Some("NOREPLICAS"), "{call}: {e:?}");
        let message = e.to_string();
        for says in ["min-replicas-to-write", "run two replicas", "NOREPLICAS"] {
            assert!(message.contains(says), "{call}: {message}");
        }
        for leaks in ["script", "@user_script", "Not enough good replicas"] {
            assert!(!message.contains(leaks), "{call}: {message}");
        }
        // One sentence a user reads, not a source line's indentation.
        assert!(!message.contains("  "), "{call}: {message:?}");
    };
    says_what_to_do("lock", client.lock("unreplicated").unwrap_err());
    says_what_to_do(
        "try_lock(ZERO)",
        client.try_lock("unreplicated", Duration::ZERO).unwrap_err(),
    );
    says_what_to_do(
        "try_lock(1 s)",
        client.try_lock("unreplicated", ms(1_000)).unwrap_err(),
    );
    says_what_to_do("unlock", held.unlock().unwrap_err());
    config_set(&mut con, "min-replicas-to-write", "0").unwrap();
    client
        .try_lock("unreplicated", Duration::ZERO)
        .unwrap()
        .expect("no grant once writes are allowed")
        .unlock()
        .unwrap();
}

/// A `redis-server` process of this test's own, on a free port, killed and reaped on drop.
/// (`RedisServer::restart` waits for loading to end; the LOADING test must not.)
struct OwnServer {
    child: process::Child,
    port: u16,
}

impl OwnServer {
    /// Starts `redis-server` on `dir` and returns once its port accepts connections, without
    /// waiting for it to answer.
    fn start_on(dir: &Path, extra_args: &[&str]) -> OwnServer {
        let bin = std::env::var_os("REDIS_SERVER_BIN")
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| "redis-server".into());
        for _ in 0..5 {
            let port = support::free_port();
            let mut child = Command::new(&bin)
                .arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(dir.join(format!("own-{port}.log")))
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(extra_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot spawn redis-server: {e}"));
            let deadline = Instant::now() + ms(10_000);
            loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return OwnServer { child, port };
                }
                if !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
                    break; // exited (port taken?) or never listened: try another port
                }
                thread::sleep(ms(2));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start redis-server on {}", dir.display());
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server still loading a 1,000,000-key snapshot: acquires get code LOADING (never "held",
/// never a wait), and once loading is over the same client locks normally.
///
/// Protection: as for OOM; and LOADING must reach the caller as a Redis error with its code, not
/// a connection error, although it can arrive on a connection made during the load.
#[test]
fn loading_is_a_typed_error() {
    let mut server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    {
        let mut con = server.connection();
        // A million keys, then a snapshot of them: seconds on a busy machine.
        con.set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("POPULATE")
            .arg(1_000_000)
            .query(&mut con)
            .unwrap();
        let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    }
    server.kill();
    let loading = OwnServer::start_on(server.dir(), &["--dbfilename", "dump.rdb"]);
    let client = builder(loading.url(), ms(30_000))
        .connection_timeout(ms(2_000))
        .build()
        .unwrap();

    let deadline = Instant::now() + ms(10_000);
    let mut unreachable = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "never saw LOADING; connection errors: {unreachable:?}"
        );
        match client.try_lock("loading", Duration::ZERO) {
            Err(e) if e.redis_code() == Some("LOADING") => break,
            Err(e) if e.is_connection() && code_behind(&e) == Some("LOADING") => {
                panic!("LOADING reported as a connection error, without its code: {e:?}")
            }
            // A connection made during the load may time out; that is no answer either way.
            Err(e) if e.is_connection() => {
                unreachable.push(format!("{e:?}"));
                thread::sleep(ms(10));
            }
            Err(e) => panic!("not a LOADING error: {e:?}"),
            Ok(None) => panic!("a free key was reported held while loading"),
            Ok(Some(_)) => panic!("loading ended before any attempt: use a bigger snapshot"),
        }
    }
    // Still loading, most likely: an error or a grant, never "held" after a wait. (As above, a
    // connection the loading server did not answer within the call's 200 ms is no answer.)
    match client.try_lock("loading", ms(200)) {
        Err(e) if e.is_connection() && code_behind(&e).is_none() => {}
        Err(e) => assert_eq!(e.redis_code(), Some("LOADING"), "{e:?}"),
        Ok(got) => assert!(got.is_some(), "a free key was reported held"),
    }

    let deadline = Instant::now() + ms(20_000);
    let guard = loop {
        match client.try_lock("loading", Duration::ZERO) {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("a free key was reported held"),
            Err(e) => {
                if !(e.is_connection() && code_behind(&e).is_none()) {
                    assert_eq!(e.redis_code(), Some("LOADING"), "{e:?}");
                }
                assert!(Instant::now() < deadline, "still loading after 20 s");
                thread::sleep(ms(50));
            }
        }
    };
    assert!(guard.is_held());
    guard.unlock().unwrap();
    drop(client);
    drop(loading);
}
