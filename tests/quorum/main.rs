//! Quorum mode on five real redis-servers: locks without faults, the engine's edges, and faults
//! of single masters under a recorded workload.

#[path = "../support/mod.rs"]
mod support;

mod edges;
mod faults;
mod locks;
