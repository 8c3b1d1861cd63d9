//! Quorum mode on five real redis-servers: locks and sets of keys (`lock_all`) without faults,
//! and the engine's edges.
//!
//! Tests share this process. `quorum_faults`, whose tests each load the machine and must run
//! alone, has a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod edges;
mod election;
mod leftovers;
mod lock_all;
mod locks;
mod proposal;
