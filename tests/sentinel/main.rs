//! Redis Sentinel and replication: a client follows the master through failovers, tokens never
//! go backwards across a failover that lost writes, sets of keys (`lock_all`) are taken again
//! after a failover, credentials and TLS reach every process, and the Sentinel test set-up itself
//! works.
//!
//! CI runs `follow_master` and `failover` a second time on Valkey (a Redis 7.2-compatible
//! server).

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod election;
mod failover;
mod follow_master;
mod harness;
mod lock_all;
mod rwlock;
mod semaphore;
