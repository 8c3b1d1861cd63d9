//! Fault injection: Redis paused, killed and restarted; the connection to it reset,
//! delayed and blackholed; the pool exhausted by the caller's own threads; Redis error replies;
//! a holder process frozen past its lease.
//!
//! Each test names the protection it checks and why it fails without it. Servers are throw-away
//! `redis-server`s on loopback (tests/support), never one on 6379; network faults go through the
//! support's TCP proxy. Bounds are generous, since the suite runs on small, busy machines, but each
//! is far below what the broken behaviour would take.
//!
//! `a_holder_frozen_past_its_lease_...` runs `examples/hold.rs`: a plain `cargo test` builds it;
//! before a filtered `cargo test --test faults`, run `cargo build --examples`.

mod support;

use std::net::TcpStream;
use std::path::Path;
use std::process::{self, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, TryRecvError};
use fencelock::{Builder, LockClient, LockGuard};
use support::history::{History, Hold};
use support::proxy::{Mode, Proxy};
use support::{
    example_bin, lock_client, lock_exists, lock_pttl, ms, Child, RedisServer, NAMESPACE,
};

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

/// A client builder in the test namespace, for a server or a proxy.
fn builder(url: String, lease: Duration) -> Builder {
    LockClient::builder(url).namespace(NAMESPACE).lease(lease)
}

fn fence_key(key: &str) -> String {
    format!("{NAMESPACE}:fence:{{{key}}}")
}

/// The key's fence counter (its last token), if any grant ever ran.
fn fence_value(con: &mut redis::Connection, key: &str) -> Option<u64> {
    redis::cmd("GET").arg(fence_key(key)).query(con).unwrap()
}

fn config_set(con: &mut redis::Connection, name: &str, value: &str) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
}

/// Runs `f` on a thread of its own; the answer arrives on the returned channel.
fn spawn_answer<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: a call that hangs fails the
/// test instead of stalling the suite.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    match spawn_answer(f).recv_timeout(limit) {
        Ok(answer) => answer,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return within {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Polls `condition` every 2 ms until it holds; panics after `limit`.
fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        thread::sleep(ms(2));
    }
}

/// Whether the guard's loss signal fired (a message, or the channel disconnected).
fn signalled(guard: &LockGuard) -> bool {
    !matches!(guard.lost().try_recv(), Err(TryRecvError::Empty))
}

/// The code of a Redis error reply found behind `e`, whatever variant wraps it.
fn code_behind(e: &fencelock::Error) -> Option<&str> {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<redis::RedisError>())
        .and_then(redis::RedisError::code)
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
// 1, 2: Redis paused (SIGSTOP)
// ---------------------------------------------------------------------------

/// Redis stopped for half the lease: the holder keeps the lock, and nobody else gets it.
///
/// Protection: a lease is lost only when its local deadline passes or Redis says the key is gone
/// or re-owned, never because a reply is slow. Renewals go about every lease/3 (667 ms), so one is
/// in flight during the 1 s pause; the renewal thread waits for its reply up to the deadline and
/// keeps renewing afterwards. A renewal thread that reported a slow reply as a loss makes
/// `is_held()` false (and fires `lost()`) during the pause; one that stopped renewing after the
/// stall leaves the grant's last confirmation older than a lease at resume + lease + 300 ms, so
/// `is_held()` is false there. The rival's refusals check that the lock key outlived the pause in
/// Redis: an acquire that granted a held key, or a lease that ran from the wrong moment, hands the
/// rival the lock.
#[test]
fn redis_paused_shorter_than_the_lease_keeps_the_lock() {
    let server = RedisServer::start();
    let lease = ms(2_000);
    let client = lock_client(&server, 2_000);
    let rival = lock_client(&server, 30_000);
    let guard = client.lock("stall").unwrap();

    server.pause();
    let paused = Instant::now();
    while paused.elapsed() < ms(1_000) {
        assert!(
            guard.is_held(),
            "lost {:?} into a pause of half the lease",
            paused.elapsed()
        );
        assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
        thread::sleep(ms(50));
    }
    server.resume();
    let resumed = Instant::now();
    assert!(
        rival.try_lock("stall", Duration::ZERO).unwrap().is_none(),
        "a rival got a lock that was held across a short pause"
    );

    // A renewal sent during the pause confirms the lease until at most resume + lease: only
    // renewals after it keep the lock past that.
    thread::sleep((lease + ms(300)).saturating_sub(resumed.elapsed()));
    assert!(guard.is_held(), "renewal did not go on after the pause");
    assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
    assert!(rival.try_lock("stall", Duration::ZERO).unwrap().is_none());
    let mut con = server.connection();
    assert!(lock_pttl(&mut con, "stall") > 0);
    guard.unlock().unwrap();
}

