//! The public face: [`LockClient`], what a user calls. It checks what needs no network, asks the
//! client's engine (`engine.rs`) for a grant and wraps it in a guard; the work is below it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{settings_setter, Config, Settings, DEFAULT_LEASE};
use crate::election::Election;
use crate::error::{Error, Result};
use crate::fenced::FencedRedis;
use crate::guard::LockGuard;
use crate::key::{LockKeys, DEFAULT_IDLE_EXPIRY};
use crate::metrics::{self, Op, Since};
use crate::multi::{self, MultiGuard};
use crate::net::connector::Connector;
use crate::options::{Deadline, LockOptions};
use crate::reentrant::{self, ReentrantGuard};
use crate::rwlock::{self, ReadGuard, RwLockStatus, WriteGuard};
use crate::scripts::shared_lock::Access;
use crate::semaphore::Semaphore;
use crate::shared::Shared;
use crate::status::LockStatus;
use crate::topology::Topology;

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
    shared: Arc<Shared>,
}

impl LockClient {
    /// Starts configuring a client for a Redis deployment: a URL of one server
    /// (`redis://[user:pass@]host:port/db`, or `redis+unix:///path`), the master that sentinels
    /// name (`redis+sentinel://host1:26379,host2:26379/mymaster`), or a [`Topology`] made by
    /// hand. See [`Topology`] for every form.
    ///
    /// ```
    /// use fencelock::{LockClient, Topology};
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let one = LockClient::builder("redis://127.0.0.1:6379/").build()?;
    /// let ha = LockClient::builder(Topology::sentinel(
    ///         ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"], "mymaster"))
    ///     .build()?;
    /// # drop((one, ha));
    /// # Ok(()) }
    /// ```
    pub fn builder(topology: impl Into<Topology>) -> Builder {
        Builder::new(topology.into())
    }

    /// A client with every setting at its default; the same as `LockClient::builder(url).build()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the URL does not parse.
    pub fn new(topology: impl Into<Topology>) -> Result<LockClient> {
        Self::builder(topology).build()
    }

    /// Takes the lock on `key`, waiting as long as it takes.
    ///
    /// Waiting costs no polling at a fixed interval: a release wakes the longest-waiting thread
    /// of this client at once. Only when the holder's lease would have run out, or 5 s after its
    /// last look if that is sooner, does the waiter look again unprompted, since a holder (or a
    /// waiter handed the lock) that died publishes no release.
    ///
    /// # Guards move between threads; re-locking a held key waits
    ///
    /// A [`LockGuard`] belongs to no thread: send it to another thread, or keep it in a thread
    /// pool's task, and the thread that took it may lock the key again as soon as the guard's
    /// new owner releases it. So `lock` does not ask which thread holds a key, and a thread that
    /// asks for a key whose plain guard it holds itself waits for itself, like any waiter of a
    /// held lock: forever with `lock` (renewal keeps the lease alive), until the timeout with
    /// [`try_lock`](LockClient::try_lock), until cancelled with
    /// [`LockOptions::cancel`](crate::LockOptions::cancel). That is what `std::sync::Mutex`
    /// and `parking_lot::Mutex` do on a re-lock; their guards are `!Send`, and parking_lot's
    /// deadlock detector cannot be built together with its `send_guard` feature, because a
    /// check by thread is wrong once guards move. Nest on one thread with
    /// [`reentrant_lock`](LockClient::reentrant_lock) instead: its guard cannot leave the
    /// thread, so a plain `lock` of a key this thread holds through it fails at once with
    /// [`Error::WouldDeadlock`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let guard = client.lock("job:7")?;
    /// let worker = std::thread::spawn(move || guard.unlock()); // the guard moves
    /// // Not refused: waits until the worker's unlock, then gets the next grant.
    /// let again = client.try_lock("job:7", Duration::from_secs(5))?;
    /// # let _ = (worker, again);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key or one longer
    /// than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, before any network call.
    /// [`Error::WouldDeadlock`] if this thread holds `key` through
    /// a [`ReentrantGuard`](crate::ReentrantGuard) of this client. Connection errors, timeouts
    /// and Redis errors end the wait rather than being retried forever: on one server at once;
    /// on Sentinel or Cluster, a master that stops answering is looked for anew and the attempt
    /// goes again on the master that replaces it, for up to 60 s from the first failure since
    /// an attempt last got through, so that `lock` rides a failover (see
    /// [`try_lock`](LockClient::try_lock)).
    pub fn lock(&self, key: &str) -> Result<LockGuard> {
        self.lock_with(key, &LockOptions::new())
    }

