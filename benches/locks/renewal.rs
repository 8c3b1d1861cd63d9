//! `renewal`: R locks held for several lease periods: round trips per renewal tick, CPU time of
//! the renewal thread, client heap per held lock.
//!
//! The renewal client talks to Redis through a `CountingProxy`, which counts its round trips
//! exactly while the locks are held; ticks are the round trips carrying EVALSHA, grouped by gaps
//! of lease/10. Client heap per held lock is the live bytes the counting allocator saw over the
//! acquisition of the R locks (proxy threads excluded); VmRSS growth is printed beside it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockGuard;

use crate::measure::{
    heap_count_start, heap_count_stop, self_pid, task_cpu, tasks, vm_rss_kib, CpuMeter, Noise,
};
use crate::params::Params;
use crate::proxy::{CountingProxy, QUIET};
use crate::report::{fmt_d, section, Report};
use crate::server::{builder, command_calls, info_value, RedisServer};

/// Redis's `used_memory`, bytes.
fn redis_used_memory(con: &mut redis::Connection) -> u64 {
    info_value(con, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
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
    let client = builder(proxy.url())
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
    let redis_mem_before = redis_used_memory(&mut stats);
    let rss_before = vm_rss_kib();
    heap_count_start();
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
    let heap = heap_count_stop();
    let rss = vm_rss_kib().saturating_sub(rss_before);
    let redis_mem = redis_used_memory(&mut stats).saturating_sub(redis_mem_before);
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
    proxy.set_exact(true);
    thread::sleep(QUIET * 2);
    let extends_before = command_calls(&mut stats, "evalsha");
    let hold_start = Instant::now();
    let renew_cpu_before = task_cpu(self_pid(), renewer);
    let cpu = CpuMeter::new(server.pid());
    thread::sleep(hold);
    let renew_cpu = task_cpu(self_pid(), renewer).saturating_sub(renew_cpu_before);
    let held_for = hold_start.elapsed();
    let (process_cpu_total, redis_cpu_total) = cpu.per_op(1);
    let extends = command_calls(&mut stats, "evalsha") - extends_before;
    let trips = proxy.round_trips_since(hold_start);
    proxy.set_exact(false);
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