/// What the holder caught by a pause saw.
#[derive(Debug)]
struct Caught {
    holder: usize,
    token: u64,
    start: Instant,
    /// When the holder found the lock lost (`is_held()` false or `lost()` fired).
    lost_at: Option<Instant>,
    signalled: bool,
    held_after: bool,
    unlock: Result<(), String>,
}

#[derive(Default)]
struct Shared {
    history: History,
    /// Set by the test before it pauses Redis: the next (or current) holder keeps the lock until
    /// it loses it, so a pause always catches a holder.
    pausing: AtomicBool,
    /// Holders that registered as caught.
    catches: AtomicUsize,
    caught: Mutex<Vec<Caught>>,
    /// Threads inside `lock()` right now.
    in_lock: AtomicUsize,
    stop: AtomicBool,
}

const PAUSED_KEY: &str = "paused";
/// How long a holder not caught by a pause keeps the lock.
const SHORT_HOLD: Duration = Duration::from_millis(10);
/// A caught holder that never learns of its loss gives up after this long (and fails the test).
const CAUGHT_GIVE_UP: Duration = Duration::from_secs(10);

/// One holder thread: lock, hold while checking `is_held()`, record, unlock; until stopped.
/// Returns the number of holds, or what went wrong.
fn hold_repeatedly(client: &LockClient, holder: usize, shared: &Shared) -> Result<usize, String> {
    let mut holds = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        shared.in_lock.fetch_add(1, Ordering::SeqCst);
        let granted = client.lock(PAUSED_KEY);
        shared.in_lock.fetch_sub(1, Ordering::SeqCst);
        let guard = granted.map_err(|e| format!("holder {holder}: lock() failed: {e:?}"))?;
        let start = Instant::now();
        let token = guard.token().as_u64();
        // The hold lasts from `start` to the last moment is_held() said true, taken *before* the
        // call: is_held() compares its own, later reading of the clock with the local deadline.
        // A holder that finds the lock lost must not count the time after its last true check.
        let mut last_true = None;
        let mut caught = false;
        let mut lost_at = None;
        loop {
            let now = Instant::now();
            if !guard.is_held() {
                lost_at = Some(Instant::now());
                break;
            }
            last_true = Some(now);
            if !caught && shared.pausing.load(Ordering::SeqCst) {
                caught = true;
                shared.catches.fetch_add(1, Ordering::SeqCst);
            }
            let limit = if caught { CAUGHT_GIVE_UP } else { SHORT_HOLD };
            if now.duration_since(start) >= limit {
                break;
            }
            match guard.lost().recv_timeout(ms(1)) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                    lost_at = Some(Instant::now());
                    break;
                }
            }
        }
        // A hold never seen held (granted, then descheduled past its deadline) is not recorded:
        // its `start` may lie after the deadline.
        if let Some(end) = last_true {
            shared.history.record(Hold {
                key: PAUSED_KEY.into(),
                holder,
                token,
                start,
                end,
            });
        }
        let was_signalled = signalled(&guard);
        let held_after = guard.is_held();
        let unlock = guard.unlock();
        match &unlock {
            Ok(()) => {}
            Err(e) if e.is_lock_lost() => {}
            Err(e) => return Err(format!("holder {holder}: unlock failed: {e:?}")),
        }
        if caught {
            shared.caught.lock().unwrap().push(Caught {
                holder,
                token,
                start,
                lost_at,
                signalled: was_signalled,
                held_after,
                unlock: unlock.map_err(|e| format!("{e:?}")),
            });
        }
        holds += 1;
    }
    Ok(holds)
}

