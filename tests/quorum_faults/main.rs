//! Quorum mode under faults of single masters, with five redis-servers (AOF on), two clients of
//! four threads each, short leases, every hold recorded from its grant to the last moment its
//! holder saw it held, and fenced writes to a separate server: holds never overlap, tokens rise
//! per key, and the store accepts no stale write.
//!
//! - two masters frozen for several leases: locking goes on, and a held lock stays held;
//! - a master killed, wiped and restarted after a lease: it serves again, tokens rise across it;
//!   and when it was the master whose counter was ahead, later grants still take tokens above
//!   the one it gave (the write-back carried that token to the rest of the majority);
//! - two masters frozen under two clients contending on a few keys: grants keep a good part of
//!   the healthy pace, and neither client starves;
//! - three masters frozen: nothing is granted, every call answers within its timeout, a held
//!   lock is reported lost within a lease, and locking resumes after the thaw;
//! - the canary: the protocol run by hand with the library's own scripts, once without the
//!   write-back (a later majority mints a lower token: the check catches it) and once with it.
//!
//! The tests run one at a time ([`serial`]): each starts six servers and eight threads, and the
//! time bounds of one must not pay for another's load on a small machine. So this is a test
//! binary of its own, where no other quorum test runs beside them.

#[path = "../support/mod.rs"]
mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::crossbeam_channel::RecvTimeoutError;
use fencelock::{FencedRedis, LockClient};

use support::faults::spawn_answer;
use support::fenced_workload::{resource, Workload, WorkloadConfig};
use support::history::{History, Hold};
use support::quorum::{pace, Quorum};
use support::{fence_key, lock_key, ms, RedisServer, NAMESPACE};

