//! Distributed locks on Redis for synchronous Rust, with fencing tokens.
//!
//! A lease-based lock alone cannot stop a holder that stalls — a GC-like pause, a swapped-out
//! process, a slow network — from acting after its lease ran out and another holder took over.
//! fencelock hands out a [`FencingToken`] with every grant, a number that strictly increases per
//! key, so the storage you write to can reject the stale holder's writes. Around that it gives
//! you what a lock you rely on needs:
//!
//! - a blocking API: [`LockClient::lock`] waits, [`LockClient::try_lock`] waits at most a
//!   timeout, and both return an RAII [`LockGuard`];
//! - waiting without polling: a release hands the lock straight to the next waiter, in the same
//!   script call, in arrival order;
//! - a background renewal thread that keeps every held lease alive and tells the holder at
//!   once when a lease was lost anyway.
//!
//! # A first lock
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::{Error, LockClient};
//!
//! # fn write_row(_: u64, _: &str) {}
//! fn main() -> Result<(), Error> {
//!     let client = LockClient::builder("redis://127.0.0.1:6379/")
//!         .namespace("billing")
//!         .lease(Duration::from_secs(10))
//!         .build()?;
//!
//!     let guard = client.lock("invoice:7")?;
//!     // Hand the token to the storage; it must refuse tokens lower than one it has seen.
//!     write_row(guard.token().as_u64(), "paid");
//!     guard.unlock()?;
//!     Ok(())
//! }
//! ```
//!
//! # Fencing tokens
//!
//! The acquire script sets the lock key and runs `INCR` on the key's fence counter in one atomic
//! step, so the token of a grant is larger than that of every earlier grant of the same key, in
//! any process. The counter outlives the lock; `docs/design.md` explains the key layout and the
//! persistence Redis needs for tokens to survive a restart.
//!
//! A token protects only storage that checks it. [`FencedRedis`] is such a store on Redis: its
//! writes carry a token and are refused with [`Error::StaleToken`] once a higher one was accepted.
//! `docs/fencing.md` shows the same pattern for SQL, object stores and compare-and-set.
//!
//! # Renewal and loss
//!
//! While a guard lives, its client's renewal thread extends the lease about every lease/3, many
//! locks per round trip. If Redis reports the key gone or re-owned, or the lease's local deadline
//! passes without a confirmed renewal, the guard is lost: [`LockGuard::is_held`] returns false and
//! [`LockGuard::lost`] fires. Check `is_held()` right before acting, or `select!` on `lost()`.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! # let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! # fn step(_: usize) {}
//! let guard = client.lock("nightly-export")?;
//! for chunk in 0..100 {
//!     if !guard.is_held() {
//!         return Err(fencelock::Error::LockLost { key: guard.key().to_owned() });
//!     }
//!     step(chunk);
//! }
//! guard.unlock()
//! # }
//! ```
//!
//! # Options, reentrancy and closures
//!
//! [`LockClient::lock_with`] takes [`LockOptions`]: a lease of its own, renewal off, a maximum
//! hold time, or a cancel channel. [`LockClient::with_lock`] runs a closure under a lock and
//! releases it on return or panic. [`LockClient::reentrant_lock`] nests on one thread, sharing
//! one grant and token; a plain [`LockClient::lock`] of a key the thread already holds returns
//! [`Error::WouldDeadlock`] instead of waiting for itself.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use std::time::Duration;
//! use fencelock::{LockClient, LockOptions};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/")?;
//! let guard = client.lock_with(
//!     "report",
//!     &LockOptions::new().lease(Duration::from_secs(5)).max_hold(Duration::from_secs(600)),
//! )?;
//! guard.extend(Duration::from_secs(20))?; // before a step that may stall
//! guard.unlock()?;
//! # Ok(()) }
//! ```
//!
//! # Errors
//!
//! Every fallible call returns [`Error`]; bad input (an empty key, a zero lease, a zero pool
//! size, a malformed URL) is rejected before any network call. Nothing in this crate panics on
//! bad input or on Redis failures, and dropping a guard never panics.
//!
//! # What this lock does not guarantee
//!
//! - Mutual exclusion of *actions*, on its own: a holder can pause right after checking
//!   `is_held()`. Only storage that checks the fencing token closes that gap.
//! - Safety across a Redis restart without persistence, or a failover that loses writes: the
//!   lock key and the fence counter can be lost with them. See `docs/design.md`.
//! - Fairness across processes: threads of one client are served in arrival order; between
//!   clients, whoever asks first after a release wins.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod acquire;
#[cfg(test)]
mod checked;
mod client;
mod config;
mod connector;
mod error;
mod fenced;
mod grant;
mod guard;
mod key;
mod listener;
mod locks;
mod options;
mod pool;
mod reentrant;
mod release;
mod renewal;
mod scripts;
mod token;
mod wait;
mod wire;

pub use crate::client::LockClient;
pub use crate::config::{Builder, MAX_POOL_SIZE, MAX_TIMEOUT};
pub use crate::error::{Error, Result};
pub use crate::fenced::{FencedBuilder, FencedRedis};
pub use crate::guard::LockGuard;
pub use crate::key::{MAX_KEY_LEN, MAX_NAMESPACE_LEN};
pub use crate::options::{LockOptions, MAX_LEASE, MIN_LEASE};
pub use crate::reentrant::ReentrantGuard;
pub use crate::token::FencingToken;

/// Re-exported so that `lost()` receivers can be used with `select!` without a direct
/// dependency on crossbeam-channel.
pub use crossbeam_channel;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
