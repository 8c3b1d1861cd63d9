//! Quorum mode on five real redis-servers: locks without faults, and the engine's edges.
//!
//! Tests share this process. `quorum_faults`, whose tests each load the machine and must run
//! alone, has a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod edges;
mod locks;
