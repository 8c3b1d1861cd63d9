//! `contention`: T threads over C clients on one key, critical section S, think time W; runs
//! with W, with no think time, 1 ms critical sections back to back, and the baseline.
//!
//! Critical sections and think times are `thread::sleep`, which overshoots by the timer slack
//! (about 50-100 µs); lock utilization uses the measured time between `lock()` returning and
//! `unlock()` being called, clipped to the run, over the run's length.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockGuard};

use crate::baseline::Baseline;
use crate::measure::{Noise, ThreadCpu};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, RedisServer};
use crate::stats::pct;

pub trait Locker: Send + 'static {
    type Held;
    fn acquire(&mut self, key: &str) -> Self::Held;
    fn release(&mut self, key: &str, held: Self::Held);
}

impl Locker for LockClient {
    type Held = LockGuard;
    fn acquire(&mut self, key: &str) -> LockGuard {
        self.lock(key).expect("lock")
    }
    fn release(&mut self, _key: &str, held: LockGuard) {
        held.unlock().expect("unlock");
    }
}

impl Locker for Baseline {
    type Held = String;
    fn acquire(&mut self, key: &str) -> String {
        self.lock(key)
    }
    fn release(&mut self, key: &str, owner: String) {
        self.unlock(key, &owner);
    }
}

pub struct Contention {
    elapsed: Duration,
    /// Grants within the run.
    acquisitions: u64,
    waits: Vec<Duration>,
    per_thread: Vec<u64>,
    held: Duration,
    pub overlaps: u64,
    /// EVALSHA, SET and PUBLISH calls the servers saw during the run (all clients of the run),
    /// PUBLISH counting those made by scripts.
    evalsha: u64,
    set: u64,
    publish: u64,
    /// CPU of this process's threads during the run, by group.
    threads: String,
}

/// `stats`: the servers whose calls are counted (summed), e.g. every master of a quorum.
pub fn run_contention<L: Locker>(
    stats: &[&RedisServer],
    lockers: Vec<L>,
    key: &str,
    critical: Duration,
    think: Duration,
    duration: Duration,
) -> Contention {
    let holders = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let n = lockers.len();
    let ready = Arc::new(Barrier::new(n + 1));
    let start = Arc::new(Mutex::new(None::<Instant>));
    let mut handles = Vec::new();
    for (i, mut locker) in lockers.into_iter().enumerate() {
        let (holders, overlaps, ready, start) = (
            Arc::clone(&holders),
            Arc::clone(&overlaps),
            Arc::clone(&ready),
            Arc::clone(&start),
        );
        let key = key.to_owned();
        let h = thread::Builder::new()
            .name(format!("bench-{i}"))
            .spawn(move || {
                // Warm up: connections made, scripts loaded.
                let held = locker.acquire(&format!("{key}:warm:{i}"));
                locker.release(&format!("{key}:warm:{i}"), held);
                ready.wait();
                ready.wait();
                let start = start.lock().expect("start").expect("start set");
                let end = start + duration;
                let mut waits = Vec::new();
                let mut count = 0u64;
                let mut held_total = Duration::ZERO;
                while Instant::now() < end {
                    let asked = Instant::now();
                    let held = locker.acquire(&key);
                    let got = Instant::now();
                    if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    if !critical.is_zero() {
                        thread::sleep(critical);
                    }
                    let done = Instant::now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    locker.release(&key, held);
                    waits.push(got - asked);
                    if got < end {
                        count += 1;
                        held_total += done.min(end).saturating_duration_since(got.max(start));
                    }
                    if !think.is_zero() {
                        thread::sleep(think);
                    }
                }
                (waits, count, held_total)
            })
            .expect("spawn");
        handles.push(h);
    }
    ready.wait();
    let mut stats: Vec<redis::Connection> = stats.iter().map(|s| s.connection()).collect();
    let commands = |stats: &mut [redis::Connection]| {
        let mut calls = (0, 0, 0);
        for con in stats {
            calls.0 += command_calls(con, "evalsha");
            calls.1 += command_calls(con, "set");
            calls.2 += command_calls(con, "publish");
        }
        calls
    };
    let before = commands(&mut stats);
    let threads_before = ThreadCpu::snapshot();
    let began = Instant::now();
    *start.lock().expect("start") = Some(began);
    ready.wait();
    thread::sleep((began + duration).saturating_duration_since(Instant::now()));
    let threads_after = ThreadCpu::snapshot();
    let after = commands(&mut stats);
    let mut out = Contention {
        elapsed: duration,
        acquisitions: 0,
        waits: Vec::new(),
        per_thread: Vec::new(),
        held: Duration::ZERO,
        overlaps: 0,
        evalsha: after.0 - before.0,
        set: after.1 - before.1,
        publish: after.2 - before.2,
        threads: String::new(),
    };
    for h in handles {
        let (waits, count, held) = h.join().expect("bench thread");
        out.waits.extend(waits);
        out.acquisitions += count;
        out.per_thread.push(count);
        out.held += held;
    }
    out.overlaps = overlaps.load(Ordering::Relaxed);
    out.threads = threads_after.per_op_since(&threads_before, out.acquisitions);
    out.waits.sort_unstable();
    out
}

