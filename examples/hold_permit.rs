//! Takes a permit of a counting semaphore and holds it, renewed, until standard input closes or
//! a line is entered.
//!
//!     REDIS_URL=redis://127.0.0.1:6379/ cargo run --example hold_permit -- uploads 4 [lease-ms]
//!
//! Prints `token N` once granted; at the end, `held=true` or `held=false` (what `is_held()` says
//! just before releasing), then `released` or `lost`. Run it in five terminals with a count of
//! four to watch the fifth wait; kill one with SIGKILL to watch the fifth take its permit when
//! the lease runs out. The test suite uses it as a holder in another process.

use std::io::BufRead;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hold_permit NAME PERMITS [LEASE_MS]";
    let name = args.next().ok_or(usage)?;
    let permits: u32 = args.next().ok_or(usage)?.parse()?;
    let lease_ms: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(30_000);
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let mut builder = fencelock::LockClient::builder(url).lease(Duration::from_millis(lease_ms));
    if let Ok(namespace) = std::env::var("FENCELOCK_NAMESPACE") {
        builder = builder.namespace(namespace);
    }
    let client = builder.build()?;

    let permit = client.semaphore(&name, permits)?.acquire()?;
    println!("token {}", permit.token());
    let _ = std::io::stdin().lock().lines().next();
    println!("held={}", permit.is_held());
    match permit.release() {
        Ok(()) => println!("released"),
        Err(e) if e.is_lock_lost() => println!("lost"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
