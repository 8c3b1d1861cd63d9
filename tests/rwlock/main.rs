//! Read-write locks (`LockClient::read_lock`, `write_lock`) on one server: never a writer beside
//! readers or another writer, tokens, no writer starved by readers, a writer's release admitting
//! every waiting reader, holders killed coming back within their lease, the `try_*` timeouts,
//! and the quorum's refusal; under faults (`faults`), holders frozen past their lease, a killed
//! reader with a queue behind it, and Redis restarted with and without AOF.
//!
//! Tests share this process: none sets process-wide state. `crash` runs holders in other
//! processes (`examples/hold_rw.rs`): build the examples first (`cargo build --examples`), as a
//! plain `cargo test` does.

#[path = "../support/mod.rs"]
mod support;

mod api;
mod crash;
mod exclusion;
mod extend;
mod faults;
mod options;
mod order;
mod status;

use std::time::Duration;

use support::{ms, poll_until, queue_len};

/// The tag of the read-write lock `name` (no braces or percent signs in the tests' names).
pub fn tag(name: &str) -> String {
    format!("%rwlock:{name}")
}

/// Polls (bounded: 10 s) until the queue in Redis of the read-write lock `name` holds `n`
/// waiting clients.
pub fn await_waiting(con: &mut redis::Connection, name: &str, n: u64) {
    poll_until(Duration::from_secs(10), ms(5), || {
        let len = queue_len(con, &tag(name));
        if len == n {
            Ok(())
        } else {
            Err(format!("{len} waiting for {name:?}, not {n}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