    /// Takes the lock on `key` if it can be had within `timeout`; `Ok(None)` if not.
    ///
    /// `Duration::ZERO` makes exactly one attempt (repeated once on a fresh connection only if
    /// the pooled one turns out to be broken), and does not queue behind other threads of this
    /// client that are waiting for the key. A zero deadline leaves no time for a round trip, so
    /// that attempt's reply is awaited up to the response timeout
    /// ([`Builder::response_timeout`](crate::Builder::response_timeout)): lower that to bound a
    /// "skip if held" call against a Redis that stopped answering.
    ///
    /// With a timeout above zero it returns within `timeout`, plus at most one connection
    /// attempt (the connection timeout) if a connection must be made, whatever Redis does: a
    /// reply is awaited no later than the deadline (at least 10 ms). A waiter that gives up takes itself out of Redis'
    /// queue before it returns, giving Redis 50 ms to answer; if it does not, the client's
    /// background thread does it, so that the caller does not wait for a Redis that stopped.
    ///
    /// On Sentinel and Cluster, an attempt whose reply does not come within the response
    /// timeout, or whose connection breaks or cannot be made, is undone behind it on its
    /// connection and goes again on the master the deployment names by then, until the deadline:
    /// a caller who gives 20 s is granted on the replica that replaces a frozen master, if that
    /// comes within them. The response timeout bounds one exchange, not the whole wait. It
    /// ends at once when the sentinels, or every node of the cluster, cannot be reached.
    ///
    /// # Errors
    /// As for [`lock`](LockClient::lock); [`Error::Timeout`] if the reply to an attempt did not
    /// come by the deadline (the attempt is undone behind it, on its connection), or, on one
    /// server, within the response timeout.
    pub fn try_lock(&self, key: &str, timeout: Duration) -> Result<Option<LockGuard>> {
        self.try_lock_with(key, timeout, &LockOptions::new())
    }

