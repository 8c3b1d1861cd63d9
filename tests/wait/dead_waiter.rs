//! A waiter that died while queued in Redis must not cost the others the whole lease it asked
//! for.
//!
//! Why: a release hands the lock straight to the oldest live entry of the key's queue in Redis,
//! with the lease that waiter asked for. A waiter process killed while queued (SIGKILL: it
//! cannot take itself out) leaves an entry that lives as long as its lease, so the next release
//! grants the lock to a dead process, and everyone else waits out that whole lease (here an
//! hour; up to 24 h). A handoff to another client's waiter must instead be granted with a short
//! lease (at most 5 s), which a live waiter then extends to its own: a dead one costs seconds.
//!
//! The repro: H holds the key (lease 30 s); a waiter in another process (`examples/hold.rs`,
//! lease one hour) queues for it and is killed; B starts waiting behind it; H unlocks. Checked: B
//! is granted the key within 15 s of the unlock, with a token above H's. That needs both bounds:
//! the dead waiter's grant is short, and B, which no release wakes when that grant runs out,
//! looks again by itself within the same few seconds rather than when H's lease would have run
//! out.
//!
//! Runs `examples/hold.rs`: a plain `cargo test` builds it; before a filtered
//! `cargo test --test wait`, run `cargo build --examples`.

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use crate::support::{
    await_queue_len, example_bin, lock_client, lock_pttl, ms, Child, RedisServer, NAMESPACE,
};

const KEY: &str = "dead-waiter";

#[test]
fn a_waiter_killed_in_the_queue_delays_the_next_by_seconds_not_its_lease() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // A long lease for H: B, waiting, must not sleep until H's lease (as B last saw it) runs out
    // before it looks again, since no release wakes it when the dead waiter's grant runs out.
    let h = lock_client(&server, 30_000);
    let h_guard = h.lock(KEY).unwrap();
    let h_token = h_guard.token().as_u64();

    let mut waiter = Child::spawn({
        let mut cmd = Command::new(example_bin("hold"));
        cmd.args([KEY, "3600000"])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", NAMESPACE);
        cmd
    });
    await_queue_len(&mut con, KEY, 1);
    waiter.kill();

    let b = lock_client(&server, 30_000);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let outcome = b.try_lock(KEY, ms(20_000));
        let _ = tx.send((outcome, Instant::now()));
    });
    // B stands in Redis' queue behind the dead waiter.
    await_queue_len(&mut con, KEY, 2);

    let unlocked = Instant::now();
    h_guard.unlock().unwrap();
    let (outcome, at) = rx
        .recv_timeout(ms(40_000))
        .expect("B's try_lock(20 s) did not return within 40 s");
    let waited = at.saturating_duration_since(unlocked);
    let b_guard = match outcome {
        Ok(Some(guard)) => guard,
        Ok(None) => panic!(
            "B was not granted {KEY:?} within {waited:?} of H's unlock; its PTTL is now {} ms \
             (-2: free, and B did not look again)",
            lock_pttl(&mut con, KEY)
        ),
        Err(e) => panic!("B's try_lock failed: {e:?}"),
    };
    assert!(
        waited < ms(15_000),
        "B was granted {KEY:?} only {waited:?} after H's unlock"
    );
    assert!(
        b_guard.token().as_u64() > h_token,
        "B's token {} is not above H's {h_token}",
        b_guard.token()
    );
    b_guard.unlock().unwrap();
}
