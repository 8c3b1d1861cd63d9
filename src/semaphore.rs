//! A fenced counting semaphore: [`Semaphore`], [`Permit`] and [`SemaphoreStatus`], a front end
//! of the shared lock (`held.rs`, `key/shared_lock.rs`; on one master,
//! `one_master/shared_lock.rs`) whose grants each weigh one of the semaphore's permits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::held::{deadline, held_guard, Held};
use crate::key::SharedLockKeys;
use crate::options::{Deadline, LockOptions};
use crate::scripts::shared_lock::Access;
use crate::shared::Shared;

/// A counting semaphore in Redis: at most `permits` [`Permit`]s of it are held at once, across
/// every client and process. Made by [`LockClient::semaphore`](crate::LockClient::semaphore).
///
/// A permit is held like a lock: under a lease that the client's renewal thread keeps alive,
/// reported lost ([`Permit::is_held`], [`Permit::lost`]) if it runs out anyway, and given back by
/// Redis when it runs out, so a crashed holder's permit comes back within its lease. Each grant
/// carries a [`FencingToken`](crate::FencingToken) larger than that of every earlier grant of the semaphore, so
/// storage can refuse a stalled holder's late writes, as for a lock.
///
/// Waiting costs no polling: callers queue in Redis, and a release hands its permit straight to
/// the waiter that has waited longest, in the same script. Clients take turns in arrival order;
/// the threads of one client queue behind each other in their own process.
///
/// # One count per name
///
/// The first call on a semaphore stores its count in Redis, and that count is in force while a
/// permit is held or a caller waits: a handle made with another count fails every call with
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (`what` is `"permits"`), and never
/// runs beside it with its own. Once nobody holds or waits, the next call's count is the one in
/// force.
///
/// Cheap to clone; a clone shares the client.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let uploads = client.semaphore("uploads", 4)?;
/// let permit = uploads.acquire()?;
/// // ... at most four of these run at once, each passing permit.token() to the storage ...
/// permit.release()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
    keys: Arc<SharedLockKeys>,
}

impl Semaphore {
    /// Checks the name and the count, and the client's engine; no network call.
    pub(crate) fn new(shared: Arc<Shared>, name: &str, permits: u32) -> Result<Semaphore> {
        let mut keys = SharedLockKeys::semaphore(&shared.config.namespace, name, permits)?;
        keys.set_idle_expiry(shared.config.idle_expiry);
        shared.engine.shared_locks(&keys)?;
        Ok(Semaphore {
            shared,
            keys: Arc::new(keys),
        })
    }

    /// The semaphore's name, as given to [`LockClient::semaphore`](crate::LockClient::semaphore).
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The count of permits this handle was made with.
    pub fn permits(&self) -> u32 {
        self.keys.count()
    }

    /// Takes a permit, waiting as long as it takes.
    ///
    /// A release wakes the waiter it hands its permit to; a waiter also asks again by itself
    /// when the soonest holder's lease would run out (at most 5 s after it last asked), since a
    /// holder that died releases nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the semaphore is in use with
    /// another count of permits (see [One count per name](Semaphore#one-count-per-name)).
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) with
    /// [`min_replica_acks`](crate::Builder::min_replica_acks), when too few replicas
    /// acknowledged the grant (it was given back). Connection errors, timeouts and Redis errors end the wait, as for
    /// [`LockClient::lock`](crate::LockClient::lock): on Sentinel or Cluster an attempt rides a
    /// failover for up to 60 s.
    pub fn acquire(&self) -> Result<Permit> {
        self.acquire_with(&LockOptions::new())
    }

    /// [`acquire`](Semaphore::acquire) with [`LockOptions`]: a lease of the permit's own
    /// ([`lease`](LockOptions::lease)), and a cancel channel ([`cancel`](LockOptions::cancel))
    /// that ends the wait with [`Error::Cancelled`](crate::Error::Cancelled), leaving no permit
    /// behind.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let uploads = client.semaphore("uploads", 4)?;
    /// let (cancel, cancelled) = fencelock::crossbeam_channel::bounded(1);
    /// // Another thread may `cancel.send(())` to end the wait.
    /// # drop(cancel);
    /// let options = fencelock::LockOptions::new().cancel(cancelled);
    /// match uploads.acquire_with(&options) {
    ///     Ok(permit) => permit.release()?,
    ///     Err(e) if e.is_cancelled() => println!("gave up waiting"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`acquire`](Semaphore::acquire); [`Error::Cancelled`](crate::Error::Cancelled)
    /// when cancelled; [`Error::InvalidArgument`](crate::Error::InvalidArgument) (`what` is
    /// `"options"`) for [`renew(false)`](LockOptions::renew) or
    /// [`max_hold`](LockOptions::max_hold), which a permit does not take: its renewal runs
    /// until it is released.
    pub fn acquire_with(&self, options: &LockOptions) -> Result<Permit> {
        loop {
            if let Some(permit) = self.take(Deadline::Never, options)? {
                return Ok(permit);
            }
        }
    }

    /// Takes a permit if one can be had within `timeout`; `Ok(None)` if not.
    ///
    /// `Duration::ZERO` makes one attempt and never queues. A waiter that gives up takes itself
    /// out of Redis' queue before it returns (giving Redis 50 ms to answer), passing on a permit
    /// handed to it meanwhile.
    ///
    /// # Errors
    /// As for [`acquire`](Semaphore::acquire); [`Error::Timeout`](crate::Error::Timeout) if the
    /// reply to an attempt did not come by the deadline.
    pub fn try_acquire(&self, timeout: Duration) -> Result<Option<Permit>> {
        self.try_acquire_with(timeout, &LockOptions::new())
    }

    /// [`try_acquire`](Semaphore::try_acquire) with [`LockOptions`], as
    /// [`acquire_with`](Semaphore::acquire_with) takes them.
    ///
    /// # Errors
    /// As for [`acquire_with`](Semaphore::acquire_with) and
    /// [`try_acquire`](Semaphore::try_acquire).
    pub fn try_acquire_with(
        &self,
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<Permit>> {
        self.take(deadline(timeout), options)
    }

    /// How the semaphore stands in Redis: permits held and clients waiting, read in one atomic
    /// step without taking anything.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let status = client.semaphore("uploads", 4)?.status()?;
    /// println!(
    ///     "{} of {} permits held, {} client(s) waiting",
    ///     status.held, status.permits, status.waiters
    /// );
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the semaphore is in use with
    /// another count; connection errors and timeouts as for any command.
    pub fn status(&self) -> Result<SemaphoreStatus> {
        let status = self.shared.engine.shared_status(&self.keys)?;
        Ok(SemaphoreStatus {
            permits: self.keys.count(),
            held: status.held,
            waiters: status.waiters,
        })
    }

    fn take(&self, deadline: Deadline, options: &LockOptions) -> Result<Option<Permit>> {
        let held = Held::take_with(&self.shared, &self.keys, Access::Permit, deadline, options)?;
        Ok(held.map(|held| Permit { held }))
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.keys.name())
            .field("permits", &self.keys.count())
            .finish_non_exhaustive()
    }
}

