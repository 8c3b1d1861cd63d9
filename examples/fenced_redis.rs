//! A stale lock holder's write is refused by fenced storage on Redis.
//!
//! Holder A takes the lock and stalls before writing; B takes the lock over, with a higher
//! fencing token, and writes; then A wakes up and writes with its old token. `FencedRedis`
//! refuses A's write, so B's value stays.
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server` on a free port and
//! stops it at the end.
//!
//!     cargo run --example fenced_redis

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use std::time::Duration;

use fencelock::{FencedRedis, LockClient};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = throwaway_redis::redis_url()?;
    println!("using {url}");
    let namespace = "fenced-example";
    let locks = LockClient::builder(url.as_str())
        .namespace(namespace)
        .lease(Duration::from_secs(5))
        .build()?;
    let store = FencedRedis::open(&url)?.with_namespace(namespace)?;
    let invoice = "invoice:7";

    let a = locks.lock(invoice)?;
    let token_a = a.token();
    println!("A holds {invoice} with token {token_a}, and stalls before writing");
    // A real stall (a long pause, a swapped-out process) outlives the lease and Redis expires
    // the lock; releasing it here has the same effect without the wait.
    a.unlock()?;

    let b = locks.lock(invoice)?;
    let token_b = b.token();
    store.set(invoice, token_b, "paid, by B")?;
    println!("B took over with token {token_b} and wrote: accepted");
    store.set(invoice, token_b, "paid and mailed, by B")?;
    println!("B wrote again with the same token {token_b}: accepted");
    let revision = store.incr_by(&format!("{invoice}:revision"), token_b, 1)?;
    println!("B bumped the revision to {revision} with token {token_b}: accepted");
    b.unlock()?;

    println!("A wakes up and writes with its old token {token_a}");
    match store.set(invoice, token_a, "paid, by A") {
        Ok(()) => return Err("the stale write was accepted".into()),
        Err(e) if e.is_stale_token() => println!("A's write: rejected: {e}"),
        Err(e) => return Err(e.into()),
    }

    let value = store.get(invoice)?.unwrap_or_default();
    let highest = store.highest_token(invoice)?;
    println!(
        "stored: {:?}, highest accepted token {}",
        String::from_utf8_lossy(&value),
        highest.map_or_else(|| "none".to_owned(), |t| t.to_string())
    );
    Ok(())
}
