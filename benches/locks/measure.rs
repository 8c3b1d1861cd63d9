//! Readings of the machine: CPU time, what else ran meanwhile, and memory.
//!
//! - CPU time: `getrusage` for the bench process (all threads), `/proc/<pid>/task/<tid>/schedstat`
//!   for redis-server and for single threads (nanoseconds on CPU).
//! - Each benchmark also prints how much CPU other processes and the hypervisor (steal) took
//!   meanwhile, from `/proc/stat`: results from a busy machine are not comparable.
//! - Client heap comes from a counting global allocator (live bytes between `heap_count_start`
//!   and `heap_count_stop`, threads that called `exclude_this_thread` left out); VmRSS from
//!   `/proc/self/status`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::report::{fmt_d, Report};

// ---------------------------------------------------------------------------------------------
// counting allocator
// ---------------------------------------------------------------------------------------------

/// Counts live heap bytes while `COUNTING` is on, except in threads that opted out.
pub struct CountingAlloc;

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

/// Leaves the calling thread's allocations out of the count from now on.
pub fn exclude_this_thread() {
    NOT_COUNTED.with(|c| c.set(true));
}

/// Starts counting live heap bytes from zero.
pub fn heap_count_start() {
    LIVE_BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
}

/// Stops counting; returns the live bytes added since `heap_count_start`.
pub fn heap_count_stop() -> isize {
    COUNTING.store(false, Ordering::SeqCst);
    LIVE_BYTES.load(Ordering::SeqCst)
}

pub fn vm_rss_kib() -> u64 {
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

// ---------------------------------------------------------------------------------------------
// CPU time
// ---------------------------------------------------------------------------------------------

/// Nanoseconds on CPU of one task, from its schedstat.
pub fn task_cpu(pid: u32, tid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or(Duration::ZERO)
}

/// `(tid, comm)` of every live thread of `pid`.
pub fn tasks(pid: u32) -> Vec<(u32, String)> {
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
pub fn process_cpu(pid: u32) -> Duration {
    tasks(pid).iter().map(|(tid, _)| task_cpu(pid, *tid)).sum()
}

pub fn self_pid() -> u32 {
    std::process::id()
}

/// CPU time of this whole process so far, exited threads included.
pub fn self_cpu() -> Duration {
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
pub struct CpuMeter {
    redis_pid: u32,
    ours: Duration,
    redis: Duration,
}

impl CpuMeter {
    pub fn new(redis_pid: u32) -> CpuMeter {
        CpuMeter {
            redis_pid,
            ours: self_cpu(),
            redis: process_cpu(redis_pid),
        }
    }

    /// `(client CPU per op, redis CPU per op)`.
    pub fn per_op(&self, ops: u64) -> (Duration, Duration) {
        let ours = self_cpu().saturating_sub(self.ours);
        let redis = process_cpu(self.redis_pid).saturating_sub(self.redis);
        let ops = ops.max(1) as u32;
        (ours / ops, redis / ops)
    }
}

/// CPU time of every live thread of this process, by tid, with its thread group: the name
/// without a trailing number (`bench-3` → `bench`), the main thread as `main`.
pub struct ThreadCpu(HashMap<u32, (String, Duration)>);

impl ThreadCpu {
    pub fn snapshot() -> ThreadCpu {
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
    pub fn per_op_since(&self, before: &ThreadCpu, ops: u64) -> String {
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

// ---------------------------------------------------------------------------------------------
// the rest of the machine
// ---------------------------------------------------------------------------------------------

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

/// What else ran on the machine: CPU used by processes other than this one and the run's
/// redis-servers, and time stolen by the hypervisor, as shares of all CPUs.
pub struct Noise {
    at: Instant,
    jiffies: (u64, u64),
    ours: Duration,
    redis: Duration,
    redis_pids: Vec<u32>,
}

/// CPU time of all the processes `pids` so far.
pub fn processes_cpu(pids: &[u32]) -> Duration {
    pids.iter().map(|pid| process_cpu(*pid)).sum()
}

impl Noise {
    pub fn start(redis_pid: u32) -> Noise {
        Noise::start_all(&[redis_pid])
    }

    /// With several redis-servers of the run, all counted as the bench's.
    pub fn start_all(redis_pids: &[u32]) -> Noise {
        Noise {
            at: Instant::now(),
            jiffies: machine_jiffies(),
            ours: self_cpu(),
            redis: processes_cpu(redis_pids),
            redis_pids: redis_pids.to_vec(),
        }
    }

    pub fn report(&self, r: &mut Report, bench: &str) {
        let wall = self.at.elapsed().as_secs_f64();
        let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let (busy, steal) = machine_jiffies();
        let hz = clock_ticks_per_sec();
        let busy = busy.saturating_sub(self.jiffies.0) as f64 / hz;
        let steal = steal.saturating_sub(self.jiffies.1) as f64 / hz;
        let ours = self_cpu().saturating_sub(self.ours).as_secs_f64();
        let redis = processes_cpu(&self.redis_pids)
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
