//! fencelock benchmarks: round trips, handoff, contention, a thread pool, renewal at scale.
//!
//! ```text
//! cargo bench --bench locks                       # everything (about 2.5 min)
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
//! - `uncontended`: `lock` + `unlock` from one thread over many keys, then where the time beyond
//!   two round trips goes: the same two calls as no-op scripts carrying the lock's keys and
//!   arguments, and as the library's scripts sent directly, with Redis' own timing of each script
//!   and of the commands it calls (SLOWLOG);
//! - `multi`: `lock_all` of 1, 2, 4 and 8 keys + `unlock`, uncontended, against that many `lock`
//!   calls one after another and as many unlocks (U iterations, at most 1000, for each size);
//!   then contended: 4 threads over 2 clients take the same keys both ways, sets per second
//!   (about 4 s for each size, at most D_MS);
//! - `handoff`: a holder releases while one waiter is blocked in `lock()`: release-to-grant
//!   latency, fencelock (waiter on another client, and on the same client), the same handoff on
//!   plain connections (release script with PUBLISH, waiter on its own SUBSCRIBE connection,
//!   then one acquire script: the physical limit), and the baseline;
//! - `election`: failover to a waiting candidate of another client after the leader's
//!   `resign()` (E samples) and after it crashed (EC samples, `E_LEASE_MS` lease, renewal off),
//!   beside a lock handoff of the same run; an observer's delay from `proclaim()` and from
//!   `resign()` to its `changes()`, beside a script's PUBLISH to a plain SUBSCRIBE connection;
//! - `semaphore`: a permit's `acquire` + `release` uncontended against `lock` + `unlock`; 16
//!   threads over a semaphore of 4 (each on its own client, then over 2 clients) with critical
//!   section S, grants per second and per thread (min, max, Jain's index), beside one lock;
//!   release-to-acquire handoff to a waiter of another client, beside a lock's (H samples);
//! - `rwlock`: 16 threads, each on its own client, on one read-write lock with critical section S
//!   and no think time, one grant in 20 a write and one in 2, beside the same threads on one
//!   plain lock (grants per second); a writer's release to 4 readers of other clients blocked in
//!   `read_lock()` (the first and the last admitted), beside a lock's handoff (H samples);
//! - `contention`: T threads over C clients on one key, critical section S, think time W; runs
//!   with W, with no think time, 1 ms critical sections back to back, and the baseline;
//! - `pool`: N workers take jobs, each locks one of K keys and does a short fenced write;
//!   compared with the EVALSHA rate Redis sustains from N threads in the same run;
//! - `renewal`: R locks held for several lease periods: round trips per renewal tick, CPU
//!   time of the renewal thread, client heap per held lock;
//! - `idle`: IK keys locked once each, on servers of their own: keys and Redis memory per key
//!   right after, once the idle expiry (1 s here) has passed, and with the counters kept for
//!   ever as they were before they expired;
//! - `pg`: fencelock against PostgreSQL advisory locks (`DATABASE_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/test`; skipped if unreachable), in turns, `PG_ROUNDS`
//!   rounds: handoff to a waiter in another process (this binary run again as a child), lock +
//!   unlock from one thread, and T threads with S and W; each against its own system's round trip.
//!   Also the pieces of fencelock's cross-process handoff, and a CDF of both handoffs written to
//!   `docs/benchmarks-pg-handoff.svg`;
//! - `cluster`: the pool's lock + unlock rate on a Redis Cluster of 1, 2 and 3 masters beside
//!   the `EVALSHA` rate of the same cluster, the CPU per job of the client and the nodes, and
//!   handoffs to another client with what each node spends per handoff's `PUBLISH`;
//! - `quorum`: quorum mode on 5 redis-servers (and on 3 of them): a no-op EVALSHA to all of
//!   them in parallel (the unit there, "PR"), uncontended `lock` + `unlock` against it, beside the
//!   same protocol on plain connections from one thread and a redsync-style Redlock (which has
//!   no fencing token); T threads over C clients on one key (quorum, one server, Redlock); and
//!   handoffs to a waiter of another client (quorum and one server);
//! - `quorum_minority` (`minority` alone): two clients contending on a quorum of 5 masters with 2
//!   frozen and of 3 with 1 frozen, against the same with all healthy and the deployment without
//!   that minority, and with 2 of 5 killed; M_MS per run;
//! - `peers`: the quorum of 5 (and 3) masters against npm `redlock` 5 (ioredis) on the same
//!   masters, each against its own client's parallel round: uncontended lock + unlock (U, in
//!   four blocks in turns) and 8 workers on one key (two turns of D_MS/2); needs Node.js and the
//!   npm packages that `benches/peers/run.sh` installs (skipped without them);
//! - `tls` (with `--features tls`): a new connection (connect, TLS handshake, PING) and
//!   uncontended `lock` + `unlock` (U iterations) over TLS, each beside the same on the plain port
//!   of one redis-server.
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
//! | `S_US` | 100 | contention, semaphore, rwlock: critical section, µs (a sleep) |
//! | `W_US` | 1000 | contention: think time between acquisitions, µs (a sleep) |
//! | `D_MS` | 5000 | duration of each contention run and of each half of `pool`, ms (semaphore, rwlock: at most 4000) |
//! | `BASE_D_MS` | 10000 | duration of each baseline contention run, ms |
//! | `N` | 32 | pool: worker threads |
//! | `K` | 10000 | pool: keys |
//! | `P` | N | pool: the client's connection pool size |
//! | `U` | 5000 | uncontended: lock + unlock iterations (semaphore: at most 2000) |
//! | `H` | 300 | handoff, semaphore, rwlock: fencelock samples (per variant) |
//! | `HB` | 60 | handoff: baseline samples (each waits up to 100 ms) |
//! | `R` | 10000 | renewal: locks held |
//! | `LEASE_MS` | 3000 | renewal: lease of the held locks, ms (renewal every lease/3) |
//! | `LEASES` | 4 | renewal: how many lease periods the locks are held |
//! | `RTT` | 10000 | samples of each round-trip baseline |
//! | `IK` | 10000 | idle: keys locked once each |
//! | `RECORDER` | 0 | 1: with `--features metrics`, record into `metrics-util`'s `DebuggingRecorder` (never read) rather than the facade's no-op |
//! | `E` | 300 | election: failovers after a resignation, and proclamations observed |
//! | `EC` | 40 | election: failovers after a crash (each at least a lease long; half as many with no candidate) |
//! | `E_LEASE_MS` | 200 | election: the crashed leader's lease, ms |
//! | `PG_ROUNDS` | 3 | pg: rounds of fencelock then PostgreSQL (H handoffs, U lock + unlock, D_MS of contention each) |
//!
//! How things are measured is told where it is done:
//!
//! - `stats`: percentiles and the rest of the arithmetic on samples;
//! - `measure`: CPU time (the process, redis-server, single threads), what else ran on the machine
//!   (other processes, steal), client heap (a counting global allocator) and VmRSS;
//! - `report`: ratios to the round trip, the PASS/MISS lines and the closing table;
//! - `server`: the throwaway redis-server and what is read from it (`INFO`);
//! - `proxy` and `resp`: the loopback proxy that counts round trips, and the RESP it reads;
//! - `params`: the parameters above;
//! - one module a benchmark: `rtt`, `uncontended`, `multi`, `handoff`, `election`, `semaphore`,
//!   `rwlock`, `contention`, `pool`, `renewal`, `idle`, `pg`, `sentinel`, `cluster`, `quorum`,
//!   `peers`, `tls`, and `baseline` (the hand-written lock they compare with).

