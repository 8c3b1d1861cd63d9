//! The renewal thread's books, with no I/O and no clock of their own.
//!
//! A [`Schedule`] knows which grants are tracked, when each falls due for renewal and by when
//! each must have been confirmed. Every method that depends on the time takes it as `now`, and
//! none waits or talks to Redis: it answers what to do (the grants due, grouped into pipelines;
//! the grants lost, and why) and is told what the round trips brought back. The thread in
//! `renewal.rs` does the rest: the inbox, the connections, the wire.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::grant::{deadline_of, Grant};

/// Most extend calls in one pipeline (one round trip).
pub(super) const BATCH: usize = 1000;

/// Grants renewed by one round trip, or taken in together: they fall due for renewal at the same
/// time. Bookkeeping per cohort rather than per grant keeps a renewal tick to a walk over a few
/// vectors: 10,000 leases renewed in 10 pipelines make 10 cohorts.
struct Cohort {
    /// When its leases fall due for renewal; `None` when they are not renewed.
    next: Option<Instant>,
    /// No member's local deadline is earlier.
    deadline: Instant,
    /// A sixth of the shortest lease: leases due this much later go in the same round trip.
    window: Duration,
    /// Each member's `Grant::place` says where in here it stands.
    members: Vec<Arc<Grant>>,
}

/// Every grant the renewal thread tracks, filed in cohorts by next renewal and by deadline.
#[derive(Default)]
pub(super) struct Schedule {
    held: HashMap<u64, Arc<Grant>>,
    cohorts: HashMap<u64, Cohort>,
    next_cohort: u64,
    /// `(next renewal, cohort)` of every cohort that is renewed.
    renewals: BTreeSet<(Instant, u64)>,
    /// `(deadline, cohort)` of every cohort.
    deadlines: BTreeSet<(Instant, u64)>,
}

/// The grants due for renewal at one tick, in pipelines.
pub(super) struct Round<N> {
    /// Up to [`BATCH`] grants each, all served by the node named.
    pub(super) pipelines: Vec<(N, Vec<Arc<Grant>>)>,
    /// No grant's local deadline is earlier.
    pub(super) earliest: Instant,
}

/// What one extend call came back with.
pub(super) enum Reply {
    /// Redis re-armed the lease.
    Extended,
    /// Redis reports the key gone or owned by another.
    Gone,
    /// Redis answered with an error, or with something that is not an answer to an extend.
    Refused(String),
    /// No answer was read: the extend may have run, or may not.
    Unknown,
}

/// A grant the schedule no longer tracks because its lock is lost; the thread marks it lost.
pub(super) struct Loss {
    pub(super) grant: Arc<Grant>,
    pub(super) why: Why,
}

/// Why a grant is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Why {
    /// Its local deadline passed while renewal was on and no renewal was confirmed.
    RanOut,
    /// Its local deadline passed and renewal was off for it.
    RenewalOff,
    /// Its local deadline passed after renewal stopped at `max_hold`.
    MaxHold,
    /// Redis reports the key gone or owned by another.
    Gone,
    /// Redis answered an extend with an error.
    Refused(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::RanOut => f.write_str("its lease ran out before a renewal was confirmed"),
            Why::RenewalOff => f.write_str("its lease ran out (renewal is off for it)"),
            Why::MaxHold => f.write_str("its maximum hold time passed, so renewal stopped"),
            Why::Gone => f.write_str("redis reports the key gone or owned by another"),
            Why::Refused(e) => write!(f, "redis refused to renew it: {e}"),
        }
    }
}

impl Schedule {
    /// Whether no grant is tracked.
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether the grant with this id is tracked.
    pub(super) fn tracks(&self, id: u64) -> bool {
        self.held.contains_key(&id)
    }