const MASTERS: usize = 5;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Two clients on a quorum, and a fenced store on a server of its own (the store is not on the
/// quorum). Fields drop in order: clients before the servers they talk to.
struct Rig {
    clients: Vec<LockClient>,
    store: FencedRedis,
    _store_server: RedisServer,
    quorum: Quorum,
}

fn rig(lease: Duration) -> Rig {
    let quorum = Quorum::start(MASTERS);
    let clients = vec![quorum.client(lease), quorum.client(lease)];
    let store_server = RedisServer::start();
    let store = FencedRedis::open(store_server.url()).unwrap();
    Rig {
        clients,
        store,
        _store_server: store_server,
        quorum,
    }
}

#[test]
fn two_frozen_masters_do_not_stop_locking() {
    let _one = serial();
    let lease = ms(500);
    let rig = rig(lease);
    let load = Workload::start(
        &rig.clients,
        &rig.store,
        &WorkloadConfig::new(&["x", "y"], lease),
    );
    load.await_grants(0, 20, Duration::from_secs(10));
    // Held across the freeze, on a key of its own: renewals by three masters of five keep it.
    let steady = rig.clients[0].lock("steady").unwrap();

    rig.quorum.freeze(1);
    rig.quorum.freeze(3);
    let frozen_at = Instant::now();
    let before = load.grants();
    let mut checks = 0;
    while frozen_at.elapsed() < lease * 6 && checks < 1_000 {
        assert!(
            steady.is_held(),
            "a lock renewed by three masters of five was lost {:?} into the freeze",
            frozen_at.elapsed()
        );
        checks += 1;
        thread::sleep(ms(20));
    }
    let during = load.grants() - before;
    // Released while the two are still frozen: a majority of releases is enough. (After the
    // thaw the lock would stand on three masters only, their leases on the other two having run
    // out, so one master slow to renew on a busy machine could end it: that is the protocol.)
    steady.unlock().unwrap();
    rig.quorum.thaw(1);
    rig.quorum.thaw(3);

    // Replies the frozen masters owed arrive now, late: none may count for a later request.
    let after = load.grants();
    load.await_grants(after, 20, Duration::from_secs(10));
    let outcome = load.stop();
    outcome.assert_safe();
    assert!(
        during >= 10,
        "only {during} grants in {:?} with two masters of five frozen ({})",
        lease * 6,
        outcome.summary()
    );
}

/// Two clients of four threads each taking three keys in turn (`try_lock(key, 2 s)`, a short hold,
/// `unlock`), with the default timeouts: with two of five masters frozen they keep a good part of
/// the pace they had with all five, and each client gets its share. The three live masters must
/// all grant for a majority, so two attempts that meet split them; such an attempt once waited
/// for the frozen masters until its validity ran out, and grants fell to about 1% of the healthy
/// count.
#[test]
fn a_frozen_minority_keeps_the_pace_of_two_contending_clients() {
    let _one = serial();
    let lease = ms(1_500);
    let q = Quorum::start(MASTERS);
    let client = || {
        LockClient::builder(q.topology())
            .namespace(NAMESPACE)
            .lease(lease)
            .build()
            .unwrap()
    };
    let clients = [client(), client()];
    let keys = ["pace-a", "pace-b", "pace-c"];
    let run = ms(2_000);
    let healthy = pace(&clients, &keys, 4, ms(2_000), run);
    q.freeze(1);
    q.freeze(2);
    let frozen = pace(&clients, &keys, 4, ms(2_000), run);
    q.thaw_all();
    eprintln!("all five masters: {healthy}\ntwo of five frozen: {frozen}");
    assert!(healthy.total() >= 40, "the workload did not run: {healthy}");
    assert_eq!(frozen.errors, 0, "{frozen}");
    assert!(
        frozen.total() * 3 >= healthy.total(),
        "with two of five masters frozen: {frozen}; with all five: {healthy}"
    );
    // An attempt that waited for the frozen masters waited until its validity ran out.
    assert!(
        frozen.wait(0.99) < lease / 3,
        "waits near the lease with two of five masters frozen: {frozen}"
    );
    for (c, grants) in frozen.grants.iter().enumerate() {
        assert!(
            grants * 12 >= frozen.total(),
            "client {c} starved with two of five masters frozen: {frozen}"
        );
    }
}

#[test]
fn a_wiped_master_restarted_after_a_lease_serves_again_and_tokens_rise() {
    let _one = serial();
    let lease = ms(400);
    let mut rig = rig(lease);
    let load = Workload::start(
        &rig.clients,
        &rig.store,
        &WorkloadConfig::new(&["x", "y"], lease),
    );
    load.await_grants(0, 20, Duration::from_secs(10));

    rig.quorum.kill_and_wipe(0);
    load.await_grants(load.grants(), 10, Duration::from_secs(10));
    rig.quorum.restart(0);
    assert_eq!(rig.quorum.fence(0, "x"), None, "master 0 was not wiped");
    // With two others frozen, no majority forms without the master that came back empty: the
    // clients must reach it again, and its grants must not take the tokens back.
    rig.quorum.freeze(1);
    rig.quorum.freeze(2);
    let before = load.grants();
    load.await_grants(before, 10, Duration::from_secs(10));
    rig.quorum.thaw(1);
    rig.quorum.thaw(2);
    let outcome = load.stop();
    outcome.assert_safe();
    assert!(
        rig.quorum.fence(0, "x").is_some() || rig.quorum.fence(0, "y").is_some(),
        "the restarted master minted nothing"
    );
}

#[test]
fn tokens_stay_above_a_grant_from_a_master_that_was_ahead_and_lost_its_data() {
    let _one = serial();
    let lease = ms(400);
    let mut rig = rig(lease);
    let q = &rig.quorum;
    // Master 0's counter leads every clock by 1000 s: whatever it mints beats the other masters'
    // clock floors for the rest of the test, so only the write-back can carry its token on.
    let now = (0..MASTERS).map(|i| q.clock_us(i)).max().unwrap();
    let ahead = now + 1_000_000_000;
    q.set_fence(0, "ahead", ahead);
    // Masters 3 and 4 frozen: the grant's majority is 0, 1 and 2, so it takes its token from 0.
    q.freeze(3);
    q.freeze(4);
    let guard = rig.clients[0].lock("ahead").unwrap();
    let start = Instant::now();
    let t1 = guard.token().as_u64();
    assert!(
        t1 > ahead,
        "the grant's token {t1} is not the largest of its majority's (master 0 minted above \
         {ahead})"
    );
    // Reported only once written back to the majority.
    for i in [1, 2] {
        let fence = q.fence(i, "ahead");
        assert!(
            fence >= Some(t1),
            "master {i}'s fence is {fence:?} when the grant of {t1} was reported"
        );
    }
    // The store learns of t1: a later grant whose token fell below it would be refused there.
    rig.store
        .incr_by(&resource("ahead"), guard.token(), 1)
        .unwrap();
    assert!(guard.is_held());
    let end = Instant::now();
    guard.unlock().unwrap();
    q.thaw(3);
    q.thaw(4);

    rig.quorum.kill_and_wipe(0);
    let load = Workload::start(
        &rig.clients,
        &rig.store,
        &WorkloadConfig::new(&["ahead"], lease),
    );
    load.await_grants(0, 15, Duration::from_secs(10));
    rig.quorum.restart(0);
    // Master 0 is back, empty, its clock 1000 s below t1. With 3 and 4 frozen, every majority
    // is 0, 1 and 2 again: only 1 and 2 know of t1.
    rig.quorum.freeze(3);
    rig.quorum.freeze(4);
    load.await_grants(load.grants(), 10, Duration::from_secs(10));
    rig.quorum.thaw_all();
    let outcome = load.stop();

    let below: Vec<u64> = outcome
        .history
        .holds()
        .iter()
        .map(|h| h.token)
        .filter(|&t| t <= t1)
        .collect();
    assert!(
        below.is_empty(),
        "{} grants after the wipe took tokens at or below {t1}: {:?} ({})",
        below.len(),
        &below[..below.len().min(5)],
        outcome.summary()
    );
    assert!(
        outcome.writes.len() >= 10,
        "the store refused the grants after the wipe ({})",
        outcome.summary()
    );
    outcome.history.record(Hold {
        key: "ahead".to_owned(),
        holder: 999,
        token: t1,
        start,
        end,
    });
    outcome.assert_safe();
}

/// A bounded `try_lock`: its outcome ("granted", "refused" or "error") and how long it took;
/// `None` if it did not return within `timeout` + 3 s (it hung on a frozen master).
fn timed_try(
    client: &LockClient,
    key: &str,
    timeout: Duration,
) -> Option<(&'static str, Duration)> {
    let (client, key) = (client.clone(), key.to_owned());
    let answer = spawn_answer(move || {
        let started = Instant::now();
        let outcome = match client.try_lock(&key, timeout) {
            Ok(Some(_)) => "granted",
            Ok(None) => "refused",
            Err(_) => "error",
        };
        (outcome, started.elapsed())
    });
    match answer.recv_timeout(timeout + Duration::from_secs(3)) {
        Ok(answer) => Some(answer),
        Err(mpsc::RecvTimeoutError::Timeout) => None,
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("try_lock panicked"),
    }
}

#[test]
fn three_frozen_masters_grant_nothing_answer_in_time_and_lose_held_locks() {
    let _one = serial();
    let lease = ms(600);
    let rig = rig(lease);
    let q = &rig.quorum;
    let held = rig.clients[0].lock("held").unwrap();
    assert!(held.is_held());
    let lost = held.lost().clone();

    q.freeze(0);
    q.freeze(1);
    q.freeze(2);
    let frozen_at = Instant::now();
    // Callers on both clients, for the held key and free ones, with timeouts from none to
    // longer than a lease; each call started after the freeze, so none may be granted.
    let callers: Vec<_> = (0..4)
        .map(|t| {
            let client = rig.clients[t % 2].clone();
            thread::spawn(move || {
                let mut calls = Vec::new();
                // Throughout the freeze: a call that fails at once is followed by others, some
                // of which meet the clients' reconnection attempts to the frozen masters.
                for round in 0..200 {
                    if frozen_at.elapsed() >= ms(2_500) {
                        break;
                    }
                    let timeout = [Duration::ZERO, ms(200), ms(700)][(t + round) % 3];
                    let key = if round % 2 == 0 { "held" } else { "free" };
                    calls.push((timeout, timed_try(&client, key, timeout)));
                    thread::sleep(ms(20));
                }
                calls
            })
        })
        .collect();

    // is_held turns false by itself once the last renewal a majority confirmed is a lease old,
    // and that renewal was sent before the freeze.
    let mut false_after = None;
    for _ in 0..1_000 {
        if !held.is_held() {
            false_after = Some(frozen_at.elapsed());
            break;
        }
        if frozen_at.elapsed() > lease + ms(1_000) {
            break;
        }
        thread::sleep(ms(2));
    }
    let false_after = false_after.unwrap_or_else(|| {
        panic!(
            "still held {:?} after three masters of five froze",
            frozen_at.elapsed()
        )
    });
    assert!(
        false_after <= lease + ms(300),
        "held for {false_after:?} after the freeze, with a lease of {lease:?}"
    );
    let wait = (lease + ms(1_500)).saturating_sub(frozen_at.elapsed());
    match lost.recv_timeout(wait) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => {}
        Err(RecvTimeoutError::Timeout) => panic!(
            "lost() did not fire within {:?} of the freeze",
            lease + ms(1_500)
        ),
    }

    let mut calls = Vec::new();
    for caller in callers {
        calls.extend(caller.join().unwrap());
    }
    q.thaw_all();
    let thawed = Instant::now();

    assert!(calls.len() >= 8, "only {} calls", calls.len());
    for (timeout, outcome) in &calls {
        let (what, took) = outcome.unwrap_or_else(|| {
            panic!("a try_lock with a timeout of {timeout:?} hung on the frozen masters")
        });
        assert_ne!(what, "granted", "granted by two masters of five: {calls:?}");
        assert!(
            took <= *timeout + ms(1_000),
            "a try_lock with a timeout of {timeout:?} answered after {took:?}"
        );
    }

    // After the thaw the frozen masters' leases are over, and their late replies to the calls
    // above must not confuse later ones: locking works again. A call may still fail at once
    // for a moment (a connection error ends a wait, and a client waits a little before it
    // connects again to a master it could not reach), so each is short and errors are retried.
    let mut again = None;
    let mut last = String::new();
    for _ in 0..50 {
        if thawed.elapsed() >= Duration::from_secs(5) {
            break;
        }
        match rig.clients[1].try_lock("held", ms(500)) {
            Ok(Some(guard)) => {
                again = Some(guard);
                break;
            }
            Ok(None) => last = "refused".to_owned(),
            Err(e) => {
                last = e.to_string();
                thread::sleep(ms(50));
            }
        }
    }
    let again = again.unwrap_or_else(|| {
        panic!(
            "not granted within {:?} of the thaw (last: {last})",
            thawed.elapsed()
        )
    });
    assert!(again.is_held());
    assert!(again.token() > held.token());
    again.unlock().unwrap();
    drop(held);
}