mod baseline;
mod cluster;
mod contention;
mod election;
mod handoff;
mod idle;
mod measure;
mod multi;
mod params;
mod peers;
mod pg;
mod pool;
mod proxy;
mod quorum;
mod renewal;
mod report;
mod resp;
mod rtt;
mod rwlock;
mod semaphore;
mod sentinel;
mod server;
mod stats;
#[cfg(feature = "tls")]
mod tls;
mod uncontended;

use std::thread;
use std::time::Instant;

use params::Params;
use server::RedisServer;

/// Counts the client's heap for `renewal`; otherwise `System` as is.
#[global_allocator]
static ALLOC: measure::CountingAlloc = measure::CountingAlloc;

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

/// Installs the recorder `RECORDER` asks for; says what the lock calls record into.
fn metrics_recorder(p: &Params) -> &'static str {
    match (cfg!(feature = "metrics"), p.recorder) {
        (false, false) => "feature off",
        (false, true) => panic!("RECORDER=1 needs --features metrics"),
        (true, false) => "feature on, no recorder installed (the facade's no-op)",
        (true, true) => {
            install_recorder();
            "feature on, recorded by metrics-util's DebuggingRecorder"
        }
    }
}

#[cfg(feature = "metrics")]
fn install_recorder() {
    metrics_util::debugging::DebuggingRecorder::new()
        .install()
        .expect("the only recorder");
}

#[cfg(not(feature = "metrics"))]
fn install_recorder() {}

fn main() {
    // A child process of the `pg` benchmark: a waiter or subscriber in another process.
    if pg::run_role() {
        return;
    }
    let p = Params::parse();
    let started = Instant::now();
    let server = RedisServer::start();
    let mut con = server.connection();
    let version = server::info_value(&mut con, "server", "redis_version").unwrap_or("?".into());
    println!(
        "fencelock benchmarks: {}; redis-server {version}",
        machine()
    );
    println!("metrics: {}", metrics_recorder(&p));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("load average at start: {}", load.join(" "));

    let mut r = rtt::run_first(&server, &p, &load.join(" "));
    if p.selected("uncontended") {
        uncontended::run(&server, &p, &mut r);
    }
    if p.selected("multi") {
        multi::run(&server, &p, &mut r);
    }
    if p.selected("handoff") {
        handoff::run(&server, &p, &mut r);
    }
    if p.selected("election") {
        election::run(&server, &p, &mut r);
    }
    if p.selected("semaphore") {
        semaphore::run(&server, &p, &mut r);
    }
    if p.selected("rwlock") {
        rwlock::run(&server, &p, &mut r);
    }
    if p.selected("contention") {
        contention::run(&server, &p, &mut r);
    }
    if p.selected("pool") {
        pool::run(&server, &p, &mut r);
    }
    if p.selected("renewal") {
        renewal::run(&server, &p, &mut r);
    }
    if p.selected("idle") {
        idle::run(&p, &mut r);
    }
    if p.selected("pg") {
        pg::run(&server, &p, &mut r);
    }
    if p.selected("sentinel") {
        sentinel::run(&p, &mut r);
    }
    if p.selected("cluster") {
        cluster::run(&p, &mut r);
    }
    if p.selected("quorum") {
        quorum::run(&p, &mut r);
    }
    if p.selected("quorum_minority") {
        quorum::run_minority(&p, &mut r);
    }
    if p.selected("peers") {
        peers::run(&p, &mut r);
    }
    if p.selected("tls") {
        #[cfg(feature = "tls")]
        tls::run(&p, &mut r);
        #[cfg(not(feature = "tls"))]
        println!("\n== 7. TLS: not measured (build with `--features tls`)");
    }
    rtt::run_again(&server, &p, &mut r);

    r.close(started.elapsed());
}