    /// [`lock`](LockClient::lock) with per-call [`LockOptions`]: a lease of its own, renewal
    /// off, a maximum hold time, a cancel channel.
    ///
    /// # Errors
    /// As for [`lock`](LockClient::lock); also [`Error::Cancelled`] when the wait was cancelled,
    /// and [`Error::InvalidArgument`] for options out of range.
    pub fn lock_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.acquire(key, Deadline::Never, options)? {
                return Ok(guard);
            }
        }
    }

    /// [`try_lock`](LockClient::try_lock) with per-call [`LockOptions`].
    ///
    /// # Errors
    /// As for [`lock_with`](LockClient::lock_with).
    pub fn try_lock_with(
        &self,
        key: &str,
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        match Deadline::within(timeout) {
            Deadline::Never => self.lock_with(key, options).map(Some),
            deadline => self.acquire(key, deadline, options),
        }
    }

    /// Runs `f` under the lock on `key`, handing it the guard, and releases the lock when `f`
    /// returns or panics. Waits for the lock as [`lock`](LockClient::lock) does.
    ///
    /// `f` returns a `Result` in an error type of your own, as with diesel's and sqlx's
    /// `transaction`: fencelock's errors (taking the lock, releasing it) convert into it through
    /// `From<fencelock::Error>`, so `?` works inside `f` and on the call alike, without a
    /// `Result<Result<..>>`.
    ///
    /// ```no_run
    /// use fencelock::{FencedRedis, LockClient};
    ///
    /// #[derive(Debug)]
    /// enum AppError {
    ///     OutOfStock,
    ///     Lock(fencelock::Error),
    /// }
    ///
    /// impl From<fencelock::Error> for AppError {
    ///     fn from(e: fencelock::Error) -> Self {
    ///         AppError::Lock(e)
    ///     }
    /// }
    ///
    /// fn take_one(client: &LockClient, store: &FencedRedis) -> Result<i64, AppError> {
    ///     client.with_lock("stock:1", |guard| {
    ///         let left = store.incr_by("stock:1", guard.token(), -1)?;
    ///         if left < 0 {
    ///             store.incr_by("stock:1", guard.token(), 1)?;
    ///             return Err(AppError::OutOfStock);
    ///         }
    ///         Ok(left)
    ///     })
    /// }
    /// ```
    ///
    /// A closure that cannot fail returns `Ok`, naming the error type where nothing else does:
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let token = client.with_lock("report", |guard| Ok::<_, fencelock::Error>(guard.token()))?;
    /// # let _ = token;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `f`'s own error, after the lock was released (a failed release is then only logged).
    /// Otherwise fencelock's errors converted into `E`: as for [`lock`](LockClient::lock), and
    /// [`Error::LockLost`] if the lock was found lost when `f` returned:
    /// `f` ran to the end, but possibly not alone, so its value is dropped.
    pub fn with_lock<T, E>(
        &self,
        key: &str,
        f: impl FnOnce(&LockGuard) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        run_locked(self.lock(key)?, f)
    }

    /// [`with_lock`](LockClient::with_lock) that waits at most `timeout`; `Ok(None)` without
    /// running `f` if the lock could not be had in time.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let ran = client.try_with_lock("nightly", Duration::from_secs(1), |_guard| {
    ///     // ... the nightly job ...
    ///     Ok::<_, fencelock::Error>(())
    /// })?;
    /// if ran.is_none() {
    ///     println!("another process runs the nightly job");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`with_lock`](LockClient::with_lock).
    pub fn try_with_lock<T, E>(
        &self,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&LockGuard) -> std::result::Result<T, E>,
    ) -> std::result::Result<Option<T>, E>
    where
        E: From<Error>,
    {
        self.try_with_lock_options(key, timeout, &LockOptions::new(), f)
    }

    /// [`with_lock`](LockClient::with_lock) with per-call [`LockOptions`], as
    /// [`lock_with`](LockClient::lock_with) takes them.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let options = LockOptions::new()
    ///     .lease(Duration::from_secs(5))
    ///     .max_hold(Duration::from_secs(60));
    /// client.with_lock_options("rebuild-index", &options, |guard| {
    ///     // ... at most a minute of work, checking guard.is_held() between steps ...
    ///     # let _ = guard;
    ///     Ok::<_, fencelock::Error>(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`with_lock`](LockClient::with_lock) and [`lock_with`](LockClient::lock_with).
    pub fn with_lock_options<T, E>(
        &self,
        key: &str,
        options: &LockOptions,
        f: impl FnOnce(&LockGuard) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        run_locked(self.lock_with(key, options)?, f)
    }

    /// [`try_with_lock`](LockClient::try_with_lock) with per-call [`LockOptions`], as
    /// [`try_lock_with`](LockClient::try_lock_with) takes them.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let short = LockOptions::new().lease(Duration::from_secs(2));
    /// let done = client.try_with_lock_options("cache:warm", Duration::ZERO, &short, |_guard| {
    ///     Ok::<_, fencelock::Error>("warmed")
    /// })?;
    /// assert!(matches!(done, Some("warmed") | None));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`with_lock_options`](LockClient::with_lock_options).
    pub fn try_with_lock_options<T, E>(
        &self,
        key: &str,
        timeout: Duration,
        options: &LockOptions,
        f: impl FnOnce(&LockGuard) -> std::result::Result<T, E>,
    ) -> std::result::Result<Option<T>, E>
    where
        E: From<Error>,
    {
        match self.try_lock_with(key, timeout, options)? {
            Some(guard) => run_locked(guard, f).map(Some),
            None => Ok(None),
        }
    }

    /// Takes the locks on every key of `keys`, all or none, waiting as long as it takes; one
    /// [`MultiGuard`] holds them, each key with its own fencing token.
    ///
    /// Deadlock-free whatever order callers name the keys in: every set is taken one key at a
    /// time in one order (sorted by the keys' escaped forms), so no two callers can each hold
    /// a key the other waits for. Each key is waited for as [`lock`](LockClient::lock) waits,
    /// in that key's queue, so callers of single keys who come later queue behind the set and
    /// cannot starve it; the keys taken so far stay held, and renewed, meanwhile. The keys may
    /// live on different nodes of a Redis Cluster.
    ///
    /// A key named twice is locked once: a set names each lock it wants, and asking for one
    /// twice asks for nothing more (a transfer from an account to itself locks that account).
    /// An empty list is refused: a guard of nothing would say it holds something.
    ///
    /// Callers that hold single keys' guards while they lock others are outside this order: a
    /// thread that holds a plain guard of one of `keys` waits for itself, as with `lock`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use fencelock::{FencedRedis, LockClient};
    ///
    /// let client = LockClient::new("redis://127.0.0.1:6379/")?;
    /// let store = FencedRedis::from(&client);
    /// let (from, to) = ("acct:7", "acct:1");
    /// let accounts = client.lock_all(&[from, to])?;
    /// store.incr_by(from, accounts.token(from).expect("locked"), -50)?;
    /// store.incr_by(to, accounts.token(to).expect("locked"), 50)?;
    /// accounts.unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list or a key [`lock`](LockClient::lock) would
    /// refuse, and [`Error::WouldDeadlock`] if this thread holds one of the keys through a
    /// [`ReentrantGuard`], all before any network call. Otherwise as for
    /// [`lock`](LockClient::lock), and [`Error::LockLost`] if a key taken earlier was lost while
    /// a later one was waited for. After an error no key stays locked: the keys taken are
    /// released before it is returned.
    pub fn lock_all<K: AsRef<str>>(&self, keys: &[K]) -> Result<MultiGuard> {
        self.lock_all_with(keys, &LockOptions::new())
    }

    /// Takes the locks on every key of `keys` if all can be had within `timeout`; `Ok(None)`
    /// if not, with every key taken meanwhile released again before it returns. The timeout is
    /// for the whole set: each key is waited for until the same deadline, in the order
    /// [`lock_all`](LockClient::lock_all) takes them. `Duration::ZERO` makes one attempt per
    /// key. The keys taken before the deadline are released as dropped guards release theirs,
    /// so the call can return up to a round trip per key taken after the deadline.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let keys = vec![String::from("seat:12A"), String::from("seat:12B")];
    /// match client.try_lock_all(&keys, Duration::from_secs(2))? {
    ///     Some(seats) => seats.unlock()?,
    ///     None => println!("one of the seats is taken; neither is held"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`lock_all`](LockClient::lock_all) and [`try_lock`](LockClient::try_lock).
    pub fn try_lock_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<Option<MultiGuard>> {
        self.try_lock_all_with(keys, timeout, &LockOptions::new())
    }

    /// [`lock_all`](LockClient::lock_all) with per-call [`LockOptions`], which apply to every
    /// key: the lease, renewal, the maximum hold time, and a cancel channel that ends the wait
    /// for the whole set (releasing the keys taken).
    ///
    /// # Errors
    /// As for [`lock_all`](LockClient::lock_all) and [`lock_with`](LockClient::lock_with).
    pub fn lock_all_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: &LockOptions,
    ) -> Result<MultiGuard> {
        loop {
            if let Some(guards) = self.acquire_all(keys, Deadline::Never, options)? {
                return Ok(guards);
            }
        }
    }

    /// [`try_lock_all`](LockClient::try_lock_all) with per-call [`LockOptions`].
    ///
    /// # Errors
    /// As for [`lock_all_with`](LockClient::lock_all_with).
    pub fn try_lock_all_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        match Instant::now().checked_add(timeout) {
            _ if timeout.is_zero() => self.acquire_all(keys, Deadline::Now, options),
            Some(deadline) => self.acquire_all(keys, Deadline::At(deadline), options),
            None => self.lock_all_with(keys, options).map(Some),
        }
    }

    /// How the lock on `key` stands in Redis now: held or free, the holder's fencing token,
    /// its remaining lease, and how many clients wait. Reads only: the lock is not taken, and
    /// nothing in Redis changes.
    ///
    /// One round trip (a read-only script, so every part is read at the same moment), on the
    /// client's pool. See [`LockStatus`] for what each part means, and when the token cannot be
    /// told.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let guard = client.lock("report")?;
    /// let status = client.status("report")?;
    /// assert!(status.held);
    /// assert_eq!(status.token, Some(guard.token()));
    /// guard.unlock()?;
    /// assert!(!client.status("report")?.held);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key that
    /// [`lock`](LockClient::lock) would refuse. Connection errors, timeouts and Redis errors
    /// (a lock or fence key of the wrong type, a fence counter that holds no token).
    pub fn status(&self, key: &str) -> Result<LockStatus> {
        let keys = self.shared.keys(key)?;
        self.shared.engine.status(&keys)
    }

    /// Releases the lock on `key` **whoever holds it**, and hands it to the next waiter in
    /// Redis' queue as a release would (or frees it if nobody waits). Returns `true` if the
    /// lock was held, `false` if it was free already. For operators: a holder that hung, a lock
    /// you must take over now rather than when its lease runs out.
    ///
    /// # This breaks mutual exclusion
    ///
    /// The holder is not asked and not told. It keeps running and believes it holds the lock
    /// until its next renewal (within a third of its lease) finds the lock gone or another's;
    /// only then does its [`is_held`](crate::LockGuard::is_held) turn false and its
    /// [`lost`](crate::LockGuard::lost) fire. Until then, it and the next holder both act under
    /// the lock. What keeps the old holder's late writes out is **fencing**: the next grant's
    /// token is higher (the fence counter is left alone, so tokens keep rising), and storage
    /// that checks tokens refuses the old holder once the new one has written. Without such
    /// storage, force a lock only once its holder is known dead or stopped.
    ///
    /// It is the lock-service counterpart of `parking_lot`'s `force_unlock`, which is `unsafe`
    /// for the same reason.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// if client.force_unlock("nightly-export")? {
    ///     println!("released; the old holder learns it at its next renewal");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key that
    /// [`lock`](LockClient::lock) would refuse. Connection errors and Redis errors. The call is
    /// not repeated on a fresh connection when the connection breaks (a second run would take
    /// the lock from the waiter the first one handed it to): after
    /// [`Error::Connection`] or [`Error::Timeout`]
    /// its outcome is unknown; ask [`status`](LockClient::status).
    pub fn force_unlock(&self, key: &str) -> Result<bool> {
        let keys = self.shared.keys(key)?;
        let held = self.shared.engine.force_unlock(&keys)?;
        if held {
            log::warn!("fencelock: the lock on {key:?} was released by force");
        }
        Ok(held)
    }

    /// The namespace this client's keys live under.
    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    /// The lease every grant of this client starts with, unless its options say otherwise.
    pub fn lease(&self) -> Duration {
        self.shared.config.lease
    }

    /// Takes the lock on `key` reentrantly: if this thread already holds it through a
    /// [`ReentrantGuard`] of this client, returns another guard of that grant at once;
    /// otherwise waits for it as [`lock`](LockClient::lock) does.
    ///
    /// Only reentrant guards nest. A key this thread holds through a plain [`LockGuard`] is
    /// waited for like any held key, as [`lock`](LockClient::lock) explains: plain guards may
    /// move between threads, so which thread holds one is not tracked.
    ///
    /// # Errors
    /// As for [`lock`](LockClient::lock); [`Error::LockLost`] if this thread's hold of the key
    /// was lost (no new grant can be had while its guards live).
    pub fn reentrant_lock(&self, key: &str) -> Result<ReentrantGuard> {
        match reentrant::nested(self.identity(), &self.shared.keys(key)?)? {
            Ok(nested) => Ok(nested),
            Err(id) => Ok(reentrant::record(id, self.lock(key)?)),
        }
    }

    /// [`reentrant_lock`](LockClient::reentrant_lock) that waits at most `timeout` for a lock
    /// this thread does not hold yet; `Ok(None)` if it could not be had in time. A nested guard
    /// of a hold this thread has comes back at once, whatever the timeout.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let Some(outer) = client.try_reentrant_lock("account:9", Duration::from_secs(1))? else {
    ///     println!("account 9 is busy");
    ///     return Ok(());
    /// };
    /// // Nested: granted at once, even with a zero timeout.
    /// let inner = client.try_reentrant_lock("account:9", Duration::ZERO)?;
    /// assert!(inner.is_some());
    /// # drop(outer);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`reentrant_lock`](LockClient::reentrant_lock).
    pub fn try_reentrant_lock(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<ReentrantGuard>> {
        match reentrant::nested(self.identity(), &self.shared.keys(key)?)? {
            Ok(nested) => Ok(Some(nested)),
            Err(id) => Ok(self
                .try_lock(key, timeout)?
                .map(|guard| reentrant::record(id, guard))),
        }
    }

    /// Election `name` among every process that opens it with this namespace: campaign to lead
    /// it, see who leads, observe each change. See [`Election`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let election = client.election("scheduler")?;
    /// let leadership = election.campaign("node-a")?;
    /// println!("leading with epoch {}", leadership.epoch());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name a key could not be (empty, or longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN)). Nothing is sent to Redis.
    pub fn election(&self, name: &str) -> Result<Election> {
        let mut keys =
            LockKeys::election(&self.shared.config.namespace, name).map_err(|e| match e {
                Error::InvalidArgument { reason, .. } => Error::InvalidArgument {
                    what: "election name",
                    reason,
                },
                e => e,
            })?;
        keys.set_idle_expiry(self.shared.config.idle_expiry);
        Ok(Election::new(Arc::clone(&self.shared), keys))
    }

    /// A counting semaphore named `name` with `permits` permits: at most that many
    /// [`Permit`](crate::Permit)s of it are held at once, across every client. No network call:
    /// the count is checked against the one in force at the first call on the semaphore (see
    /// [`Semaphore`]).
    ///
    /// A semaphore and a lock of the same name are unrelated: they share no key.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let uploads = client.semaphore("uploads", 4)?;
    /// let permit = uploads.acquire()?;
    /// println!("upload slot with fencing token {}", permit.token());
    /// drop(permit); // released
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or one longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, or zero permits; and, with `what` =
    /// `"topology"`, on a client of a quorum of masters (`Topology::quorum`), which cannot
    /// count permits: permits granted on a majority of masters that each admit N add up to
    /// nearly 2N.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(Arc::clone(&self.shared), name, permits)
    }

    /// Takes the read-write lock `key` to read, waiting as long as it takes: any number of
    /// readers hold it together, never beside a writer (see [`ReadGuard`]).
    ///
    /// Callers take turns first come, first served, in one queue per lock: a reader that comes
    /// after a waiting writer waits behind it, even while other readers hold, so a steady
    /// stream of readers never starves a writer; a writer's release lets in every reader
    /// waiting at the head of the queue at once. A read-write lock and a plain lock of the same
    /// name are two independent locks: they share no key.
    ///
    /// Don't ask for a read lock of a key while this thread, or anything it waits for, holds
    /// one of it: a writer that queued in between waits for the first grant, and the second
    /// waits behind the writer. Nor is a write guard turned into a read guard: release it, then
    /// ask again.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let config = client.read_lock("config")?;
    /// println!("reading under token {}", config.token());
    /// drop(config); // released
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key or one longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes; and, with `what` = `"topology"`, on a client
    /// of a quorum of masters (`Topology::quorum`), which has no read-write locks. Connection
    /// errors, timeouts and Redis errors end the wait, as for [`lock`](LockClient::lock).
    pub fn read_lock(&self, key: &str) -> Result<ReadGuard> {
        self.read_lock_with(key, &LockOptions::new())
    }

    /// Takes the read-write lock `key` to write, waiting as long as it takes: nobody else holds
    /// it meanwhile, to read or to write (see [`WriteGuard`]). A writer waits for the readers
    /// that came before it, and readers that come after it wait for it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let config = client.write_lock("config")?;
    /// println!("writing with fencing token {}", config.token());
    /// config.unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`read_lock`](LockClient::read_lock).
    pub fn write_lock(&self, key: &str) -> Result<WriteGuard> {
        self.write_lock_with(key, &LockOptions::new())
    }

    /// Takes the read-write lock `key` to read if that can be done within `timeout`;
    /// `Ok(None)` if not. `Duration::ZERO` makes one attempt and never queues. A waiter that
    /// gives up takes itself out of Redis' queue before it returns (giving Redis 50 ms to
    /// answer), passing on a grant handed to it meanwhile.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// match client.try_read_lock("config", Duration::from_secs(1))? {
    ///     Some(config) => println!("reading under token {}", config.token()),
    ///     None => println!("a writer holds the config, or waits for it"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`read_lock`](LockClient::read_lock); [`Error::Timeout`] if the reply to an
    /// attempt did not come by the deadline.
    pub fn try_read_lock(&self, key: &str, timeout: Duration) -> Result<Option<ReadGuard>> {
        self.try_read_lock_with(key, timeout, &LockOptions::new())
    }

    /// Takes the read-write lock `key` to write if that can be done within `timeout`;
    /// `Ok(None)` if not, as [`try_read_lock`](LockClient::try_read_lock) does.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// if let Some(config) = client.try_write_lock("config", Duration::ZERO)? {
    ///     println!("writing with fencing token {}", config.token());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`try_read_lock`](LockClient::try_read_lock).
    pub fn try_write_lock(&self, key: &str, timeout: Duration) -> Result<Option<WriteGuard>> {
        self.try_write_lock_with(key, timeout, &LockOptions::new())
    }

    /// [`read_lock`](LockClient::read_lock) with per-call [`LockOptions`]: a lease of the
    /// grant's own ([`lease`](LockOptions::lease)) and a cancel channel
    /// ([`cancel`](LockOptions::cancel)) that ends the wait with [`Error::Cancelled`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let (stop, stopped) = fencelock::crossbeam_channel::bounded::<()>(1);
    /// let options = fencelock::LockOptions::new()
    ///     .lease(Duration::from_secs(60))
    ///     .cancel(stopped);
    /// let config = client.read_lock_with("config", &options)?;
    /// # drop((stop, config));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`read_lock`](LockClient::read_lock); also [`Error::Cancelled`], and
    /// [`Error::InvalidArgument`] (`what` = `"options"`) for [`renew(false)`](LockOptions::renew)
    /// or [`max_hold`](LockOptions::max_hold), which a read or write grant does not take: it is
    /// renewed until it is released.
    pub fn read_lock_with(&self, key: &str, options: &LockOptions) -> Result<ReadGuard> {
        ReadGuard::wait(&self.shared, key, Access::Read, options)
    }

    /// [`write_lock`](LockClient::write_lock) with per-call [`LockOptions`], as
    /// [`read_lock_with`](LockClient::read_lock_with).
    ///
    /// # Errors
    /// As for [`read_lock_with`](LockClient::read_lock_with).
    pub fn write_lock_with(&self, key: &str, options: &LockOptions) -> Result<WriteGuard> {
        WriteGuard::wait(&self.shared, key, Access::Write, options)
    }

    /// [`try_read_lock`](LockClient::try_read_lock) with per-call [`LockOptions`], as
    /// [`read_lock_with`](LockClient::read_lock_with).
    ///
    /// # Errors
    /// As for [`read_lock_with`](LockClient::read_lock_with).
    pub fn try_read_lock_with(
        &self,
        key: &str,
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<ReadGuard>> {
        ReadGuard::try_take(&self.shared, key, Access::Read, timeout, options)
    }

    /// [`try_write_lock`](LockClient::try_write_lock) with per-call [`LockOptions`], as
    /// [`read_lock_with`](LockClient::read_lock_with).
    ///
    /// # Errors
    /// As for [`read_lock_with`](LockClient::read_lock_with).
    pub fn try_write_lock_with(
        &self,
        key: &str,
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<WriteGuard>> {
        WriteGuard::try_take(&self.shared, key, Access::Write, timeout, options)
    }

    /// How the read-write lock `key` stands in Redis: how many hold it to read, whether one
    /// holds it to write, and how many clients wait, read in one atomic step without taking
    /// anything. The read-write lock's counterpart of [`status`](LockClient::status) and
    /// [`Semaphore::status`](crate::Semaphore::status).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let status = client.rwlock_status("config")?;
    /// if status.writer {
    ///     println!("a writer holds the config; {} client(s) wait", status.waiters);
    /// } else {
    ///     println!("{} reader(s) hold the config", status.readers);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`read_lock`](LockClient::read_lock) before it waits: an invalid key, a quorum
    /// client; connection errors and timeouts as for any command.
    pub fn rwlock_status(&self, key: &str) -> Result<RwLockStatus> {
        rwlock::status(&self.shared, key)
    }

    /// Tells clients apart (clones are one client): the address of the shared state, which
    /// lives as long as the client or any of its guards.
    fn identity(&self) -> usize {
        self.shared.identity()
    }

    /// A client in `namespace` over a fake engine (`engine/fake.rs`), and the fake, for a unit
    /// test to steer and inspect. The URL is parsed, never dialled.
    #[cfg(test)]
    pub(crate) fn over_fake(namespace: &str) -> (LockClient, Arc<crate::engine::fake::Fake>) {
        let (connector, config) = LockClient::builder("redis://127.0.0.1:1/")
            .namespace(namespace)
            .open()
            .expect("a URL that parses and a valid configuration");
        let fake = crate::engine::fake::Fake::new(connector, &config);
        let engine = crate::engine::Engine::Fake(Arc::clone(&fake));
        let client = LockClient {
            shared: Arc::new(Shared { config, engine }),
        };
        (client, fake)
    }

    /// Every lock call: checks what needs no network, then waits for the engine's grant until
    /// `deadline`, and wraps it in a guard.
    fn acquire(
        &self,
        key: &str,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let called = Since::now();
        let result = self
            .prepare(key, options)
            .and_then(|keys| self.take(keys, deadline, options));
        metrics::acquired(&self.shared.config.namespace, called, &result);
        result
    }

    /// Every `lock_all` call: `multi.rs` takes the set, one key at a time, with this client's
    /// checks and acquire. Each key's wait is recorded as a lock call's, so that wait samples
    /// and grants still count the same; an error that no key's wait returned, once.
    fn acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let namespace = &self.shared.config.namespace;
        let mut counted = false;
        let result = multi::acquire(
            keys,
            |key| self.prepare(key, options),
            |keys| {
                let called = Since::now();
                let taken = self.take(keys, deadline, options);
                metrics::acquired(namespace, called, &taken);
                counted = taken.is_err();
                taken
            },
        );
        if let (Err(e), false) = (&result, counted) {
            metrics::failed(namespace, Op::Lock, e);
        }
        result
    }

    /// Waits for the engine's grant of `keys`, which [`prepare`](LockClient::prepare) checked,
    /// until `deadline`, and wraps it in a guard.
    fn take(
        &self,
        keys: LockKeys,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let lease = options.lease.unwrap_or(self.shared.config.lease);
        let grant = self.shared.engine.acquire(keys, lease, deadline, options)?;
        Ok(grant.map(|grant| LockGuard::new(Arc::clone(&self.shared), grant)))
    }

    /// Checks everything that needs no network: the key, the options, and that this thread does
    /// not hold the key through a [`ReentrantGuard`]. A plain guard may have moved to another
    /// thread, so holding one is no reason to refuse (see [`LockClient::lock`]).
    fn prepare(&self, key: &str, options: &LockOptions) -> Result<LockKeys> {
        let keys = self.shared.keys(key)?;
        options.validate()?;
        if reentrant::held_here(self.identity(), keys.tag()) {
            return Err(Error::WouldDeadlock {
                key: keys.user().to_owned(),
            });
        }
        if options.is_cancelled() {
            return Err(Error::Cancelled);
        }
        Ok(keys)
    }
}

