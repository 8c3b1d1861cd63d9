//! A holder whose CPU is throttled: its worker process put, right after one of its threads read
//! its counter, in a cgroup allowed 1 ms of CPU a second for six leases
//! (tests/support/cgroup.rs), so that once it used that, none of its threads runs for the rest
//! of the second, its renewal thread included: the lease runs out while the holder is between
//! its read and its write. Without a fence updates are lost (the
//! nemesis bites); through `FencedRedis` none is.
//!
//! Needs root (a cgroup of its own), hence the feature `partition-tests`.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::deployments::{assert_busy, run, Deployment, Nemesis};
use super::support::cgroup::CpuThrottle;
use super::support::{ms, poll_until};
use super::Store;

#[test]
fn a_throttled_process_is_held_back_and_the_cgroup_is_removed() {
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .expect("sh");
    let throttle = CpuThrottle::new(10, 100);
    let dir = throttle.dir().to_path_buf();
    throttle.add(busy.id());
    assert_eq!(throttle.pids(), vec![busy.id()]);
    let throttled = poll_until(Duration::from_secs(5), ms(50), || {
        let n = throttle.throttled();
        (n >= 3).then_some(n).ok_or(format!("nr_throttled {n}"))
    });
    drop(throttle);
    let _ = busy.kill();
    let _ = busy.wait();
    throttled.unwrap_or_else(|why| panic!("a busy loop was never throttled: {why}"));
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

/// The nemesis bites. (Tokens are not asserted here either: see below.)
#[test]
fn throttled_holders_without_a_fence_lose_updates() {
    let run = run(
        Deployment::One,
        Store::Unfenced,
        &[Nemesis::ThrottleClient],
        8,
        3,
    );
    assert_busy(&run);
    assert!(
        run.verdict.count("lost_updates") >= 1,
        "no update lost without a fence under {} throttles: the nemesis did not bite\n{}",
        run.faults,
        run.verdict.output
    );
}

/// The fence keeps the data, and the lock's record holds: a process starved between Redis'
/// grant and its reading of the reply gives back a grant whose lease ran out
/// (`faults::late_grant`).
#[test]
fn throttled_holders_through_fenced_redis_lose_nothing() {
    let run = run(
        Deployment::One,
        Store::FencedRedis,
        &[Nemesis::ThrottleClient],
        8,
        3,
    );
    assert_busy(&run);
    assert!(run.faults >= 1, "no throttle:\n{}", run.verdict.output);
    let v = &run.verdict;
    assert_eq!(v.count("lost_updates"), 0, "{}", v.output);
    // A grant heard of after its lease ran out is given back, never returned: the lock's own
    // record holds too.
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}
