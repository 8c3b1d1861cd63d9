use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use uuid::Uuid;

use crate::config::{Builder, Config};
use crate::connector::{Connector, Node};
use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant};
use crate::guard::LockGuard;
use crate::key::{release_channel, LockKeys};
use crate::listener;
use crate::options::LockOptions;
use crate::pool::Pool;
use crate::renewal::{self, Renewal};
use crate::scripts::{self, Acquire, Queue, Released, HANDOFF_LEASE};
use crate::token::FencingToken;
use crate::wait::{Left, Ticket, Waited, Waiters, Wake, LOCAL_RUN};

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
    /// Every owner id of this client starts with this: a random id for the client, and `:`.
    owner_prefix: String,
    next_owner: AtomicU64,
    /// Which grant, taken by which thread, holds each key this client holds: the deadlock check.
    holders: Mutex<HashMap<String, (u64, ThreadId)>>,
    pool: Pool,
    waiters: Arc<Waiters>,
    renewal: Renewal,
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

    pub(crate) fn start(connector: Arc<Connector>, config: Config) -> Result<LockClient> {
        let thread_error = |e: std::io::Error| Error::Connection(Box::new(e));
        let waiters = Arc::new(Waiters::default());
        // One random id per client, a counter per lock call: owner ids never repeat, cost no
        // system call each, and name the channel on which handoffs to this client come.
        let client_id = Uuid::new_v4().simple().to_string();
        let owner_prefix = format!("{client_id}:");
        listener::spawn(
            Arc::clone(&connector),
            release_channel(&config.namespace, &client_id),
            owner_prefix.clone(),
            config.connection_timeout,
            Arc::downgrade(&waiters),
        )
        .map_err(thread_error)?;
        let renewal = renewal::spawn(
            Arc::clone(&connector),
            config.lease,
            config.connection_timeout,
            config.response_timeout,
        )
        .map_err(thread_error)?;
        Ok(LockClient {
            inner: Arc::new(Inner {
                pool: Pool::new(
                    connector,
                    Node::SINGLE,
                    config.pool_size,
                    config.connection_timeout,
                    config.response_timeout,
                ),
                config,
                owner_prefix,
                next_owner: AtomicU64::new(0),
                waiters,
                renewal,
                next_grant: AtomicU64::new(0),
                holders: Mutex::new(HashMap::new()),
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
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, before any network call.
    /// [`Error::WouldDeadlock`] if this thread already holds `key` through this client (use
    /// [`reentrant_lock`](LockClient::reentrant_lock) to nest). Connection errors, timeouts and
    /// Redis errors end the wait rather than being retried forever.
    pub fn lock(&self, key: &str) -> Result<LockGuard> {
        self.lock_with(key, &LockOptions::new())
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
            if let Some(guard) = self.acquire(key, None, options)? {
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
        match Instant::now().checked_add(timeout) {
            _ if timeout.is_zero() => self.acquire_once(key, options),
            Some(deadline) => self.acquire(key, Some(deadline), options),
            None => self.lock_with(key, options).map(Some),
        }
    }

    /// Runs `f` under the lock on `key`, handing it the guard, and releases the lock when `f`
    /// returns or panics. Waits for the lock as [`lock`](LockClient::lock) does.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # fn deduct(_: u64) -> u32 { 0 }
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let left = client.with_lock("stock:1", |guard| deduct(guard.token().as_u64()))?;
    /// # let _ = left;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`lock`](LockClient::lock). Also [`Error::LockLost`] if the lock was found lost
    /// when `f` returned: `f` ran to the end, but possibly not alone, so its value is dropped.
    pub fn with_lock<T>(&self, key: &str, f: impl FnOnce(&LockGuard) -> T) -> Result<T> {
        let guard = self.lock(key)?;
        let value = f(&guard);
        guard.unlock().map(|()| value)
    }

    /// [`with_lock`](LockClient::with_lock) that waits at most `timeout`; `Ok(None)` without
    /// running `f` if the lock could not be had in time.
    ///
    /// # Errors
    /// As for [`with_lock`](LockClient::with_lock).
    pub fn try_with_lock<T>(
        &self,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&LockGuard) -> T,
    ) -> Result<Option<T>> {
        let Some(guard) = self.try_lock(key, timeout)? else {
            return Ok(None);
        };
        let value = f(&guard);
        guard.unlock().map(|()| Some(value))
    }

    /// The namespace this client's keys live under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The lease every grant of this client starts with, unless its options say otherwise.
    pub fn lease(&self) -> Duration {
        self.inner.config.lease
    }

    /// Checks everything that needs no network: the key, the options, and that this thread does
    /// not hold the key already.
    fn prepare(&self, key: &str, options: &LockOptions) -> Result<LockKeys> {
        let keys = LockKeys::new(&self.inner.config.namespace, key)?;
        options.validate()?;
        if self.held_by_this_thread(keys.tag()) {
            return Err(Error::WouldDeadlock {
                key: keys.user().to_owned(),
            });
        }
        if options.cancel.as_ref().is_some_and(is_ready) {
            return Err(Error::Cancelled);
        }
        Ok(keys)
    }

    fn acquire_once(&self, key: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
        let mut keys = self.prepare(key, options)?;
        self.new_owner(&mut keys);
        let lease = options.lease.unwrap_or(self.inner.config.lease);
        let sent = Instant::now();
        Ok(
            match self.attempt(&keys, keys.owner(), lease, Queue::Never)? {
                Acquire::Granted(token) => Some(self.grant(NewGrant {
                    keys,
                    token,
                    sent,
                    granted: lease,
                    lease,
                    auto_renew: !options.no_renewal,
                    max_hold: options.max_hold,
                    queued: false,
                    local_run: 0,
                })),
                Acquire::Held(_) => None,
            },
        )
    }

    /// Waits in the key's local queue until granted, `deadline`, or cancelled: at its head it
    /// attempts when woken, and takes a lock handed to it by a release.
    fn acquire(
        &self,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        loop {
            match self.acquire_round(key, deadline, options)? {
                Round::Granted(guard) => return Ok(Some(guard)),
                Round::Deadline => return Ok(None),
                Round::Stale => {}
            }
        }
    }

    fn acquire_round(
        &self,
        key: &str,
        deadline: Option<Instant>,
        options: &LockOptions,
    ) -> Result<Round> {
        let mut keys = self.prepare(key, options)?;
        self.new_owner(&mut keys);
        let owner = keys.owner();
        let lease = options.lease.unwrap_or(self.inner.config.lease);
        let mut wait = Wait {
            joined: Instant::now(),
            ticket: self.inner.waiters.join(keys.tag(), owner, lease),
            queued_since: None,
        };
        let found = self.wait_for_grant(&keys, owner, lease, deadline, options, &mut wait);
        if let Ok(Some((token, sent, via))) = found {
            wait.ticket.leave_granted();
            return self.take(keys, token, sent, lease, options, via);
        }
        // Leaving without a grant; a handoff may have reached us all the same.
        let earliest = wait.since();
        let (late, named) = wait.ticket.leave();
        if let (Some(wake), Ok(None)) = (late, &found) {
            if let Some((token, since, via)) = handed(wake, earliest) {
                // Granted before we gave up: better taken than handed on.
                return self.take(keys, token, since, lease, options, via);
            }
        }
        // Only a waiter in Redis' queue or named by a release can have been handed the lock.
        if wait.queued_since.is_some() || named {
            // Out of Redis' queue, so no handoff is wasted on us; one that already reached us
            // is passed on. On failure, the entry expires by itself.
            if let Err(e) = self.hand_over(&keys, owner, true, LOCAL_RUN) {
                log::warn!("fencelock: leaving the queue of {key:?} failed: {e}");
            }
        }
        found.map(|_| Round::Deadline)
    }

    /// The waiting loop of [`acquire`](LockClient::acquire): the token, the lower bound of the
    /// lease's start and how the lock came, or `None` at `deadline`.
    fn wait_for_grant(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        deadline: Option<Instant>,
        options: &LockOptions,
        wait: &mut Wait,
    ) -> Result<Option<(FencingToken, Instant, Via)>> {
        let mut attempt = wait.ticket.is_head();
        // When the holder's lease runs out, as reported by our last attempt: a crashed holder
        // releases nothing, so the head attempts then.
        let mut holder_expiry: Option<Instant> = None;
        loop {
            if attempt {
                let sent = Instant::now();
                // Only an owner that may stand in Redis' queue has an entry to take out when
                // granted: one that attempted before or was named by a release.
                let join = wait.queued_since.is_none() && !wait.ticket.named();
                let queue = if join { Queue::Join } else { Queue::Rejoin };
                // Before sending: if the reply is lost, leaving must still withdraw.
                wait.queued_since.get_or_insert(sent);
                match self.attempt(keys, owner, lease, queue)? {
                    Acquire::Granted(token) => {
                        // A release that named us while we attempted may have queued us: the
                        // grant's release then takes the entry out.
                        let queued = join && wait.ticket.named();
                        return Ok(Some((token, sent, Via::Attempt { queued })));
                    }
                    Acquire::Held(pttl) => {
                        // A key without expiry was not set by fencelock; look again a lease later.
                        // Never later than a handoff's lease: the holder may meanwhile have
                        // handed the lock to a waiter ahead of us that died, whose grant runs out
                        // after that long without a release to wake us.
                        let after =
                            pttl.unwrap_or(lease).min(HANDOFF_LEASE) + Duration::from_millis(1);
                        holder_expiry = Instant::now().checked_add(after);
                    }
                }
            }
            attempt = false;
            let until = deadline.into_iter().chain(holder_expiry).min();
            match wait.ticket.wait(until, options.cancel.as_ref()) {
                Waited::Woken(wakes) => {
                    for wake in wakes {
                        if let Some(handed) = handed(wake, wait.since()) {
                            return Ok(Some(handed));
                        }
                        match wake {
                            Wake::Granted { .. } => {}
                            Wake::Attempt => attempt = true,
                            Wake::Queued { retry_after, since } => {
                                wait.queued_since.get_or_insert(since);
                                holder_expiry = Instant::now()
                                    .checked_add(retry_after + Duration::from_millis(1));
                            }
                        }
                    }
                }
                Waited::Cancelled => return Err(Error::Cancelled),
                Waited::TimedOut => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    attempt = wait.ticket.is_head();
                }
            }
        }
    }

    /// Turns a token into a guard. A lock handed over by a release started its lease at some
    /// unknown moment after `sent`, and Redis set it to `granted` (capped for a handoff from
    /// Redis' queue). If little of it is left by that count, or it is short of the lease asked
    /// for while nothing renews it, one extend confirms the lease first, so that the guard
    /// starts out held rather than lost, and loss is never reported for a lock still ours.
    fn take(
        &self,
        keys: LockKeys,
        token: FencingToken,
        sent: Instant,
        lease: Duration,
        options: &LockOptions,
        via: Via,
    ) -> Result<Round> {
        let (granted, local_run, queued) = match via {
            Via::Attempt { queued } => (lease, 0, queued),
            Via::Handoff { granted, local_run } => (granted, local_run, false),
        };
        let acks = self.inner.config.replica_acks;
        let confirm = matches!(via, Via::Handoff { .. })
            && (acks.is_some()
                || (granted < lease && options.no_renewal)
                || sent.elapsed() > granted / 2);
        let (sent, granted, acked) = if confirm {
            // With replica acks: a handoff was written by the releaser, on another connection,
            // and WAIT counts only what its own connection wrote, so the extend re-arms the
            // lease on ours and WAITs behind it.
            let sent = Instant::now();
            let (ours, acked) = self.inner.pool.run(|con, _| match acks {
                Some(acks) => scripts::extend_acked(con, &keys, keys.owner(), lease, acks)
                    .map(|(ours, acked)| (ours, Some(acked))),
                None => scripts::extend(con, &keys, keys.owner(), lease).map(|ours| (ours, None)),
            })?;
            if !ours {
                // It ran out before we heard of it: wait again.
                log::debug!(
                    "fencelock: a handoff of {:?} (token {token}) came too late to use",
                    keys.user()
                );
                return Ok(Round::Stale);
            }
            (sent, lease, acked)
        } else {
            (sent, granted, None)
        };
        let guard = self.grant(NewGrant {
            keys,
            token,
            sent,
            granted,
            lease,
            auto_renew: !options.no_renewal,
            max_hold: options.max_hold,
            queued,
            local_run,
        });
        match (acks, acked) {
            (Some(acks), Some(acked)) if acked < acks.replicas => {
                let _ = guard.unlock();
                Err(Error::NotReplicated {
                    acked,
                    required: acks.replicas,
                })
            }
            _ => Ok(Round::Granted(guard)),
        }
    }

    /// One run of the acquire script (and WAIT, if replica acks are required). `queue`: join
    /// Redis' queue for the key if the lock is held.
    fn attempt(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquire> {
        let acks = self.inner.config.replica_acks;
        self.inner.pool.run(|con, retry| {
            // A first run may have queued us before its reply was lost: a grant on this run must
            // take the entry out.
            let queue = match queue {
                Queue::Join if retry => Queue::Rejoin,
                queue => queue,
            };
            match scripts::acquire(con, keys, owner, lease, queue, acks) {
                Err(e) if e.is_timeout() => {
                    // The script may still run and grant us the lock we are about to report as
                    // not taken. A release sent on the same connection runs after it, whatever
                    // it did, and takes us out of the queue. (A retry of the whole closure after
                    // a broken connection is safe too: the script treats a lock already ours as
                    // granted.)
                    let _ = scripts::release(con, keys, owner, true, None);
                    Err(e)
                }
                Err(e) => Err(e),
                Ok((found, acked)) => match (found, acks, acked) {
                    (Acquire::Granted(_), Some(acks), Some(acked)) if acked < acks.replicas => {
                        // Too few replicas have it, so a failover could lose it: give it back.
                        scripts::release(con, keys, owner, false, None)?;
                        Ok(Err(Error::NotReplicated {
                            acked,
                            required: acks.replicas,
                        }))
                    }
                    (found, ..) => Ok(Ok(found)),
                },
            }
        })?
    }

    /// A fresh owner id for every lock call: never reused, and not derivable from the key.
    fn new_owner(&self, keys: &mut LockKeys) {
        let n = self.inner.next_owner.fetch_add(1, Ordering::Relaxed);
        keys.set_owner(&self.inner.owner_prefix, n);
    }

    /// Makes the guard of a grant and hands the grant to the renewal thread.
    fn grant(&self, new: NewGrant) -> LockGuard {
        let id = self.inner.next_grant.fetch_add(1, Ordering::Relaxed);
        log::debug!(
            "fencelock: granted {:?} with token {}",
            new.keys.user(),
            new.token
        );
        let grant = Arc::new(Grant::new(id, new, Arc::downgrade(&self.inner.waiters)));
        self.holders()
            .insert(grant.keys.tag().to_owned(), (id, thread::current().id()));
        // The renewal thread outlives every guard, so this only fails if it died: then nothing
        // will renew this lease, and the holder must hear so now, not at the deadline.
        if !self.inner.renewal.hold(Arc::clone(&grant)) {
            grant.mark_lost("the renewal thread is gone");
        }
        LockGuard::new(self.clone(), grant)
    }

    fn holders(&self) -> MutexGuard<'_, HashMap<String, (u64, ThreadId)>> {
        self.inner
            .holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells clients apart (clones are one client): the address of the shared state, which
    /// lives as long as the client or any of its guards.
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Whether the calling thread took `tag` through this client and still holds the guard.
    pub(crate) fn held_by_this_thread(&self, tag: &str) -> bool {
        self.holders()
            .get(tag)
            .is_some_and(|(_, thread)| *thread == thread::current().id())
    }

    /// Re-arms a grant's lease to `lease`, through the renewal thread's connection.
    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        let lost = || Error::LockLost {
            key: grant.keys.user().to_owned(),
        };
        if !grant.is_held() {
            return Err(lost());
        }
        let answer = self.inner.renewal.extend(Arc::clone(grant), lease);
        // The renewal thread bounds each of its round trips by the response timeout; allow for
        // one renewal batch ahead of ours.
        let patience =
            self.inner.config.response_timeout * 3 + self.inner.config.connection_timeout;
        match answer.recv_timeout(patience) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(lost()),
            Ok(Err(e)) => Err(Error::from_redis(e)),
            // The thread is gone, and with it every lease it kept: see Renewer's Drop.
            Err(RecvTimeoutError::Disconnected) => Err(lost()),
            Err(RecvTimeoutError::Timeout) => Err(Error::Connection(
                "the renewal thread did not answer in time".into(),
            )),
        }
    }

    /// Releases a grant: stops its renewal, then compare-and-delete, or compare-and-hand-over
    /// to the next waiter. Logs failures at warn, so `Drop` can stay silent.
    pub(crate) fn release(&self, grant: &Grant) -> Result<()> {
        let was_held = grant.is_held();
        grant.end();
        self.inner.renewal.forget(grant.id);
        {
            let mut holders = self.holders();
            if holders
                .get(grant.keys.tag())
                .is_some_and(|(id, _)| *id == grant.id)
            {
                holders.remove(grant.keys.tag());
            }
        }
        let user = grant.keys.user();
        let (released, reply_lost) = match self.hand_over(
            &grant.keys,
            grant.keys.owner(),
            grant.queued,
            grant.local_run,
        ) {
            Ok(found) => found,
            Err(e) => {
                log::warn!("fencelock: releasing {user:?} failed, it expires with its lease: {e}");
                return Err(e);
            }
        };
        match released {
            Released::Freed | Released::HandedOver { .. } => {
                log::debug!("fencelock: released {user:?} (token {})", grant.token);
                Ok(())
            }
            // The first run may have deleted the key before its connection broke: if we still
            // held the lock then, that is the likelier story. Either way nothing of anyone else's
            // was touched. A lock already known lost stays reported as lost.
            Released::NotOurs if reply_lost && was_held => {
                log::debug!(
                    "fencelock: released {user:?} (token {}) on a retry",
                    grant.token
                );
                Ok(())
            }
            Released::NotOurs => {
                if grant.mark_lost("it was no longer ours at release") {
                    log::warn!(
                        "fencelock: {user:?} (token {}) was no longer ours at release",
                        grant.token
                    );
                }
                Err(Error::LockLost {
                    key: user.to_owned(),
                })
            }
        }
    }

    /// Runs the release script for `owner` (a holder's release, or with `withdraw` a waiter
    /// leaving the queue), naming this client's next waiter for the key, and tells that waiter
    /// what became of it. Returns what the script found for `owner`, and whether its first
    /// reply was lost to a broken connection (so it ran again).
    fn hand_over(
        &self,
        keys: &LockKeys,
        owner: &str,
        withdraw: bool,
        local_run: u32,
    ) -> Result<(Released, bool)> {
        let mut first = None;
        // After the first run, each run gives back a handoff to a waiter of ours that left
        // before hearing of it, or takes such a waiter out of Redis' queue, in its name; those
        // serve Redis' queue first.
        let mut runs = vec![(owner.to_owned(), withdraw, local_run)];
        for _ in 0..MAX_HANDOVERS {
            let Some((owner, withdraw, local_run)) = runs.pop() else {
                break;
            };
            let next = self.inner.waiters.next(keys.tag());
            // Our own waiter goes before other clients' only so many times in a row.
            let ahead = local_run < LOCAL_RUN;
            let next_ref = next.as_ref().map(|n| (n.owner(), n.lease(), ahead));
            let sent = Instant::now();
            let mut reply_lost = false;
            let released = self.inner.pool.run_combined(
                scripts::pack_release(keys, &owner, withdraw, next_ref),
                |reply| scripts::released(reply, keys),
                |con, retry| {
                    reply_lost |= retry;
                    scripts::release(con, keys, &owner, withdraw, next_ref)
                },
            );
            let released = match released {
                Ok(released) => released,
                Err(e) => {
                    // Whatever happened, the key may be free for our next waiter. A handoff we
                    // could not give back expires with its waiter's lease.
                    self.inner.waiters.wake_head(keys.tag());
                    match first {
                        None => return Err(e),
                        Some(_) => {
                            log::warn!("fencelock: giving back a handoff failed: {e}");
                            break;
                        }
                    }
                }
            };
            match (&released, next) {
                (
                    Released::HandedOver {
                        token,
                        owner: to,
                        lease,
                    },
                    Some(next),
                ) if to == next.owner() => {
                    let wake = Wake::Granted {
                        token: *token,
                        since: Some(sent),
                        lease: *lease,
                        // Without the go-ahead, Redis' queue was empty: nobody was passed over.
                        local_run: if ahead { local_run + 1 } else { 0 },
                    };
                    match self.inner.waiters.deliver_to(&next, wake) {
                        // The lock is the scarce resource: let its new holder run now rather
                        // than queue behind the rest of our unlock on this core (on a busy
                        // machine the scheduler tends to put a woken thread there).
                        Ok(()) => thread::yield_now(),
                        // It left, maybe after leaving Redis' queue too: give the lock back.
                        Err(Left::Empty) => runs.push((to.clone(), false, LOCAL_RUN)),
                        Err(Left::Granted) => {}
                    }
                }
                (
                    Released::HandedOver {
                        token,
                        owner: to,
                        lease,
                    },
                    next,
                ) => {
                    if to.starts_with(&self.inner.owner_prefix) {
                        // One of ours that queued in Redis: if it left meanwhile, its leaving
                        // gives the lock back.
                        let wake = Wake::Granted {
                            token: *token,
                            since: Some(sent),
                            lease: *lease,
                            local_run: 0,
                        };
                        self.inner.waiters.deliver(keys.tag(), to, wake);
                    }
                    if let Some(next) = next {
                        // The script put it in Redis' queue behind `to`.
                        let wake = Wake::Queued {
                            retry_after: *lease,
                            since: sent,
                        };
                        if let Err(Left::Empty) = self.inner.waiters.deliver_to(&next, wake) {
                            runs.push((next.owner().to_owned(), true, LOCAL_RUN));
                        }
                    }
                }
                (Released::NotOurs | Released::Freed, next) => {
                    if next.is_some() {
                        self.inner.waiters.wake_head(keys.tag());
                    }
                }
            }
            first.get_or_insert((released, reply_lost));
        }
        first.ok_or_else(|| Error::Connection("no release was attempted".into()))
    }
}

/// Bounds the rounds of one release: see [`LockClient::hand_over`].
const MAX_HANDOVERS: usize = 64;

/// How one round of waiting ended.
enum Round {
    Granted(LockGuard),
    Deadline,
    /// A handoff reached us too late to be used.
    Stale,
}

/// How a waiter came by its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Its own attempt; `queued` if it may still stand in Redis' queue all the same.
    Attempt { queued: bool },
    /// A release handed it over, setting the lease to `granted`; see `Grant::local_run`.
    Handoff { granted: Duration, local_run: u32 },
}

/// The grant a wake carries, if it is one: its token, the earliest its lease can have started
/// (`earliest` unless the release that handed it over says), and how it came.
fn handed(wake: Wake, earliest: Instant) -> Option<(FencingToken, Instant, Via)> {
    match wake {
        Wake::Granted {
            token,
            since,
            lease,
            local_run,
        } => Some((
            token,
            since.unwrap_or(earliest),
            Via::Handoff {
                granted: lease,
                local_run,
            },
        )),
        _ => None,
    }
}

/// A waiter's state between attempts.
struct Wait {
    ticket: Ticket,
    /// When we first may have entered Redis' queue: our first attempt, or the release of ours
    /// that queued us. `None`: we never did, unless a release named us (see `Ticket::leave`).
    queued_since: Option<Instant>,
    joined: Instant,
}

impl Wait {
    /// No handoff from Redis' queue can have reached us before this. Never moved forward: a
    /// handoff message can arrive late, after later attempts of ours.
    fn since(&self) -> Instant {
        self.queued_since.unwrap_or(self.joined)
    }
}

fn is_ready(cancel: &Receiver<()>) -> bool {
    !matches!(cancel.try_recv(), Err(TryRecvError::Empty))
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