/// Redis stopped for twice the lease, twice, while six threads on two clients take turns on one
/// key: the holder caught by each pause learns of its loss (`lost()` fires, `is_held()` false)
/// during the pause, before anyone else is granted the key; the waiters blocked in `lock()` go on
/// once Redis resumes; the recorded holds never overlap and their tokens increase.
///
/// Protection: the local deadline (the send time of the last confirmed renewal plus the lease,
/// less the drift margin), which `is_held()` checks by itself and the renewal thread reports by,
/// since its read waits no longer than the deadline. Without it the holder learns of the loss only
/// from Redis, after the resume, racing the waiters' grants: its last true `is_held()` overlaps a
/// waiter's hold in the history, or `lost_at` falls after the pause; either fails the test
/// (checked by breaking the library; both outcomes were seen). Each hold's end is its last true
/// `is_held()`, so the history shows only overlaps the lock really allowed; an acquire that grants
/// a held key makes `History::check` fail here (also checked).
#[test]
fn redis_paused_past_the_lease_tells_the_holder_before_anyone_else_is_granted() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let pause = ms(2_000);
    let clients = [lock_client(&server, 1_000), lock_client(&server, 1_000)];
    let shared = Arc::new(Shared::default());
    let (done_tx, done_rx) = mpsc::channel();
    for holder in 0..6 {
        let client = clients[holder % 2].clone();
        let (shared, done) = (Arc::clone(&shared), done_tx.clone());
        thread::spawn(move || {
            let _ = done.send((holder, hold_repeatedly(&client, holder, &shared)));
        });
    }
    drop(done_tx);

    // (paused at, resumed at, threads inside lock() at the pause)
    let mut pauses: Vec<(Instant, Instant, usize)> = Vec::new();
    for round in 1..=2 {
        thread::sleep(ms(500));
        shared.pausing.store(true, Ordering::SeqCst);
        wait_until(ms(5_000), "a holder to be caught", || {
            shared.catches.load(Ordering::SeqCst) >= round
        });
        server.pause();
        let paused = Instant::now();
        thread::sleep(ms(100));
        let waiting = shared.in_lock.load(Ordering::SeqCst);
        thread::sleep(pause.saturating_sub(paused.elapsed()));
        shared.pausing.store(false, Ordering::SeqCst);
        server.resume();
        pauses.push((paused, Instant::now(), waiting));
    }
    thread::sleep(ms(500));
    shared.stop.store(true, Ordering::SeqCst);

    let deadline = Instant::now() + ms(15_000);
    for _ in 0..6 {
        let (holder, outcome) = done_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a holder thread hung (or panicked)");
        outcome.unwrap_or_else(|e| panic!("holder {holder}: {e}"));
    }

    let checked = shared
        .history
        .check()
        .unwrap_or_else(|e| panic!("history violated: {e}"));
    assert!(
        checked >= 20,
        "only {checked} holds: the test proves little"
    );
    let holds = shared.history.holds();
    let caught = shared.caught.lock().unwrap();
    assert_eq!(caught.len(), 2, "{caught:#?}");
    for ((paused, resumed, waiting), c) in pauses.iter().zip(caught.iter()) {
        let lost_at = c
            .lost_at
            .unwrap_or_else(|| panic!("the caught holder never learned of its loss: {c:?}"));
        assert!(
            lost_at > *paused && lost_at < *resumed,
            "loss noticed {:?} after the pause, which lasted {:?}: {c:?}",
            lost_at.saturating_duration_since(*paused),
            resumed.duration_since(*paused)
        );
        assert!(
            lost_at.duration_since(*paused) <= lease + ms(500),
            "loss noticed {:?} into the pause",
            lost_at.duration_since(*paused)
        );
        assert!(c.signalled, "lost() did not fire: {c:?}");
        assert!(!c.held_after, "is_held() true after the loss: {c:?}");
        let err = c.unlock.as_ref().expect_err("a stale unlock succeeded");
        assert!(err.contains("LockLost"), "{err}");
        // Nobody else was granted the key before the holder knew it had lost it.
        for h in holds
            .iter()
            .filter(|h| h.start > c.start && h.token != c.token)
        {
            assert!(
                h.start > lost_at,
                "holder {} (token {}) started {:?} before holder {} (token {}) noticed its loss",
                h.holder,
                h.token,
                lost_at.duration_since(h.start),
                c.holder,
                c.token
            );
        }
        // The waiters were blocked in lock() during the pause, and went on after it.
        assert!(
            *waiting >= 1,
            "nobody was waiting in lock() during the pause"
        );
        assert!(
            holds
                .iter()
                .any(|h| h.start > *resumed && h.start < *resumed + ms(3_000)),
            "no waiter was granted within 3 s of the resume"
        );
    }
}

// ---------------------------------------------------------------------------
// 3: Redis killed and restarted
// ---------------------------------------------------------------------------