/// Runs `f` under `guard` and releases it: `f`'s error wins over a failed release (which
/// `release` logs); a panic in `f` releases through the guard's drop.
fn run_locked<T, E: From<Error>>(
    guard: LockGuard,
    f: impl FnOnce(&LockGuard) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    match f(&guard) {
        Ok(value) => {
            guard.unlock()?;
            Ok(value)
        }
        Err(e) => {
            let _ = guard.unlock();
            Err(e)
        }
    }
}

/// A fenced store that shares the client's connections (its pool) and its namespace: one set of
/// connections for the locks and the writes they guard. Its writes wait for the client's
/// [`min_replica_acks`](Builder::min_replica_acks), if set, as its grants do (see
/// [`FencedBuilder::min_replica_acks`](crate::FencedBuilder::min_replica_acks)).
///
/// A client on a [quorum](Topology::quorum) of masters has no one server to store on: every
/// call of such a store fails with [`Error::Rejected`]. Open the store with
/// [`FencedRedis::open`] on the server that holds the data instead.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// use fencelock::{FencedRedis, LockClient};
///
/// let client = LockClient::builder("redis://127.0.0.1:6379/").namespace("orders").build()?;
/// let store = FencedRedis::from(&client);
/// assert_eq!(store.namespace(), "orders");
/// let guard = client.lock("order:42")?;
/// store.set("order:42", guard.token(), "paid")?;
/// # Ok(()) }
/// ```
impl From<&LockClient> for FencedRedis {
    fn from(client: &LockClient) -> FencedRedis {
        FencedRedis::on_pool(
            client.namespace(),
            client.shared.engine.router(),
            client.shared.config.replica_acks,
        )
    }
}

