//! Short soaks under random faults, on one server and on a quorum of five (the long ones are
//! `examples/soak.rs` and `examples/quorum_soak.rs`): no overlapping holds, no token
//! regressions, no stale write accepted.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use support::quorum_soak::{self, QuorumSoakConfig};
use support::soak::{run, SoakConfig};

#[test]
fn a_short_soak_under_random_faults_keeps_every_promise() {
    let config = SoakConfig {
        duration: Duration::from_secs(12),
        fault_every: Duration::from_millis(800),
        ..SoakConfig::default()
    };
    let report = run(&config);
    report.print(&config);
    let faults: u64 = report.faults.iter().map(|(_, n)| n).sum();
    assert!(faults >= 5, "only {faults} faults injected");
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
    assert_eq!(report.overlaps, 0, "{report:?}");
    assert_eq!(report.token_regressions, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
}

#[test]
fn a_short_quorum_soak_under_random_faults_keeps_every_promise() {
    let config = QuorumSoakConfig {
        duration: Duration::from_secs(12),
        fault_every: Duration::from_millis(700),
        ..QuorumSoakConfig::default()
    };
    let report = quorum_soak::run(&config);
    report.print(&config);
    let faults: u64 = report.faults.iter().map(|(_, n)| n).sum();
    assert!(faults >= 5, "only {faults} faults injected");
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
    assert_eq!(report.overlaps, 0, "{report:?}");
    assert_eq!(report.token_regressions, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
}
