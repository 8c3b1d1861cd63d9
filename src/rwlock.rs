//! A fenced read-write lock: [`ReadGuard`] and [`WriteGuard`], made by
//! [`LockClient::read_lock`](crate::LockClient::read_lock) and
//! [`LockClient::write_lock`](crate::LockClient::write_lock), and [`RwLockStatus`]: front ends
//! of the shared lock (`held.rs`, `key/shared_lock.rs`; on one master,
//! `one_master/shared_lock.rs`) whose grants weigh one beside other reads, or everything.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::held::{deadline, held_guard, Held};
use crate::key::SharedLockKeys;
use crate::options::{Deadline, LockOptions};
use crate::scripts::shared_lock::Access;
use crate::shared::Shared;

/// Takes the read-write lock `name` as `access` says, with `options`, waiting until `deadline`.
fn take(
    shared: &Arc<Shared>,
    name: &str,
    access: Access,
    deadline: Deadline,
    options: &LockOptions,
) -> Result<Option<Held>> {
    let keys = Arc::new(keys(shared, name)?);
    Held::take_with(shared, &keys, access, deadline, options)
}

/// The checked names of the read-write lock `name`, and the client's engine checked for them.
fn keys(shared: &Shared, name: &str) -> Result<SharedLockKeys> {
    let mut keys = SharedLockKeys::rwlock(&shared.config.namespace, name)?;
    keys.set_idle_expiry(shared.config.idle_expiry);
    shared.engine.shared_locks(&keys)?;
    Ok(keys)
}

/// See [`LockClient::rwlock_status`](crate::LockClient::rwlock_status).
pub(crate) fn status(shared: &Shared, name: &str) -> Result<RwLockStatus> {
    let keys = keys(shared, name)?;
    let status = shared.engine.shared_status(&keys)?;
    Ok(RwLockStatus {
        readers: status.held,
        writer: status.writers > 0,
        waiters: status.waiters,
    })
}

/// How a read-write lock stood in Redis when
/// [`LockClient::rwlock_status`](crate::LockClient::rwlock_status) read it, in one atomic step:
/// for operators and monitoring, not for deciding whether to take it
/// ([`try_read_lock`](crate::LockClient::try_read_lock) with `Duration::ZERO` asks and takes in
/// one step).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockStatus {
    /// Read grants held: granted, not released, and with their lease not run out in Redis.
    pub readers: u64,
    /// Whether a write grant is held (then `readers` is 0).
    pub writer: bool,
    /// Clients waiting in the lock's queue in Redis, to read or to write, as
    /// [`LockStatus::waiters`](crate::LockStatus::waiters) counts them: one per waiting client
    /// (its other threads wait behind it, in its own process).
    pub waiters: u64,
}

impl RwLockStatus {
    /// Whether anyone holds the lock, to read or to write.
    pub fn held(&self) -> bool {
        self.writer || self.readers > 0
    }
}

/// A read-write lock held to read: other readers may hold it too, no writer does. Made by
/// [`LockClient::read_lock`](crate::LockClient::read_lock). Releases it when dropped;
/// [`unlock`](ReadGuard::unlock) releases it and reports how that went.
///
/// Like a [`LockGuard`](crate::LockGuard), it has no lifetime and may move to another thread;
/// while it lives, the client's renewal thread keeps its lease alive.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let config = client.read_lock("config")?;
/// // ... read, beside other readers; no writer holds ...
/// println!("read under token {}", config.token());
/// config.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the read lock is released at once"]
#[clippy::has_significant_drop]
pub struct ReadGuard {
    held: Held,
}

/// A read-write lock held to write: nobody else holds it, to read or to write. Made by
/// [`LockClient::write_lock`](crate::LockClient::write_lock). Releases it when dropped, admitting
/// the readers waiting at the head of the queue, all at once;
/// [`unlock`](WriteGuard::unlock) releases it and reports how that went.
///
/// Like a [`LockGuard`](crate::LockGuard), it has no lifetime and may move to another thread;
/// while it lives, the client's renewal thread keeps its lease alive.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let config = client.write_lock("config")?;
/// // ... write alone, passing config.token() to the storage, which refuses smaller ones ...
/// config.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the write lock is released at once"]
#[clippy::has_significant_drop]
pub struct WriteGuard {
    held: Held,
}

macro_rules! guard_methods {
    ($guard:ident, $what:literal) => {
        impl $guard {
            /// Waits as long as it takes, or until cancelled.
            pub(crate) fn wait(
                shared: &Arc<Shared>,
                name: &str,
                access: Access,
                options: &LockOptions,
            ) -> Result<$guard> {
                loop {
                    if let Some(held) = take(shared, name, access, Deadline::Never, options)? {
                        return Ok($guard { held });
                    }
                }
            }

            /// Waits up to `timeout`, or until cancelled.
            pub(crate) fn try_take(
                shared: &Arc<Shared>,
                name: &str,
                access: Access,
                timeout: Duration,
                options: &LockOptions,
            ) -> Result<Option<$guard>> {
                let held = take(shared, name, access, deadline(timeout), options)?;
                Ok(held.map(|held| $guard { held }))
            }

            /// The lock's name, as given to the call that took it.
            pub fn key(&self) -> &str {
                self.held.name()
            }

            #[doc = concat!("Releases the ", $what, " lock now and waits for Redis to confirm it; the")]
            /// same script admits the waiters that may hold next.
            ///
            /// # Errors
            /// [`Error::LockLost`](crate::Error::LockLost) if the grant was no longer ours: its
            /// lease ran out. Connection errors and timeouts as for any command; the grant then
            /// runs out with its lease, as renewal has stopped.
            pub fn unlock(self) -> Result<()> {
                self.held.unlock()
            }
        }

        impl fmt::Debug for $guard {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.held.debug(f, stringify!($guard), "key")
            }
        }
    };
}

guard_methods!(ReadGuard, "read");
guard_methods!(WriteGuard, "write");
held_guard!(
    ReadGuard,
    "read grant",
    "grant of the lock, read or write (one counter per lock)",
    "client.read_lock(\"config\")?"
);
held_guard!(
    WriteGuard,
    "write grant",
    "grant of the lock, read or write (one counter per lock): a write's token is above that of \
     every read and write granted before it",
    "client.write_lock(\"config\")?"
);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::LockClient;

    #[test]
    fn an_engine_without_rw_locks_refuses_them_without_panicking() {
        let (client, _fake) = LockClient::over_fake("ns");
        let err = client.read_lock("config").unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        let err = client.try_write_lock("config", Duration::ZERO).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(client.write_lock("").unwrap_err().is_invalid_argument());
        // The lock of the same name is another lock.
        assert!(client.try_lock("config", Duration::ZERO).unwrap().is_some());
    }
}