// ---------------------------------------------------------------------------
// The canary: the protocol by hand, with the library's scripts
// ---------------------------------------------------------------------------

const GRANT_LUA: &str = include_str!("../../src/scripts/grant.lua");
const ACQUIRE_LUA: &str = include_str!("../../src/scripts/acquire.lua");
const CONFIRM_LUA: &str = include_str!("../../src/scripts/confirm.lua");
const RELEASE_LUA: &str = include_str!("../../src/scripts/quorum_release.lua");
/// The lease and fence idle expiry the hand-run protocol asks for, in ms.
const CANARY_LEASE_MS: u64 = 10_000;
const CANARY_IDLE_MS: u64 = 24 * 60 * 60 * 1000;

/// One master of the hand-run protocol.
struct Master {
    con: redis::Connection,
}

impl Master {
    fn eval(&mut self, body: &str, keys: &[String], args: &[String]) -> redis::Value {
        redis::cmd("EVAL")
            .arg(body)
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .query(&mut self.con)
            .unwrap_or_else(|e| panic!("EVAL: {e}"))
    }

    /// acquire.lua, a single try: the token if granted.
    fn acquire(&mut self, key: &str, owner: &str) -> Option<u64> {
        let body = format!("{GRANT_LUA}{ACQUIRE_LUA}");
        let keys = ["lock", "fence", "queue", "waiters"]
            .map(|kind| format!("{NAMESPACE}:{kind}:{{{key}}}"));
        let args = [
            owner.to_owned(),
            CANARY_LEASE_MS.to_string(),
            "0".to_owned(),
            CANARY_IDLE_MS.to_string(),
        ];
        match self.eval(&body, &keys, &args) {
            redis::Value::Array(reply) => match reply.as_slice() {
                [redis::Value::Int(1), token] => {
                    let token: String = redis::from_redis_value_ref(token).unwrap();
                    Some(token.parse().unwrap())
                }
                [redis::Value::Int(0), _] => None,
                other => panic!("acquire replied {other:?}"),
            },
            other => panic!("acquire replied {other:?}"),
        }
    }

