//! Short soaks under random faults, on one server, Sentinel, Cluster and a quorum of five (the
//! long ones are `examples/soak.rs` and `examples/quorum_soak.rs`): no overlapping holds, no
//! token regressions, no stale write accepted. On Sentinel, holds may overlap across a failover
//! (the old master grants and renews for a moment after the switch: docs/design.md), so there
//! only the tokens and the fenced store must hold.

#[path = "../support/mod.rs"]
mod support;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use support::soak::{run, ClusterOf, OneServer, QuorumOf, SentinelOf, SoakConfig, SoakReport};

/// One soak at a time, as when each was a test binary of its own: each loads the machine by
/// itself, and its counts of grants and faults are bounds.
fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn a_short_soak_under_random_faults_keeps_every_promise() {
    let _alone = alone();
    let config = SoakConfig {
        duration: Duration::from_secs(12),
        fault_every: Duration::from_millis(800),
        min_faults: 5,
        ..SoakConfig::one_server()
    };
    let report = run(&mut OneServer::start(), &config);
    report.print(&config);
    assert_every_promise_kept(&report);
}

#[test]
fn a_short_quorum_soak_under_random_faults_keeps_every_promise() {
    let _alone = alone();
    let config = SoakConfig {
        duration: Duration::from_secs(12),
        fault_every: Duration::from_millis(700),
        min_faults: 5,
        ..SoakConfig::quorum()
    };
    let report = run(&mut QuorumOf::start(5), &config);
    report.print(&config);
    assert_every_promise_kept(&report);
}

#[test]
fn a_short_cluster_soak_under_random_faults_keeps_every_promise() {
    let _alone = alone();
    let config = SoakConfig {
        duration: Duration::from_secs(15),
        fault_every: Duration::from_millis(1_500),
        min_faults: 5,
        ..SoakConfig::replicated()
    };
    let report = run(&mut ClusterOf::start(config.keys), &config);
    report.print(&config);
    assert_every_promise_kept(&report);
}

#[test]
fn a_short_sentinel_soak_with_failovers_keeps_tokens_rising_and_the_store_safe() {
    let _alone = alone();
    let config = SoakConfig {
        duration: Duration::from_secs(15),
        fault_every: Duration::from_millis(1_500),
        min_faults: 2,
        ..SoakConfig::replicated()
    };
    let report = run(&mut SentinelOf::start(true), &config);
    report.print(&config);
    // A failover takes seconds to settle: two faults in 15 s are what fits.
    assert_enough_happened(&report, 2);
    assert_eq!(report.token_regressions, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
}

/// Enough happened for the soak to prove something, and nothing broke a promise.
fn assert_every_promise_kept(report: &SoakReport) {
    assert_enough_happened(report, 5);
    assert_eq!(report.overlaps, 0, "{report:?}");
    assert_eq!(report.token_regressions, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
}

fn assert_enough_happened(report: &SoakReport, min_faults: u64) {
    let faults: u64 = report.faults.iter().map(|(_, n)| n).sum();
    assert!(faults >= min_faults, "only {faults} faults injected");
    assert!(
        report.grants >= 100,
        "only {} grants: the soak proves little",
        report.grants
    );
    assert!(
        report.writes_accepted >= 50,
        "only {} fenced writes",
        report.writes_accepted
    );
}