/// Waiters blocked in `lock()` while Redis is killed and restarted: each one answers within 4 s of
/// the restart, with the lock or an error, and the same two clients (never rebuilt) work after.
/// With AOF, the lock held across the restart stays its holder's until released: the history of
/// the holder and the waiters has no overlap.
///
/// Protection: the wake-up path survives the restart. The holder's lease is 6 s and the waiters
/// last looked before the kill, so if nothing woke them they would sleep until that lease ran out:
/// past the 4 s bound. After an empty restart nobody publishes a release (the key just vanished),
/// so what wakes them is the re-subscription, which wakes every waiting queue head to look again;
/// with AOF the holder's release after the restart wakes them, which needs the pub/sub connection
/// re-established. (Checked by breaking the library: without the wake-up on re-subscription the
/// empty case fails, without reconnecting the pub/sub connection both fail.) Also, for an empty
/// restart, the clock floor of the tokens (a waiter's token repeating the holder's fails the
/// check), and with AOF the restored lock's exclusion (a waiter granted before the holder's
/// release overlaps it in the history).
fn waiters_survive_a_restart(mut server: RedisServer, durable: bool) {
    const KEY: &str = "outage";
    let a = lock_client(&server, 6_000);
    let b = lock_client(&server, 6_000);
    let history = History::new();
    let held = a.lock(KEY).unwrap();
    let held_start = Instant::now();
    let old_token = held.token().as_u64();

    let (tx, rx) = mpsc::channel();
    for waiter in 0..4 {
        let client = if waiter % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let (tx, history) = (tx.clone(), history.clone());
        thread::spawn(move || {
            let outcome = client.lock(KEY).map(|guard| {
                let start = Instant::now();
                thread::sleep(ms(20));
                let checked = Instant::now();
                if guard.is_held() {
                    history.record(Hold {
                        key: KEY.into(),
                        holder: waiter + 1,
                        token: guard.token().as_u64(),
                        start,
                        end: checked,
                    });
                }
                (guard.token().as_u64(), guard.unlock())
            });
            let _ = tx.send((waiter, outcome));
        });
    }
    drop(tx);
    thread::sleep(ms(300));
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "a waiter answered while the key was held"
    );

    server.kill();
    thread::sleep(ms(300));
    server.restart();
    let restarted = Instant::now();

    if durable {
        // The lock came back with the data: woken waiters find it held, and so does a newcomer.
        thread::sleep(ms(500));
        assert!(
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "a waiter was granted a lock restored from the AOF"
        );
        let rival = lock_client(&server, 30_000);
        assert!(rival.try_lock(KEY, Duration::ZERO).unwrap().is_none());
        let checked = Instant::now();
        assert!(held.is_held());
        history.record(Hold {
            key: KEY.into(),
            holder: 0,
            token: old_token,
            start: held_start,
            end: checked,
        });
        held.unlock().unwrap();
    } else {
        // The lock vanished with the data (a documented limit: no safety across an empty
        // restart); the holder must still hear of it, and fencing must still order the grants.
        let fired = held.lost().recv_timeout(ms(6_000));
        assert!(fired.is_ok(), "the holder never heard its lock was gone");
        assert!(!held.is_held());
        // What unlock() must say here is the subject of `a_lock_lost_to_an_empty_restart_...`.
        let unlocked = held.unlock();
        assert!(
            unlocked
                .as_ref()
                .map_or_else(|e| e.is_lock_lost(), |()| true),
            "{unlocked:?}"
        );
    }

    let deadline = restarted + ms(4_000);
    let mut granted = 0;
    for _ in 0..4 {
        let (waiter, outcome) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                panic!("a waiter blocked in lock() had no answer 4 s after the restart")
            });
        match outcome {
            Ok((token, unlocked)) => {
                granted += 1;
                assert!(token > old_token, "token {token} after {old_token}");
                unlocked.unwrap_or_else(|e| panic!("waiter {waiter}: unlock: {e:?}"));
            }
            Err(e) => assert!(e.is_connection(), "waiter {waiter}: {e:?}"),
        }
    }
    assert!(granted >= 1, "no waiter got the lock after the restart");
    history
        .check()
        .unwrap_or_else(|e| panic!("history violated: {e}"));

    for client in [&a, &b] {
        let guard = client.try_lock("after", ms(2_000)).unwrap().unwrap();
        assert!(guard.is_held());
        guard.unlock().unwrap();
    }
}

#[test]
fn waiters_answer_and_clients_recover_across_an_empty_restart() {
    waiters_survive_a_restart(RedisServer::start(), false);
}

#[test]
fn waiters_answer_and_the_lock_survives_a_restart_with_aof() {
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    waiters_survive_a_restart(server, true);
}

/// Redis restarted empty under a lone holder: renewal finds the key gone and reports the loss
/// (`lost()` fires, `is_held()` is false); `unlock()` must then say `LockLost`. The holder's pooled
/// connection predates the restart, so the release runs again on a fresh connection, which finds
/// the key gone.
///
/// Protection: `unlock()` (and so `with_lock`) reports a loss the guard has already signalled.
/// Without it the caller is told its hold ended cleanly after being told it was lost, and
/// `with_lock` hands back the value of a closure that may have run alongside another holder.
/// (This suite found `release()` mapping "key gone on the retry after a broken connection" to
/// `Ok(())` whatever the grant's loss flag said; fixed in 03d2b2a.)
#[test]
fn a_lock_lost_to_an_empty_restart_unlocks_as_lost() {
    let mut server = RedisServer::start();
    let client = lock_client(&server, 1_000);
    let held = client.lock("restarted").unwrap();
    server.restart();
    assert!(
        held.lost().recv_timeout(ms(3_000)).is_ok(),
        "the holder never heard its lock was gone"
    );
    assert!(!held.is_held());
    let err = held
        .unlock()
        .expect_err("a lock whose loss was reported was unlocked as if it had been held");
    assert!(err.is_lock_lost(), "{err:?}");
}

