//! A soak under random faults: threads on two clients contend for keys and write to a fenced
//! store, while Redis is paused, restarted, failed over and disturbed through a fault proxy.
//! Prints grants, faults injected, overlaps, token regressions and stale writes accepted; the
//! last three must be zero, but for overlaps across a Sentinel or Cluster failover, which those
//! deployments do not promise to prevent (docs/design.md). Starts its own redis-servers.
//!
//!     cargo run --release --example soak -- [SECONDS] [SEED] [one|sentinel|sentinel-acks|cluster]
//!
//! `one` (the default) is one server behind a fault proxy; `sentinel` a master, two replicas and
//! three sentinels (`sentinel-acks`: clients with `min_replica_acks(1)`); `cluster` three
//! masters with a replica each. The quorum has its own: `examples/quorum_soak.rs`.
//!
//! `docs/reliability.md` records the latest figures.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::soak::{run, ClusterOf, OneServer, SentinelOf, SoakConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let secs = args.next().and_then(|s| s.parse().ok());
    let seed = args.next().and_then(|s| s.parse().ok());
    let on = args.next().unwrap_or_else(|| "one".to_owned());
    let mut config = match on.as_str() {
        "one" => SoakConfig::one_server(),
        "sentinel" | "sentinel-acks" | "cluster" => SoakConfig::replicated(),
        other => {
            eprintln!("unknown deployment {other:?}: one, sentinel, sentinel-acks or cluster");
            std::process::exit(2);
        }
    };
    if let Some(secs) = secs {
        config.duration = Duration::from_secs(secs);
    }
    if let Some(seed) = seed {
        config.seed = seed;
    }
    let report = match on.as_str() {
        "sentinel" => run(&mut SentinelOf::start(false), &config),
        "sentinel-acks" => run(&mut SentinelOf::start(true), &config),
        "cluster" => run(&mut ClusterOf::start(config.keys), &config),
        _ => run(&mut OneServer::start(), &config),
    };
    report.print(&config);
    if !report.is_clean() {
        eprintln!("soak FAILED: the lock or the fenced store broke a promise");
        std::process::exit(1);
    }
}
