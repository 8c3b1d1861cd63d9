//! The state of one grant, shared by its guard and the renewal thread.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::key::LockKeys;
use crate::metrics::{self, Since};
use crate::token::FencingToken;

pub(crate) struct Grant {
    /// Unique within the client; names the grant to the renewal thread.
    pub(crate) id: u64,
    /// The key's names, and the owner id stored at the lock key (`LockKeys::owner`).
    pub(crate) keys: LockKeys,
    pub(crate) token: FencingToken,
    /// Whether the renewal thread keeps the lease alive (`LockOptions::renew`).
    pub(crate) auto_renew: bool,
    /// Renewal stops here (`LockOptions::max_hold`); the lease then runs out.
    pub(crate) renew_until: Option<Instant>,
    /// The owner id may still stand in the key's queue in Redis (a release queued it while its
    /// own attempt was granted): the release takes the entry out.
    pub(crate) queued: bool,
    /// How many releases in a row handed this lock from one thread of this client to the next
    /// ahead of other clients' waiters, this grant's included (see `MAX_LOCAL_RUN` in
    /// `one_master/wait.rs`). It travels with the lock, not with the key's local queue, which
    /// empties between turns.
    pub(crate) local_run: u32,
    /// When the guard was made, for the hold time (`metrics`).
    pub(crate) granted_at: Since,
    /// What the round trips that confirmed the lease (the grant, renewals, extends) tell.
    lease: Mutex<Lease>,
    lost: AtomicBool,
    /// Set when the guard starts releasing: loss found after that is not news to anyone.
    ended: AtomicBool,
    /// The sending end of the guard's `lost()` channel, made when the holder first asks for it
    /// (most never do, and a channel is most of a grant's memory). Sent to once and dropped
    /// when the grant is lost.
    lost_tx: Mutex<Option<Sender<()>>>,
    /// A loss signal this grant shares with the other grants of a set (`MultiGuard::lost`), set
    /// when the holder of the set first asks for it; fired on loss as `lost_tx` is.
    shared_lost: Mutex<Option<SharedLoss>>,
    /// Where the renewal thread files the grant; only that thread uses it.
    pub(crate) place: CohortSlot,
    /// The client's waiters: a thread of ours queued for this key waits for our release, which
    /// hands the lock to it; if the lock is lost instead, the loss wakes it to ask Redis.
    waiters: Weak<dyn Waiting>,
}

/// Who hears of a grant's loss besides its holder: the client's waiters for its key, whose head
/// then asks Redis at once rather than wait for a release that will not come.
pub(crate) trait Waiting: Send + Sync {
    fn wake_head(&self, tag: &str);
}

/// For grants whose loss wakes nobody.
pub(crate) fn nobody() -> Weak<dyn Waiting> {
    struct Nobody;
    impl Waiting for Nobody {
        fn wake_head(&self, _: &str) {}
    }
    Weak::<Nobody>::new()
}

/// One loss signal for several grants: the first of them to be lost sends on it and drops the
/// sender, so the receiver hears one `()` and then disconnects, however many are lost. Each grant
/// fires it as it fires its own signal, so a set of grants needs no thread of its own to watch
/// them.
#[derive(Clone)]
pub(crate) struct SharedLoss(Arc<Mutex<Option<Sender<()>>>>);

