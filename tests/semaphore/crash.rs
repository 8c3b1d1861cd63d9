//! Holders in other processes: one killed, one frozen (SIGSTOP). Each one's permit comes back
//! within its lease; the frozen one, woken, knows its permit is lost.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{example_bin, lock_client, ms, Child, RedisServer, NAMESPACE};

fn holder(server: &RedisServer, lease_ms: u64) -> Child {
    let mut cmd = Command::new(example_bin("hold_permit"));
    cmd.args(["crash", "2", &lease_ms.to_string()])
        .env("REDIS_URL", server.url())
        .env("FENCELOCK_NAMESPACE", NAMESPACE);
    Child::spawn(cmd)
}

fn token(line: &str) -> u64 {
    line.trim_start_matches("token ").trim().parse().unwrap()
}

#[test]
fn permits_of_a_killed_and_a_frozen_holder_come_back_within_their_lease() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let mut killed = holder(&server, 1_000);
    let first = token(&killed.expect_line("token ", Duration::from_secs(20)));
    let frozen = holder(&server, 1_000);
    let second = token(&frozen.expect_line("token ", Duration::from_secs(20)));
    let client = lock_client(&server, 30_000);
    let crash = client.semaphore("crash", 2).unwrap();
    assert!(crash.try_acquire(Duration::ZERO).unwrap().is_none());

    killed.kill();
    frozen.pause();
    let stopped = Instant::now();
    let a = crash
        .try_acquire(Duration::from_secs(10))
        .unwrap()
        .expect("the killed holder's permit");
    let b = crash
        .try_acquire(Duration::from_secs(10))
        .unwrap()
        .expect("the frozen holder's permit");
    let took = stopped.elapsed();
    assert!(took < lease + ms(2_000), "came back after {took:?}");
    assert!(a.token().as_u64() > first.max(second));
    assert!(b.token() > a.token());
    assert_eq!(crash.status().unwrap().held, 2);

    // Woken, the frozen holder finds its permit lost, and its release frees nobody's.
    frozen.resume();
    frozen.send_line("");
    frozen.expect_line("held=false", Duration::from_secs(10));
    frozen.expect_line("lost", Duration::from_secs(10));
    assert!(a.is_held() && b.is_held());
    assert_eq!(crash.status().unwrap().held, 2);
}