/// Configures and builds a [`LockClient`]; made by [`LockClient::builder`].
///
/// Setters only record values; [`build`](Builder::build) validates all of them and reports the
/// first bad one as [`Error::InvalidArgument`]. Nothing here touches the network.
///
/// ```
/// use std::time::Duration;
/// use fencelock::LockClient;
///
/// let err = LockClient::builder("redis://127.0.0.1:6379/")
///     .lease(Duration::from_millis(1))
///     .build()
///     .unwrap_err();
/// assert!(err.is_invalid_argument());
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct Builder {
    topology: Topology,
    /// What a fenced store's builder records too.
    settings: Settings,
    lease: Duration,
    idle_expiry: Duration,
}

impl Builder {
    fn new(topology: Topology) -> Builder {
        Builder {
            topology,
            settings: Settings::default(),
            lease: DEFAULT_LEASE,
            idle_expiry: DEFAULT_IDLE_EXPIRY,
        }
    }

    settings_setter! {
        /// Prefix of every Redis key and channel this client uses, like a registry path: clients
        /// with different namespaces never contend, even for equal keys.
        fn Builder::namespace;
    }

    /// How long a grant lives in Redis without renewal. The renewal thread extends it about every
    /// lease/3 while the guard lives, so the lease is the time another client waits after a holder
    /// crashes, not a bound on how long you may hold a lock.
    ///
    /// Whole milliseconds from [`MIN_LEASE`](crate::MIN_LEASE) (10 ms) to
    /// [`MAX_LEASE`](crate::MAX_LEASE) (24 h); a fraction of a millisecond is rejected. Defaults
    /// to 30 s.
    pub fn lease(mut self, lease: Duration) -> Builder {
        self.lease = lease;
        self
    }

