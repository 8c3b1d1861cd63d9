//! The state of one grant, shared by its guard and the renewal thread.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::key::LockKeys;
use crate::token::FencingToken;
use crate::wait::Waiters;

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
    /// The last round trip that confirmed the lease (the grant, a renewal or an extend): when it
    /// was *sent*, and the lease it set. Redis set the TTL no earlier than the send, so the lease
    /// runs at least until `sent + lease`.
    confirmed: Mutex<Confirmed>,
    lost: AtomicBool,
    /// Set when the guard starts releasing: loss found after that is not news to anyone.
    ended: AtomicBool,
    /// The sending end of the guard's `lost()` channel, made when the holder first asks for it
    /// (most never do, and a channel is most of a grant's memory). Sent to once and dropped
    /// when the grant is lost.
    lost_tx: Mutex<Option<Sender<()>>>,
    /// Where the renewal thread files the grant; only that thread uses it.
    pub(crate) place: Place,
    /// The client's waiters: a thread of ours queued for this key waits for our release, which
    /// hands the lock to it; if the lock is lost instead, the loss wakes it to ask Redis.
    waiters: Weak<Waiters>,
}

/// The renewal thread's cohort of a grant and its index there. Atomics only so that `Grant` stays
/// `Sync`: one thread reads and writes them, so relaxed is enough.
pub(crate) struct Place {
    cohort: AtomicU64,
    index: AtomicUsize,
}

impl Default for Place {
    fn default() -> Place {
        Place {
            cohort: AtomicU64::new(Place::NONE),
            index: AtomicUsize::new(0),
        }
    }
}

impl Place {
    /// Not filed (yet, or any more); no cohort has this id.
    pub(crate) const NONE: u64 = u64::MAX;

    /// Where the grant was filed, and it is not filed any more.
    pub(crate) fn take(&self) -> (u64, usize) {
        (
            self.cohort.swap(Place::NONE, Ordering::Relaxed),
            self.index.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn set(&self, cohort: u64, index: usize) {
        self.cohort.store(cohort, Ordering::Relaxed);
        self.index.store(index, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
struct Confirmed {
    sent: Instant,
    lease: Duration,
}

fn local_deadline(c: Confirmed) -> Instant {
    deadline_of(c.sent, c.lease)
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

impl Grant {
    #[allow(clippy::too_many_arguments)] // one call site, each argument a distinct fact of the grant
    pub(crate) fn new(
        id: u64,
        keys: LockKeys,
        token: FencingToken,
        lease: Duration,
        sent: Instant,
        auto_renew: bool,
        max_hold: Option<Duration>,
        queued: bool,
        waiters: Weak<Waiters>,
    ) -> Grant {
        Grant {
            id,
            keys,
            token,
            auto_renew,
            renew_until: max_hold.and_then(|d| sent.checked_add(d)),
            queued,
            confirmed: Mutex::new(Confirmed { sent, lease }),
            lost: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            lost_tx: Mutex::new(None),
            place: Place::default(),
            waiters,
        }
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

    fn confirmed(&self) -> Confirmed {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease the last confirmation set; renewals re-arm this much.
    pub(crate) fn lease(&self) -> Duration {
        self.confirmed().lease
    }

    /// The lease the last confirmation set, and the local deadline it gives.
    pub(crate) fn lease_and_deadline(&self) -> (Duration, Instant) {
        let confirmed = self.confirmed();
        (confirmed.lease, local_deadline(confirmed))
    }

    /// When the lease is next due for renewal: a third of a lease after its last confirmation.
    pub(crate) fn next_renewal(&self) -> Instant {
        let confirmed = self.confirmed();
        confirmed.sent + confirmed.lease / 3
    }

    /// A renewal or extend sent at `sent`, setting `lease`, succeeded; its reply came no later
    /// than `now`. Returns false, and marks the grant lost, if the local deadline passed before
    /// then: once `is_held()` could have said false, it must never say true again.
    pub(crate) fn confirm(&self, sent: Instant, lease: Duration, now: Instant) -> bool {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        if now >= local_deadline(*confirmed) {
            drop(confirmed);
            self.mark_lost("its lease ran out before a renewal was confirmed");
            return false;
        }
        // All extends of a grant go out on the renewal thread's one connection, in order, so the
        // latest sent is the one Redis applied last.
        if sent >= confirmed.sent {
            *confirmed = Confirmed { sent, lease };
        }
        true
    }

    /// An extend to `lease` sent at `sent` may or may not have run (its reply was lost). Brings
    /// the local deadline forward if that extend, had it run, ended the lease sooner; returns
    /// whether it did.
    pub(crate) fn limit(&self, sent: Instant, lease: Duration) -> bool {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if deadline_of(sent, lease) >= local_deadline(*confirmed) {
            return false;
        }
        *confirmed = Confirmed { sent, lease };
        true
    }

    /// The local end of the lease, on the monotonic clock.
    pub(crate) fn deadline(&self) -> Instant {
        local_deadline(self.confirmed())
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
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.wake_head(self.keys.tag());
        }
        true
    }

    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}