// ---------------------------------------------------------------------------
// 4: the connection reset, delayed, blackholed (TCP fault proxy)
// ---------------------------------------------------------------------------

/// The connection is reset after Redis granted an acquire but before its reply came back, and
/// stays down: the call fails with a connection error, the grant it made is an orphan that no
/// guard holds and nothing renews, and it expires with its lease; then a rival gets the key, with
/// a higher token, and the faulted client, reconnected, does not think it holds the key.
///
/// Protection: every grant carries its lease (SET PX) and the client renews only grants it handed
/// out. A grant without expiry, or one renewed although its reply never came, would keep the key
/// from the rival for its whole 4 s wait.
#[test]
fn a_reset_after_the_grant_leaves_an_orphan_that_expires_with_its_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(2_000);
    let client = builder(proxy.url(), lease)
        .connection_timeout(ms(500))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap(); // a pooled connection; the scripts loaded

    proxy.set_mode(Mode::Delay(ms(400)));
    let faulted = client.clone();
    let answer = spawn_answer(move || faulted.try_lock("orphan", Duration::ZERO));
    // The acquire reaches Redis 400 ms after it was sent; its reply is then held 400 ms more.
    wait_until(ms(5_000), "the delayed acquire to reach redis", || {
        lock_exists(&mut con, "orphan")
    });
    proxy.set_mode(Mode::Reset);
    let reset = Instant::now();
    let orphan_token = fence_value(&mut con, "orphan").unwrap();
    let pttl = lock_pttl(&mut con, "orphan");
    assert!(pttl > 0 && pttl <= 2_000, "orphan's pttl {pttl}");
    // The pool retries on a fresh connection, which the proxy resets too; the checkout gives up
    // after the 500 ms connection timeout.
    let err = answer
        .recv_timeout(ms(5_000))
        .expect("try_lock hung after a reset")
        .expect_err("granted although its reply was lost and the connection stayed down");
    assert!(err.is_connection(), "{err:?}");

    let fresh = rival
        .try_lock("orphan", ms(4_000))
        .unwrap()
        .expect("the orphaned grant outlived its lease");
    let freed = reset.elapsed();
    assert!(freed <= lease + ms(500), "the orphan lasted {freed:?}");
    assert!(fresh.token().as_u64() > orphan_token);

    proxy.set_mode(Mode::Pass);
    assert!(
        client.try_lock("orphan", Duration::ZERO).unwrap().is_none(),
        "the faulted client was granted the rival's lock"
    );
    fresh.unlock().unwrap();
    let again = client
        .try_lock("orphan", ms(3_000))
        .unwrap()
        .expect("the faulted client did not recover");
    again.unlock().unwrap();
}

/// The connection is reset after Redis granted an acquire but before its reply came back, and
/// the network works again at once: the pool repeats the acquire on a fresh connection and it
/// returns the grant already made (same token, no second grant), instead of "held" against the
/// caller's own orphan. Exactly one holder: a rival is refused until the guard unlocks.
///
/// Protection: the acquire script treats a lock already held by the same owner id as granted, and
/// one `try_lock` call keeps its owner id across the retry. Without that, the retry finds the key
/// held, `try_lock(ZERO)` returns `Ok(None)`, and the orphan blocks everyone for its lease.
#[test]
fn a_reply_lost_to_a_reset_is_retried_into_the_same_grant() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000)).build().unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Delay(ms(400)));
    let faulted = client.clone();
    let answer = spawn_answer(move || faulted.try_lock("retried", Duration::ZERO));
    wait_until(ms(5_000), "the delayed acquire to reach redis", || {
        lock_exists(&mut con, "retried")
    });
    let granted_token = fence_value(&mut con, "retried").unwrap();
    // The held reply dies with its connection; new connections still get through (delayed).
    proxy.close_connections();
    let guard = answer
        .recv_timeout(ms(10_000))
        .expect("try_lock hung after a reset")
        .expect("the retry after a reset failed")
        .expect("the retry took the caller's own grant for another holder's");
    assert_eq!(guard.token().as_u64(), granted_token);
    assert_eq!(
        fence_value(&mut con, "retried"),
        Some(granted_token),
        "the retry made a second grant"
    );

    proxy.set_mode(Mode::Pass);
    assert!(guard.is_held());
    assert!(rival.try_lock("retried", Duration::ZERO).unwrap().is_none());
    guard.unlock().unwrap();
    assert!(!lock_exists(&mut con, "retried"));
}

