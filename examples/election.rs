//! Leader election whose epochs fence: one scheduler leads at a time, and a deposed leader that
//! stalled cannot overwrite its successor's work.
//!
//!     cargo run --example election
//!
//! Runs two candidates in one process and an observer: `node-a` leads and writes the schedule
//! through `FencedRedis` with its epoch, then stalls past its lease (it stops renewing: its
//! leadership has a maximum term); `node-b` takes over, proclaims, writes with a higher epoch;
//! `node-a` wakes and its late write is refused. The observer prints every change of leader.
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server` on a free port.
//!
//! With arguments it is one candidate, for running in several terminals (and for the test
//! suite, which kills and freezes it):
//!
//!     REDIS_URL=redis://127.0.0.1:6379/ cargo run --example election -- NAME VALUE [LEASE_MS]
//!
//! It prints `leader <epoch>` once it leads, then resigns and prints `resigned` when a line is
//! entered or standard input closes (`lost` if the leadership was lost by then).

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use std::io::BufRead;
use std::thread;
use std::time::Duration;

use fencelock::{FencedRedis, LockClient, LockOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [name, value, rest @ ..] = args.as_slice() {
        let lease_ms = rest
            .first()
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(30_000);
        return candidate(name, value, Duration::from_millis(lease_ms));
    }
    demo()
}

/// One candidate, as the test suite runs it.
fn candidate(name: &str, value: &str, lease: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let mut builder = LockClient::builder(url).lease(lease);
    if let Ok(namespace) = std::env::var("FENCELOCK_NAMESPACE") {
        builder = builder.namespace(namespace);
    }
    let client = builder.build()?;
    let leadership = client.election(name)?.campaign(value)?;
    println!("leader {}", leadership.epoch());
    let _ = std::io::stdin().lock().lines().next();
    match leadership.resign() {
        Ok(()) => println!("resigned"),
        Err(e) if e.is_lock_lost() => println!("lost"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = throwaway_redis::redis_url()?;
    println!("using {url}");
    let client = LockClient::builder(url.as_str())
        .namespace("election-example")
        .lease(Duration::from_millis(500))
        .build()?;
    let store = FencedRedis::from(&client);
    let election = client.election("scheduler")?;

    let observer = election.observe()?;
    // Prints every change, until nobody leads after node-b did.
    let printer = thread::spawn(move || {
        let mut seen_b = false;
        for change in observer.changes() {
            match change {
                Some(leader) => {
                    println!(
                        "observer: {} leads (epoch {})",
                        leader.value(),
                        leader.epoch()
                    );
                    seen_b |= leader.value() == "node-b";
                }
                None if seen_b => {
                    println!("observer: nobody leads");
                    return;
                }
                None => println!("observer: nobody leads"),
            }
        }
    });

    // node-a leads for at most 1 s: then renewal stops, as it would for a process that stalls.
    let a = election.campaign_with(
        "node-a",
        &LockOptions::new().max_hold(Duration::from_secs(1)),
    )?;
    println!("node-a leads with epoch {}", a.epoch());
    store.set("schedule", a.epoch(), "written by node-a")?;

    // node-b waits its turn, and gets it when node-a's last lease runs out.
    let b = election.campaign("node-b")?;
    println!(
        "node-b leads with epoch {} (node-a still thinks it leads: {})",
        b.epoch(),
        a.is_leader()
    );
    store.set("schedule", b.epoch(), "written by node-b")?;

    // node-a wakes and writes with its old epoch: refused.
    match store.set("schedule", a.epoch(), "late write by node-a") {
        Err(e) if e.is_stale_token() => println!("node-a's late write refused: {e}"),
        other => {
            return Err(format!("a deposed leader's write must be refused, got {other:?}").into())
        }
    }
    let schedule = store.get("schedule")?.ok_or("the schedule was written")?;
    println!("schedule: {}", String::from_utf8_lossy(&schedule));

    b.resign()?;
    drop(a);
    printer.join().map_err(|_| "the printer panicked")?;
    Ok(())
}
