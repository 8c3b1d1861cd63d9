//! The renewal thread's books, with no I/O and no clock of their own.
//!
//! A [`Schedule`] knows which grants are tracked, when each falls due for renewal and by when
//! each must have been confirmed. Every method that depends on the time takes it as `now`, and
//! none waits or talks to Redis: it answers what to do (the grants due, grouped into pipelines;
//! the grants lost, and why) and is told what the round trips brought back. The thread in
//! `renew.rs` does the rest: the inbox, the connections, the wire.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::{drift_margin, NewGrant};
    use crate::key::LockKeys;
    use crate::token::FencingToken;

    const LEASE: Duration = Duration::from_secs(30);
    const MS: Duration = Duration::from_millis(1);

    /// What renews a test grant: the client's default, nothing, or renewal up to a `max_hold`.
    #[derive(Clone, Copy)]
    enum Renew {
        On,
        Off,
        Until(Duration),
    }

    /// A grant granted by a round trip sent at `sent`, for `lease`.
    fn grant(id: u64, sent: Instant, lease: Duration, renew: Renew) -> Arc<Grant> {
        let mut keys = LockKeys::new("ns", &format!("k{id}")).unwrap();
        keys.set_owner("owner:", id);
        let new = NewGrant {
            keys,
            token: FencingToken::new(id),
            sent,
            granted: lease,
            lease,
            auto_renew: !matches!(renew, Renew::Off),
            max_hold: match renew {
                Renew::Until(max_hold) => Some(max_hold),
                _ => None,
            },
            queued: false,
            local_run: 0,
        };
        Arc::new(Grant::new(id, new, crate::grant::nobody()))
    }

    fn grants(ids: std::ops::Range<u64>, sent: Instant) -> Vec<Arc<Grant>> {
        ids.map(|id| grant(id, sent, LEASE, Renew::On)).collect()
    }

    /// A schedule that holds grants with these ids, granted now for [`LEASE`], and now.
    fn holding(ids: std::ops::Range<u64>) -> (Instant, Schedule) {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        schedule.hold(grants(ids, t0));
        (t0, schedule)
    }

    /// A schedule that holds one grant, granted now for [`LEASE`] and renewed as `renew`.
    fn holding_one(renew: Renew) -> (Instant, Schedule, Arc<Grant>) {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        let g = grant(1, t0, LEASE, renew);
        schedule.hold(vec![Arc::clone(&g)]);
        (t0, schedule, g)
    }

    fn one_node(_: &Grant) -> u32 {
        0
    }

    fn ids(grants: &[Arc<Grant>]) -> Vec<u64> {
        let mut ids: Vec<u64> = grants.iter().map(|g| g.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Every grant of a round, whatever its pipeline.
    fn all(round: Round<u32>) -> Vec<Arc<Grant>> {
        round.pipelines.into_iter().flat_map(|(_, b)| b).collect()
    }

    /// The grants of the one pipeline due at `now`, by id.
    fn one_pipeline(schedule: &mut Schedule, now: Instant) -> Vec<Arc<Grant>> {
        let mut round = schedule.due(now, one_node).unwrap();
        assert_eq!(round.pipelines.len(), 1);
        let (_, mut batch) = round.pipelines.pop().unwrap();
        batch.sort_by_key(|g| g.id);
        batch
    }

    /// The leases a renewal of `batch` re-arms.
    fn leases(batch: &[Arc<Grant>]) -> Vec<Duration> {
        batch.iter().map(|g| g.renewal_lease()).collect()
    }

    fn reasons(lost: &[Loss]) -> Vec<(u64, Why)> {
        lost.iter().map(|l| (l.grant.id, l.why.clone())).collect()
    }

    /// Renews a round's grants as if every pipeline was sent at `sent` and answered with
    /// `reply`, read by `now`.
    fn settle_all(
        schedule: &mut Schedule,
        round: Round<u32>,
        reply: fn() -> Reply,
        sent: Instant,
        now: Instant,
    ) -> Vec<Loss> {
        let mut lost = Vec::new();
        for (_, batch) in round.pipelines {
            let replies: Vec<Reply> = batch.iter().map(|_| reply()).collect();
            lost.extend(schedule.settle(batch.clone(), leases(&batch), replies, sent, now));
        }
        lost
    }

    impl Schedule {
        /// The cohort a tracked grant is filed in, its index there, the cohort's next renewal
        /// and its deadline.
        fn filed(&self, id: u64) -> Option<(u64, usize, Option<Instant>, Instant)> {
            self.cohorts.iter().find_map(|(&cohort_id, c)| {
                let index = c.members.iter().position(|g| g.id == id)?;
                Some((cohort_id, index, c.next, c.deadline))
            })
        }
    }

    #[test]
    fn a_grant_falls_due_a_third_of_a_lease_after_it_was_sent_and_not_before() {
        let (t0, mut schedule) = holding(1..2);
        assert_eq!(schedule.next_wake(), Some(t0 + LEASE / 3));
        assert!(schedule.due(t0 + LEASE / 3 - MS, one_node).is_none());
        assert!(schedule.tracks(1));
        let round = schedule.due(t0 + LEASE / 3, one_node).unwrap();
        assert_eq!(round.earliest, t0 + LEASE - drift_margin(LEASE));
        assert_eq!(ids(&all(round)), [1]);
        // Taken out for the round trip, still tracked until its reply is in.
        assert!(schedule.tracks(1));
        assert_eq!(schedule.filed(1), None);
    }

    #[test]
    fn grants_due_within_a_sixth_of_a_lease_go_in_one_round() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        // Due at 10 s, 14 s and 16 s; the window is 5 s.
        schedule.hold(grants(1..2, t0));
        schedule.hold(grants(2..3, t0 + Duration::from_secs(4)));
        schedule.hold(grants(3..4, t0 + Duration::from_secs(6)));
        let round = schedule.due(t0 + LEASE / 3, one_node).unwrap();
        assert_eq!(round.pipelines.len(), 1);
        assert_eq!(ids(&all(round)), [1, 2]);
        assert_eq!(
            schedule.next_wake(),
            Some(t0 + Duration::from_secs(6) + LEASE / 3)
        );
        let later = schedule.due(t0 + Duration::from_secs(16), one_node);
        assert_eq!(ids(&all(later.unwrap())), [3]);
    }

    #[test]
    fn a_confirmed_renewal_refiles_a_third_of_a_lease_after_it_was_sent() {
        let (t0, mut schedule) = holding(1..3);
        let sent = t0 + LEASE / 3;
        let round = schedule.due(sent, one_node).unwrap();
        let lost = settle_all(
            &mut schedule,
            round,
            || Reply::Extended,
            sent,
            sent + 5 * MS,
        );
        assert!(lost.is_empty());
        let deadline = sent + LEASE - drift_margin(LEASE);
        let (cohort, _, next, cohort_deadline) = schedule.filed(1).unwrap();
        assert_eq!(next, Some(sent + LEASE / 3));
        assert_eq!(cohort_deadline, deadline);
        // One pipeline, one lease: one cohort.
        assert_eq!(schedule.filed(2).unwrap().0, cohort);
        for id in [1, 2] {
            let grant = &schedule.held[&id];
            assert_eq!(grant.deadline(), deadline);
            assert_eq!(grant.next_renewal(), sent + LEASE / 3);
            assert!(grant.is_held());
        }
        assert!(schedule.due(sent + LEASE / 3 - MS, one_node).is_none());
        let again = schedule.due(sent + LEASE / 3, one_node).unwrap();
        assert_eq!(ids(&all(again)), [1, 2]);
    }

    #[test]
    fn a_deadline_passed_with_renewal_on_loses_the_grant_as_run_out() {
        let (_, mut schedule, g) = holding_one(Renew::On);
        let deadline = g.deadline();
        assert!(schedule.expire_overdue(deadline - MS).is_empty());
        let lost = schedule.expire_overdue(deadline);
        assert_eq!(reasons(&lost), [(1, Why::RanOut)]);
        assert!(!schedule.tracks(1));
        assert!(schedule.is_empty());
        assert_eq!(schedule.next_wake(), None);
    }

    #[test]
    fn a_deadline_passed_with_renewal_off_loses_the_grant_as_not_renewed() {
        let (_, mut schedule, g) = holding_one(Renew::Off);
        // Never due: only its deadline wakes the thread.
        assert_eq!(schedule.next_wake(), Some(g.deadline()));
        assert!(schedule.due(g.deadline() - MS, one_node).is_none());
        let lost = schedule.expire_overdue(g.deadline());
        assert_eq!(reasons(&lost), [(1, Why::RenewalOff)]);
        assert!(schedule.is_empty());
    }

    #[test]
    fn renewal_stops_at_max_hold_and_the_loss_says_so() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        // Renewed once at 10 s; the next renewal (20 s) would fall after max_hold (15 s).
        let g = grant(1, t0, LEASE, Renew::Until(Duration::from_secs(15)));
        schedule.hold(vec![Arc::clone(&g)]);
        let sent = t0 + LEASE / 3;
        let round = schedule.due(sent, one_node).unwrap();
        assert!(settle_all(&mut schedule, round, || Reply::Extended, sent, sent).is_empty());
        assert_eq!(schedule.filed(1).unwrap().2, None);
        assert_eq!(schedule.next_wake(), Some(g.deadline()));
        let lost = schedule.expire_overdue(g.deadline());
        assert_eq!(reasons(&lost), [(1, Why::MaxHold)]);

        // A max_hold shorter than a third of the lease: never renewed at all.
        let short = grant(2, t0, LEASE, Renew::Until(Duration::from_secs(5)));
        schedule.hold(vec![Arc::clone(&short)]);
        assert!(schedule.due(t0 + LEASE, one_node).is_none());
        let lost = schedule.expire_overdue(short.deadline());
        assert_eq!(reasons(&lost), [(2, Why::MaxHold)]);
    }

    #[test]
    fn replies_of_a_pipeline_file_each_grant_by_its_own_reply() {
        let (t0, mut schedule) = holding(1..5);
        let sent = t0 + LEASE / 3;
        let batch = one_pipeline(&mut schedule, sent);
        let leases = leases(&batch);
        let replies = [
            Reply::Extended,
            Reply::Gone,
            Reply::Refused("WRONGTYPE".to_owned()),
            Reply::Unknown,
        ];
        let lost = schedule.settle(batch, leases, replies, sent, sent + MS);
        assert_eq!(
            reasons(&lost),
            [(2, Why::Gone), (3, Why::Refused("WRONGTYPE".to_owned()))]
        );
        assert_eq!(
            lost[1].why.to_string(),
            "redis refused to renew it: WRONGTYPE"
        );
        assert!(schedule.tracks(1) && schedule.tracks(4));
        assert!(!schedule.tracks(2) && !schedule.tracks(3));
        // The unread one is tried again soon: a tenth of its lease, at most 500 ms.
        assert_eq!(schedule.filed(4).unwrap().2, Some(sent + 500 * MS));
        assert_eq!(schedule.filed(1).unwrap().2, Some(sent + LEASE / 3));
    }

    #[test]
    fn a_failed_pipeline_is_retried_after_a_tenth_of_the_shortest_lease() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        let short = Duration::from_secs(1);
        schedule.hold(vec![
            grant(1, t0, short, Renew::On),
            grant(2, t0, LEASE, Renew::On),
        ]);
        let sent = t0 + short / 3;
        let batch = one_pipeline(&mut schedule, sent);
        assert_eq!(ids(&batch), [1, 2]);
        schedule.retry(batch.clone(), &leases(&batch), sent);
        assert!(schedule.due(sent + 100 * MS - MS, one_node).is_none());
        let again = schedule.due(sent + 100 * MS, one_node).unwrap();
        assert_eq!(ids(&all(again)), [1, 2]);
    }

    #[test]
    fn a_pipeline_whose_deadlines_passed_before_it_was_sent_loses_those_grants() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        let short = grant(1, t0, Duration::from_secs(3), Renew::On);
        schedule.hold(vec![Arc::clone(&short)]);
        schedule.hold(grants(2..3, t0 + Duration::from_millis(500)));
        let round = schedule.due(t0 + LEASE / 3, one_node).unwrap();
        let earliest = round.earliest;
        assert_eq!(earliest, short.deadline());
        let batch = all(round);
        let (alive, lost) = schedule.unexpired(batch.clone(), earliest, earliest - MS);
        assert_eq!((ids(&alive), lost.len()), (vec![1, 2], 0));
        let (alive, lost) = schedule.unexpired(batch, earliest, earliest);
        assert_eq!(ids(&alive), [2]);
        assert_eq!(reasons(&lost), [(1, Why::RanOut)]);
    }

    #[test]
    fn a_confirmation_after_the_deadline_leaves_the_grant_lost() {
        let (t0, mut schedule, g) = holding_one(Renew::On);
        let sent = t0 + LEASE / 3;
        let round = schedule.due(sent, one_node).unwrap();
        let late = g.deadline();
        // `confirm` itself marks it lost: nothing is left for the thread to report.
        let lost = settle_all(&mut schedule, round, || Reply::Extended, sent, late);
        assert!(lost.is_empty());
        assert!(!schedule.tracks(1));
        assert!(!g.is_held());
        assert!(!g.confirm(sent, LEASE, sent + MS));
        assert!(!g.is_held());
    }

    #[test]
    fn an_explicit_extend_moves_its_grant_to_a_cohort_of_its_own() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        let gs = grants(1..3, t0);
        let (a, b) = (Arc::clone(&gs[0]), Arc::clone(&gs[1]));
        schedule.hold(gs);
        let together = schedule.filed(1).unwrap().0;
        assert_eq!(schedule.filed(2).unwrap().0, together);

        let long = 2 * LEASE;
        let sent = t0 + Duration::from_secs(1);
        assert!(schedule
            .extended(&a, long, Reply::Extended, sent, sent + MS)
            .is_none());
        let (alone, _, next, deadline) = schedule.filed(1).unwrap();
        assert_ne!(alone, together);
        assert_eq!(schedule.filed(2).unwrap().0, together);
        assert_eq!(a.renewal_lease(), long);
        assert_eq!(next, Some(sent + long / 3));
        assert_eq!(deadline, sent + long - drift_margin(long));
        assert_eq!(a.deadline(), deadline);
        assert_eq!(b.deadline(), t0 + LEASE - drift_margin(LEASE));

        // A shorter extend after it re-arms renewals to the shorter lease, and keeps the later
        // deadline the longer one promised.
        let later = sent + Duration::from_secs(1);
        assert!(schedule
            .extended(&a, LEASE, Reply::Extended, later, later + MS)
            .is_none());
        let (_, _, next, kept) = schedule.filed(1).unwrap();
        assert_eq!(kept, deadline);
        assert_eq!(a.deadline(), deadline);
        assert_eq!(a.renewal_lease(), LEASE);
        assert_eq!(next, Some(later + LEASE / 3));
    }

    #[test]
    fn an_extend_whose_outcome_is_unknown_changes_nothing() {
        let (t0, mut schedule, g) = holding_one(Renew::On);
        let before = (schedule.filed(1), g.deadline(), g.next_renewal());
        let sent = t0 + Duration::from_secs(1);
        let lost = schedule.extended(&g, 2 * LEASE, Reply::Unknown, sent, sent + MS);
        assert!(lost.is_none());
        assert_eq!((schedule.filed(1), g.deadline(), g.next_renewal()), before);
        assert_eq!(g.renewal_lease(), LEASE);
        assert!(g.is_held());
    }

    #[test]
    fn an_extend_refused_or_finding_the_key_gone_loses_the_grant() {
        let t0 = Instant::now();
        let mut schedule = Schedule::default();
        let gs = grants(1..3, t0);
        schedule.hold(gs.clone());
        let lost = schedule.extended(&gs[0], LEASE, Reply::Gone, t0, t0 + MS);
        assert_eq!(
            reasons(&lost.into_iter().collect::<Vec<_>>()),
            [(1, Why::Gone)]
        );
        let e = Reply::Refused("ERR".to_owned());
        let lost = schedule.extended(&gs[1], LEASE, e, t0, t0 + MS);
        assert_eq!(
            reasons(&lost.into_iter().collect::<Vec<_>>()),
            [(2, Why::Refused("ERR".to_owned()))]
        );
        assert!(schedule.is_empty());
    }

    #[test]
    fn forgetting_a_grant_takes_it_out_of_its_cohort_at_once() {
        let (_, mut schedule) = holding(1..4);
        let cohort = schedule.filed(1).unwrap().0;
        assert_eq!(schedule.forget(1).map(|g| g.id), Some(1));
        assert_eq!(schedule.forget(1).map(|g| g.id), None);
        // The last member took the freed index, and knows it: forgetting it finds it there.
        assert_eq!(schedule.filed(3).unwrap().1, 0);
        assert_eq!(schedule.forget(3).map(|g| g.id), Some(3));
        assert_eq!(schedule.filed(2).unwrap().0, cohort);
        assert_eq!(schedule.forget(2).map(|g| g.id), Some(2));
        // The emptied cohort is gone, from both orders.
        assert!(schedule.is_empty());
        assert!(schedule.cohorts.is_empty());
        assert_eq!(schedule.next_wake(), None);
    }

    #[test]
    fn a_stale_cohort_slot_is_a_no_op() {
        let (t0, mut schedule) = holding(1..3);
        // Taken out for a round trip: their cohort is gone, their places still name it.
        let round = schedule.due(t0 + LEASE / 3, one_node).unwrap();
        assert_eq!(schedule.forget(1).map(|g| g.id), Some(1));
        assert!(schedule.tracks(2));
        let sent = t0 + LEASE / 3;
        let lost = settle_all(&mut schedule, round, || Reply::Extended, sent, sent);
        assert!(lost.is_empty());
        assert!(!schedule.tracks(1));
        assert!(schedule.filed(2).is_some());

        // A place that names another grant's slot leaves that grant alone.
        let x = grant(3, t0, LEASE, Renew::On);
        schedule.hold(vec![Arc::clone(&x)]);
        let (cohort, index, _, _) = schedule.filed(2).unwrap();
        x.place.set(cohort, index);
        assert_eq!(schedule.forget(3).map(|g| g.id), Some(3));
        assert_eq!(schedule.filed(2).unwrap().0, cohort);
        assert!(schedule.tracks(2));
    }

    #[test]
    fn ten_thousand_grants_filed_together_renew_in_pipelines_of_at_most_a_batch() {
        let (t0, mut schedule) = holding(0..10_000);
        assert_eq!(schedule.cohorts.len(), 1);
        let sent = t0 + LEASE / 3;
        let round = schedule.due(sent, one_node).unwrap();
        assert_eq!(round.pipelines.len(), 10_000 / BATCH);
        assert!(round.pipelines.iter().all(|(_, b)| b.len() <= BATCH));
        let mut renewed: Vec<u64> = round.pipelines.iter().flat_map(|(_, b)| ids(b)).collect();
        renewed.sort_unstable();
        assert_eq!(renewed, (0..10_000).collect::<Vec<_>>());

        assert!(settle_all(&mut schedule, round, || Reply::Extended, sent, sent).is_empty());
        // A cohort per pipeline, all due together again.
        assert_eq!(schedule.cohorts.len(), 10_000 / BATCH);
        assert_eq!(schedule.next_wake(), Some(sent + LEASE / 3));
    }

    #[test]
    fn a_pipeline_goes_to_one_node() {
        let (t0, mut schedule) = holding(0..2_500);
        let round = schedule
            .due(t0 + LEASE / 3, |g: &Grant| (g.id % 2) as u32)
            .unwrap();
        let mut sizes = Vec::new();
        for (node, batch) in &round.pipelines {
            assert!(batch.iter().all(|g| (g.id % 2) as u32 == *node));
            sizes.push((*node, batch.len()));
        }
        assert_eq!(sizes, [(0, 1000), (0, 250), (1, 1000), (1, 250)]);
    }
}
