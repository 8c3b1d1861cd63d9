//! Waiting for a lock: a release wakes one waiter at once, hands the lock straight to the next
//! in queue order, with a lease the waiter confirms, for keys of any bytes; a dead waiter costs
//! little; clients get a fair share; releases of many threads go out together.
//!
//! Tests share this process: none of them sets process-wide state. `wait_late_handoff`, which
//! captures the log, has a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod combining;
mod dead_waiter;
mod fairness;
mod handoff;
mod handoff_keys;
mod handoff_lease;
mod wake;
