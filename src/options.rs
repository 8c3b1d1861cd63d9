use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::error::{Error, Result};

/// Shortest lease accepted by [`Builder::lease`](crate::Builder::lease) and [`LockOptions::lease`].
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease accepted by [`Builder::lease`](crate::Builder::lease) and [`LockOptions::lease`].
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings for one lock call, for [`LockClient::lock_with`](crate::LockClient::lock_with) and
/// [`try_lock_with`](crate::LockClient::try_lock_with); every setting defaults to the client's.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{LockClient, LockOptions};
///
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = LockClient::new("redis://127.0.0.1:6379/")?;
/// let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
/// let options = LockOptions::new()
///     .lease(Duration::from_secs(5))
///     .max_hold(Duration::from_secs(60))
///     .cancel(cancelled);
/// // Another thread may `cancel.send(())` to make this wait give up with Error::Cancelled.
/// # drop(cancel);
/// let guard = client.lock_with("batch-job", &options)?;
/// # drop(guard);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "options do nothing until passed to lock_with or try_lock_with"]
pub struct LockOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) no_renewal: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) cancel: Option<Receiver<()>>,
}

impl LockOptions {
    /// Options that change nothing: the client's lease, with renewal, without limits.
    pub fn new() -> LockOptions {
        LockOptions::default()
    }

    /// The lease of this grant, instead of the client's; the same range applies
    /// ([`MIN_LEASE`] to [`MAX_LEASE`], whole milliseconds).
    pub fn lease(mut self, lease: Duration) -> LockOptions {
        self.lease = Some(lease);
        self
    }

    /// Whether the renewal thread keeps the lease alive while the guard lives. Defaults to
    /// `true`. Without renewal the lock expires one lease after the grant (or after the last
    /// [`LockGuard::extend`](crate::LockGuard::extend)), and the guard reports it lost then.
    pub fn renew(mut self, renew: bool) -> LockOptions {
        self.no_renewal = !renew;
        self
    }

    /// Bounds how long renewal keeps this lock: once `max_hold` has passed since the grant,
    /// renewal stops, the lease runs out within one more lease, and the guard reports the lock
    /// lost through [`is_held`](crate::LockGuard::is_held) and [`lost`](crate::LockGuard::lost).
    /// A hold that ends before is unaffected. Unbounded by default.
    ///
    /// Locks that limit renewals by count map onto this: renewal runs about every lease / 3, so
    /// at most `n` renewals is `max_hold = n × lease / 3`.
    pub fn max_hold(mut self, max_hold: Duration) -> LockOptions {
        self.max_hold = Some(max_hold);
        self
    }

    /// Makes the wait cancellable: when `cancel` receives a message, or all its senders are
    /// dropped, the call gives up with [`Error::Cancelled`] and leaves no lock behind. Send `()`
    /// to cancel one wait; drop the sender to cancel every wait that shares the receiver.
    pub fn cancel(mut self, cancel: Receiver<()>) -> LockOptions {
        self.cancel = Some(cancel);
        self
    }

    /// Whether the caller's cancel signal is ready (a message, or every sender gone).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|cancel| !matches!(cancel.try_recv(), Err(TryRecvError::Empty)))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(lease) = self.lease {
            validate_lease(lease)?;
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid("max hold", "must be more than zero"));
        }
        Ok(())
    }
}

/// How long a lock call may wait for its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// One attempt, no waiting (`try_lock` with a zero timeout).
    Now,
    At(Instant),
    /// Until granted (`lock`).
    Never,
}

impl Deadline {
    /// The deadline of a call that may wait `timeout`: one attempt for zero, none at all for a
    /// timeout too long to add to the clock.
    pub(crate) fn within(timeout: Duration) -> Deadline {
        match Instant::now().checked_add(timeout) {
            _ if timeout.is_zero() => Deadline::Now,
            Some(at) => Deadline::At(at),
            None => Deadline::Never,
        }
    }
}

/// Checks a lease: whole milliseconds from [`MIN_LEASE`] to [`MAX_LEASE`].
pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::invalid(
            "lease",
            format!("is {lease:?}, allowed are {MIN_LEASE:?} to {MAX_LEASE:?}"),
        ));
    }
    if !lease.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::invalid(
            "lease",
            format!("is {lease:?}; Redis leases are whole milliseconds"),
        ));
    }
    Ok(())
}
