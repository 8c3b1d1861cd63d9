//! fencelock benchmarks: round trips, handoff, contention, a thread pool, renewal at scale.
//!
//! ```text
//! cargo bench --bench locks                       # everything (about 75 s)
//! cargo bench --bench locks -- handoff            # only benchmarks whose name contains "handoff"
//! cargo bench --bench locks -- contention T=8 W_US=0
//! BENCH_T=8 BENCH_D_MS=2000 cargo bench --bench locks -- contention
//! ```
//!
//! Each run starts its own `redis-server` on a free loopback port (never the one on 6379) and
//! first measures a PING and a no-op EVALSHA (`return 1`) round trip on a plain connection; every
//! latency below is also printed as a ratio to that EVALSHA round trip (p50, "RT"). Targets are
//! checked and printed as PASS/MISS; they are informational, the exit code is 0 regardless. A
//! markdown table of every result closes the output (docs/benchmarks.md keeps the latest).
//!
//! On a small VM one loopback round trip takes 1× or 2-3× as long depending on whether the
//! client thread and redis-server run on one core or two, and a round trip that wakes an idle
//! machine takes several times longer again. So the targets that compare with a round trip use
//! one measured in the same conditions where that matters: lock + unlock against two no-op
//! EVALSHA from the same thread just before it, and handoff against the same handoff done on
//! plain connections. Each benchmark also prints how much CPU other processes and the hypervisor
//! (steal) took meanwhile: results from a busy machine are not comparable.
//!
//! Benchmarks (names for the filter arguments):
//!
//! - `rtt`: PING and no-op EVALSHA round trips (always measured: everything is relative to it);
//! - `uncontended`: `lock` + `unlock` from one thread over many keys;
//! - `handoff`: a holder releases while one waiter is blocked in `lock()`: release-to-grant
//!   latency, fencelock (waiter on another client, and on the same client), the same handoff on
//!   plain connections (release script with PUBLISH, waiter on its own SUBSCRIBE connection,
//!   then one acquire script: the physical limit), and the baseline;
//! - `contention`: T threads over C clients on one key, critical section S, think time W; runs
//!   with W, with no think time, 1 ms critical sections back to back, and the baseline;
//! - `pool`: N workers take jobs, each locks one of K keys and does a short fenced write;
//!   compared with the EVALSHA rate Redis sustains from N threads in the same run;
//! - `renewal`: R locks held for several lease periods: round trips per renewal tick, CPU
//!   time of the renewal thread, client heap per held lock.
//!
//! The baseline is the common hand-written lock: `SET key owner NX PX 30000`, on failure
//! sleep 100 ms and retry; release by a compare-and-delete script.
//!
//! Parameters: an argument `KEY=VALUE` or the environment variable `BENCH_KEY` (the argument
//! wins). Unknown `--flags` (cargo passes `--bench`) are ignored.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `T` | 16 | contention: threads |
//! | `C` | 2 | contention: clients the threads are spread over |
//! | `S_US` | 100 | contention: critical section, µs (a sleep) |
//! | `W_US` | 1000 | contention: think time between acquisitions, µs (a sleep) |
//! | `D_MS` | 5000 | duration of each contention run and of each half of `pool`, ms |
//! | `BASE_D_MS` | 10000 | duration of each baseline contention run, ms |
//! | `N` | 32 | pool: worker threads |
//! | `K` | 10000 | pool: keys |
//! | `P` | N | pool: the client's connection pool size |
//! | `U` | 5000 | uncontended: lock + unlock iterations |
//! | `H` | 300 | handoff: fencelock samples (per variant) |
//! | `HB` | 60 | handoff: baseline samples (each waits up to 100 ms) |
//! | `R` | 10000 | renewal: locks held |
//! | `LEASE_MS` | 3000 | renewal: lease of the held locks, ms (renewal every lease/3) |
//! | `LEASES` | 4 | renewal: how many lease periods the locks are held |
//! | `RTT` | 10000 | samples of each round-trip baseline |
//!
//! How things are measured:
//!
//! - Latencies come from `Instant` around the call; percentiles are nearest-rank.
//! - Critical sections and think times are `thread::sleep`, which overshoots by the timer
//!   slack (about 50-100 µs); lock utilization uses the measured time between `lock()`
//!   returning and `unlock()` being called, clipped to the run, over the run's length.
//! - CPU time: `getrusage` for the bench process (all threads), `/proc/<pid>/task/<tid>/schedstat`
//!   for redis-server and for single threads (nanoseconds on CPU).
//! - Round trips per renewal tick are counted by a loopback proxy in front of the renewal
//!   client that parses RESP: it forwards replies only once the client has sent nothing for
//!   2 ms and every command is answered, so a round trip is exactly "client sends, then waits
//!   for every reply". Ticks are round trips carrying EVALSHA, grouped by gaps of lease/10.
//! - Client heap per held lock comes from a counting global allocator (live bytes over the
//!   acquisition of R locks, proxy threads excluded); VmRSS growth is printed beside it.

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{LockClient, LockGuard};
use support::RedisServer;

// ---------------------------------------------------------------------------------------------
// counting allocator
// ---------------------------------------------------------------------------------------------

/// Counts live heap bytes while `COUNTING` is on, except in threads that opted out.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Set in the proxy's threads: their buffers are the bench's, not the lock's.
    static NOT_COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTING.load(Ordering::Relaxed) && !NOT_COUNTED.try_with(Cell::get).unwrap_or(true)
}

