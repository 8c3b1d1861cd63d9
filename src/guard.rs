//! [`LockGuard`]: one grant, held. Written once over any engine: extending and releasing go to
//! the client's engine (`engine.rs`), which the guard holds a share of, as `lock_api` guards hold
//! their raw lock.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};
use crate::grant::{Grant, SharedLoss};
use crate::metrics::{self, Op};
use crate::options::validate_lease;
use crate::shared::Shared;
use crate::token::FencingToken;

/// A held lock. Releases it when dropped; [`unlock`](LockGuard::unlock) releases it and reports
/// how that went.
///
/// The guard owns what it needs (a share of its client's state), so it has no lifetime and can
/// be moved to another thread or stored; it belongs to no thread, so the thread that took it can
/// lock the key again once the guard's new owner releases it (see
/// [`LockClient::lock`](crate::LockClient::lock)). While it lives, the client's renewal thread
/// keeps its lease alive; if the lease is lost anyway, [`is_held`](LockGuard::is_held) turns
/// false and [`lost`](LockGuard::lost) fires.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let guard = client.lock("invoice:7")?;
/// println!("writing with fencing token {}", guard.token());
/// // ... the guarded work, passing guard.token() to the storage ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    shared: Arc<Shared>,
    grant: Arc<Grant>,
    lost: OnceLock<Receiver<()>>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(shared: Arc<Shared>, grant: Arc<Grant>) -> LockGuard {
        LockGuard {
            shared,
            grant,
            lost: OnceLock::new(),
            released: false,
        }
    }

    /// The key this guard holds, as given to [`LockClient::lock`](crate::LockClient::lock).
    pub fn key(&self) -> &str {
        self.grant.keys.user()
    }

    /// The fencing token of this grant: larger than that of every earlier grant of the key.
    pub fn token(&self) -> FencingToken {
        self.grant.token
    }

    /// The lease renewals re-arm: the one this grant was taken with, or the last
    /// [`extend`](LockGuard::extend)'s.
    pub fn lease(&self) -> Duration {
        self.grant.renewal_lease()
    }

    /// Whether the lock is still ours, as far as this process can know without asking Redis.
    ///
    /// False once renewal found the key gone or owned by another, and false by itself once the
    /// local deadline passes without a confirmed renewal: the start of the last confirmed round
    /// trip plus the lease, less a drift margin of 2 ms + 1% of the lease, on the monotonic
    /// clock. So it turns false before Redis can expire the key, even if Redis is unreachable or
    /// the renewal thread is stuck. A `true` is a statement about the past: check it right
    /// before acting, and let storage check the [`token`](LockGuard::token) for the rest.
    pub fn is_held(&self) -> bool {
        self.grant.is_held()
    }

    /// A channel that becomes ready when the lock is lost, to block or `select!` on.
    ///
    /// When renewal reports the lease lost, one `()` is sent and the channel disconnects, so any
    /// result from `recv` — `Ok(())` or `Err(RecvError)` — means lost. It is ready at once if the
    /// lock was lost before the first call. It also disconnects some time after the guard is
    /// released, which matters only to clones of the receiver.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use fencelock::crossbeam_channel::{select, unbounded};
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let guard = client.lock("report")?;
    /// let (_work_tx, work_done) = unbounded::<()>();
    /// select! {
    ///     recv(work_done) -> _ => guard.unlock()?,
    ///     recv(guard.lost()) -> _ => eprintln!("lost the lock; abandoning the report"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> &Receiver<()> {
        self.lost.get_or_init(|| self.grant.watch())
    }

    /// Makes the loss of this grant fire `signal` too (a [`MultiGuard`](crate::MultiGuard)'s,
    /// shared by the grants of its keys); at once if it is lost already.
    pub(crate) fn share_loss(&self, signal: &SharedLoss) {
        self.grant.watch_shared(signal);
    }

    /// Marks the grant lost, if it is not already (a set's extend that found this key gone).
    pub(crate) fn mark_lost(&self, why: &str) {
        self.grant.mark_lost(why);
    }

    /// Counts `error`, returned by an `op` of this guard's set before any key was asked, as
    /// this guard's own would be.
    pub(crate) fn count_failed(&self, op: Op, error: &Error) {
        metrics::failed(self.grant.keys.namespace(), op, error);
    }

    /// Makes the lease run at least `lease` from now, if the lock is still ours; renewal (if on)
    /// keeps re-arming this lease from then on. Useful with renewal off
    /// ([`LockOptions::renew`](crate::LockOptions::renew)), or to lengthen a lease before a step
    /// that may stall.
    ///
    /// An extend never shortens a lease: if more than `lease` is left, the lease stays as it is
    /// (and `is_held()` with it). Extends can reach Redis late and out of order; were a late,
    /// shorter one allowed to cut the lease, Redis could free the lock while this guard still
    /// says held.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease out of range, before
    /// any network call; [`Error::LockLost`](crate::Error::LockLost) if the lock is no longer
    /// ours; [`Error::NotReplicated`](crate::Error::NotReplicated) when
    /// [`min_replica_acks`](crate::Builder::min_replica_acks) is on and too few replicas
    /// acknowledged the extend in time (the lock stays held until the deadline it had before);
    /// connection errors and timeouts as for any command.
    pub fn extend(&self, lease: Duration) -> Result<()> {
        let extended =
            validate_lease(lease).and_then(|()| self.shared.engine.extend(&self.grant, lease));
        metrics::outcome(self.grant.keys.namespace(), Op::Extend, &extended);
        extended
    }

    /// Releases the lock now, and waits for Redis to confirm it.
    ///
    /// Renewal stops at once. The release is one round trip: at most one connection attempt
    /// (the connection timeout) and one response timeout, and once more on a new connection if
    /// a pooled one turns out to predate a Redis restart.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the key was no longer ours (its lease ran
    /// out, or another owner holds it now); nothing is deleted then. Connection errors and
    /// timeouts as for any command; the lock then expires with its lease, as renewal has stopped.
    pub fn unlock(mut self) -> Result<()> {
        self.release_now()
    }

    /// [`unlock`](LockGuard::unlock) for a type that owns the guard and ends with it (a
    /// leadership's resignation): the drop then does nothing.
    pub(crate) fn release_now(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        self.shared.engine.release(&self.grant)
    }

    /// The grant held: its keys and owner id.
    pub(crate) fn grant(&self) -> &Arc<Grant> {
        &self.grant
    }
}

/// Releases the lock, best effort: failures are logged at warn and the lock then expires with its
/// lease.
///
/// The release is one round trip, made by the dropping thread so that a waiter gets the lock
/// without a detour. While Redis is unreachable (the client's last connection attempt or command
/// failed to reach it, and none has succeeded since) the drop does not wait: renewal stops at
/// once, and the release is left to a background thread, as it is for a lock already known
/// lost. So a drop waits at most for one
/// round trip to a Redis that answered last time: the response timeout if it stops answering
/// just then. Call [`unlock`](LockGuard::unlock) to wait for the outcome instead.
impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Failures are logged; a guard dropped during a panic must not panic again.
        self.shared.engine.release_detached(&self.grant);
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.grant.keys.user())
            .field("token", &self.grant.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}