    /// confirm.lua: raise the fence to `t` while the lock is `owner`'s.
    fn confirm(&mut self, key: &str, owner: &str, t: u64) -> bool {
        let body = format!("{GRANT_LUA}{CONFIRM_LUA}");
        let keys = [lock_key(key), fence_key(key)];
        let args = [
            owner.to_owned(),
            t.to_string(),
            CANARY_LEASE_MS.to_string(),
            CANARY_IDLE_MS.to_string(),
        ];
        self.eval(&body, &keys, &args) == redis::Value::Int(1)
    }

    /// quorum_release.lua: compare-and-delete.
    fn release(&mut self, key: &str, owner: &str) -> bool {
        let keys = [lock_key(key)];
        let args = [owner.to_owned(), format!("{NAMESPACE}:freed:{{{key}}}")];
        self.eval(RELEASE_LUA, &keys, &args) == redis::Value::Int(1)
    }

    fn fence(&mut self, key: &str) -> Option<u64> {
        let value: Option<String> = redis::cmd("GET")
            .arg(fence_key(key))
            .query(&mut self.con)
            .unwrap();
        value.map(|v| v.parse().unwrap())
    }

    fn clock_us(&mut self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.con).unwrap();
        secs * 1_000_000 + micros
    }
}

/// One run of the scripted interleaving on `key`: master A's counter is ahead; client 1 is
/// granted by A and B (C does not answer in time), takes T1 = max = A's token, optionally writes
/// it back to A and B, works and releases; then client 2, cut off from A, is granted by B and C.
/// Returns the two holds, in grant order.
fn interleave(masters: &mut [Master; 3], key: &str, write_back: bool) -> History {
    let [a, b, c] = masters;
    let ahead = a.clock_us().max(b.clock_us()).max(c.clock_us()) + 1_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(fence_key(key))
        .arg(ahead.to_string())
        .query(&mut a.con)
        .unwrap();
    let history = History::new();

    let start = Instant::now();
    let (c1, c2) = (format!("{key}-client1:1"), format!("{key}-client2:1"));
    let from_a = a.acquire(key, &c1).expect("A grants client 1");
    let from_b = b.acquire(key, &c1).expect("B grants client 1");
    assert_eq!(from_a, ahead + 1, "A mints from its counter");
    assert!(from_b < from_a, "B mints from its clock: {from_b}");
    let t1 = from_a.max(from_b);
    if write_back {
        assert!(a.confirm(key, &c1, t1), "A: client 1's lock is gone");
        assert!(b.confirm(key, &c1, t1), "B: client 1's lock is gone");
        assert_eq!(b.fence(key), Some(t1));
    }
    history.record(Hold {
        key: key.to_owned(),
        holder: 1,
        token: t1,
        start,
        end: Instant::now(),
    });
    assert!(a.release(key, &c1));
    assert!(b.release(key, &c1));

    let start = Instant::now();
    let t2 = [
        b.acquire(key, &c2).expect("B grants client 2"),
        c.acquire(key, &c2).expect("C grants client 2"),
    ]
    .into_iter()
    .max()
    .unwrap();
    history.record(Hold {
        key: key.to_owned(),
        holder: 2,
        token: t2,
        start,
        end: Instant::now(),
    });
    history
}

