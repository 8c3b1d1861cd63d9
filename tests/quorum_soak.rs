//! A short soak of quorum mode under random faults of up to two masters at a time (the long one
//! is `examples/quorum_soak.rs`): no overlapping holds, no token regressions, no stale write
//! accepted.

mod support;

use std::time::Duration;

use support::quorum_soak::{run, QuorumSoakConfig};

#[test]
fn a_short_quorum_soak_under_random_faults_keeps_every_promise() {
    let config = QuorumSoakConfig {
        duration: Duration::from_secs(12),
        fault_every: Duration::from_millis(700),
        ..QuorumSoakConfig::default()
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
