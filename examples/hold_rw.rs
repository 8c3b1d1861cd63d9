//! Takes a read-write lock to read or to write and holds it, renewed, until standard input closes
//! or a line is entered.
//!
//!     REDIS_URL=redis://127.0.0.1:6379/ cargo run --example hold_rw -- config read [lease-ms]
//!
//! Prints `token N` once granted; at the end, `held=true` or `held=false` (what `is_held()` says
//! just before releasing), then `released` or `lost`. Run a few readers and a writer in
//! terminals to watch them take turns; kill one with SIGKILL to watch the next take the lock when
//! the lease runs out. The test suite uses it as a holder in another process.

use std::io::BufRead;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hold_rw NAME read|write [LEASE_MS]";
    let name = args.next().ok_or(usage)?;
    let write = match args.next().as_deref() {
        Some("read") => false,
        Some("write") => true,
        _ => return Err(usage.into()),
    };
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

    let wait_for_line = || {
        let _ = std::io::stdin().lock().lines().next();
    };
    let released = if write {
        let guard = client.write_lock(&name)?;
        println!("token {}", guard.token());
        wait_for_line();
        println!("held={}", guard.is_held());
        guard.unlock()
    } else {
        let guard = client.read_lock(&name)?;
        println!("token {}", guard.token());
        wait_for_line();
        println!("held={}", guard.is_held());
        guard.unlock()
    };
    match released {
        Ok(()) => println!("released"),
        Err(e) if e.is_lock_lost() => println!("lost"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