    /// When the next renewal or deadline falls: the latest the thread may sleep until.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        [self.renewals.first(), self.deadlines.first()]
            .into_iter()
            .flatten()
            .map(|(at, _)| *at)
            .min()
    }

    /// Stops tracking every grant, and hands them over.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Arc<Grant>> + '_ {
        self.cohorts.clear();
        self.renewals.clear();
        self.deadlines.clear();
        self.held.drain().map(|(_, grant)| grant)
    }

    /// Starts tracking new grants, filed together: each falls due at its own
    /// `Grant::next_renewal`, if it is renewed.
    pub(super) fn hold(&mut self, grants: Vec<Arc<Grant>>) {
        for grant in &grants {
            self.held.insert(grant.id, Arc::clone(grant));
        }
        self.file(grants, None);
    }

    /// Files tracked grants in new cohorts: those renewed fall due at `next` (each at its own
    /// `Grant::next_renewal` if `None`), the rest only have a deadline.
    fn file(&mut self, grants: Vec<Arc<Grant>>, next: Option<Instant>) {
        let (mut renewed, mut expiring) = (Vec::new(), Vec::new());
        let mut due: Option<Instant> = None;
        for grant in grants {
            let at = next.unwrap_or_else(|| grant.next_renewal());
            if grant.auto_renew && grant.renew_until.is_none_or(|until| at < until) {
                due = Some(due.map_or(at, |due| due.min(at)));
                renewed.push(grant);
            } else {
                expiring.push(grant);
            }
        }
        for (members, next) in [(renewed, due), (expiring, None)] {
            let (mut deadline, mut window) = (None::<Instant>, Duration::MAX);
            let id = self.next_cohort;
            for (index, grant) in members.iter().enumerate() {
                let (lease, ends) = grant.lease_and_deadline();
                deadline = Some(deadline.map_or(ends, |d| d.min(ends)));
                window = window.min(lease / 6);
                grant.place.set(id, index);
            }
            // No deadline: no members.
            if let Some(deadline) = deadline {
                self.next_cohort += 1;
                let cohort = Cohort {
                    next,
                    deadline,
                    window,
                    members,
                };
                self.register(id, cohort);
            }
        }
    }

    /// Puts a cohort whose members know their place in the schedule.
    fn register(&mut self, id: u64, cohort: Cohort) {
        if let Some(next) = cohort.next {
            self.renewals.insert((next, id));
        }
        self.deadlines.insert((cohort.deadline, id));
        self.cohorts.insert(id, cohort);
    }

    /// Takes a cohort out of the schedule, members and all.
    fn take_cohort(&mut self, id: u64) -> Option<Cohort> {
        let cohort = self.cohorts.remove(&id)?;
        if let Some(next) = cohort.next {
            self.renewals.remove(&(next, id));
        }
        self.deadlines.remove(&(cohort.deadline, id));
        Some(cohort)
    }

    /// Stops tracking a grant: it leaves the books entirely. O(1): its place says where it is.
    pub(super) fn forget(&mut self, id: u64) -> Option<Arc<Grant>> {
        let grant = self.held.remove(&id)?;
        let (cohort_id, index) = grant.place.take();
        let empty = match self.cohorts.get_mut(&cohort_id) {
            // The id check makes a stale place a no-op rather than the loss of another grant.
            Some(cohort) if cohort.members.get(index).is_some_and(|g| g.id == id) => {
                cohort.members.swap_remove(index);
                if let Some(moved) = cohort.members.get(index) {
                    moved.place.set(cohort_id, index);
                }
                cohort.members.is_empty()
            }
            _ => false,
        };
        if empty {
            self.take_cohort(cohort_id);
        }
        Some(grant)
    }

    /// Stops tracking the grants whose cohort's deadline passed by `now` and whose own deadline
    /// passed too, and returns them; the cohort's other members are filed anew.
    pub(super) fn expire_overdue(&mut self, now: Instant) -> Vec<Loss> {
        let mut lost = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let Some(cohort) = self.take_cohort(id) else {
                // Not a cohort (cannot happen): drop the stray entry rather than meet it again.
                self.deadlines.remove(&(deadline, id));
                continue;
            };
            // Members renewed on their own (an explicit extend) may have later deadlines.
            let alive = self.expire(cohort.members, now, &mut lost);
            if !alive.is_empty() {
                self.file(alive, cohort.next);
            }
        }
        lost
    }

    /// Takes out of the schedule every cohort due for renewal by `now`, and those due within
    /// their window after it, so that one round trip serves many; groups their grants into
    /// pipelines of up to [`BATCH`] per node, as `node_of` names it. `None` while nothing is due.
    pub(super) fn due<N: Ord + Copy>(
        &mut self,
        now: Instant,
        node_of: impl Fn(&Grant) -> N,
    ) -> Option<Round<N>> {
        // Only once a lease is due: a wake-up for the inbox renewing early would shift leases
        // into ever earlier phases, renewing each more often than every lease/3.
        if self.renewals.first().is_none_or(|(next, _)| *next > now) {
            return None;
        }
        let ids: Vec<u64> = self
            .renewals
            .iter()
            .map_while(|&(next, id)| {
                let window = self.cohorts.get(&id).map_or(Duration::ZERO, |c| c.window);
                (next <= now + window).then_some(id)
            })
            .collect();
        let mut due = Vec::new();
        let mut earliest = None::<Instant>;
        for id in ids {
            if let Some(cohort) = self.take_cohort(id) {
                due.extend(cohort.members);
                earliest = Some(earliest.map_or(cohort.deadline, |e| e.min(cohort.deadline)));
            }
        }
        let earliest = earliest?;
        // A pipeline goes to one node.
        let mut by_node: BTreeMap<N, Vec<Arc<Grant>>> = BTreeMap::new();
        for grant in due {
            by_node.entry(node_of(&grant)).or_default().push(grant);
        }
        let mut pipelines = Vec::new();
        for (node, grants) in by_node {
            let mut grants = grants.into_iter().peekable();
            while grants.peek().is_some() {
                let batch: Vec<Arc<Grant>> = grants.by_ref().take(BATCH).collect();
                pipelines.push((node, batch));
            }
        }
        Some(Round {
            pipelines,
            earliest,
        })
    }

    /// A pipeline of a round about to be sent at `now`: an earlier one may have taken long
    /// enough for deadlines in this one to pass. Stops tracking the grants whose deadline
    /// passed, and returns the rest and those.
    pub(super) fn unexpired(
        &mut self,
        batch: Vec<Arc<Grant>>,
        earliest: Instant,
        now: Instant,
    ) -> (Vec<Arc<Grant>>, Vec<Loss>) {
        let mut lost = Vec::new();
        if earliest <= now {
            (self.expire(batch, now, &mut lost), lost)
        } else {
            (batch, lost)
        }
    }

    /// A pipeline of renewals sent at `sent`, the grants of `batch` with the leases of `leases`,
    /// failed as a whole: it is tried again soon.
    pub(super) fn retry(&mut self, batch: Vec<Arc<Grant>>, leases: &[Duration], sent: Instant) {
        let retry = leases.iter().map(|l| retry_delay(*l)).min();
        self.file(batch, retry.map(|r| sent + r));
    }

    /// Files the grants of a pipeline of renewals sent at `sent` by their replies, read by
    /// `now`; returns those lost.
    pub(super) fn settle(
        &mut self,
        batch: Vec<Arc<Grant>>,
        leases: Vec<Duration>,
        replies: impl IntoIterator<Item = Reply>,
        sent: Instant,
        now: Instant,
    ) -> Vec<Loss> {
        // Confirmed leases make a cohort per lease (nearly always one), filed as they are
        // settled: a batch's grants are touched once here, as this walk over them is what costs
        // (cache misses). A reply lost to a storm of signals is tried again soon.
        let mut lost = Vec::new();
        let mut renewed: Vec<(u64, Cohort)> = Vec::new();
        let mut again = Vec::new();
        for ((grant, lease), reply) in batch.into_iter().zip(leases).zip(replies) {
            match reply {
                Reply::Extended if grant.confirm(sent, lease, now) => {
                    // The lease runs at least until `sent + lease` (later if extended since).
                    let deadline = deadline_of(sent, lease);
                    let next = sent + lease / 3;
                    let next = grant.renew_until.is_none_or(|u| next < u).then_some(next);
                    let found = renewed
                        .iter()
                        .position(|(_, c)| c.deadline == deadline && c.next == next);
                    let i = found.unwrap_or_else(|| {
                        let cohort = Cohort {
                            next,
                            deadline,
                            window: lease / 6,
                            members: Vec::new(),
                        };
                        renewed.push((self.next_cohort, cohort));
                        self.next_cohort += 1;
                        renewed.len() - 1
                    });
                    let (id, cohort) = &mut renewed[i];
                    grant.place.set(*id, cohort.members.len());
                    cohort.members.push(grant);
                }
                Reply::Extended => {
                    // Confirmed too late: `confirm` marked it lost.
                    self.forget(grant.id);
                }
                Reply::Gone => self.lose(&grant, Why::Gone, &mut lost),
                // This key alone is broken (a wrong type at the lock key, say): it cannot be
                // renewed, while the rest of a batch can.
                Reply::Refused(e) => self.lose(&grant, Why::Refused(e), &mut lost),
                Reply::Unknown => again.push(grant),
            }
        }
        for (id, cohort) in renewed {
            self.register(id, cohort);
        }
        if let Some(first) = again.first() {
            let retry = sent + retry_delay(first.renewal_lease());
            self.file(again, Some(retry));
        }
        lost
    }

    /// Files a tracked grant by the reply to an explicit extend to `lease`, sent at `sent` and
    /// read by `now`; returns its loss, if it is lost. An unknown outcome changes nothing: any
    /// extend sent may run, now or later, and none can shorten the lease, so the local deadline
    /// stands, and renewal (if on) takes its course.
    pub(super) fn extended(
        &mut self,
        grant: &Arc<Grant>,
        lease: Duration,
        reply: Reply,
        sent: Instant,
        now: Instant,
    ) -> Option<Loss> {
        let mut lost = Vec::new();
        match reply {
            Reply::Unknown => {}
            Reply::Extended if grant.confirm(sent, lease, now) => {
                grant.renew_with(lease);
                // Its lease or deadline may differ from its cohort's now.
                if let Some(grant) = self.forget(grant.id) {
                    self.hold(vec![grant]);
                }
            }
            Reply::Extended => {
                // Confirmed too late: `confirm` marked it lost.
                self.forget(grant.id);
            }
            Reply::Gone => self.lose(grant, Why::Gone, &mut lost),
            Reply::Refused(e) => self.lose(grant, Why::Refused(e), &mut lost),
        }
        lost.pop()
    }

    /// Stops tracking the grants of `grants` whose deadline passed by `now`, adding them to
    /// `lost`; returns the others.
    fn expire(
        &mut self,
        grants: Vec<Arc<Grant>>,
        now: Instant,
        lost: &mut Vec<Loss>,
    ) -> Vec<Arc<Grant>> {
        let (expired, alive): (Vec<_>, Vec<_>) =
            grants.into_iter().partition(|g| g.deadline() <= now);
        for grant in expired {
            let why = expiry_reason(&grant, now);
            self.lose(&grant, why, lost);
        }
        alive
    }

    /// Stops tracking a grant and adds it to `lost`, if it was still tracked.
    fn lose(&mut self, grant: &Grant, why: Why, lost: &mut Vec<Loss>) {
        if let Some(grant) = self.forget(grant.id) {
            lost.push(Loss { grant, why });
        }
    }
}

/// Why a grant whose local deadline passed at `now` is lost.
fn expiry_reason(grant: &Grant, now: Instant) -> Why {
    if grant.renew_until.is_some_and(|until| until <= now) {
        Why::MaxHold
    } else if grant.auto_renew {
        Why::RanOut
    } else {
        Why::RenewalOff
    }
}

/// After a failed renewal, try again soon enough to save the lease several times over.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(2), Duration::from_millis(500))
}
