//! A holder in another process dies without releasing: the lock is free once its lease runs out.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::{example_bin, lock_client, Child, RedisServer};

#[test]
fn lock_of_a_killed_holder_is_taken_over_when_its_lease_runs_out() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1_000);
    let mut holder = Child::spawn({
        let mut cmd = Command::new(example_bin("hold"));
        cmd.args(["crashing", "1000"])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", support::NAMESPACE);
        cmd
    });
    let line = holder.expect_line("token ", Duration::from_secs(10));
    let holder_token: u64 = line["token ".len()..].trim().parse().unwrap();

    let client = lock_client(&server, 30_000);
    assert!(client
        .try_lock("crashing", Duration::ZERO)
        .unwrap()
        .is_none());
    holder.kill();
    let killed = Instant::now();
    let guard = client.lock("crashing").unwrap();
    let waited = killed.elapsed();

    assert!(guard.token().as_u64() > holder_token);
    // Renewed every lease/3, so at least 2/3 of the lease was left at the kill.
    assert!(
        waited >= lease / 2,
        "took over after {waited:?}, before the lease could run out"
    );
    assert!(
        waited <= lease + Duration::from_millis(500),
        "took {waited:?}"
    );
}
