//! `pool`: N workers take jobs, each locks one of K keys and does a short fenced write;
//! compared with the EVALSHA rate Redis sustains from N threads in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::measure::{CpuMeter, Noise, ThreadCpu};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{builder, command_calls, RedisServer};
use crate::stats::{mix, pct, sorted};

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

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
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

    let client = builder(server.url())
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
    let evalsha_before = command_calls(&mut stats, "evalsha");
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
    let evalsha = command_calls(&mut stats, "evalsha") - evalsha_before;
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
