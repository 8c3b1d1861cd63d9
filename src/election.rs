//! Leader election over a lock, as etcd's `concurrency.Election` and Curator's `LeaderLatch`
//! offer it, with the lock's fencing token as the epoch.
//!
//! An election is a lock on a key of its own (no lock key names the same Redis keys), so
//! candidates wait, are renewed, lose and hand over exactly as lock callers do: first come, first
//! served, without polling, the next candidate taking over at a resignation's release or within
//! about a lease of a leader's crash. What an election adds lies beside the lock:
//!
//! | Redis key or channel | holds |
//! |---|---|
//! | the lock, fence counter and queue | those of a lock whose tag is `%election:<name>` |
//! | `<namespace>:leader:{<tag>}` (a HASH) | the leader's last proclamation: owner id, epoch, seq, value |
//! | channel `<namespace>:leader:{<tag>}` | `leader <epoch> <seq> <pttl> <value>` at each proclamation, `resigned <epoch> <seq>` at a resignation |
//!
//! | state | lock | record | `leader()` |
//! |---|---|---|---|
//! | nobody campaigns | free | absent, or a past leader's | `None` |
//! | a candidate was just granted | the candidate's | absent, or a past leader's | `None` |
//! | leading | the leader's | the leader's, its last proclamation | `Some(epoch, value)` |
//! | the leader resigned | released (handed on) | deleted first | `None`, then the next leader |
//! | the leader crashed or froze | the leader's until its lease runs out | the leader's | the leader, then `None` or the next |
//!
//! A leadership begins when its first proclamation is recorded: [`Election::campaign`] returns
//! after it. Who leads is read in one script that compares the record's owner with the lock's,
//! so a record left by a leader that died never names anybody.

mod observer;

pub use observer::Observer;

use std::fmt;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::key::{leader_record, LockKeys};
use crate::metrics::{self, Since};
use crate::options::{Deadline, LockOptions};
use crate::scripts::{Leading, Proclamation};
use crate::shared::Shared;
use crate::token::FencingToken;

/// Longest value a leader may advertise, in bytes: every observer receives it with each change.
pub const MAX_LEADER_VALUE_LEN: usize = 64 * 1024;

/// One election, by name, among every process whose client has the same namespace: campaign to
/// lead it, read who leads, observe each change. Made by
/// [`LockClient::election`](crate::LockClient::election); cheap to clone.
///
/// The leader's [`epoch`](Leadership::epoch) is a [`FencingToken`] that rises with every new
/// leadership, so storage that keeps the highest epoch it accepted refuses a deposed leader that
/// stalled and woke up ([`FencedRedis`](crate::FencedRedis), or the SQL pattern in the README).
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let election = client.election("scheduler")?;
///
/// // Blocks until this process leads.
/// let leadership = election.campaign("node-a:8080")?;
/// println!("leading, epoch {}", leadership.epoch());
///
/// // Elsewhere: who leads now.
/// if let Some(leader) = election.leader()? {
///     println!("{} leads with epoch {}", leader.value(), leader.epoch());
/// }
///
/// leadership.resign()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    keys: LockKeys,
    /// Both the record's key and the observers' channel.
    record: String,
}

impl Election {
    pub(crate) fn new(shared: Arc<Shared>, keys: LockKeys) -> Election {
        let record = leader_record(&keys);
        Election {
            inner: Arc::new(Inner {
                shared,
                keys,
                record,
            }),
        }
    }

    /// The election's name, as given to [`LockClient::election`](crate::LockClient::election).
    pub fn name(&self) -> &str {
        self.inner.keys.user()
    }

