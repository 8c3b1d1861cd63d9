//! Holders in other processes, killed (SIGKILL): what they held comes back within their lease,
//! to a writer after a reader's death and to readers after a writer's.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{example_bin, lock_client, ms, Child, RedisServer, NAMESPACE};

fn holder(server: &RedisServer, mode: &str, lease_ms: u64) -> Child {
    let mut cmd = Command::new(example_bin("hold_rw"));
    cmd.args(["crash", mode, &lease_ms.to_string()])
        .env("REDIS_URL", server.url())
        .env("FENCELOCK_NAMESPACE", NAMESPACE);
    Child::spawn(cmd)
}

fn token(line: &str) -> u64 {
    line.trim_start_matches("token ").trim().parse().unwrap()
}

#[test]
fn the_grants_of_killed_holders_come_back_within_their_lease() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let client = lock_client(&server, 30_000);

    // Two readers in other processes; the writer here waits for both.
    let mut r1 = holder(&server, "read", 1_000);
    let t1 = token(&r1.expect_line("token ", Duration::from_secs(20)));
    let mut r2 = holder(&server, "read", 1_000);
    let t2 = token(&r2.expect_line("token ", Duration::from_secs(20)));
    assert!(client
        .try_write_lock("crash", Duration::ZERO)
        .unwrap()
        .is_none());
    r1.kill();
    r2.kill();
    let killed = Instant::now();
    let w = client
        .try_write_lock("crash", Duration::from_secs(10))
        .unwrap()
        .expect("the killed readers' lock");
    let took = killed.elapsed();
    assert!(took < lease + ms(2_000), "came back after {took:?}");
    assert!(w.token().as_u64() > t1.max(t2));
    w.unlock().unwrap();

    // A writer in another process; readers here wait for it.
    let mut writer = holder(&server, "write", 1_000);
    let tw = token(&writer.expect_line("token ", Duration::from_secs(20)));
    assert!(client
        .try_read_lock("crash", Duration::ZERO)
        .unwrap()
        .is_none());
    writer.kill();
    let killed = Instant::now();
    let r = client
        .try_read_lock("crash", Duration::from_secs(10))
        .unwrap()
        .expect("the killed writer's lock");
    let took = killed.elapsed();
    assert!(took < lease + ms(2_000), "came back after {took:?}");
    assert!(r.token().as_u64() > tw);
    // Another reader joins it.
    let other = lock_client(&server, 30_000);
    let r2 = other
        .try_read_lock("crash", Duration::ZERO)
        .unwrap()
        .expect("a second reader");
    assert!(r.is_held() && r2.is_held());
}