impl Contention {
    /// Two runs of the same lockers as one: the counts added, the thread CPU of both.
    pub fn merge(mut self, other: Contention) -> Contention {
        self.elapsed += other.elapsed;
        self.acquisitions += other.acquisitions;
        self.waits.extend(other.waits);
        self.waits.sort_unstable();
        for (a, b) in self.per_thread.iter_mut().zip(other.per_thread) {
            *a += b;
        }
        self.held += other.held;
        self.overlaps += other.overlaps;
        self.evalsha += other.evalsha;
        self.set += other.set;
        self.publish += other.publish;
        self.threads = format!("{}; then {}", self.threads, other.threads);
        self
    }

    pub fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }
    /// PUBLISH calls (scripts' included) per acquisition.
    pub fn publish_per_acquisition(&self) -> f64 {
        self.publish as f64 / self.acquisitions.max(1) as f64
    }
    pub fn utilization(&self) -> f64 {
        self.held.as_secs_f64() / self.elapsed.as_secs_f64()
    }
    fn max_min(&self) -> (u64, u64) {
        let max = self.per_thread.iter().copied().max().unwrap_or(0);
        let min = self.per_thread.iter().copied().min().unwrap_or(0);
        (max, min)
    }
    pub fn fairness(&self) -> f64 {
        let (max, min) = self.max_min();
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }
    fn p99(&self) -> Duration {
        pct(&self.waits, 0.99)
    }
    /// The `q` percentile of the waits.
    pub fn wait(&self, q: f64) -> Duration {
        pct(&self.waits, q)
    }
    pub fn describe(&self, r: &mut Report, bench: &str, who: &str) {
        let (max, min) = self.max_min();
        r.info(
            bench,
            &format!("{who}: acquisitions/s, utilization"),
            format!("{:.0}/s, {:.1}%", self.rate(), 100.0 * self.utilization()),
        );
        r.info(
            bench,
            &format!("{who}: wait p50 / p99 / max"),
            format!(
                "{} / {} / {}",
                fmt_d(pct(&self.waits, 0.5)),
                fmt_d(self.p99()),
                fmt_d(self.waits.last().copied().unwrap_or_default())
            ),
        );
        r.info(
            bench,
            &format!("{who}: per-thread acquisitions max/min"),
            format!("{max}/{min} = {:.2}", self.fairness()),
        );
        r.info(
            bench,
            &format!("{who}: per acquisition: EVALSHA, SET calls"),
            format!(
                "{:.2}, {:.2}",
                self.evalsha as f64 / self.acquisitions.max(1) as f64,
                self.set as f64 / self.acquisitions.max(1) as f64
            ),
        );
        r.info(
            bench,
            &format!("{who}: client CPU per acquisition by thread"),
            self.threads.clone(),
        );
        if self.acquisitions > 0 {
            r.info(
                bench,
                &format!("{who}: mean hold, overlapping holds"),
                format!(
                    "{}, {}",
                    fmt_d(self.held / self.acquisitions as u32),
                    self.overlaps
                ),
            );
        }
    }
}

