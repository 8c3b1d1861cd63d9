//! Renewal: short leases kept alive for many periods, late extends that must not shorten a
//! lease, and a loss told to the holder at once.
//!
//! Tests share this process: none of them sets process-wide state. `api_threads`, which counts
//! the renewal thread, has a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod late_extend;
mod loss;
mod renewal;
