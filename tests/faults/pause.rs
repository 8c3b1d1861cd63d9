//! Fault injection, Redis paused: the server stopped (SIGSTOP, then SIGCONT) for less and for more
//! than a lease, and a holder process frozen past its lease.
//!
//! A pause is where a lease is easiest to get wrong. A slow reply is not a loss, so a short pause
//! must cost the holder nothing; a pause past the lease must tell the holder of its loss before
//! anyone else is granted the key; and a holder frozen past its lease must harm nobody when it
//! wakes, since it may still believe it holds the lock.
//!
//! Each test names the protection it checks and why it fails without it. Servers are throw-away
//! `redis-server`s on loopback (tests/support), never one on 6379. Bounds are generous, since the
//! suite runs on small, busy machines, but each is far below what the broken behaviour would take.
//!
//! `a_holder_frozen_past_its_lease_...` runs `examples/hold.rs`: a plain `cargo test` builds it;
//! before a filtered `cargo test --test faults`, run `cargo build --examples`.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, TryRecvError};
use fencelock::{LockClient, LockGuard};

use crate::support::faults::wait_until;
use crate::support::history::{History, Hold};
use crate::support::{
    example_bin, lock_client, lock_exists, lock_pttl, ms, Child, RedisServer, NAMESPACE,
};

// ---------------------------------------------------------------------------
// Redis paused (SIGSTOP)
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

/// Whether the guard's loss signal fired (a message, or the channel disconnected).
fn signalled(guard: &LockGuard) -> bool {
    !matches!(guard.lost().try_recv(), Err(TryRecvError::Empty))
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
// the holder process frozen past its lease
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