/// An acquire whose reply takes longer than the response timeout (the proxy delays each direction
/// by 500 ms; the timeout is 300 ms) fails with `is_timeout()`. Its late effect is undone: the
/// grant it made once it reached Redis is gone long before its 30 s lease, and a rival takes the
/// key. The connection that timed out, the client's only one, then answers the next acquire with
/// that acquire's own reply, not the late "granted".
///
/// Protection: after a timed-out acquire the client sends a compare-and-delete for its owner id on
/// the same connection, so it runs after the acquire whatever that did. Without it the lock key
/// stays for its 30 s lease and the wait for it to go fails. And late replies are skipped, never
/// read as a later command's (redis-rs counts the replies it gave up on; the pool could also drop
/// the connection): reading the late `{1, token}` as the next acquire's answer would give the
/// faulted client a guard for the key the rival holds.
#[test]
fn an_acquire_that_timed_out_is_undone_and_its_late_reply_is_never_taken_for_another() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .pool_size(1)
        .response_timeout(ms(300))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Delay(ms(500)));
    let started = Instant::now();
    let err = client
        .try_lock("late", Duration::ZERO)
        .expect_err("a reply 1 s late arrived within a 300 ms response timeout");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        started.elapsed() < ms(2_000),
        "took {:?}",
        started.elapsed()
    );
    proxy.set_mode(Mode::Pass);

    // The acquire ran late (the counter moved), and the compare-and-delete behind it removed its
    // lock.
    wait_until(ms(5_000), "the late grant to be undone", || {
        fence_value(&mut con, "late").is_some() && !lock_exists(&mut con, "late")
    });
    thread::sleep(ms(300));
    assert!(
        !lock_exists(&mut con, "late"),
        "a lock appeared after the clean-up"
    );

    let fresh = rival
        .try_lock("late", Duration::ZERO)
        .unwrap()
        .expect("a rival could not take the key");
    assert!(
        client.try_lock("late", Duration::ZERO).unwrap().is_none(),
        "the faulted client read a late reply as a grant of the rival's lock"
    );
    let other = client
        .try_lock("other", Duration::ZERO)
        .unwrap()
        .expect("the faulted client's connection is out of step");
    other.unlock().unwrap();
    fresh.unlock().unwrap();
}

/// Every byte dropped (the proxy's blackhole): `try_lock` and `lock` fail within the response
/// timeouts instead of waiting forever, nothing reaches Redis (no lock, no token), a rival talking
/// to Redis directly takes the key at once, and once the dead connections are torn down the same
/// client works again.
///
/// Protection: the response timeout on pooled connections (without it the calls hang, which the
/// bounds catch), and the pool's replacement of broken connections.
#[test]
fn a_blackholed_acquire_times_out_grants_nothing_and_the_client_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .response_timeout(ms(300))
        .connection_timeout(ms(1_000))
        .build()
        .unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let attempt = client.clone();
    let err = within(ms(5_000), "try_lock(ZERO) through a blackhole", move || {
        attempt.try_lock("dropped", Duration::ZERO).map(drop)
    })
    .expect_err("granted through a blackhole");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        started.elapsed() < ms(2_000),
        "took {:?}",
        started.elapsed()
    );
    let waiter = client.clone();
    let err = within(ms(5_000), "lock() through a blackhole", move || {
        waiter.lock("dropped").map(drop)
    })
    .expect_err("granted through a blackhole");
    assert!(err.is_connection(), "{err:?}");

    assert!(!lock_exists(&mut con, "dropped"));
    assert_eq!(fence_value(&mut con, "dropped"), None);
    rival
        .try_lock("dropped", Duration::ZERO)
        .unwrap()
        .expect("redis itself was fine")
        .unlock()
        .unwrap();

    // The partition ends the way it does for a TCP connection that lost bytes: the connection is
    // torn down.
    proxy.set_mode(Mode::Reset);
    proxy.set_mode(Mode::Pass);
    let guard = client
        .try_lock("dropped", ms(3_000))
        .unwrap()
        .expect("the client did not recover after the partition");
    assert!(guard.is_held());
    guard.unlock().unwrap();
}

