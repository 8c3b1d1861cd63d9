//! Faults on one server: the network reset, delayed and blackholed; Redis paused, killed,
//! restarted, unreachable or answering with errors; a holder process that crashes.
//!
//! Tests share this process: none of them sets process-wide state. `faults_signals`, which
//! installs a signal handler and signals the library's threads, has a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod clock;
mod crash;
mod late_grant;
mod network;
mod pause;
mod replies;
mod restart;
mod unreachable;
mod unreachable_edges;
