//! A soak under random faults: threads on two clients contend for one key and write to a
//! fenced store, while Redis is paused, restarted and disturbed through a fault proxy. Prints
//! grants, faults injected, overlaps, token regressions and stale writes accepted; the last
//! three must be zero. Starts its own redis-server.
//!
//!     cargo run --release --example soak -- [SECONDS] [SEED]
//!
//! `docs/reliability.md` records the latest figures.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::soak::{run, OneServer, SoakConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut config = SoakConfig::one_server();
    if let Some(secs) = args.next().and_then(|s| s.parse().ok()) {
        config.duration = Duration::from_secs(secs);
    }
    if let Some(seed) = args.next().and_then(|s| s.parse().ok()) {
        config.seed = seed;
    }
    let report = run(&mut OneServer::start(), &config);
    report.print(&config);
    if !report.is_clean() {
        eprintln!("soak FAILED: the lock or the fenced store broke a promise");
        std::process::exit(1);
    }
}