#[test]
fn canary_the_token_check_catches_a_quorum_without_write_back() {
    let _one = serial();
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let mut masters = servers.each_ref().map(|s| Master {
        con: s.connection(),
    });

    // Without the write-back the second majority never saw T1: its largest token is a clock
    // reading, 1000 s below it. The same check the fault tests rely on must say so.
    let without = interleave(&mut masters, "no-write-back", false);
    let holds = without.holds();
    assert!(
        holds[1].token <= holds[0].token,
        "the canary did not fail: {} then {} without the write-back",
        holds[0].token,
        holds[1].token
    );
    let found = without
        .check()
        .expect_err("the history check missed a token going back");
    assert!(found.contains("token not increasing"), "{found}");

    // With it, B carries T1 into the second majority, and B mints above it.
    let with = interleave(&mut masters, "write-back", true);
    let holds = with.holds();
    assert!(
        holds[1].token > holds[0].token,
        "{} then {} with the write-back",
        holds[0].token,
        holds[1].token
    );
    with.check().unwrap();

    // A confirm that arrives after the lock changed hands changes nothing: raising the fence
    // under client 2's feet, or counting B for client 1, would be wrong.
    let [_, b, _] = &mut masters;
    let before = b.fence("write-back");
    let late = before.unwrap() + 1_000_000_000_000;
    assert!(!b.confirm("write-back", "write-back-client1:1", late));
    assert_eq!(b.fence("write-back"), before);
}
