use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use uuid::Uuid;

use crate::config::{Builder, Config};
use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::guard::LockGuard;
use crate::key::{release_channel, LockKeys};
use crate::pool::Pool;
use crate::renewal::{self, Command};
use crate::scripts::{self, Acquire};
use crate::wait::{self, Waiters, Wake};

/// A handle to lock keys on one Redis server.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`: share one client among all threads of a
/// process. Each client owns a connection pool, a renewal thread and a pub/sub connection for
/// wake-ups; they stop when the client and every guard it handed out are dropped.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::LockClient;
///
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = LockClient::builder("redis://127.0.0.1:6379/")
///     .namespace("orders")
///     .lease(Duration::from_secs(10))
///     .build()?;
///
/// let guard = client.lock("order:42")?;
/// assert!(guard.is_held());
/// drop(guard); // released
///
/// match client.try_lock("order:42", Duration::from_millis(500))? {
///     Some(guard) => println!("got it with token {}", guard.token()),
///     None => println!("still busy after 500 ms"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    pool: Pool,
    waiters: Arc<Waiters>,
    renewal: Sender<Command>,
    next_grant: AtomicU64,
}

impl LockClient {
    /// Starts configuring a client for the Redis server at `url` (`redis://[user:pass@]host:port/db`,
    /// or `redis+unix:///path`).
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder::new(url.into())
    }

    /// A client with every setting at its default; the same as `LockClient::builder(url).build()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the URL does not parse.
    pub fn new(url: impl Into<String>) -> Result<LockClient> {
        Self::builder(url).build()
    }

    pub(crate) fn start(client: redis::Client, config: Config) -> Result<LockClient> {
        let thread_error = |e: std::io::Error| Error::Connection(Box::new(e));
        let waiters = Arc::new(Waiters::default());
        wait::spawn_dispatcher(
            client.clone(),
            release_channel(&config.namespace),
            config.connection_timeout,
            Arc::downgrade(&waiters),
        )
        .map_err(thread_error)?;
        let renewal = renewal::spawn(
            client.clone(),
            config.connection_timeout,
            config.response_timeout,
        )
        .map_err(thread_error)?;
        Ok(LockClient {
            inner: Arc::new(Inner {
                pool: Pool::new(client, &config),
                config,
                waiters,
                renewal,
                next_grant: AtomicU64::new(0),
            }),
        })
    }

    /// Takes the lock on `key`, waiting as long as it takes.
    ///
    /// Waiting costs no polling at a fixed interval: a release wakes the longest-waiting thread
    /// of this client at once. Only when the holder's lease would have run out does the waiter
    /// look again unprompted, since a holder that died publishes no release; while a live holder
    /// keeps renewing, that is about once per lease.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key or one longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, before any network call. Connection errors,
    /// timeouts and Redis errors end the wait rather than being retried forever.
    pub fn lock(&self, key: &str) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.acquire(key, None)? {
                return Ok(guard);
            }
        }
    }

    /// Takes the lock on `key` if it can be had within `timeout`; `Ok(None)` if not.
    ///
    /// `Duration::ZERO` makes exactly one attempt (repeated once on a fresh connection only if
    /// the pooled one turns out to be broken), and does not queue behind other threads of this
    /// client that are waiting for the key.
    ///
    /// # Errors
    /// As for [`lock`](LockClient::lock).
    pub fn try_lock(&self, key: &str, timeout: Duration) -> Result<Option<LockGuard>> {
        if timeout.is_zero() {
            let keys = LockKeys::new(&self.inner.config.namespace, key)?;
            let owner = new_owner();
            let sent = Instant::now();
            return Ok(match self.attempt(&keys, &owner)? {
                Acquire::Granted(token) => Some(self.grant(keys, owner, token, sent)),
                Acquire::Held(_) => None,
            });
        }
        self.acquire(key, Instant::now().checked_add(timeout))
    }

    /// The namespace this client's keys live under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The lease every grant of this client starts with.
    pub fn lease(&self) -> Duration {
        self.inner.config.lease
    }

    /// Waits in the key's local queue, attempting whenever at its head and woken, until granted
    /// or `deadline`.
    fn acquire(&self, key: &str, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let keys = LockKeys::new(&self.inner.config.namespace, key)?;
        let owner = new_owner();
        let lease = self.inner.config.lease;
        let ticket = self.inner.waiters.join(&keys.tag);
        let mut attempt = ticket.is_head();
        // When the holder's lease runs out, as reported by our last attempt: a crashed holder
        // publishes no release, so the head retries then.
        let mut holder_expiry: Option<Instant> = None;
        loop {
            if attempt {
                let sent = Instant::now();
                match self.attempt(&keys, &owner)? {
                    Acquire::Granted(token) => {
                        ticket.leave_granted();
                        return Ok(Some(self.grant(keys, owner, token, sent)));
                    }
                    Acquire::Held(pttl) => {
                        // A key without expiry was not set by fencelock; look again a lease later.
                        let wait = pttl.unwrap_or(lease) + Duration::from_millis(1);
                        holder_expiry = Instant::now().checked_add(wait);
                    }
                }
            }
            let until = match (deadline, holder_expiry) {
                (Some(d), Some(h)) => Some(d.min(h)),
                (d, h) => d.or(h),
            };
            match ticket.wait(until) {
                Some(Wake::Attempt) => attempt = true,
                Some(Wake::HeadBehindLocalHolder) => {
                    attempt = false;
                    holder_expiry = Some(Instant::now() + lease);
                }
                None => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    attempt = ticket.is_head();
                }
            }
        }
    }

    /// One run of the acquire script.
    fn attempt(&self, keys: &LockKeys, owner: &str) -> Result<Acquire> {
        let lease = self.inner.config.lease;
        self.inner.pool.run(
            |con, _retry| match scripts::acquire(con, keys, owner, lease) {
                Err(e) if e.is_timeout() => {
                    // The script may still run and grant us the lock we are about to report as
                    // not taken. A compare-and-delete sent on the same connection runs after it,
                    // whatever it did. (A retry of the whole closure after a broken connection is
                    // safe too: the script treats a lock already ours as granted.)
                    let _ = scripts::release(con, keys, owner);
                    Err(e)
                }
                other => other,
            },
        )
    }

    fn grant(
        &self,
        keys: LockKeys,
        owner: String,
        token: crate::FencingToken,
        sent: Instant,
    ) -> LockGuard {
        let id = self.inner.next_grant.fetch_add(1, Ordering::Relaxed);
        log::debug!("fencelock: granted {:?} with token {token}", keys.user);
        let (grant, lost) = Grant::new(id, keys, owner, token, self.inner.config.lease, sent);
        let grant = Arc::new(grant);
        // The renewal thread outlives every guard, so this only fails if it panicked; the guard
        // still works, and its local deadline reports the lease lost when it runs out.
        if self
            .inner
            .renewal
            .send(Command::Hold(Arc::clone(&grant)))
            .is_err()
        {
            log::warn!(
                "fencelock: renewal thread is gone; {:?} will not be renewed",
                grant.keys.user
            );
        }
        LockGuard::new(self.clone(), grant, lost)
    }

    /// Releases a grant: stops its renewal, then compare-and-delete. Logs failures at warn, so
    /// `Drop` can stay silent.
    pub(crate) fn release(&self, grant: &Grant) -> Result<()> {
        grant.end();
        let _ = self.inner.renewal.send(Command::Forget(grant.id));
        let user = &grant.keys.user;
        let mut reply_lost = false;
        let released = self.inner.pool.run(|con, retry| {
            reply_lost = retry;
            scripts::release(con, &grant.keys, &grant.owner)
        });
        match released {
            Ok(true) => {
                log::debug!("fencelock: released {user:?} (token {})", grant.token);
                Ok(())
            }
            // The first run may have deleted the key before its connection broke: the key is not
            // ours now either way, and nothing of anyone else's was touched.
            Ok(false) if reply_lost => {
                log::debug!(
                    "fencelock: released {user:?} (token {}) on a retry",
                    grant.token
                );
                Ok(())
            }
            Ok(false) => {
                if grant.mark_lost("it was no longer ours at release") {
                    log::warn!(
                        "fencelock: {user:?} (token {}) was no longer ours at release",
                        grant.token
                    );
                }
                Err(Error::LockLost { key: user.clone() })
            }
            Err(e) => {
                log::warn!("fencelock: releasing {user:?} failed, it expires with its lease: {e}");
                Err(e)
            }
        }
    }
}

/// A fresh owner id for every lock call: never reused, and not derivable from the key.
fn new_owner() -> String {
    Uuid::new_v4().to_string()
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("LockClient")
            .field("namespace", &self.inner.config.namespace)
            .field("lease", &self.inner.config.lease)
            .field("pool_size", &self.inner.config.pool_size)
            .finish_non_exhaustive()
    }
}