impl SharedLoss {
    /// A signal no grant fires yet, and its receiving end.
    pub(crate) fn new() -> (SharedLoss, Receiver<()>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        (SharedLoss(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    fn fire(&self) {
        let tx = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(tx) = tx {
            let _ = tx.try_send(());
        }
    }
}

/// The renewal thread's cohort of a grant and its index there. Atomics only so that `Grant` stays
/// `Sync`: one thread reads and writes them, so relaxed is enough.
pub(crate) struct CohortSlot {
    cohort: AtomicU64,
    index: AtomicUsize,
}

impl Default for CohortSlot {
    fn default() -> CohortSlot {
        CohortSlot {
            cohort: AtomicU64::new(CohortSlot::NONE),
            index: AtomicUsize::new(0),
        }
    }
}

impl CohortSlot {
    /// Not filed (yet, or any more); no cohort has this id.
    pub(crate) const NONE: u64 = u64::MAX;

    /// Where the grant was filed, and it is not filed any more.
    pub(crate) fn take(&self) -> (u64, usize) {
        (
            self.cohort.swap(CohortSlot::NONE, Ordering::Relaxed),
            self.index.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn set(&self, cohort: u64, index: usize) {
        self.cohort.store(cohort, Ordering::Relaxed);
        self.index.store(index, Ordering::Relaxed);
    }
}

/// A grant's lease as this process knows it.
///
/// Redis never shortens a lease (extend.lua re-arms only a lease that would end sooner), so the
/// key's expiry only moves forward while the lock is ours, and every confirmed round trip sent
/// at `sent` that set `lease` proves the lease runs at least until `sent + lease`, whatever order
/// Redis applied them in (a delayed extend on a dropped connection included). The local
/// deadline is the latest of those ends, less the drift margin.
#[derive(Clone, Copy)]
struct Lease {
    /// The latest-sent confirmed round trip and the lease it set: renewals fall due a third of
    /// that lease after it.
    sent: Instant,
    lease: Duration,
    /// What renewals re-arm: the lease asked for at the grant, or by the last explicit extend.
    /// More than `lease` after a handoff capped at `scripts::HANDOFF_LEASE`.
    renew: Duration,
    deadline: Instant,
}

/// The local deadline of a lease confirmed by a round trip sent at `sent`.
pub(crate) fn deadline_of(sent: Instant, lease: Duration) -> Instant {
    sent + lease.saturating_sub(drift_margin(lease))
}

/// How much earlier than Redis the local deadline gives up the lock: Redis' own Redlock margin,
/// 2 ms plus 1% of the lease, for clock rate differences and expiry granularity.
pub(crate) fn drift_margin(lease: Duration) -> Duration {
    Duration::from_millis(2) + lease / 100
}

/// What a new grant is made of: the facts its acquire or handoff established.
pub(crate) struct NewGrant {
    pub(crate) keys: LockKeys,
    pub(crate) token: FencingToken,
    /// When the round trip that granted it was sent (no later than Redis set the lease), and the
    /// lease Redis set then.
    pub(crate) sent: Instant,
    pub(crate) granted: Duration,
    /// The lease the holder asked for: what renewals re-arm.
    pub(crate) lease: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) queued: bool,
    pub(crate) local_run: u32,
}

impl Grant {
    /// `id` names the grant to the renewal thread; the head of `waiters`' queue for its key is
    /// woken if it is lost.
    pub(crate) fn new(id: u64, new: NewGrant, waiters: Weak<dyn Waiting>) -> Grant {
        let NewGrant {
            keys,
            token,
            sent,
            granted,
            lease,
            auto_renew,
            max_hold,
            queued,
            local_run,
        } = new;
        Grant {
            id,
            keys,
            token,
            auto_renew,
            renew_until: max_hold.and_then(|d| sent.checked_add(d)),
            queued,
            local_run,
            granted_at: Since::now(),
            lease: Mutex::new(Lease {
                sent,
                lease: granted,
                renew: lease,
                deadline: deadline_of(sent, granted),
            }),
            lost: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            lost_tx: Mutex::new(None),
            shared_lost: Mutex::new(None),
            place: CohortSlot::default(),
            waiters,
        }
    }

    /// A new grant, held: `renew` hands it to the engine's renewal thread. That thread outlives
    /// every guard, so this fails only if it died: then nothing will renew the lease, and the
    /// holder hears so now, not at the deadline.
    pub(crate) fn held(
        id: u64,
        new: NewGrant,
        waiters: Weak<dyn Waiting>,
        renew: impl FnOnce(Arc<Grant>) -> bool,
    ) -> Arc<Grant> {
        log::debug!(
            "fencelock: granted {:?} with token {}",
            new.keys.user(),
            new.token
        );
        let grant = Arc::new(Grant::new(id, new, waiters));
        if !renew(Arc::clone(&grant)) {
            grant.mark_lost("the renewal thread is gone");
        }
        grant
    }

    /// A channel that fires when the grant is lost, or at once if it already is.
    pub(crate) fn watch(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut slot = self.lost_tx.lock().unwrap_or_else(PoisonError::into_inner);
        // mark_lost sets the flag before it takes the slot, so a loss either shows here or finds
        // the sender in the slot.
        if self.lost.load(Ordering::Acquire) {
            let _ = tx.try_send(());
        } else {
            *slot = Some(tx);
        }
        rx
    }

    /// Makes a loss of this grant fire `signal` too, at once if it is lost already.
    pub(crate) fn watch_shared(&self, signal: &SharedLoss) {
        let mut slot = self
            .shared_lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // As in `watch`: a loss either shows here or finds the signal in the slot.
        if self.lost.load(Ordering::Acquire) {
            signal.fire();
        } else {
            *slot = Some(signal.clone());
        }
    }

    fn state(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease renewals re-arm.
    pub(crate) fn renewal_lease(&self) -> Duration {
        self.state().renew
    }

    /// The lease the latest confirmation set, and the local deadline.
    pub(crate) fn lease_and_deadline(&self) -> (Duration, Instant) {
        let state = self.state();
        (state.lease, state.deadline)
    }

    /// When the lease is next due for renewal: a third of a lease after its latest confirmation.
    pub(crate) fn next_renewal(&self) -> Instant {
        let state = self.state();
        state.sent + state.lease / 3
    }

    /// A renewal or extend sent at `sent`, setting `lease`, succeeded; its reply came no later
    /// than `now`. Returns false, and marks the grant lost, if the local deadline passed before
    /// then: once `is_held()` could have said false, it must never say true again.
    pub(crate) fn confirm(&self, sent: Instant, lease: Duration, now: Instant) -> bool {
        let mut state = self.state();
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        if now >= state.deadline {
            drop(state);
            self.mark_lost("its lease ran out before a renewal was confirmed");
            return false;
        }
        // Redis applied it no earlier than `sent`, and no extend shortens a lease since: the
        // key lives until `sent + lease` at least, whatever came before or after it.
        state.deadline = state.deadline.max(deadline_of(sent, lease));
        if sent >= state.sent {
            state.sent = sent;
            state.lease = lease;
        }
        true
    }

    /// An explicit extend to `lease` was confirmed: renewals re-arm that much from now on.
    pub(crate) fn renew_with(&self, lease: Duration) {
        self.state().renew = lease;
    }

    /// The local end of the lease, on the monotonic clock.
    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// Loss is one-way: past the deadline the grant is marked lost, by whoever notices first.
    pub(crate) fn is_held(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        if Instant::now() >= self.deadline() {
            self.mark_lost("its lease ran out before a renewal was confirmed");
            return false;
        }
        true
    }

    /// Marks the grant lost and fires the guard's signal, once; logs a warning unless the guard
    /// is already releasing. Returns whether this call was the one that marked it.
    pub(crate) fn mark_lost(&self, why: &str) -> bool {
        if self.lost.swap(true, Ordering::AcqRel) {
            return false;
        }
        metrics::lost(&self.keys);
        if !self.ended.load(Ordering::Acquire) {
            log::warn!(
                "fencelock: lost the lock on {:?} (token {}): {why}",
                self.keys.user(),
                self.token
            );
        }
        if let Some(tx) = self
            .lost_tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = tx.try_send(());
        }
        if let Some(signal) = self
            .shared_lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            signal.fire();
        }
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.wake_head(self.keys.tag());
        }
        true
    }

    /// The holder gives the grant up: loss found after this is not news to anyone. Returns
    /// whether it was held until now.
    pub(crate) fn end(&self) -> bool {
        let was_held = self.is_held();
        metrics::held(&self.keys, self.granted_at);
        self.ended.store(true, Ordering::Release);
        was_held
    }
}