    settings_setter! {
        /// Maximum number of pooled connections for acquire and release (renewal and wake-ups use
        /// connections of their own).
        fn Builder::pool_size;
    }

    settings_setter! {
        /// How long a call may wait for a connection: for one attempt to connect to Redis (and
        /// its set-up: password, database), or for a pooled connection to come free when all are
        /// in use. A call whose attempt fails reports it at once: [`Error::Connection`] (refused,
        /// timed out), [`Error::Rejected`] (wrong credentials or database), or
        /// [`Error::PoolExhausted`]. Nothing is retried until the timeout runs out.
        fn Builder::connection_timeout;
    }

    settings_setter! {
        /// How long to wait for a reply to a command before reporting [`Error::Timeout`].
        fn Builder::response_timeout;
    }

    settings_setter! {
        /// Makes every grant wait until at least `replicas` replicas have it, for at most
        /// `timeout`: the acquire script and a `WAIT replicas timeout` go out in one pipeline on
        /// one connection, so the count is for this very grant. A grant acknowledged by fewer
        /// replicas in time is released and reported as [`Error::NotReplicated`], never as held:
        /// after a failover to a replica, an acknowledged grant (its lock and its token) is still
        /// there.
        ///
        /// Renewals wait the same way: the renewal thread ends each pipeline with the `WAIT`, and
        /// a renewal acknowledged by too few replicas does not move the guard's deadline, so a
        /// guard never says held past the lease its replicas know. While replicas stay out of
        /// reach, held locks are therefore reported lost when their lease runs out, though the
        /// master still has them.
        fn Builder::min_replica_acks;
        /// A [`FencedRedis`] made with `FencedRedis::from(&client)` takes the same setting for its
        /// writes.
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// use fencelock::{LockClient, Topology};
        ///
        /// # fn main() -> Result<(), fencelock::Error> {
        /// // Sentinel with two replicas: a grant counts once one of them has it.
        /// let client = LockClient::builder(Topology::sentinel(
        ///         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
        ///         "mymaster"))
        ///     .min_replica_acks(1, Duration::from_millis(500))
        ///     .build()?;
        /// match client.try_lock("report", Duration::from_secs(5)) {
        ///     Ok(Some(guard)) => guard.unlock()?,
        ///     Ok(None) => println!("held by another"),
        ///     // No replica had the grant in time: it was given back; try again later.
        ///     Err(e) if e.is_not_replicated() => println!("{e}"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
    }