/// A held permit of a [`Semaphore`]. Releases it when dropped; [`release`](Permit::release)
/// releases it and reports how that went.
///
/// Like a [`LockGuard`](crate::LockGuard), it has no lifetime and may move to another thread;
/// while it lives, the client's renewal thread keeps its lease alive.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// use std::time::Duration;
///
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let uploads = client.semaphore("uploads", 4)?;
/// match uploads.try_acquire(Duration::from_secs(1))? {
///     Some(permit) => {
///         println!("uploading with fencing token {}", permit.token());
///         permit.release()?;
///     }
///     None => println!("four uploads are running; try later"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "if unused the permit is released at once"]
#[clippy::has_significant_drop]
pub struct Permit {
    held: Held,
}

impl Permit {
    /// The name of the semaphore this permit is of.
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// Releases the permit now, handing it to the longest waiter if any, and waits for Redis to
    /// confirm it.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) (with the semaphore's name) if the permit was
    /// no longer ours: its lease ran out. Connection errors and timeouts as for any command;
    /// the permit then runs out with its lease, as renewal has stopped.
    pub fn release(self) -> Result<()> {
        self.held.unlock()
    }
}

held_guard!(
    Permit,
    "permit",
    "grant of the semaphore, whichever permit it was",
    "client.semaphore(\"uploads\", 4)?.acquire()?"
);

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.held.debug(f, "Permit", "name")
    }
}

/// How a semaphore stood in Redis when [`Semaphore::status`] read it, in one atomic step: for
/// operators and monitoring, not for deciding whether to acquire
/// ([`try_acquire`](Semaphore::try_acquire) with `Duration::ZERO` asks and takes in one step).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The count of permits, which is the one in force (a handle with another count gets an
    /// error instead).
    pub permits: u32,
    /// Permits held: granted, not released, and with their lease not run out in Redis.
    pub held: u64,
    /// Clients waiting in the semaphore's queue in Redis, as [`LockStatus::waiters`] counts
    /// them: one per waiting client (its other threads wait behind it, in its own process).
    ///
    /// [`LockStatus::waiters`]: crate::LockStatus::waiters
    pub waiters: u64,
}

impl SemaphoreStatus {
    /// Permits not held: `permits - held`, or zero.
    pub fn available(&self) -> u64 {
        u64::from(self.permits).saturating_sub(self.held)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::LockClient;

    #[test]
    fn an_engine_without_semaphores_refuses_them_without_panicking() {
        let (client, _fake) = LockClient::over_fake("ns");
        let err = client.semaphore("uploads", 4).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(client.semaphore("", 4).unwrap_err().is_invalid_argument());
        // Nothing reaches the engine's lock calls either.
        assert!(client
            .try_lock("uploads", Duration::ZERO)
            .unwrap()
            .is_some());
    }
}
