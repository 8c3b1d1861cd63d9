//! Redis Cluster: each lock goes to its slot's master through redirects, failovers and slot
//! migrations; faults that lose replies or hide slots; wake-ups by `SPUBLISH` in the key's slot;
//! sets of keys on different masters (`lock_all`); semaphores and read-write locks; and the cluster test set-up itself.
//!
//! Tests share this process. `cluster_wake_faults`, which counts the process' shard threads, has
//! a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod election;
mod faults;
mod harness;
mod lock_all;
mod routing;
mod rwlock;
mod semaphore;
mod wake;
