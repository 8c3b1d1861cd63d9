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
//!   script call; waiting clients take turns;
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
//! # Waiting at most so long
//!
//! [`LockClient::try_lock`] gives up after a timeout with `Ok(None)`; `Duration::ZERO` makes
//! exactly one attempt and never queues.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use std::time::Duration;
//!
//! let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! match client.try_lock("report:daily", Duration::from_millis(500))? {
//!     Some(guard) => {
//!         // ... build the report, passing guard.token() to the storage ...
//!         guard.unlock()?;
//!     }
//!     None => println!("another worker has the daily report"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Fencing tokens
//!
//! The acquire script sets the lock key and runs `INCR` on the key's fence counter in one atomic
//! step, so the token of a grant is larger than that of every earlier grant of the same key, in
//! any process. The counter outlives the lock, and expires once nobody has locked the key for
//! [`Builder::idle_expiry`] (24 h by default): the next grant takes its token from the Redis
//! server's clock, which has passed the counter by then, so a key nobody uses leaves nothing in
//! Redis. [design.md] explains the key layout, the clock assumption of that expiry and the
//! persistence Redis needs for tokens to survive a restart.
//!
//! A token protects only storage that checks it: storage that remembers the highest token it
//! applied per resource, and refuses a lower one in the same atomic step as the write.
//! [fencing.md] says why, and how for SQL, Redis, object stores and compare-and-set.
//!
//! ## Fenced storage on Redis
//!
//! [`FencedRedis`] is such a store: its writes carry a token and are refused with
//! [`Error::StaleToken`] once a higher one was accepted. `FencedRedis::from(&client)` shares the
//! client's connections and namespace.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use fencelock::{FencedRedis, LockClient};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/")?;
//! let store = FencedRedis::from(&client);
//!
//! let guard = client.lock("invoice:7")?;
//! match store.set("invoice:7", guard.token(), "paid") {
//!     Ok(()) => {}
//!     // A newer holder has written since this grant: drop the work.
//!     Err(e) if e.is_stale_token() => return Ok(()),
//!     Err(e) => return Err(e),
//! }
//! store.incr_by("invoices:paid", guard.token(), 1)?;
//! let paid = store.get_i64("invoices:paid")?.unwrap_or(0);
//! # let _ = paid;
//! guard.unlock()
//! # }
//! ```
//!
//! ## Fencing in SQL
//!
//! Give the table a `fence bigint` column and put the token into the `UPDATE`'s condition; zero
//! rows means a newer holder wrote (or the row is missing). [`FencingToken::as_i64`] gives the
//! token as a `bigint`; every granted token fits. With the `postgres` crate:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! # let mut db = postgres::Client::connect("postgres://localhost/app", postgres::NoTls)?;
//! // CREATE TABLE documents (id text PRIMARY KEY, body text NOT NULL,
//! //                         fence bigint NOT NULL DEFAULT 0);
//! let guard = client.lock("documents:report")?;
//! let rows = db.execute(
//!     "UPDATE documents SET body = $1, fence = $2 WHERE id = $3 AND fence <= $2",
//!     &[&"final", &guard.token().as_i64()?, &"report"],
//! )?;
//! if rows == 0 {
//!     println!("a newer holder wrote the report (or there is no such row)");
//! }
//! guard.unlock()?;
//! # Ok(()) }
//! ```
//!
//! That one statement is enough for a write that depends on nothing it read. A job that reads
//! the row, computes and writes back (a balance, a counter) must **claim the row before it
//! reads**: first, in the transaction, `UPDATE documents SET fence = $2 WHERE id = $1 AND fence
//! <= $2` (zero rows: roll back), then the read and the write. Until the new holder's first
//! write, a stalled old holder's token is still the highest, and its late write could land
//! between the read and the write-back. [fencing.md] shows the variants.
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
//! # Options, closures and reentrancy
//!
//! [`LockClient::lock_with`] takes [`LockOptions`]: a lease of its own, renewal off, a maximum
//! hold time, or a cancel channel.
//!
//! [`LockClient::with_lock`] runs a closure under a lock and releases it on return, error or
//! panic. The closure returns a `Result` in your own error type, and fencelock's errors convert
//! into it (`E: From<fencelock::Error>`), as with diesel's `transaction`: `?` works inside the
//! closure and on the call. [`LockClient::try_with_lock`] waits at most a timeout, and
//! [`LockClient::with_lock_options`] and [`LockClient::try_with_lock_options`] take options.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use std::time::Duration;
//! use fencelock::{FencedRedis, LockClient, LockOptions};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/")?;
//! let store = FencedRedis::from(&client);
//! let options = LockOptions::new().lease(Duration::from_secs(5));
//! let left = client.with_lock_options("stock:7", &options, |guard| {
//!     store.incr_by("stock:7", guard.token(), -1)
//! })?;
//! # let _ = left;
//! # Ok(()) }
//! ```
//!
//! [`LockClient::reentrant_lock`] (or [`LockClient::try_reentrant_lock`], with a timeout) nests
//! on one thread, sharing one grant and token; a plain [`LockClient::lock`] of a key the thread
//! holds that way returns [`Error::WouldDeadlock`].
//!
//! # Several keys at once
//!
//! [`LockClient::lock_all`] takes every key of a set or none, and [`LockClient::try_lock_all`]
//! gives up after a timeout, releasing what it took. Sets are taken in one order whatever order
//! they are named in, so overlapping sets never deadlock, and each key is waited for in its own
//! queue, so callers of single keys do not starve a set. The [`MultiGuard`] keeps each key's own
//! fencing token, and losing any key loses the set; [`MultiGuard::extend`] lengthens every key's
//! lease at once.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use fencelock::{FencedRedis, LockClient};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/")?;
//! let store = FencedRedis::from(&client);
//! let accounts = client.lock_all(&["acct:7", "acct:1"])?;
//! for (account, delta) in [("acct:7", -50), ("acct:1", 50)] {
//!     let token = accounts.token(account).expect("one of the set");
//!     store.incr_by(account, token, delta)?;
//! }
//! accounts.unlock()
//! # }
//! ```
//!
//! # Leader election
//!
//! [`LockClient::election`] gives an [`Election`]: [`Election::campaign`] waits until this
//! process leads, first come, first served, and returns a [`Leadership`] whose
//! [`epoch`](Leadership::epoch) is a fencing token that rises with every new leader, so the
//! storage a leader writes to refuses a deposed one. Anyone can read [`Election::leader`], or
//! [`observe`](Election::observe) every change without polling; [`Election::run_while_leader`]
//! runs work while leading and campaigns again.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! use fencelock::{FencedRedis, LockClient};
//!
//! let client = LockClient::new("redis://127.0.0.1:6379/")?;
//! let store = FencedRedis::from(&client);
//! let election = client.election("scheduler")?;
//! let leadership = election.campaign("node-a:8080")?;
//! store.set("schedule", leadership.epoch(), "nightly at 02:00")?;
//! if let Some(leader) = election.leader()? {
//!     println!("{} leads, epoch {}", leader.value(), leader.epoch());
//! }
//! leadership.resign()
//! # }
//! ```
//!
//! # Counting semaphores
//!
//! [`LockClient::semaphore`] makes a [`Semaphore`]: at most so many [`Permit`]s of it are held
//! at once, across every client. A permit is held as a lock is (renewed, extended with
//! [`Permit::extend`], reported lost, given back by Redis when its lease runs out), carries its
//! own [`FencingToken`], and is handed straight to the next waiter by a release, first come,
//! first served across clients.
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! let uploads = client.semaphore("uploads", 4)?;
//! let permit = uploads.acquire()?;
//! // ... one of at most four uploads, passing permit.token() to the storage ...
//! permit.release()
//! # }
//! ```
//!
//! # Read-write locks
//!
//! [`LockClient::read_lock`] and [`LockClient::write_lock`] (and [`LockClient::try_read_lock`],
//! [`LockClient::try_write_lock`]) take a read-write lock: any number of [`ReadGuard`]s together,
//! or one [`WriteGuard`] alone. Callers take turns first come, first served in one queue per
//! lock, so a reader that comes after a waiting writer waits behind it and readers never starve
//! a writer; a writer's release admits every reader waiting at the head of the queue at once.
//! Every grant carries a [`FencingToken`] from one counter per lock, so a write's token is above
//! that of every earlier read and write. The guards are renewed and extended as a [`LockGuard`]
//! is, and [`LockClient::rwlock_status`] reads how the lock stands ([`RwLockStatus`]). A
//! read-write lock and a plain lock of the same name are two independent locks. One master only
//! (a single server, Sentinel or Cluster).
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! let config = client.write_lock("config")?;
//! // ... rewrite the config alone, passing config.token() to the storage ...
//! config.unlock()?;
//! let config = client.read_lock("config")?;
//! // ... read it beside other readers ...
//! config.unlock()
//! # }
//! ```
//!
//! # Looking at a lock, and breaking it
//!
//! [`LockClient::status`] reads how a lock stands without taking it: held or free, the
//! holder's fencing token, its remaining lease and how many clients wait ([`LockStatus`]).
//! [`LockClient::force_unlock`] releases a lock whoever holds it and hands it to the next
//! waiter; it breaks mutual exclusion until the old holder's next renewal, so only fencing keeps
//! that holder's late writes out. The `fencelock` command-line tool (the `cli` feature:
//! `cargo install fencelock --features cli`) does both from a shell, and runs a command under a
//! lock; see [cli.md].
//!
//! ```no_run
//! # fn main() -> Result<(), fencelock::Error> {
//! let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
//! let status = client.status("nightly-export")?;
//! if status.held && status.remaining_lease.is_none() {
//!     // A lock key without expiry was set by hand: nothing will ever free it.
//!     client.force_unlock("nightly-export")?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Guards that move between threads
//!
//! A [`LockGuard`] is `Send` and belongs to no thread: a thread pool can hand it from worker to
//! worker, and any thread may release it. So which thread holds a plain guard is not tracked,
//! and a thread that locks a key whose plain guard it holds itself waits like any other waiter,
//! as with `std::sync::Mutex`: bound such waits with `try_lock` or a cancel channel, and nest
//! with `reentrant_lock`. [`LockClient::lock`] explains the choice.
//!
//! # TLS
//!
//! With the `tls` feature, a `rediss://` URL connects over TLS (rustls, through redis-rs):
//! every connection of the client checks that the server's certificate chains up to a trusted
//! root, is within its validity period and names the URL's host. The roots are the platform's
//! certificate store, or Mozilla's compiled in with `tls-webpki-roots`. For a server whose
//! certificate a private CA signed, `Builder::tls_root_certificates` trusts that CA instead; for
//! a server that asks for client certificates (Redis does by default), `tls_client_certificate`
//! presents one. [`FencedBuilder`] has both.
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use fencelock::LockClient;
//!
//! let client = LockClient::builder("rediss://redis.internal:6380/")
//!     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
//!     .tls_client_certificate(
//!         std::fs::read("/etc/orders/tls/client.crt")?,
//!         std::fs::read("/etc/orders/tls/client.key")?,
//!     )
//!     .build()?;
//! # drop(client);
//! # Ok(()) }
//! # #[cfg(not(feature = "tls"))]
//! # fn main() {}
//! ```
//!
//! Certificates and keys that do not parse, or TLS settings for a URL that is not `rediss://`,
//! fail `build()` with [`Error::InvalidArgument`]; a handshake that fails (a certificate not
//! trusted, a wrong host name, a client certificate missing or refused) fails the call that
//! connects at once with [`Error::Rejected`], whose message says what to check. Without the
//! feature, `rediss://` is refused by `build()`. [tls.md] has the details and the costs.
//!
//! # Logging
//!
//! fencelock logs through the [`log`](https://docs.rs/log) facade, so install any logger
//! (`env_logger`, `tracing`'s `log` bridge, ...) to see it. Every record's target starts with
//! `fencelock` (`fencelock::release`, `fencelock::renewal`, ...: filter on the prefix, as in
//! `RUST_LOG=fencelock=debug`, since the parts after it name internal modules) and its message
//! with `fencelock: `. Two levels are used:
//!
//! - **warn**: a lock lost while held (renewal found the key gone or another's, the local
//!   deadline passed, the release found it no longer ours); a release, or a waiter's leaving of
//!   the queue, that failed (the lock then expires with its lease); a handoff that could not be
//!   given back, or that reached a waiter as it was dropped (it expires with its lease); a
//!   client whose Redis user may not subscribe to its release channel (ACL); a lock released
//!   by [`LockClient::force_unlock`].
//! - **debug**: grants and releases (key and token), a handoff that came too late to use,
//!   renewal rounds that failed and are retried, the release channel reconnecting, release
//!   messages ignored.
//!
//! Nothing is logged at error, info or trace: failures a caller can see are returned to it as
//! [`Error`], not logged. Owner ids never appear above debug.
//!
//! # Metrics
//!
//! With the `metrics` cargo feature, fencelock records counters and histograms through the
//! [`metrics`](https://docs.rs/metrics) facade, into whichever recorder or exporter the program
//! installs (install it before building clients, so that they describe their metrics to it):
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `fencelock_grants_total` | counter | `grant`, `how` | grants: own attempt, or handoff |
//! | `fencelock_wait_seconds` | histogram | `grant` | from a lock call to its grant |
//! | `fencelock_lock_timeouts_total` | counter | `grant` | `try_*` calls that returned `None` |
//! | `fencelock_hold_seconds` | histogram | `grant` | from a grant to its release |
//! | `fencelock_handoffs_total` | counter | `grant`, `to` | grants a release handed over |
//! | `fencelock_renewals_total` | counter | | leases renewed |
//! | `fencelock_renewal_round_trip_seconds` | histogram | | one renewal pipeline |
//! | `fencelock_losses_total` | counter | `grant` | grants lost while held |
//! | `fencelock_errors_total` | counter | `op`, `kind` | errors: `kind="connection"`, ... |
//!
//! Every series carries the client's `namespace` as a label, and those of one grant its `grant`:
//! `lock`, `permit` (a semaphore's), `read` or `write` (a read-write lock's). Lock keys never
//! become labels.
//! Without the feature nothing is recorded and nothing is paid.
//! [metrics.md] says exactly what each one counts, and what recording costs.
//!
//! # Errors
//!
//! Every fallible call returns [`Error`]; bad input (an empty key, a zero lease, a zero pool
//! size, a malformed URL) is rejected before any network call, with what is wrong in its
//! message. A call that cannot reach Redis fails at once with the cause
//! ([`Error::Connection`]: refused, timed out), and one whose connection set-up the server refused
//! (a wrong password, a database out of range) fails with [`Error::Rejected`], which retrying
//! cannot fix. `try_lock(key, timeout)` returns within `timeout` plus at most one connection
//! attempt (the connection timeout), whatever Redis does. Nothing in this crate panics on bad
//! input or on Redis failures, and dropping a guard never panics, nor waits for a Redis that
//! stopped answering.
//!
//! # What this lock does not guarantee
//!
//! - Mutual exclusion of *actions*, on its own: a holder can pause right after checking
//!   `is_held()`. Only storage that checks the fencing token closes that gap.
//! - Safety across a Redis restart without persistence, or a failover that loses writes: the
//!   lock key and the fence counter can be lost with them. See [design.md].
//! - Strict first-come, first-served order across processes. Waiting clients queue in Redis and
//!   a release hands the lock to the one that has waited longest (threads of one client queue
//!   locally, in arrival order), so clients take turns; but a client may first pass a lock among
//!   its own threads up to 8 times in a row, and a lock freed by a lease that ran out (a holder
//!   that died) goes to whichever waiter looks first.
//!
//! fencelock talks to one Redis server, to the master that Redis Sentinel names, to the masters
//! of a Redis Cluster, or to a quorum of independent masters, Redlock-style but with fencing
//! tokens that never go back (see [`Topology`], and "Running on Sentinel", "Running on Redis
//! Cluster" and "Running on a quorum of masters" in the [README] and [design.md]).
//!
//! # Further reading
//!
//! - [design.md]: threads, Redis key layout, the scripts' state tables, the safety argument
//!   and its assumptions.
//! - [fencing.md]: why leases alone fail, and fencing for SQL, Redis, object stores and any
//!   compare-and-set store.
//! - [reliability.md]: the faults the test suite injects, and the soak's figures.
//! - [benchmarks.md]: how to run the benchmarks, and the results.
//! - [cli.md]: the `fencelock` command-line tool.
//! - [metrics.md]: the metrics of the `metrics` feature.
//! - [tls.md]: TLS: setting it up, what a connection checks, what fails how, what it costs.
//!
//! [README]: https://github.com/fencelock/fencelock/blob/main/README.md
//! [design.md]: https://github.com/fencelock/fencelock/blob/main/docs/design.md
//! [fencing.md]: https://github.com/fencelock/fencelock/blob/main/docs/fencing.md
//! [reliability.md]: https://github.com/fencelock/fencelock/blob/main/docs/reliability.md
//! [benchmarks.md]: https://github.com/fencelock/fencelock/blob/main/docs/benchmarks.md
//! [cli.md]: https://github.com/fencelock/fencelock/blob/main/docs/cli.md
//! [metrics.md]: https://github.com/fencelock/fencelock/blob/main/docs/metrics.md
//! [tls.md]: https://github.com/fencelock/fencelock/blob/main/docs/tls.md

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// The facade: what users call, and the guards it hands out.
mod client;
mod election;
mod guard;
mod held;
mod multi;
mod reentrant;
mod rwlock;
mod semaphore;
// The client's shared core, and the seam behind which each deployment lives.
mod engine;
mod shared;
// The engines.
mod one_master;
mod quorum;
// What the engines share.
mod grant;
mod metrics;
#[cfg(test)]
mod model;
mod net;
mod queue;
mod scripts;
// What a user configures and is told.
mod config;
mod error;
mod fenced;
mod key;
mod options;
mod status;
mod token;
mod topology;