fn count(delta: isize) {
    if counted() {
        LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees hold; the counting only touches atomics and a const-initialized thread-local
// without a destructor, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds the rest.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------------------------
// parameters
// ---------------------------------------------------------------------------------------------

struct Params {
    filters: Vec<String>,
    threads: usize,
    clients: usize,
    critical: Duration,
    think: Duration,
    duration: Duration,
    base_duration: Duration,
    workers: usize,
    keys: u64,
    pool_size: u32,
    uncontended: usize,
    handoffs: usize,
    base_handoffs: usize,
    renew_locks: usize,
    renew_lease: Duration,
    renew_leases: u32,
    rtt_samples: usize,
}

impl Params {
    fn parse() -> Params {
        let mut args: Vec<(String, String)> = Vec::new();
        let mut filters = Vec::new();
        for arg in std::env::args().skip(1) {
            if arg.starts_with('-') {
                continue; // `--bench` from cargo, and any other flag
            }
            match arg.split_once('=') {
                Some((k, v)) => args.push((k.to_ascii_uppercase(), v.to_owned())),
                None => filters.push(arg.to_ascii_lowercase()),
            }
        }
        let get = |key: &str, default: u64| -> u64 {
            let raw = args
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(format!("BENCH_{key}")).ok());
            match raw {
                Some(v) => v
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("parameter {key}={v:?}: {e}")),
                None => default,
            }
        };
        let workers = get("N", 32).max(1) as usize;
        Params {
            filters,
            threads: get("T", 16).max(1) as usize,
            clients: get("C", 2).max(1) as usize,
            critical: Duration::from_micros(get("S_US", 100)),
            think: Duration::from_micros(get("W_US", 1000)),
            duration: Duration::from_millis(get("D_MS", 5000).max(100)),
            base_duration: Duration::from_millis(get("BASE_D_MS", 10_000).max(100)),
            workers,
            keys: get("K", 10_000).max(1),
            pool_size: get("P", workers as u64).clamp(1, u64::from(fencelock::MAX_POOL_SIZE))
                as u32,
            uncontended: get("U", 5000).max(10) as usize,
            handoffs: get("H", 300).max(5) as usize,
            base_handoffs: get("HB", 60).max(3) as usize,
            renew_locks: get("R", 10_000).max(1) as usize,
            renew_lease: Duration::from_millis(get("LEASE_MS", 3000).max(30)),
            renew_leases: get("LEASES", 4).max(1) as u32,
            rtt_samples: get("RTT", 10_000).max(100) as usize,
        }
    }

    fn selected(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}

// ---------------------------------------------------------------------------------------------
// small helpers: percentiles, formatting, randomness, CPU and memory readings
// ---------------------------------------------------------------------------------------------

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort_unstable();
    v
}

fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / v.len() as u32
}

fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// splitmix64: a fixed, dependency-free stream of well-mixed numbers.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A duration in `[lo, hi)`, picked by `seed`.
fn jitter(seed: u64, lo: Duration, hi: Duration) -> Duration {
    let span = (hi - lo).as_nanos().max(1) as u64;
    lo + Duration::from_nanos(mix(seed) % span)
}

/// Nanoseconds on CPU of one task, from its schedstat.
fn task_cpu(pid: u32, tid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or(Duration::ZERO)
}

/// `(tid, comm)` of every live thread of `pid`.
fn tasks(pid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        Some((tid, comm.trim().to_owned()))
    })
    .collect()
}

/// CPU time of all live threads of `pid` (threads that exited are not counted).
fn process_cpu(pid: u32) -> Duration {
    tasks(pid).iter().map(|(tid, _)| task_cpu(pid, *tid)).sum()
}

fn self_pid() -> u32 {
    std::process::id()
}

