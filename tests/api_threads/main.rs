//! A client's background threads live as long as the client or any of its guards, and no longer.
//! Its own test binary, with one test: it counts the process' threads by name, so no other
//! test's threads may run beside it.

#[path = "../support/mod.rs"]
mod support;

use std::thread;
use std::time::{Duration, Instant};

use support::{lock_client, ms, RedisServer};

fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn background_threads_stop_when_the_client_and_its_guards_are_gone() {
    let server = RedisServer::start();
    let client = lock_client(&server, 150);
    // A new thread names itself, so give it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    while threads_named("fencelock-renew") + threads_named("fencelock-wake") < 2 {
        assert!(
            Instant::now() < deadline,
            "background threads never started"
        );
        thread::sleep(ms(10));
    }
    assert_eq!(threads_named("fencelock-renew"), 1);
    assert_eq!(threads_named("fencelock-wake"), 1);

    let guard = client.lock("outlives").unwrap();
    drop(client);
    // The guard keeps its client's renewal going.
    thread::sleep(ms(600));
    assert!(guard.is_held());
    assert_eq!(threads_named("fencelock-renew"), 1);
    drop(guard);

    let deadline = Instant::now() + Duration::from_secs(3);
    while threads_named("fencelock-") > 0 {
        assert!(
            Instant::now() < deadline,
            "background threads outlived the client"
        );
        thread::sleep(ms(20));
    }
}