    /// Campaigns until this process leads, then proclaims `value` (what observers and
    /// [`leader`](Election::leader) report: an address, a node name) and returns the
    /// leadership. Candidates are served first come, first served; the renewal thread keeps the
    /// leadership's lease alive until it is resigned or dropped.
    ///
    /// A thread that campaigns while it holds a [`Leadership`] of the same election waits for
    /// itself, as a thread locking a key whose guard it holds does: bound such a campaign with
    /// [`try_campaign`](Election::try_campaign).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE_LEN`]; otherwise as
    /// for [`LockClient::lock`](crate::LockClient::lock).
    pub fn campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_with(value, &LockOptions::new())
    }

    /// [`campaign`](Election::campaign) for at most `timeout`: `Ok(None)` if this process did
    /// not come to lead by then.
    ///
    /// # Errors
    /// As for [`campaign`](Election::campaign).
    pub fn try_campaign(&self, value: &str, timeout: Duration) -> Result<Option<Leadership>> {
        self.try_campaign_with(value, timeout, &LockOptions::new())
    }

    /// [`campaign`](Election::campaign) with [`LockOptions`]: a lease of the leadership's own, a
    /// maximum term ([`max_hold`](LockOptions::max_hold)), a cancel channel that ends the
    /// campaign with [`Error::Cancelled`].
    ///
    /// # Errors
    /// As for [`campaign`](Election::campaign); [`Error::Cancelled`] when cancelled.
    pub fn campaign_with(&self, value: &str, options: &LockOptions) -> Result<Leadership> {
        loop {
            if let Some(leadership) = self.run_campaign(value, Deadline::Never, options)? {
                return Ok(leadership);
            }
        }
    }

    /// [`try_campaign`](Election::try_campaign) with [`LockOptions`].
    ///
    /// # Errors
    /// As for [`campaign_with`](Election::campaign_with).
    pub fn try_campaign_with(
        &self,
        value: &str,
        timeout: Duration,
        options: &LockOptions,
    ) -> Result<Option<Leadership>> {
        self.run_campaign(value, Deadline::within(timeout), options)
    }

    /// Who leads now, read from Redis (a majority of a quorum's masters): `None` while nobody
    /// does, including the moment between a candidate's grant and its first proclamation.
    ///
    /// On a quorum, a proclamation that reached only some masters (its `proclaim` failed) may
    /// show in one read and not in the next; an [`Observer`] never reports such a step back.
    ///
    /// # Errors
    /// Connection errors and timeouts, as for any call.
    pub fn leader(&self) -> Result<Option<Leader>> {
        let inner = &self.inner;
        let who = inner.shared.engine.leader(&inner.keys, &inner.record)?;
        Ok(who.leading().map(Leader::from))
    }

    /// Starts observing the election: [`Observer::changes`] delivers who leads now, then every
    /// change of leader or of its value, in order, as it happens. See [`Observer`].
    ///
    /// # Errors
    /// [`Error::Connection`] if the observer's thread could not be started. Redis being
    /// unreachable is no error: the observer reports the leader once it can read it.
    pub fn observe(&self) -> Result<Observer> {
        Observer::start(self.clone())
    }

    /// Leads, does `work`, and campaigns again, in the manner of Curator's `LeaderSelector`:
    /// campaigns with `value`, runs `work` with the [`Leadership`], resigns when `work`
    /// returns, and then either returns `work`'s [`ControlFlow::Break`] value or, on
    /// [`ControlFlow::Continue`], joins the back of the queue and campaigns again.
    ///
    /// `work` should watch [`Leadership::lost`] (or check [`Leadership::is_leader`]) and return
    /// `Continue` soon after the leadership is lost: nothing can stop it from outside. A panic
    /// in `work` resigns too (the leadership is dropped) and goes on up.
    ///
    /// ```no_run
    /// use std::ops::ControlFlow;
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let election = client.election("scheduler")?;
    /// let ticks = election.run_while_leader("node-a", &fencelock::LockOptions::new(), |lead| {
    ///     let mut ticks = 0;
    ///     // Work in steps, each fenced by the epoch, until the leadership is lost.
    ///     while lead.lost().recv_timeout(Duration::from_secs(1)).is_err() {
    ///         ticks += 1;
    ///         println!("tick {ticks} as leader of epoch {}", lead.epoch());
    ///         if ticks == 10 {
    ///             return ControlFlow::Break(ticks);
    ///         }
    ///     }
    ///     ControlFlow::Continue(()) // lost: campaign again
    /// })?;
    /// # let _ = ticks;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A campaign that fails for a passing reason (Redis unreachable or not answering, a
    /// failover under way, a proclamation not replicated in time) is logged and tried again
    /// after a pause (100 ms, doubling to 5 s), as Curator's `autoRequeue` does; any other
    /// error ends the loop: [`Error::Cancelled`] through the options' cancel channel (which
    /// also ends a pause), [`Error::InvalidArgument`], [`Error::Rejected`] (a wrong password,
    /// say). A resignation that fails is logged: the leadership's lease ends it anyway.
    pub fn run_while_leader<T>(
        &self,
        value: &str,
        options: &LockOptions,
        mut work: impl FnMut(&Leadership) -> ControlFlow<T>,
    ) -> Result<T> {
        let mut pause = FIRST_RETRY;
        loop {
            let leadership = match self.campaign_with(value, options) {
                Ok(leadership) => leadership,
                Err(e) if passing(&e) => {
                    log::warn!(
                        "fencelock: campaigning in election {:?} failed; trying again in \
                         {pause:?}: {e}",
                        self.name()
                    );
                    let cancelled = match &options.cancel {
                        Some(cancel) => !matches!(
                            cancel.recv_timeout(pause),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout)
                        ),
                        None => {
                            std::thread::sleep(pause);
                            false
                        }
                    };
                    if cancelled {
                        return Err(Error::Cancelled);
                    }
                    pause = (pause * 2).min(MAX_RETRY);
                    continue;
                }
                Err(e) => return Err(e),
            };
            pause = FIRST_RETRY;
            let flow = work(&leadership);
            if let Err(e) = leadership.resign() {
                if !e.is_lock_lost() {
                    log::warn!(
                        "fencelock: resigning from election {:?} failed; its lease ends it: {e}",
                        self.name()
                    );
                }
            }
            if let ControlFlow::Break(done) = flow {
                return Ok(done);
            }
        }
    }

    /// Takes the election's lock, then proclaims: `None` at the deadline. A grant lost before
    /// its first proclamation is campaigned for again while the deadline allows.
    fn run_campaign(
        &self,
        value: &str,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<Leadership>> {
        validate_value(value)?;
        loop {
            let Some(guard) = self.take(deadline, options)? else {
                return Ok(None);
            };
            let leadership = Leadership {
                guard,
                resigned: false,
                election: self.clone(),
                seq: Mutex::new(0),
                value: Mutex::new(String::new()),
            };
            match leadership.proclaim(value) {
                Ok(()) => return Ok(Some(leadership)),
                Err(e) if e.is_lock_lost() => {
                    let passed = match deadline {
                        Deadline::Now => true,
                        Deadline::At(at) => Instant::now() >= at,
                        Deadline::Never => false,
                    };
                    if passed {
                        return Ok(None);
                    }
                }
                // Dropping the leadership resigns and releases.
                Err(e) => return Err(e),
            }
        }
    }
}

