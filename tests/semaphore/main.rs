//! Counting semaphores (`LockClient::semaphore`) on one server: never more than N permits held,
//! tokens, permits of a holder cut off coming back, `try_acquire`'s timeout, status, handoff in
//! arrival order, one count per name, and the quorum's refusal.
//!
//! Tests share this process: none sets process-wide state.

#[path = "../support/mod.rs"]
mod support;

mod api;
mod counting;
mod lapse;
mod order;
