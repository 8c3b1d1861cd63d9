//! A fenced read-write lock: [`ReadGuard`] and [`WriteGuard`], made by
//! [`LockClient::read_lock`](crate::LockClient::read_lock) and
//! [`LockClient::write_lock`](crate::LockClient::write_lock). A thin type over what a lock
//! already has (queues, handoff, renewal, grants, tokens), through the engine seam (`engine.rs`;
//! on one master, `one_master/rw.rs`).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::error::Result;
use crate::grant::Grant;
use crate::key::RwKeys;
use crate::options::Deadline;
use crate::scripts::rw::Access;
use crate::shared::Shared;
use crate::token::FencingToken;

/// One grant of a read-write lock, read or write, as both guards hold it.
struct Held {
    shared: Arc<Shared>,
    keys: RwKeys,
    grant: Arc<Grant>,
    lost: OnceLock<Receiver<()>>,
    released: bool,
}

/// Takes the read-write lock `name` as `access` says, waiting until `deadline`.
fn take(
    shared: &Arc<Shared>,
    name: &str,
    access: Access,
    deadline: Deadline,
) -> Result<Option<Held>> {
    let mut keys = RwKeys::new(&shared.config.namespace, name)?;
    keys.set_idle_expiry(shared.config.idle_expiry);
    let lease = shared.config.lease;
    loop {
        let grant = shared.engine.acquire_rw(&keys, access, lease, deadline)?;
        match (grant, deadline) {
            (Some(grant), _) => {
                return Ok(Some(Held {
                    shared: Arc::clone(shared),
                    keys,
                    grant,
                    lost: OnceLock::new(),
                    released: false,
                }))
            }
            (None, Deadline::Never) => continue,
            (None, _) => return Ok(None),
        }
    }
}

/// The deadline of a wait of `timeout` from now: one attempt for zero, none for a timeout too
/// long to count.
fn deadline(timeout: Duration) -> Deadline {
    match Instant::now().checked_add(timeout) {
        _ if timeout.is_zero() => Deadline::Now,
        Some(at) => Deadline::At(at),
        None => Deadline::Never,
    }
}

impl Held {
    fn token(&self) -> FencingToken {
        self.grant.token
    }

    fn is_held(&self) -> bool {
        self.grant.is_held()
    }

    fn lost(&self) -> &Receiver<()> {
        self.lost.get_or_init(|| self.grant.watch())
    }

    fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.shared.engine.release_rw(&self.keys, &self.grant)
    }

    fn debug(&self, f: &mut fmt::Formatter<'_>, what: &str) -> fmt::Result {
        f.debug_struct(what)
            .field("key", &self.keys.name())
            .field("token", &self.grant.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

/// Releases the grant, best effort, as a [`LockGuard`](crate::LockGuard)'s drop does.
impl Drop for Held {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared
            .engine
            .release_rw_detached(&self.keys, &self.grant);
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
            /// Waits as long as it takes.
            pub(crate) fn wait(shared: &Arc<Shared>, name: &str, access: Access) -> Result<$guard> {
                loop {
                    if let Some(held) = take(shared, name, access, Deadline::Never)? {
                        return Ok($guard { held });
                    }
                }
            }

            /// Waits up to `timeout`.
            pub(crate) fn try_take(
                shared: &Arc<Shared>,
                name: &str,
                access: Access,
                timeout: Duration,
            ) -> Result<Option<$guard>> {
                Ok(take(shared, name, access, deadline(timeout))?.map(|held| $guard { held }))
            }

            /// The lock's name, as given to the call that took it.
            pub fn key(&self) -> &str {
                self.held.keys.name()
            }

            /// The fencing token of this grant, from one counter per lock for reads and writes
            /// alike: larger than that of every earlier grant of the lock. So a write's token is
            /// above that of every read and write granted before it, and storage that refuses
            /// a token below the largest it has seen refuses a stalled holder's late writes.
            pub fn token(&self) -> FencingToken {
                self.held.token()
            }

            /// Whether the lock is still ours, as far as this process can know without asking
            /// Redis: exactly as [`LockGuard::is_held`](crate::LockGuard::is_held) says of a
            /// lock. False once renewal found the grant gone, or the local deadline passed
            /// without a confirmed renewal.
            pub fn is_held(&self) -> bool {
                self.held.is_held()
            }

            /// A channel that becomes ready when the grant is lost, to block or `select!` on:
            /// one `()`, then it disconnects, as [`LockGuard::lost`](crate::LockGuard::lost)
            /// does. Ready at once if the grant was lost before the first call.
            pub fn lost(&self) -> &Receiver<()> {
                self.held.lost()
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
                self.held.debug(f, stringify!($guard))
            }
        }
    };
}

guard_methods!(ReadGuard, "read");
guard_methods!(WriteGuard, "write");

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
