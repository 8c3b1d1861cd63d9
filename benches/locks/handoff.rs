//! `handoff`: a holder releases while one waiter is blocked in `lock()`; the release-to-grant
//! latency of fencelock (waiter on another client, and on the same client), of the same handoff
//! on plain connections (the physical limit), and of the baseline.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::baseline::Baseline;
use crate::measure::{CpuMeter, Noise};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, RedisServer, NOOP};
use crate::stats::{jitter, pct, sorted};

/// Waits until Redis has run `command` more than `before` times: the waiter's first attempt
/// was made (so it will be woken by the release), whatever the scheduler did meanwhile.
pub fn wait_for_attempt(stats: &mut redis::Connection, command: &str, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while command_calls(stats, command) <= before {
        assert!(Instant::now() < deadline, "the waiter never attempted");
        thread::sleep(Duration::from_micros(200));
    }
}

/// Release-to-grant latencies: the holder (this thread) takes the lock, lets the waiter block in
/// `lock()`, waits a moment, and releases; the time runs from the start of the release to the
/// waiter's `lock()` returning.
///
/// Returns `(release-to-grant, the holder's unlock() alone)`.
pub fn handoff_fencelock(
    server: &RedisServer,
    holder: LockClient,
    waiter: LockClient,
    key: &str,
    n: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut stats = server.connection();
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<Instant>(0);
    let key_w = key.to_owned();
    let t = thread::spawn(move || {
        while go_rx.recv().is_ok() {
            let guard = waiter.lock(&key_w).expect("waiter lock");
            let granted = Instant::now();
            guard.unlock().expect("waiter unlock");
            done_tx.send(granted).expect("report");
        }
    });
    let mut out = Vec::with_capacity(n);
    let mut unlocks = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let guard = holder.lock(key).expect("holder lock");
        let before = command_calls(&mut stats, "evalsha");
        go_tx.send(()).expect("go");
        wait_for_attempt(&mut stats, "evalsha", before);
        // Time for the waiter to block after its failed attempt, and for the machine to idle.
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let released = Instant::now();
        guard.unlock().expect("holder unlock");
        let unlocked = Instant::now();
        let granted = done_rx.recv().expect("granted");
        if i >= 5 {
            out.push(granted.saturating_duration_since(released));
            unlocks.push(unlocked - released);
        }
    }
    drop(go_tx);
    t.join().expect("waiter thread");
    (out, unlocks)
}

fn handoff_baseline(server: &RedisServer, key: &str, n: usize) -> Vec<Duration> {
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<Instant>(0);
    let mut waiter = Baseline::new(server, "base-waiter".into());
    let key_w = key.to_owned();
    let t = thread::spawn(move || {
        while go_rx.recv().is_ok() {
            let owner = waiter.lock(&key_w);
            let granted = Instant::now();
            waiter.unlock(&key_w, &owner);
            done_tx.send(granted).expect("report");
        }
    });
    let mut holder = Baseline::new(server, "base-holder".into());
    let mut stats = server.connection();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let owner = holder.lock(key);
        let before = command_calls(&mut stats, "set");
        go_tx.send(()).expect("go");
        wait_for_attempt(&mut stats, "set", before);
        // A random phase against the waiter's 100 ms sleep.
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(5),
            Duration::from_millis(105),
        ));
        let released = Instant::now();
        holder.unlock(key, &owner);
        let granted = done_rx.recv().expect("granted");
        out.push(granted.saturating_duration_since(released));
    }
    drop(go_tx);
    t.join().expect("waiter thread");
    out
}

const RAW_ACQUIRE: &str =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 1 end return 0";
const RAW_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], KEYS[1]) return 1 end return 0";