    /// How long Redis keeps a key's bookkeeping once nobody locks the key: its fence counter
    /// expires this long after the Redis server's clock, read in microseconds, passes the last
    /// token granted, which is this long after the last grant unless the counter ran ahead of
    /// the clock. Every grant re-arms it. (The lock key lives for its lease, and a key's queue
    /// of waiters as long as its longest-lived entry.)
    ///
    /// Tokens keep increasing across the expiry: the first grant after it takes its token from
    /// the server clock (the clock floor), which is then past every earlier token, provided the
    /// Redis server's wall clock never steps back by more than `idle` (see "How long the fence
    /// counter lives" in `docs/design.md`). A longer expiry tolerates a larger step back of the
    /// clock, and keeps more keys: about 170 bytes of Redis memory for each key locked within
    /// that time, with short key names (`docs/benchmarks.md`, run J).
    ///
    /// Whole milliseconds from [`MIN_IDLE_EXPIRY`](crate::MIN_IDLE_EXPIRY) (1 s) to
    /// [`MAX_IDLE_EXPIRY`](crate::MAX_IDLE_EXPIRY) (ten years); a fraction of a millisecond is
    /// rejected. Defaults to 24 h.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::LockClient;
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// // Request ids as lock keys: forget each one a week after its last use.
    /// let client = LockClient::builder("redis://127.0.0.1:6379/")
    ///     .idle_expiry(Duration::from_secs(7 * 24 * 60 * 60))
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn idle_expiry(mut self, idle: Duration) -> Builder {
        self.idle_expiry = idle;
        self
    }