impl Election {
    /// Takes the election's lock as a lock call takes a key: the options checked, the wait
    /// recorded in the metrics as a lock call's.
    fn take(&self, deadline: Deadline, options: &LockOptions) -> Result<Option<LockGuard>> {
        let shared = &self.inner.shared;
        let called = Since::now();
        let result = options
            .validate()
            .and_then(|()| {
                if options.is_cancelled() {
                    Err(Error::Cancelled)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| {
                let lease = options.lease.unwrap_or(shared.config.lease);
                let keys = self.inner.keys.clone();
                let grant = shared.engine.acquire(keys, lease, deadline, options)?;
                Ok(grant.map(|grant| LockGuard::new(Arc::clone(shared), grant)))
            });
        metrics::acquired(&shared.config.namespace, called, &result);
        result
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// This process leads an election: made by [`Election::campaign`]. Resigns when dropped;
/// [`resign`](Leadership::resign) resigns and reports how that went.
///
/// Like a [`LockGuard`](crate::LockGuard), it owns what it needs and can move between threads;
/// while it lives the client's renewal thread keeps its lease alive, and if the lease is lost
/// anyway [`is_leader`](Leadership::is_leader) turns false and [`lost`](Leadership::lost) fires.
#[must_use = "if unused the leadership is resigned at once"]
#[clippy::has_significant_drop]
pub struct Leadership {
    guard: LockGuard,
    /// Set by `resign`: the drop has nothing left to do.
    resigned: bool,
    election: Election,
    /// The seq of the last proclamation; held across a proclamation, so that proclamations
    /// are recorded in the order they were made.
    seq: Mutex<u64>,
    /// The value of the last proclamation that stood.
    value: Mutex<String>,
}

impl Leadership {
    /// The epoch of this leadership: a fencing token strictly above every earlier
    /// leadership's of this election. Pass it to storage, as a lock's token, so that a deposed
    /// leader's late writes are refused.
    pub fn epoch(&self) -> FencingToken {
        self.guard.token()
    }

    /// Whether this process still leads: `false` once the leadership is known lost (its lease
    /// ran out while renewal could not reach Redis, say), as
    /// [`LockGuard::is_held`](crate::LockGuard::is_held).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Fires (a message, then disconnection) once the leadership is known lost, as
    /// [`LockGuard::lost`](crate::LockGuard::lost).
    pub fn lost(&self) -> &Receiver<()> {
        self.guard.lost()
    }

    /// What this leader advertises: the value of its last proclamation that stood.
    pub fn value(&self) -> String {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The election led.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// Changes what this leader advertises; the epoch stays. Observers see the new value in
    /// order with every other change.
    ///
    /// # Errors
    /// [`Error::LockLost`] if this process no longer leads (nothing is recorded then);
    /// [`Error::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE_LEN`]; connection
    /// errors and timeouts as for any call (the value may or may not have been recorded).
    pub fn proclaim(&self, value: &str) -> Result<()> {
        validate_value(value)?;
        let guard = &self.guard;
        let mut seq = self.seq.lock().unwrap_or_else(PoisonError::into_inner);
        let election = &self.election.inner;
        let next = *seq + 1;
        let p = Proclamation {
            owner: guard.grant().keys.owner(),
            epoch: guard.token(),
            seq: next,
            value,
        };
        let stands = election
            .shared
            .engine
            .proclaim(&election.keys, &election.record, &p);
        // Counted even when the outcome is unknown: the next proclamation must rise above one
        // that may have been recorded.
        *seq = next;
        if stands? {
            value.clone_into(&mut self.value.lock().unwrap_or_else(PoisonError::into_inner));
            Ok(())
        } else {
            guard
                .grant()
                .mark_lost("its election's lock belongs to another owner");
            Err(Error::LockLost {
                key: self.election.name().to_owned(),
            })
        }
    }

    /// Stops leading: withdraws the record (observers hear of it), then releases the lock,
    /// which goes to the next candidate at once.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the leadership had been lost already; connection errors and
    /// timeouts as for [`LockGuard::unlock`](crate::LockGuard::unlock), after which the lease
    /// ends the leadership.
    pub fn resign(mut self) -> Result<()> {
        self.resigned = true;
        let election = &self.election.inner;
        let withdrawn = election.shared.engine.resign(
            &election.keys,
            &election.record,
            self.guard.grant().keys.owner(),
        );
        let released = self.guard.release_now();
        withdrawn.and(released)
    }
}

/// Resigns, best effort: the record is withdrawn while Redis answers (failures logged at
/// debug), and the lock released as a [`LockGuard`](crate::LockGuard)'s drop releases it.
impl Drop for Leadership {
    fn drop(&mut self) {
        if self.resigned {
            return;
        }
        let election = &self.election.inner;
        let engine = &election.shared.engine;
        let owner = self.guard.grant().keys.owner();
        if self.guard.is_held() && !engine.unreachable(&election.keys) {
            if let Err(e) = engine.resign(&election.keys, &election.record, owner) {
                log::debug!(
                    "fencelock: withdrawing the record of election {:?} failed: {e}",
                    self.election.name()
                );
            }
        }
        // The guard's own drop releases the lock.
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.name())
            .field("epoch", &self.guard.token())
            .field("leader", &self.guard.is_held())
            .finish_non_exhaustive()
    }
}

/// Who leads an election: the value its leader proclaimed, and the leadership's epoch. From
/// [`Election::leader`] and [`Observer::changes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    epoch: FencingToken,
    value: String,
}

impl Leader {
    /// The leadership's epoch: its fencing token.
    pub fn epoch(&self) -> FencingToken {
        self.epoch
    }

    /// What the leader proclaimed last.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl From<Leading> for Leader {
    fn from(l: Leading) -> Leader {
        Leader {
            epoch: l.epoch,
            value: l.value,
        }
    }
}

/// The pauses of [`Election::run_while_leader`] after a campaign that failed for a passing
/// reason.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Whether a campaign's error may pass by itself: an outage, a failover, a slow replica.
fn passing(e: &Error) -> bool {
    e.is_connection()
        || e.is_timeout()
        || e.is_not_writable()
        || e.is_not_replicated()
        || e.is_pool_exhausted()
}

fn validate_value(value: &str) -> Result<()> {
    if value.len() > MAX_LEADER_VALUE_LEN {
        return Err(Error::invalid(
            "leader value",
            format!(
                "is {} bytes long, the maximum is {MAX_LEADER_VALUE_LEN}",
                value.len()
            ),
        ));
    }
    Ok(())
}