/// The physical limit of a handoff on plain connections, in the same shape as fencelock's: the
/// waiter tries once, blocks reading its own pub/sub connection, and on the release message runs
/// one acquire script. Returns `(release-to-grant, a no-op EVALSHA after the same idle time)`.
fn handoff_raw(server: &RedisServer, key: &str, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (tried_tx, tried_rx) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<Instant>(0);
    let mut sub = server.connection();
    let mut con_w = server.connection();
    let key_w = key.to_owned();
    let t = thread::spawn(move || {
        let acquire = redis::Script::new(RAW_ACQUIRE);
        let release = redis::Script::new(RAW_RELEASE);
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe("raw:released").expect("subscribe");
        while go_rx.recv().is_ok() {
            let got: i64 = acquire
                .key(&key_w)
                .arg("w")
                .invoke(&mut con_w)
                .expect("acquire");
            assert_eq!(got, 0, "the holder holds the key");
            tried_tx.send(()).expect("tried");
            pubsub.get_message().expect("release message");
            let got: i64 = acquire
                .key(&key_w)
                .arg("w")
                .invoke(&mut con_w)
                .expect("acquire");
            let granted = Instant::now();
            assert_eq!(got, 1, "granted after the release");
            let _: i64 = release
                .key(&key_w)
                .arg("w")
                .arg("raw:nobody")
                .invoke(&mut con_w)
                .expect("release");
            done_tx.send(granted).expect("report");
        }
    });
    let mut con = server.connection();
    let acquire = redis::Script::new(RAW_ACQUIRE);
    let release = redis::Script::new(RAW_RELEASE);
    let noop = redis::Script::new(NOOP);
    let mut out = Vec::with_capacity(n);
    let mut cold = Vec::with_capacity(n);
    for i in 0..n + 5 {
        // A cold round trip: the same idle time as before a release.
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let t = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let cold_rt = t.elapsed();
        let got: i64 = acquire.key(key).arg("h").invoke(&mut con).expect("acquire");
        assert_eq!(got, 1);
        go_tx.send(()).expect("go");
        tried_rx.recv().expect("tried");
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let released = Instant::now();
        let _: i64 = release
            .key(key)
            .arg("h")
            .arg("raw:released")
            .invoke(&mut con)
            .expect("release");
        let granted = done_rx.recv().expect("granted");
        if i >= 5 {
            out.push(granted.saturating_duration_since(released));
            cold.push(cold_rt);
        }
    }
    drop(go_tx);
    t.join().expect("raw waiter thread");
    (out, cold)
}

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "2 handoff";
    let noise = Noise::start(server.pid());
    section("2. handoff: release-to-grant latency with one waiter blocked in lock()");
    let url = server.url();
    let cpu = CpuMeter::new(server.pid());
    let (cross, unlocks) =
        handoff_fencelock(server, client(&url), client(&url), "handoff:x", p.handoffs);
    let (client_cpu, redis_cpu) = cpu.per_op(p.handoffs as u64 + 5);
    let (cross, unlocks) = (sorted(cross), sorted(unlocks));
    let a = client(&url);
    let same = sorted(handoff_fencelock(server, a.clone(), a, "handoff:s", p.handoffs).0);
    let (raw, cold) = handoff_raw(server, "handoff:r", p.handoffs);
    let (raw, cold) = (sorted(raw), sorted(cold));
    let base = sorted(handoff_baseline(server, "handoff:b", p.base_handoffs));

    let p50 = pct(&cross, 0.5);
    let p99 = pct(&cross, 0.99);
    r.check(
        B,
        "waiter on another client: p50",
        r.lat(p50),
        "≤ 4× RT",
        r.ratio(p50) <= 4.0,
    );
    r.check(
        B,
        "waiter on another client: p99",
        r.lat(p99),
        "≤ 20 ms",
        p99 <= Duration::from_millis(20),
    );
    r.info(
        B,
        "waiter on another client: max",
        r.lat(*cross.last().expect("samples")),
    );
    r.info(
        B,
        "of which the holder's unlock(): p50",
        r.lat(pct(&unlocks, 0.5)),
    );
    r.info(
        B,
        "plain redis, same shape (the physical limit): p50 / p99",
        format!("{} / {}", r.lat(pct(&raw, 0.5)), fmt_d(pct(&raw, 0.99))),
    );
    r.info(
        B,
        "a no-op EVALSHA after the same idle time: p50",
        r.lat(pct(&cold, 0.5)),
    );
    r.info(
        B,
        "fencelock p50 / plain-redis p50",
        format!("{:.2}", p50.as_secs_f64() / pct(&raw, 0.5).as_secs_f64()),
    );
    r.info(
        B,
        "waiter on the same client: p50 / p99",
        format!("{} / {}", r.lat(pct(&same, 0.5)), fmt_d(pct(&same, 0.99))),
    );
    r.info(
        B,
        "baseline: p50 / p99",
        format!(
            "{} / {} ({} samples)",
            fmt_d(pct(&base, 0.5)),
            fmt_d(pct(&base, 0.99)),
            base.len()
        ),
    );
    let speedup = pct(&base, 0.5).as_secs_f64() / p50.as_secs_f64();
    r.check(
        B,
        "baseline p50 / fencelock p50",
        format!("{speedup:.0}×"),
        "≥ 100×",
        speedup >= 100.0,
    );
    r.info(
        B,
        "CPU per handoff cycle: client, redis",
        format!("{}, {}", fmt_d(client_cpu), fmt_d(redis_cpu)),
    );
    noise.report(r, B);
}