pub fn fencelock_lockers(url: &str, threads: usize, clients: usize) -> Vec<LockClient> {
    spread((0..clients).map(|_| client(url)).collect(), threads)
}

/// `threads` lockers taken from `clients` in turn.
pub fn spread(clients: Vec<LockClient>, threads: usize) -> Vec<LockClient> {
    (0..threads)
        .map(|i| clients[i % clients.len()].clone())
        .collect()
}

fn baseline_lockers(server: &RedisServer, threads: usize) -> Vec<Baseline> {
    (0..threads)
        .map(|i| Baseline::new(server, format!("base-{i}")))
        .collect()
}

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "3 contention";
    let noise = Noise::start(server.pid());
    let url = server.url();
    let (t, c, s, w) = (p.threads, p.clients, p.critical, p.think);
    section(&format!(
        "3. contention: T={t} threads over C={c} clients, one key, S={}, W={}, {} per run",
        fmt_d(s),
        fmt_d(w),
        fmt_d(p.duration)
    ));

    println!(" -- fencelock, with think time W");
    let fl = run_contention(
        &[server],
        fencelock_lockers(&url, t, c),
        "hot:1",
        s,
        w,
        p.duration,
    );
    fl.describe(r, B, "W: fencelock");
    println!(
        " -- baseline, with think time W ({})",
        fmt_d(p.base_duration)
    );
    let base = run_contention(
        &[server],
        baseline_lockers(server, t),
        "hot:b1",
        s,
        w,
        p.base_duration,
    );
    base.describe(r, B, "W: baseline");
    r.check(
        B,
        "W: fencelock per-thread max/min",
        format!("{:.2}", fl.fairness()),
        "≤ 1.5",
        fl.fairness() <= 1.5,
    );
    let ratio = base.p99().as_secs_f64() / fl.p99().as_secs_f64().max(1e-9);
    r.check(
        B,
        "W: baseline p99 wait / fencelock p99 wait",
        format!("{ratio:.1}× ({} vs {})", fmt_d(base.p99()), fmt_d(fl.p99())),
        "≥ 20×",
        ratio >= 20.0,
    );

    println!(" -- fencelock, no think time");
    let fl0 = run_contention(
        &[server],
        fencelock_lockers(&url, t, c),
        "hot:2",
        s,
        Duration::ZERO,
        p.duration,
    );
    fl0.describe(r, B, "W=0: fencelock");
    r.check(
        B,
        "W=0: fencelock per-thread max/min",
        format!("{:.2} (min {})", fl0.fairness(), fl0.max_min().1),
        "≤ 3, min > 0",
        fl0.fairness() <= 3.0,
    );
    println!(" -- baseline, no think time ({})", fmt_d(p.base_duration));
    let base0 = run_contention(
        &[server],
        baseline_lockers(server, t),
        "hot:b2",
        s,
        Duration::ZERO,
        p.base_duration,
    );
    base0.describe(r, B, "W=0: baseline");

    println!(" -- fencelock, 1 ms critical sections back to back");
    let ms1 = Duration::from_millis(1);
    let util = run_contention(
        &[server],
        fencelock_lockers(&url, t, c),
        "hot:3",
        ms1,
        Duration::ZERO,
        p.duration,
    );
    util.describe(r, B, "S=1ms W=0: fencelock");
    r.check(
        B,
        "S=1ms W=0: lock utilization",
        format!("{:.1}%", 100.0 * util.utilization()),
        "≥ 85%",
        util.utilization() >= 0.85,
    );
    let overlaps = fl.overlaps + fl0.overlaps + util.overlaps + base.overlaps + base0.overlaps;
    r.check(
        B,
        "overlapping holds seen (all runs)",
        overlaps.to_string(),
        "0",
        overlaps == 0,
    );
    noise.report(r, B);
}
