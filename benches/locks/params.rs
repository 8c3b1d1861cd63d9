//! The parameters: an argument `KEY=VALUE` or the environment variable `BENCH_KEY` (the argument
//! wins), with the defaults of the table in `main.rs`; other arguments are name filters.

use std::time::Duration;

pub struct Params {
    filters: Vec<String>,
    pub threads: usize,
    pub clients: usize,
    pub critical: Duration,
    pub think: Duration,
    pub duration: Duration,
    pub base_duration: Duration,
    pub workers: usize,
    pub keys: u64,
    pub pool_size: u32,
    pub uncontended: usize,
    pub handoffs: usize,
    pub base_handoffs: usize,
    pub renew_locks: usize,
    pub renew_lease: Duration,
    pub renew_leases: u32,
    pub rtt_samples: usize,
    pub idle_keys: u64,
    pub recorder: bool,
    pub pg_rounds: usize,
    /// One run of the quorum-minority workload (`M_MS`).
    pub minority: Duration,
    /// election: failovers after a resignation, and proclamations observed (`E`).
    pub elections: usize,
    /// election: failovers after a crash (`EC`), each at least a lease long.
    pub crashes: usize,
    /// election: the crashed leader's lease (`E_LEASE_MS`).
    pub crash_lease: Duration,
}

impl Params {
    pub fn parse() -> Params {
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
            idle_keys: get("IK", 10_000).max(1),
            recorder: get("RECORDER", 0) != 0,
            pg_rounds: get("PG_ROUNDS", 3).max(1) as usize,
            minority: Duration::from_millis(get("M_MS", 2000).max(100)),
            elections: get("E", 300).max(5) as usize,
            crashes: get("EC", 40).max(3) as usize,
            crash_lease: Duration::from_millis(get("E_LEASE_MS", 200).clamp(10, 10_000)),
        }
    }

    /// Whether the benchmark `name` runs: no filter given, or one is part of its name.
    pub fn selected(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}