/// A pooled connection whose command timed out is not handed out again: after a partition that
/// silently dropped bytes and then healed without tearing connections down, the next call works
/// on a fresh connection instead of timing out for ever on one still waiting for lost replies.
///
/// Protection: the pool retires a connection on a response timeout. Without that, the warm
/// connection goes back to the pool out of step and every later call on it times out.
#[test]
fn a_connection_that_timed_out_is_not_reused() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = builder(proxy.url(), ms(30_000))
        .response_timeout(ms(300))
        .pool_size(1)
        .build()
        .unwrap();
    client.lock("warm").unwrap().unlock().unwrap();

    proxy.set_mode(Mode::Blackhole);
    let err = client.try_lock("healed", Duration::ZERO).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // The partition heals without a reset: the old connection is still open, but out of step.
    proxy.set_mode(Mode::Pass);
    for attempt in 0..3 {
        let got = client.try_lock("healed", Duration::ZERO);
        assert!(
            matches!(got, Ok(Some(_))),
            "attempt {attempt} after the partition healed: {got:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// 5: the renewal thread's connection broken mid-hold
// ---------------------------------------------------------------------------

/// The renewal thread's connection is cut every 200 ms for five leases of 500 ms: it reconnects
/// each time and the lock stays held throughout, in the guard and in Redis.
///
/// Protection: after a failed round trip the renewal thread drops the connection, reconnects and
/// retries after lease/10. A renewal thread that kept the broken connection, or stopped retrying,
/// would let the lease lapse within one lease of the first cut.
#[test]
fn renewal_reconnects_when_its_connection_is_cut() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(500);
    let client = builder(proxy.url(), lease).build().unwrap();
    let rival = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = client.lock("cut").unwrap();

    let accepted_before = proxy.accepted_connections();
    let started = Instant::now();
    let mut cuts = 0;
    while started.elapsed() < lease * 5 {
        thread::sleep(ms(200));
        proxy.close_connections();
        cuts += 1;
        assert!(guard.is_held(), "lost after {cuts} cuts");
        assert_eq!(guard.lost().try_recv(), Err(TryRecvError::Empty));
        assert!(lock_pttl(&mut con, "cut") > 0, "the lease ran out in redis");
    }
    thread::sleep(ms(200));
    assert!(guard.is_held());
    let reconnects = proxy.accepted_connections() - accepted_before;
    assert!(
        reconnects >= cuts / 2,
        "{reconnects} new connections over {cuts} cuts: renewal did not reconnect"
    );
    assert!(rival.try_lock("cut", Duration::ZERO).unwrap().is_none());
    guard.unlock().unwrap();
    assert!(!lock_exists(&mut con, "cut"));
}

/// The renewal thread is cut off (blackhole) for longer than the lease: the loss signal fires
/// within lease + 500 ms although no reply and no error ever arrives, `is_held()` is false, and
/// the next holder, talking to Redis directly, gets the key with a higher token; the stale
/// holder's unlock then leaves the new holder's lock alone.
///
/// Protection: the renewal thread waits for a reply, and for a new connection, no longer than the
/// first local deadline in its batch, then reports the loss. Waiting the full response timeout
/// (5 s) on the blackholed connection instead would keep `lost()` silent past the bound: nobody
/// calls `is_held()` before it fires, so only the renewal thread can fire it. The unlock is a
/// compare-and-delete: a plain DEL would remove the new holder's lock.
#[test]
fn renewal_cut_off_past_the_deadline_reports_the_loss_before_the_next_holder() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = ms(500);
    let client = builder(proxy.url(), lease).build().unwrap();
    let direct = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = client.lock("partitioned").unwrap();
    let token = guard.token();
    thread::sleep(ms(300));

    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let fired = guard.lost().recv_timeout(lease + ms(500));
    let noticed = cut.elapsed();
    assert!(
        !matches!(fired, Err(RecvTimeoutError::Timeout)),
        "no loss signal within {noticed:?} of the cut"
    );
    assert!(!guard.is_held());

    let fresh = direct
        .try_lock("partitioned", ms(3_000))
        .unwrap()
        .expect("the cut-off lease never ran out in redis");
    assert!(fresh.token() > token);

    proxy.set_mode(Mode::Pass);
    let err = guard.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(
        lock_exists(&mut con, "partitioned"),
        "the stale unlock removed the new holder's lock"
    );
    fresh.unlock().unwrap();
}

// ---------------------------------------------------------------------------
// 6: the pool exhausted by the caller's own threads
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

    server.pause();
    let (started_tx, started_rx) = mpsc::channel();
    let busy = client.clone();
    let answer = spawn_answer(move || {
        let _ = started_tx.send(());
        busy.try_lock("first", Duration::ZERO)
    });
    started_rx.recv_timeout(ms(5_000)).unwrap();
    thread::sleep(ms(300)); // the first thread holds the connection, waiting for Redis

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

// ---------------------------------------------------------------------------
// 7: Redis error replies
// ---------------------------------------------------------------------------