/// CPU time of this whole process so far, exited threads included.
fn self_cpu() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` through a pointer to a live, writable one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU used by the bench process (all threads) and by redis-server between `new()` and
/// `per_op()`.
struct CpuMeter {
    redis_pid: u32,
    ours: Duration,
    redis: Duration,
}

impl CpuMeter {
    fn new(redis_pid: u32) -> CpuMeter {
        CpuMeter {
            redis_pid,
            ours: self_cpu(),
            redis: process_cpu(redis_pid),
        }
    }

    /// `(client CPU per op, redis CPU per op)`.
    fn per_op(&self, ops: u64) -> (Duration, Duration) {
        let ours = self_cpu().saturating_sub(self.ours);
        let redis = process_cpu(self.redis_pid).saturating_sub(self.redis);
        let ops = ops.max(1) as u32;
        (ours / ops, redis / ops)
    }
}

/// CPU time of every live thread of this process, by tid, with its thread group: the name
/// without a trailing number (`bench-3` → `bench`), the main thread as `main`.
struct ThreadCpu(std::collections::HashMap<u32, (String, Duration)>);

impl ThreadCpu {
    fn snapshot() -> ThreadCpu {
        let pid = self_pid();
        ThreadCpu(
            tasks(pid)
                .into_iter()
                .map(|(tid, name)| {
                    let group = if tid == pid {
                        "main".to_owned()
                    } else {
                        name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
                            .to_owned()
                    };
                    (tid, (group, task_cpu(pid, tid)))
                })
                .collect(),
        )
    }

    /// CPU per op of each group since `before`, largest first, as text.
    fn per_op_since(&self, before: &ThreadCpu, ops: u64) -> String {
        let mut groups: Vec<(String, Duration)> = Vec::new();
        for (tid, (group, now)) in &self.0 {
            let then = before.0.get(tid).map_or(Duration::ZERO, |(_, d)| *d);
            let used = now.saturating_sub(then);
            match groups.iter_mut().find(|(g, _)| g == group) {
                Some((_, d)) => *d += used,
                None => groups.push((group.clone(), used)),
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.1));
        groups
            .iter()
            .filter(|(_, d)| !d.is_zero())
            .take(5)
            .map(|(g, d)| format!("{g} {}", fmt_d(*d / ops.max(1) as u32)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `(busy, steal)` jiffies of the whole machine, from /proc/stat.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    (at(0) + at(1) + at(2) + at(5) + at(6), at(7))
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// What else ran on the machine: CPU used by processes other than this one and redis-server,
/// and time stolen by the hypervisor, as shares of all CPUs.
struct Noise {
    at: Instant,
    jiffies: (u64, u64),
    ours: Duration,
    redis: Duration,
    redis_pid: u32,
}

impl Noise {
    fn start(redis_pid: u32) -> Noise {
        Noise {
            at: Instant::now(),
            jiffies: machine_jiffies(),
            ours: self_cpu(),
            redis: process_cpu(redis_pid),
            redis_pid,
        }
    }

    fn report(&self, r: &mut Report, bench: &str) {
        let wall = self.at.elapsed().as_secs_f64();
        let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let (busy, steal) = machine_jiffies();
        let hz = clock_ticks_per_sec();
        let busy = busy.saturating_sub(self.jiffies.0) as f64 / hz;
        let steal = steal.saturating_sub(self.jiffies.1) as f64 / hz;
        let ours = self_cpu().saturating_sub(self.ours).as_secs_f64();
        let redis = process_cpu(self.redis_pid)
            .saturating_sub(self.redis)
            .as_secs_f64();
        let others = (busy - ours - redis).max(0.0);
        r.info(
            bench,
            "machine: bench + redis, other processes, steal",
            format!(
                "{:.0}%, {:.0}%, {:.0}% of {cpus} CPUs",
                100.0 * (ours + redis) / (wall * cpus),
                100.0 * others / (wall * cpus),
                100.0 * steal / (wall * cpus)
            ),
        );
    }
}

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn client(url: &str) -> LockClient {
    LockClient::builder(url)
        .namespace("bench")
        .build()
        .expect("LockClient")
}

// ---------------------------------------------------------------------------------------------
// the report
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Verdict {
    Pass,
    Miss,
    Info,
}

struct Row {
    bench: String,
    metric: String,
    value: String,
    target: String,
    verdict: Verdict,
}

struct Report {
    /// p50 of a no-op EVALSHA round trip: the unit of every ratio.
    evalsha: Duration,
    rows: Vec<Row>,
}

impl Report {
    fn ratio(&self, d: Duration) -> f64 {
        d.as_secs_f64() / self.evalsha.as_secs_f64()
    }

    /// A latency with its ratio to the EVALSHA round trip.
    fn lat(&self, d: Duration) -> String {
        format!("{} ({:.2}× RT)", fmt_d(d), self.ratio(d))
    }

    fn row(&mut self, bench: &str, metric: &str, value: String, target: &str, verdict: Verdict) {
        let mark = match verdict {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Info => "",
        };
        println!("  {metric:<44} {value:<40} {target} {mark}");
        self.rows.push(Row {
            bench: bench.to_owned(),
            metric: metric.to_owned(),
            value,
            target: target.to_owned(),
            verdict,
        });
    }

    fn info(&mut self, bench: &str, metric: &str, value: String) {
        self.row(bench, metric, value, "", Verdict::Info);
    }

    fn check(&mut self, bench: &str, metric: &str, value: String, target: &str, ok: bool) {
        let verdict = if ok { Verdict::Pass } else { Verdict::Miss };
        self.row(bench, metric, value, target, verdict);
    }

    fn summary(&self) -> String {
        let mut out =
            String::from("| benchmark | metric | result | target | |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            let mark = match r.verdict {
                Verdict::Pass => "PASS",
                Verdict::Miss => "**MISS**",
                Verdict::Info => "",
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {mark} |",
                r.bench, r.metric, r.value, r.target
            );
        }
        out
    }
}

fn section(title: &str) {
    println!("\n== {title}");
}

// ---------------------------------------------------------------------------------------------
// round-trip baselines
// ---------------------------------------------------------------------------------------------

struct Rtt {
    ping: Duration,
    evalsha: Duration,
    /// Lowest and highest EVALSHA p50 of the blocks.
    evalsha_blocks: (Duration, Duration),
}

/// PING and no-op EVALSHA, interleaved so both see the same conditions, in 20 blocks separated by
/// short sleeps; the first samples after each sleep (a cold machine) are dropped. Whether the
/// client thread and redis-server share a core changes a round trip by up to 3× on a small VM
/// and tends to last for seconds: the spread of the blocks' p50 shows it.
fn measure_rtt(server: &RedisServer, samples: usize) -> Rtt {
    const BLOCKS: usize = 20;
    const DROPPED: usize = 20;
    let mut con = server.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query(&mut con)
        .expect("SCRIPT LOAD");
    let ping_cmd = redis::cmd("PING");
    let mut evalsha_cmd = redis::cmd("EVALSHA");
    evalsha_cmd.arg(&sha).arg(0);
    let per_block = (samples / BLOCKS).max(10);
    let mut ping = Vec::with_capacity(samples);
    let mut evalsha = Vec::with_capacity(samples);
    let mut blocks = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        thread::sleep(Duration::from_millis(2));
        let mut block = Vec::with_capacity(per_block);
        for i in 0..per_block + DROPPED {
            let t = Instant::now();
            let _: redis::Value = ping_cmd.query(&mut con).expect("PING");
            let t_ping = t.elapsed();
            let t = Instant::now();
            let _: redis::Value = evalsha_cmd.query(&mut con).expect("EVALSHA");
            let t_evalsha = t.elapsed();
            if i >= DROPPED {
                ping.push(t_ping);
                evalsha.push(t_evalsha);
                block.push(t_evalsha);
            }
        }
        blocks.push(pct(&sorted(block), 0.5));
    }
    let (ping, evalsha) = (sorted(ping), sorted(evalsha));
    for (name, s) in [("PING", &ping), ("EVALSHA `return 1`", &evalsha)] {
        println!(
            "  {name:<20} p50 {}  p99 {}  mean {}  ({} samples)",
            fmt_d(pct(s, 0.5)),
            fmt_d(pct(s, 0.99)),
            fmt_d(mean(s)),
            s.len()
        );
    }
    let lo = blocks.iter().copied().min().unwrap_or_default();
    let hi = blocks.iter().copied().max().unwrap_or_default();
    println!(
        "  EVALSHA p50 of each block: {} to {}",
        fmt_d(lo),
        fmt_d(hi)
    );
    Rtt {
        ping: pct(&ping, 0.5),
        evalsha: pct(&evalsha, 0.5),
        evalsha_blocks: (lo, hi),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. uncontended
// ---------------------------------------------------------------------------------------------

fn bench_uncontended(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "1 uncontended";
    section("1. uncontended lock + unlock, one thread, a fresh key each time");
    let noise = Noise::start(server.pid());
    let client = client(&server.url());
    for i in 0..200 {
        client
            .lock(&format!("warm:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    // Latency: each lock + unlock is paired with two no-op EVALSHA round trips from the same
    // thread just before it, so both see the same scheduling (one core or two) and load.
    let mut con = server.connection();
    let noop = redis::Script::new("return 1");
    let _: i64 = noop.invoke(&mut con).expect("noop");
    let mut pairs = Vec::with_capacity(p.uncontended);
    let mut locks = Vec::with_capacity(p.uncontended);
    let mut unlocks = Vec::with_capacity(p.uncontended);
    let mut both = Vec::with_capacity(p.uncontended);
    for i in 0..p.uncontended {
        let key = format!("u:{i}");
        let t = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let t0 = Instant::now();
        let guard = client.lock(&key).expect("lock");
        let t1 = Instant::now();
        guard.unlock().expect("unlock");
        let t2 = Instant::now();
        pairs.push(t0 - t);
        locks.push(t1 - t0);
        unlocks.push(t2 - t1);
        both.push(t2 - t0);
    }
    // Throughput and CPU: lock + unlock alone.
    let threads = ThreadCpu::snapshot();
    let cpu = CpuMeter::new(server.pid());
    let start = Instant::now();
    for i in 0..p.uncontended {
        client
            .lock(&format!("v:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    let elapsed = start.elapsed();
    let (client_cpu, redis_cpu) = cpu.per_op(p.uncontended as u64);
    let by_thread = ThreadCpu::snapshot().per_op_since(&threads, p.uncontended as u64);
    let (pairs, locks, unlocks, both) =
        (sorted(pairs), sorted(locks), sorted(unlocks), sorted(both));
    r.info(B, "lock p50", r.lat(pct(&locks, 0.5)));
    r.info(B, "unlock p50", r.lat(pct(&unlocks, 0.5)));
    let p50 = pct(&both, 0.5);
    let pair = pct(&pairs, 0.5);
    r.info(
        B,
        "two no-op EVALSHA, paired with each op: p50",
        r.lat(pair),
    );
    r.check(
        B,
        "lock+unlock p50 / two paired EVALSHA",
        format!(
            "{} = {:.2}× (vs the run's RT: {:.2}× 2 RT)",
            fmt_d(p50),
            p50.as_secs_f64() / pair.as_secs_f64(),
            r.ratio(p50) / 2.0
        ),
        "≤ 1.3",
        p50.as_secs_f64() <= 1.3 * pair.as_secs_f64(),
    );
    r.info(B, "lock+unlock p99", r.lat(pct(&both, 0.99)));
    r.info(
        B,
        "lock+unlock alone: throughput",
        format!("{:.0}/s", p.uncontended as f64 / elapsed.as_secs_f64()),
    );
    r.info(
        B,
        "CPU per lock+unlock: client, redis",
        format!("{}, {}", fmt_d(client_cpu), fmt_d(redis_cpu)),
    );
    r.info(B, "client CPU per lock+unlock by thread", by_thread);
    noise.report(r, B);
}

// ---------------------------------------------------------------------------------------------
// baseline: the common hand-written lock
// ---------------------------------------------------------------------------------------------

const BASELINE_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const BASELINE_SLEEP: Duration = Duration::from_millis(100);

/// SET NX PX, sleep 100 ms, retry; release by compare-and-delete.
struct Baseline {
    con: redis::Connection,
    release: redis::Script,
    owner: String,
    n: u64,
}

impl Baseline {
    fn new(server: &RedisServer, owner: String) -> Baseline {
        Baseline {
            con: server.connection(),
            release: redis::Script::new(BASELINE_RELEASE),
            owner,
            n: 0,
        }
    }

    fn lock(&mut self, key: &str) -> String {
        self.n += 1;
        let owner = format!("{}-{}", self.owner, self.n);
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query(&mut self.con)
                .expect("SET NX");
            if set.is_some() {
                return owner;
            }
            thread::sleep(BASELINE_SLEEP);
        }
    }

    fn unlock(&mut self, key: &str, owner: &str) {
        let _: i64 = self
            .release
            .key(key)
            .arg(owner)
            .invoke(&mut self.con)
            .expect("baseline release");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. handoff
// ---------------------------------------------------------------------------------------------

/// Release-to-grant latencies: the holder (this thread) takes the lock, lets the waiter block in
/// `lock()`, waits a moment, and releases; the time runs from the start of the release to the
/// waiter's `lock()` returning.
/// Waits until Redis has run `command` more than `before` times: the waiter's first attempt
/// was made (so it will be woken by the release), whatever the scheduler did meanwhile.
fn wait_for_attempt(stats: &mut redis::Connection, command: &str, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while support::command_calls(stats, command) <= before {
        assert!(Instant::now() < deadline, "the waiter never attempted");
        thread::sleep(Duration::from_micros(200));
    }
}

/// Returns `(release-to-grant, the holder's unlock() alone)`.
fn handoff_fencelock(
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
        let before = support::command_calls(&mut stats, "evalsha");
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
        let before = support::command_calls(&mut stats, "set");
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
    let noop = redis::Script::new("return 1");
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

fn bench_handoff(server: &RedisServer, p: &Params, r: &mut Report) {
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

// ---------------------------------------------------------------------------------------------
// 3. contention
// ---------------------------------------------------------------------------------------------

trait Locker: Send + 'static {
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

struct Contention {
    elapsed: Duration,
    /// Grants within the run.
    acquisitions: u64,
    waits: Vec<Duration>,
    per_thread: Vec<u64>,
    held: Duration,
    overlaps: u64,
    /// EVALSHA and SET calls Redis saw during the run (all clients of the run).
    evalsha: u64,
    set: u64,
    /// CPU of this process's threads during the run, by group.
    threads: String,
}

fn run_contention<L: Locker>(
    server: &RedisServer,
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
    let mut stats = server.connection();
    let commands = |stats: &mut redis::Connection| {
        (
            support::command_calls(stats, "evalsha"),
            support::command_calls(stats, "set"),
        )
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
    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }
    fn utilization(&self) -> f64 {
        self.held.as_secs_f64() / self.elapsed.as_secs_f64()
    }
    fn max_min(&self) -> (u64, u64) {
        let max = self.per_thread.iter().copied().max().unwrap_or(0);
        let min = self.per_thread.iter().copied().min().unwrap_or(0);
        (max, min)
    }
    fn fairness(&self) -> f64 {
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
    fn describe(&self, r: &mut Report, bench: &str, who: &str) {
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

fn fencelock_lockers(url: &str, threads: usize, clients: usize) -> Vec<LockClient> {
    let clients: Vec<LockClient> = (0..clients).map(|_| client(url)).collect();
    (0..threads)
        .map(|i| clients[i % clients.len()].clone())
        .collect()
}

fn baseline_lockers(server: &RedisServer, threads: usize) -> Vec<Baseline> {
    (0..threads)
        .map(|i| Baseline::new(server, format!("base-{i}")))
        .collect()
}

fn bench_contention(server: &RedisServer, p: &Params, r: &mut Report) {
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
        server,
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
        server,
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
        server,
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
        server,
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
        server,
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

// ---------------------------------------------------------------------------------------------
// 4. thread pool over many keys
// ---------------------------------------------------------------------------------------------

const TOUCH: &str = "return redis.call('INCR', KEYS[1])";

/// The EVALSHA rate Redis sustains from `n` threads, each on its own connection, each call a
/// small script touching one of `keys` keys.
/// Returns `(calls/s, client CPU per call, redis CPU per call)`.
fn script_throughput(
    server: &RedisServer,
    n: usize,
    keys: u64,
    duration: Duration,
) -> (f64, Duration, Duration) {
    let calls = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let mut con = server.connection();
            let (calls, ready) = (Arc::clone(&calls), Arc::clone(&ready));
            thread::spawn(move || {
                let script = redis::Script::new(TOUCH);
                let _: i64 = script.key("tp:warm").invoke(&mut con).expect("touch");
                ready.wait();
                let end = Instant::now() + duration;
                let mut j = i as u64 * 1_000_003;
                let mut local = 0u64;
                while Instant::now() < end {
                    j += 1;
                    let key = format!("tp:{}", mix(j) % keys);
                    let _: i64 = script.key(&key).invoke(&mut con).expect("touch");
                    local += 1;
                }
                calls.fetch_add(local, Ordering::Relaxed);
            })
        })
        .collect();
    ready.wait();
    let cpu = CpuMeter::new(server.pid());
    for h in handles {
        h.join().expect("throughput thread");
    }
    let calls = calls.load(Ordering::Relaxed);
    let (client_cpu, redis_cpu) = cpu.per_op(calls);
    (calls as f64 / duration.as_secs_f64(), client_cpu, redis_cpu)
}

fn bench_pool(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "4 pool";
    let noise = Noise::start(server.pid());
    let (n, k) = (p.workers, p.keys);
    section(&format!(
        "4. thread pool: N={n} workers, K={k} keys, pool size P={}, {} per half",
        p.pool_size,
        fmt_d(p.duration)
    ));
    let (scripts, script_client_cpu, script_redis_cpu) =
        script_throughput(server, n, k, p.duration);
    r.info(
        B,
        &format!("Redis script throughput ({n} threads, own connections)"),
        format!("{scripts:.0} EVALSHA/s"),
    );
    r.info(
        B,
        "CPU per script call: client, redis",
        format!("{}, {}", fmt_d(script_client_cpu), fmt_d(script_redis_cpu)),
    );

    let client = LockClient::builder(server.url())
        .namespace("bench")
        .pool_size(p.pool_size)
        .build()
        .expect("LockClient");
    let fences: Arc<Vec<AtomicU64>> = Arc::new((0..k).map(|_| AtomicU64::new(0)).collect());
    let next_job = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(n + 1));
    let mut stats = server.connection();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let client = client.clone();
            let (fences, next_job, stale, ready) = (
                Arc::clone(&fences),
                Arc::clone(&next_job),
                Arc::clone(&stale),
                Arc::clone(&ready),
            );
            let duration = p.duration;
            let worker = thread::Builder::new().name(format!("worker-{i}"));
            worker
                .spawn(move || {
                    client
                        .lock(&format!("job:warm:{i}"))
                        .expect("lock")
                        .unlock()
                        .expect("unlock");
                    ready.wait();
                    let end = Instant::now() + duration;
                    let mut latencies = Vec::new();
                    while Instant::now() < end {
                        let job = next_job.fetch_add(1, Ordering::Relaxed);
                        let slot = mix(job) % fences.len() as u64;
                        let t = Instant::now();
                        let guard = client.lock(&format!("job:{slot}")).expect("lock");
                        // The short write: fenced storage keeps the highest token it accepted and
                        // refuses lower ones.
                        let token = guard.token().as_u64();
                        if fences[slot as usize].fetch_max(token, Ordering::SeqCst) >= token {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                        guard.unlock().expect("unlock");
                        latencies.push(t.elapsed());
                    }
                    latencies
                })
                .expect("spawn")
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    let evalsha_before = support::command_calls(&mut stats, "evalsha");
    let cpu = CpuMeter::new(server.pid());
    let threads = ThreadCpu::snapshot();
    let jobs_before = next_job.load(Ordering::Relaxed);
    thread::sleep(p.duration.saturating_sub(Duration::from_millis(50)));
    let by_thread = ThreadCpu::snapshot()
        .per_op_since(&threads, next_job.load(Ordering::Relaxed) - jobs_before);
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.join().expect("worker"));
    }
    let elapsed = start.elapsed();
    let jobs = latencies.len() as u64;
    let (client_cpu, redis_cpu) = cpu.per_op(jobs);
    let evalsha = support::command_calls(&mut stats, "evalsha") - evalsha_before;
    let latencies = sorted(latencies);
    let rate = jobs as f64 / elapsed.as_secs_f64();
    let goal = 0.7 * scripts / 2.0;
    r.info(
        B,
        "fencelock jobs/s (lock + fenced write + unlock)",
        format!("{rate:.0}/s"),
    );
    r.check(
        B,
        "jobs/s / (script throughput / 2)",
        format!("{:.0}% (goal {goal:.0}/s)", 100.0 * rate / (scripts / 2.0)),
        "≥ 70%",
        rate >= goal,
    );
    r.info(
        B,
        "job latency p50 / p99",
        format!(
            "{} / {}",
            r.lat(pct(&latencies, 0.5)),
            fmt_d(pct(&latencies, 0.99))
        ),
    );
    r.info(
        B,
        "EVALSHA per job, stale tokens",
        format!(
            "{:.2}, {}",
            evalsha as f64 / jobs.max(1) as f64,
            stale.load(Ordering::Relaxed)
        ),
    );
    r.info(
        B,
        "CPU per job: client, redis",
        format!("{}, {}", fmt_d(client_cpu), fmt_d(redis_cpu)),
    );
    r.info(B, "client CPU per job by thread", by_thread);
    noise.report(r, B);
}

// ---------------------------------------------------------------------------------------------
// 5. renewal at scale, with a round-trip counting proxy
// ---------------------------------------------------------------------------------------------

/// One round trip as the proxy saw it: the client sent `commands` (of which `evalsha` were
/// EVALSHA), then waited for every reply.
#[derive(Clone, Copy)]
struct RoundTrip {
    at: Instant,
    commands: u64,
    evalsha: u64,
}

/// A loopback proxy that counts round trips. It forwards requests at once and holds replies back
/// until the client has been quiet for `QUIET` and every command is answered, so a sync client
/// cannot see a reply while still sending: each round trip is counted exactly once. (A client
/// that stalls for longer than `QUIET` in the middle of one write would be counted twice.)
struct CountingProxy {
    port: u16,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    stop: Arc<AtomicBool>,
    /// Hold replies back as described; when off, replies pass at once and the log is rough.
    exact: Arc<AtomicBool>,
}

const QUIET: Duration = Duration::from_millis(2);

struct ProxyConn {
    state: Mutex<ProxyState>,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    exact: Arc<AtomicBool>,
}

struct ProxyState {
    outstanding: u64,
    last_request: Instant,
    /// Every reply so far was delivered: the next request byte starts a round trip.
    answered: bool,
    current: usize,
}

impl CountingProxy {
    fn start(upstream_port: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let exact = Arc::new(AtomicBool::new(false));
        let (log2, stop2, exact2) = (Arc::clone(&log), Arc::clone(&stop), Arc::clone(&exact));
        thread::spawn(move || {
            NOT_COUNTED.with(|c| c.set(true));
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).expect("blocking");
                        let upstream =
                            TcpStream::connect(("127.0.0.1", upstream_port)).expect("upstream");
                        proxy_connection(client, upstream, Arc::clone(&log2), Arc::clone(&exact2));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                }
            }
        });
        CountingProxy {
            port,
            log,
            stop,
            exact,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn round_trips_since(&self, since: Instant) -> Vec<RoundTrip> {
        let log = self.log.lock().expect("log");
        log.iter().filter(|rt| rt.at >= since).copied().collect()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn proxy_connection(
    client: TcpStream,
    upstream: TcpStream,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    exact: Arc<AtomicBool>,
) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let conn = Arc::new(ProxyConn {
        state: Mutex::new(ProxyState {
            outstanding: 0,
            last_request: Instant::now(),
            answered: true,
            current: 0,
        }),
        log,
        exact,
    });
    let (c_in, c_out) = (client.try_clone().expect("clone"), client);
    let (u_in, u_out) = (upstream.try_clone().expect("clone"), upstream);
    let conn2 = Arc::clone(&conn);
    thread::spawn(move || {
        NOT_COUNTED.with(|c| c.set(true));
        pump_requests(c_in, u_out, &conn2);
    });
    thread::spawn(move || {
        NOT_COUNTED.with(|c| c.set(true));
        pump_replies(u_in, c_out, &conn);
    });
}

fn pump_requests(mut from: TcpStream, mut to: TcpStream, conn: &ProxyConn) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let (consumed, commands, evalsha) = parse_requests(&pending);
        pending.drain(..consumed);
        {
            let mut st = conn.state.lock().expect("state");
            let mut log = conn.log.lock().expect("log");
            if st.answered {
                st.answered = false;
                st.current = log.len();
                log.push(RoundTrip {
                    at: Instant::now(),
                    commands: 0,
                    evalsha: 0,
                });
            }
            log[st.current].commands += commands;
            log[st.current].evalsha += evalsha;
            st.outstanding += commands;
            st.last_request = Instant::now();
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn pump_replies(mut from: TcpStream, mut to: TcpStream, conn: &ProxyConn) {
    from.set_read_timeout(Some(QUIET / 2)).expect("timeout");
    let mut buf = vec![0u8; 256 * 1024];
    let mut unparsed: Vec<u8> = Vec::new();
    let mut held: Vec<u8> = Vec::new();
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                held.extend_from_slice(&buf[..n]);
                unparsed.extend_from_slice(&buf[..n]);
                let (consumed, replies) = parse_replies(&unparsed);
                unparsed.drain(..consumed);
                let mut st = conn.state.lock().expect("state");
                st.outstanding = st.outstanding.saturating_sub(replies);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        if held.is_empty() {
            continue;
        }
        let release = {
            let mut st = conn.state.lock().expect("state");
            let ok = !conn.exact.load(Ordering::Relaxed)
                || (st.outstanding == 0 && st.last_request.elapsed() >= QUIET);
            if ok {
                st.answered = true;
            }
            ok
        };
        if release {
            if to.write_all(&held).is_err() {
                break;
            }
            held.clear();
        }
    }
    let _ = to.write_all(&held);
    let _ = to.shutdown(Shutdown::Both);
}

/// `(value, index after its CRLF)` of the integer line starting at `at` (after the type byte).
fn resp_line(b: &[u8], at: usize) -> Option<(i64, usize)> {
    let end = at + b.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let v = std::str::from_utf8(&b[at..end]).ok()?.parse().unwrap_or(0);
    Some((v, end + 2))
}

/// The end of one complete RESP value at `at`, or `None` if incomplete.
fn resp_value(b: &[u8], at: usize) -> Option<usize> {
    match *b.get(at)? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
            let (_, next) = resp_line(b, at + 1)?;
            Some(next)
        }
        b'$' | b'=' | b'!' => {
            let (len, next) = resp_line(b, at + 1)?;
            if len < 0 {
                return Some(next);
            }
            let end = next + len as usize + 2;
            (end <= b.len()).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let (n, mut next) = resp_line(b, at + 1)?;
            let n = if matches!(b[at], b'%' | b'|') {
                n * 2
            } else {
                n
            };
            for _ in 0..n.max(0) {
                next = resp_value(b, next)?;
            }
            Some(next)
        }
        // Not RESP: count nothing from here on (cannot happen with redis-rs).
        _ => None,
    }
}

/// `(bytes consumed, complete replies)`.
fn parse_replies(b: &[u8]) -> (usize, u64) {
    let (mut at, mut n) = (0, 0);
    while let Some(next) = resp_value(b, at) {
        at = next;
        n += 1;
    }
    (at, n)
}

/// `(bytes consumed, complete commands, of which EVALSHA)`; commands are arrays of bulk strings.
fn parse_requests(b: &[u8]) -> (usize, u64, u64) {
    let (mut at, mut n, mut evalsha) = (0, 0, 0);
    while let Some(next) = resp_value(b, at) {
        // The command name is the first bulk string: `*N\r\n$len\r\nNAME\r\n`.
        let name = resp_line(b, at + 1)
            .and_then(|(_, first)| {
                let (len, start) = resp_line(b, first + 1)?;
                b.get(start..start + usize::try_from(len).ok()?)
            })
            .unwrap_or_default();
        if name.eq_ignore_ascii_case(b"EVALSHA") {
            evalsha += 1;
        }
        at = next;
        n += 1;
    }
    (at, n, evalsha)
}

fn bench_renewal(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "5 renewal";
    let noise = Noise::start(server.pid());
    let (count, lease) = (p.renew_locks, p.renew_lease);
    let hold = lease * p.renew_leases;
    section(&format!(
        "5. renewal: {count} locks held for {} leases of {} (through a counting proxy)",
        p.renew_leases,
        fmt_d(lease)
    ));
    let proxy = CountingProxy::start(server.port());
    let renewers_before: Vec<u32> = tasks(self_pid())
        .into_iter()
        .filter(|(_, name)| name == "fencelock-renew")
        .map(|(tid, _)| tid)
        .collect();
    let client = LockClient::builder(proxy.url())
        .namespace("bench")
        .lease(lease)
        .build()
        .expect("LockClient");
    let mut stats = server.connection();
    const ACQUIRERS: usize = 8;
    // Warm up: the pool's connections exist before memory is counted.
    thread::scope(|s| {
        for i in 0..ACQUIRERS {
            let client = &client;
            s.spawn(move || {
                client
                    .lock(&format!("r:warm:{i}"))
                    .expect("lock")
                    .unlock()
                    .expect("unlock");
            });
        }
    });
    let renewer = {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let found = tasks(self_pid())
                .into_iter()
                .find(|(tid, name)| name == "fencelock-renew" && !renewers_before.contains(tid));
            if let Some((tid, _)) = found {
                break tid;
            }
            assert!(Instant::now() < deadline, "no fencelock-renew thread found");
            thread::sleep(Duration::from_millis(5));
        }
    };
    let mut vecs: Vec<Vec<LockGuard>> = (0..ACQUIRERS)
        .map(|_| Vec::with_capacity(count / ACQUIRERS + 1))
        .collect();
    let redis_mem_before = info_field(&mut stats, "memory", "used_memory");
    let rss_before = vm_rss_kib();
    LIVE_BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    thread::scope(|s| {
        for guards in vecs.iter_mut() {
            let (client, next) = (&client, &next);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                guards.push(client.lock(&format!("r:{i}")).expect("lock"));
            });
        }
    });
    let acquired_in = started.elapsed();
    // Let the renewal thread take in the grants.
    thread::sleep(Duration::from_millis(100));
    COUNTING.store(false, Ordering::SeqCst);
    let heap = LIVE_BYTES.load(Ordering::SeqCst);
    let rss = vm_rss_kib().saturating_sub(rss_before);
    let redis_mem =
        info_field(&mut stats, "memory", "used_memory").saturating_sub(redis_mem_before);
    let per_lock = heap as f64 / count as f64 + std::mem::size_of::<LockGuard>() as f64;
    r.info(
        B,
        &format!("acquired {count} locks with {ACQUIRERS} threads"),
        format!(
            "in {} ({:.0}/s)",
            fmt_d(acquired_in),
            count as f64 / acquired_in.as_secs_f64()
        ),
    );
    r.check(
        B,
        "client heap per held lock (+ the guard itself)",
        format!("{per_lock:.0} B"),
        "≤ 1024 B",
        per_lock <= 1024.0,
    );
    r.info(
        B,
        "VmRSS growth per held lock (rough), redis memory per lock",
        format!(
            "{:.0} B, {:.0} B",
            rss as f64 * 1024.0 / count as f64,
            redis_mem as f64 / count as f64
        ),
    );

    // Hold, counting round trips exactly.
    proxy.exact.store(true, Ordering::SeqCst);
    thread::sleep(QUIET * 2);
    let extends_before = support::command_calls(&mut stats, "evalsha");
    let hold_start = Instant::now();
    let renew_cpu_before = task_cpu(self_pid(), renewer);
    let cpu = CpuMeter::new(server.pid());
    thread::sleep(hold);
    let renew_cpu = task_cpu(self_pid(), renewer).saturating_sub(renew_cpu_before);
    let held_for = hold_start.elapsed();
    let (process_cpu_total, redis_cpu_total) = cpu.per_op(1);
    let extends = support::command_calls(&mut stats, "evalsha") - extends_before;
    let trips = proxy.round_trips_since(hold_start);
    proxy.exact.store(false, Ordering::SeqCst);
    let lost = vecs.iter().flatten().filter(|g| !g.is_held()).count();

    // Ticks: round trips carrying extends, grouped by gaps longer than a tenth of the lease.
    let mut ticks: Vec<(u64, u64)> = Vec::new(); // (round trips, extends)
    let mut last: Option<Instant> = None;
    for rt in trips.iter().filter(|rt| rt.evalsha > 0) {
        if last.is_none_or(|l| rt.at.duration_since(l) > lease / 10) {
            ticks.push((0, 0));
        }
        let tick = ticks.last_mut().expect("a tick");
        tick.0 += 1;
        tick.1 += rt.evalsha;
        last = Some(rt.at);
    }
    let other = trips.iter().filter(|rt| rt.evalsha == 0).count();
    let max_trips = ticks.iter().map(|t| t.0).max().unwrap_or(0);
    let per_tick = if ticks.is_empty() {
        0.0
    } else {
        ticks.iter().map(|t| t.0).sum::<u64>() as f64 / ticks.len() as f64
    };
    let extends_per_tick = if ticks.is_empty() {
        0.0
    } else {
        ticks.iter().map(|t| t.1).sum::<u64>() as f64 / ticks.len() as f64
    };
    r.info(
        B,
        "renewal ticks, extends per tick (proxy), EVALSHA (redis)",
        format!(
            "{} in {}, {extends_per_tick:.0}, {extends}",
            ticks.len(),
            fmt_d(held_for)
        ),
    );
    let each: Vec<String> = ticks
        .iter()
        .map(|(trips, extends)| format!("{trips}/{extends}"))
        .collect();
    r.info(B, "each tick: round trips/extends", each.join(" "));
    r.check(
        B,
        "round trips per tick: mean (max)",
        format!("{per_tick:.1} ({max_trips}); + {other} other round trips (heartbeats)"),
        "≤ 20",
        !ticks.is_empty() && max_trips <= 20,
    );
    let share = renew_cpu.as_secs_f64() / held_for.as_secs_f64();
    r.check(
        B,
        &format!("renewal thread CPU (lease {})", fmt_d(lease)),
        format!(
            "{:.2}% of a core ({} per tick, {} per extend)",
            100.0 * share,
            fmt_d(renew_cpu / (ticks.len().max(1) as u32)),
            fmt_d(renew_cpu / (extends.max(1) as u32))
        ),
        "≤ 1%",
        share <= 0.01,
    );
    r.info(
        B,
        "same, scaled to the default 30 s lease",
        format!(
            "{:.3}% of a core",
            100.0 * share * lease.as_secs_f64() / 30.0
        ),
    );
    r.info(
        B,
        "whole process CPU, redis CPU while holding",
        format!(
            "{:.2}%, {:.2}% of a core",
            100.0 * process_cpu_total.as_secs_f64() / held_for.as_secs_f64(),
            100.0 * redis_cpu_total.as_secs_f64() / held_for.as_secs_f64()
        ),
    );
    r.check(B, "locks lost while held", lost.to_string(), "0", lost == 0);

    // Release everything in parallel.
    thread::scope(|s| {
        for guards in vecs.drain(..) {
            s.spawn(move || drop(guards));
        }
    });
    drop(client);
    drop(proxy);
    noise.report(r, B);
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn machine() -> String {
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs, {model}")
}