pub use crate::client::{Builder, LockClient};
pub use crate::config::{MAX_IDLE_EXPIRY, MAX_POOL_SIZE, MAX_TIMEOUT, MIN_IDLE_EXPIRY};
pub use crate::election::{Election, Leader, Leadership, Observer, MAX_LEADER_VALUE_LEN};
pub use crate::error::{Error, Result};
pub use crate::fenced::{FencedBuilder, FencedRedis};
pub use crate::guard::LockGuard;
pub use crate::key::{MAX_KEY_LEN, MAX_NAMESPACE_LEN};
pub use crate::multi::MultiGuard;
pub use crate::options::{LockOptions, MAX_LEASE, MIN_LEASE};
pub use crate::reentrant::ReentrantGuard;
pub use crate::rwlock::{ReadGuard, RwLockStatus, WriteGuard};
pub use crate::semaphore::{Permit, Semaphore, SemaphoreStatus};
pub use crate::status::LockStatus;
pub use crate::token::FencingToken;
pub use crate::topology::{Topology, QUORUM_MIN_NODES, SENTINEL_PORT};

/// Re-exported so that `lost()` receivers can be used with `select!` without a direct
/// dependency on crossbeam-channel.
pub use crossbeam_channel;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The examples of docs/tls.md, which need the `tls` feature.
#[cfg(all(doctest, feature = "tls"))]
#[doc = include_str!("../docs/tls.md")]
struct TlsDoctests;