/// `SCRIPT FLUSH` under a live client: acquire, release and renewal all reload their scripts on
/// NOSCRIPT. A guard with a 400 ms lease is held across two flushes for three leases.
///
/// Protection: the NOSCRIPT fallback, in the renewal thread's pipelines (EVALSHA only, reloaded by
/// hand) and in acquire/release. Without it in the renewal, every extend fails with NOSCRIPT and
/// the guard is marked lost within a lease; without it in acquire/release, those calls return a
/// NOSCRIPT error, which the unwraps catch.
#[test]
fn noscript_after_a_script_flush_is_recovered_everywhere() {
    let server = RedisServer::start();
    let client = lock_client(&server, 400);
    let mut con = server.connection();
    let flush = |con: &mut redis::Connection| {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(con).unwrap();
    };
    let guard = client.lock("flushed").unwrap();
    flush(&mut con);
    thread::sleep(ms(600));
    flush(&mut con);
    thread::sleep(ms(600));
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
    let client = lock_client(&server, 400);
    let mut con = server.connection();
    let held = client.lock("held-before").unwrap();

    config_set(&mut con, "maxmemory-policy", "noeviction").unwrap();
    config_set(&mut con, "maxmemory", "1").unwrap();
    assert_refused_with(&client, "full", "OOM");
    assert!(!lock_exists(&mut con, "full"));
    thread::sleep(ms(600));
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
/// acquire with the Redis error, and no lock is left behind without a token.
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

/// `min-replicas-to-write 1` with no replica: acquires get code NOREPLICAS, never "held".
///
/// Protection: as for OOM.
#[test]
fn noreplicas_is_a_typed_error() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    config_set(&mut con, "min-replicas-to-write", "1").unwrap();
    assert_refused_with(&client, "unreplicated", "NOREPLICAS");
    assert!(!lock_exists(&mut con, "unreplicated"));
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
    // Still loading, most likely: an error or a grant, never "held" after a wait.
    match client.try_lock("loading", ms(200)) {
        Err(e) => assert_eq!(e.redis_code(), Some("LOADING"), "{e:?}"),
        Ok(got) => assert!(got.is_some(), "a free key was reported held"),
    }

    let deadline = Instant::now() + ms(20_000);
    let guard = loop {
        match client.try_lock("loading", Duration::ZERO) {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("a free key was reported held"),
            Err(e) => {
                assert_eq!(e.redis_code(), Some("LOADING"), "{e:?}");
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

// ---------------------------------------------------------------------------
// 8: the holder process frozen past its lease
// ---------------------------------------------------------------------------

/// Kleppmann's case: a holder process (`examples/hold.rs`) frozen with SIGSTOP past its 500 ms
/// lease. The test is granted the key only after that lease ran out in Redis, with a higher token;
/// the holder, resumed, finds `is_held()` false and its unlock reports the loss without touching
/// the new holder's lock.
///
/// Protection: fencing (a higher token for the new grant, so storage could refuse the stale
/// holder); the local deadline, which makes `is_held()` false on resume although the holder's
/// renewal thread was frozen too (by `is_held()`'s own clock check or the renewal thread's overdue
/// check, whichever runs first: without both, it prints `held=true`); and release as a
/// compare-and-delete (a plain DEL prints `released` and deletes the test's lock).
#[test]
fn a_holder_frozen_past_its_lease_finds_it_lost_and_harms_nobody() {
    let server = RedisServer::start();
    let mut holder = Child::spawn({
        let mut cmd = Command::new(example_bin("hold"));
        cmd.args(["frozen", "500"])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", NAMESPACE);
        cmd
    });
    let line = holder.expect_line("token ", ms(10_000));
    let holder_token: u64 = line["token ".len()..].trim().parse().unwrap();
    let client = lock_client(&server, 30_000);

    holder.pause();
    let frozen = Instant::now();
    let guard = client
        .try_lock("frozen", ms(3_000))
        .unwrap()
        .expect("the frozen holder's lease never ran out");
    let waited = frozen.elapsed();
    // Renewed every lease/3 before the freeze, so about 2/3 of the lease was left.
    assert!(
        waited >= ms(250),
        "granted {waited:?} after the freeze, before the lease could run out"
    );
    assert!(guard.token().as_u64() > holder_token);
    thread::sleep(ms(1_000).saturating_sub(frozen.elapsed()));

    holder.resume();
    holder.send_line("");
    assert_eq!(holder.expect_line("held=", ms(5_000)), "held=false");
    assert_eq!(holder.expect_line("", ms(5_000)), "lost");
    let status = holder
        .wait_exit(ms(5_000))
        .expect("the holder did not exit");
    assert!(status.success(), "{status}");

    let mut con = server.connection();
    assert!(
        lock_exists(&mut con, "frozen"),
        "the stale unlock removed the new holder's lock"
    );
    assert!(guard.is_held());
    guard.unlock().unwrap();
}