fn main() {
    let p = Params::parse();
    let started = Instant::now();
    let server = RedisServer::start();
    let mut con = server.connection();
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .expect("INFO");
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "fencelock benchmarks: {}; redis-server {version}",
        machine()
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("load average at start: {}", load.join(" "));

    section("round trips on a plain connection (the unit of every ratio)");
    let rtt = measure_rtt(&server, p.rtt_samples);
    let mut r = Report {
        evalsha: rtt.evalsha,
        rows: Vec::new(),
    };
    r.info(
        "0 round trip",
        "machine: load average at start (1, 5, 15 min)",
        load.join(" "),
    );
    r.info("0 round trip", "PING p50", fmt_d(rtt.ping));
    r.info(
        "0 round trip",
        "no-op EVALSHA p50 (= 1 RT)",
        fmt_d(rtt.evalsha),
    );

    if p.selected("uncontended") {
        bench_uncontended(&server, &p, &mut r);
    }
    if p.selected("handoff") {
        bench_handoff(&server, &p, &mut r);
    }
    if p.selected("contention") {
        bench_contention(&server, &p, &mut r);
    }
    if p.selected("pool") {
        bench_pool(&server, &p, &mut r);
    }
    if p.selected("renewal") {
        bench_renewal(&server, &p, &mut r);
    }

    section("round trips again, at the end of the run (drift check)");
    let end = measure_rtt(&server, p.rtt_samples / 2);
    r.info(
        "0 round trip",
        "no-op EVALSHA p50 at the end of the run",
        format!(
            "{} (blocks {} to {})",
            fmt_d(end.evalsha),
            fmt_d(end.evalsha_blocks.0),
            fmt_d(end.evalsha_blocks.1)
        ),
    );

    let misses = r
        .rows
        .iter()
        .filter(|row| matches!(row.verdict, Verdict::Miss))
        .count();
    let checked = r
        .rows
        .iter()
        .filter(|row| !matches!(row.verdict, Verdict::Info))
        .count();
    println!(
        "\n== summary ({} passed, {misses} missed; {} in all)\n",
        checked - misses,
        fmt_d(started.elapsed())
    );
    println!("{}", r.summary());
}