    settings_setter! {
        fn Builder::tls_root_certificates;
        /// ```no_run
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// use fencelock::LockClient;
        ///
        /// let client = LockClient::builder("rediss://redis.internal:6380/")
        ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
        ///     .build()?;
        /// # drop(client);
        /// # Ok(()) }
        /// ```
    }

    settings_setter! {
        fn Builder::tls_client_certificate;
        /// ```no_run
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// use fencelock::LockClient;
        ///
        /// let client = LockClient::builder("rediss://redis.internal:6380/")
        ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
        ///     .tls_client_certificate(
        ///         std::fs::read("/etc/orders/tls/client.crt")?,
        ///         std::fs::read("/etc/orders/tls/client.key")?,
        ///     )
        ///     .build()?;
        /// # drop(client);
        /// # Ok(()) }
        /// ```
    }

    /// Validates every setting and starts the client: its pool, its renewal thread and its
    /// pub/sub connection. Connections are made lazily, so Redis need not be up yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first setting that is out of range, or the URL if
    /// it does not parse as `redis://`, `redis+unix://` or `unix://` (or `rediss://`, with the
    /// `tls` feature), or TLS settings that do not parse or were given for a URL that is not
    /// `rediss://`.
    pub fn build(self) -> Result<LockClient> {
        let (connector, config) = self.open()?;
        Ok(LockClient {
            shared: Shared::start(connector, config)?,
        })
    }

    /// What [`build`](Builder::build) starts a client on: the deployment's connector (nothing
    /// dialled yet) and the checked configuration. Unit tests start a fake engine on them.
    pub(crate) fn open(self) -> Result<(Arc<Connector>, Config)> {
        let connector = Arc::new(Connector::open(
            self.topology.resolve()?,
            &self.settings.tls,
            self.settings.connection_timeout,
        )?);
        let config = Config::new(self.settings, self.lease, self.idle_expiry)?;
        Ok((connector, config))
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The topology shows itself without passwords; the TLS settings without keys.
        f.debug_struct("Builder")
            .field("topology", &self.topology)
            .field("settings", &self.settings)
            .field("lease", &self.lease)
            .field("idle_expiry", &self.idle_expiry)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("LockClient")
            .field("namespace", &self.shared.config.namespace)
            .field("lease", &self.shared.config.lease)
            .field("pool_size", &self.shared.config.pool_size)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
