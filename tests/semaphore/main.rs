//! Counting semaphores (`LockClient::semaphore`) on one server: never more than N permits held,
//! tokens, permits of a holder cut off, killed or frozen coming back, `try_acquire`'s timeout,
//! status, handoff in arrival order, one count per name, and the quorum's refusal.
//!
//! Tests share this process: none sets process-wide state. `crash` runs holders in other
//! processes (`examples/hold_permit.rs`): build the examples first (`cargo build --examples`),
//! as a plain `cargo test` does.

#[path = "../support/mod.rs"]
mod support;

mod api;
mod counting;
mod crash;
mod extend;
mod lapse;
mod order;
