//! A soak of quorum mode under random faults: threads on two clients lock two keys on five
//! redis-servers and write to a fenced store, while up to two masters at a time are frozen,
//! killed and wiped (and restarted once the lease has run out), or have their traffic delayed
//! or cut through fault proxies. Prints grants, faults injected, overlaps, token regressions and
//! stale writes accepted; the last three must be zero. Starts its own redis-servers.
//!
//!     cargo run --release --example quorum_soak -- [SECONDS] [SEED]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::soak::{run, QuorumOf, SoakConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut config = SoakConfig::quorum();
    if let Some(secs) = args.next().and_then(|s| s.parse().ok()) {
        config.duration = Duration::from_secs(secs);
    }
    if let Some(seed) = args.next().and_then(|s| s.parse().ok()) {
        config.seed = seed;
    }
    let report = run(&mut QuorumOf::start(5), &config);
    report.print(&config);
    if !report.is_clean() {
        eprintln!("quorum soak FAILED: the lock or the fenced store broke a promise");
        std::process::exit(1);
    }
}
