//! The renewal thread: one per client, extending every held lease about every lease/3.
//!
//! Guards register and deregister through an inbox the thread reads whenever it wakes; the
//! thread sleeps until the next lease is due, then extends every lease that is due, or nearly so, in
//! pipelines of up to [`BATCH`] owner-checked extend calls, one pipeline per node: one round trip
//! renews many locks. It uses connections of its own, so callers exhausting the pool cannot
//! starve it. A lease that
//! Redis reports gone or re-owned, or whose local deadline passes without a confirmed renewal
//! (Redis unreachable, this thread stalled), is reported lost through its guard's signal.
//!
//! Renewal times and deadlines are kept in ordered sets, so each tick costs time in proportion
//! to the leases it renews, not to all leases held.
//!
//! Taking and releasing a lock costs no wake-up of this thread, which on a small machine would
//! compete with the caller and Redis for a core: a new grant rings the thread's doorbell (a
//! crossbeam channel) only if its first renewal falls due before the thread would wake anyway.
//!
//! The thread holds no reference to the client: when the client and all its guards are dropped,
//! the doorbell disconnects and the thread exits.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::connector::{Connector, Node};
use crate::grant::Grant;
use crate::scripts;
use crate::wire::Interrupted;

/// Most extend calls in one pipeline (one round trip).
const BATCH: usize = 1000;
/// Shortest read or connect timeout the thread uses.
const MIN_TIMEOUT: Duration = Duration::from_millis(5);
/// Commands that may wait in the inbox before the thread is rung to take them in anyway.
const INBOX_LIMIT: usize = 1024;

enum Command {
    /// Track this grant: renew it if it wants renewal, report its loss either way.
    Hold(Arc<Grant>),
    /// Stop tracking the grant with this id (it is being released).
    Forget(u64),
    /// Re-arm this grant's lease to `lease` now, and answer whether it was still ours. Runs
    /// here because the grant's place in the schedule changes with its lease, and only this
    /// thread files grants. (Order on the wire does not matter: no extend shortens a lease.)
    Extend {
        grant: Arc<Grant>,
        lease: Duration,
        reply: Sender<redis::RedisResult<bool>>,
    },
}

/// What the client side shares with the thread.
#[derive(Default)]
struct Inbox {
    commands: Vec<Command>,
    /// When the thread will next wake by itself; `None` while it sleeps until rung.
    /// Written by the thread under this mutex, only when it has found `commands` empty, so a
    /// client that pushes a command and reads this in one critical section knows whether the
    /// thread will see the command in time.
    next_wake: Option<Instant>,
    /// The thread is gone: nothing will renew a lease handed in now.
    closed: bool,
}

/// The client's handle on its renewal thread.
pub(crate) struct Renewal {
    inbox: Arc<Mutex<Inbox>>,
    doorbell: Sender<()>,
}

impl Renewal {
    /// Starts tracking a grant. Returns false if the thread is gone.
    pub(crate) fn hold(&self, grant: Arc<Grant>) -> bool {
        let due = if grant.auto_renew {
            grant.next_renewal()
        } else {
            grant.deadline()
        };
        self.push(Command::Hold(grant), Some(due))
    }

    /// Stops tracking a grant that is being released. Needs no wake-up: the thread takes it in
    /// before its next renewal.
    pub(crate) fn forget(&self, id: u64) {
        self.push(Command::Forget(id), None);
    }

    /// Asks the thread to extend a grant now; the answer comes on the returned channel, or the
    /// channel disconnects if the thread is gone.
    pub(crate) fn extend(
        &self,
        grant: Arc<Grant>,
        lease: Duration,
    ) -> Receiver<redis::RedisResult<bool>> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.push(
            Command::Extend {
                grant,
                lease,
                reply,
            },
            Some(Instant::now()),
        );
        answer
    }

    fn push(&self, command: Command, due: Option<Instant>) -> bool {
        let ring = {
            let mut inbox = lock_inbox(&self.inbox);
            if inbox.closed {
                return false;
            }
            inbox.commands.push(command);
            inbox.commands.len() >= INBOX_LIMIT
                || due.is_some_and(|due| inbox.next_wake.is_none_or(|wake| due < wake))
        };
        if ring {
            // Full means already rung; the thread then takes in everything, this included.
            let _ = self.doorbell.try_send(());
        }
        true
    }
}

fn lock_inbox(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(PoisonError::into_inner)
}

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

struct Renewer {
    inbox: Arc<Mutex<Inbox>>,
    /// Longest sleep: a sixth of the client's lease, at most a second.
    idle_wake: Duration,
    connector: Arc<Connector>,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// One connection per node, made when first needed and dropped when it fails.
    cons: HashMap<Node, redis::Connection>,
    held: HashMap<u64, Arc<Grant>>,
    cohorts: HashMap<u64, Cohort>,
    next_cohort: u64,
    /// `(next renewal, cohort)` of every cohort that is renewed.
    renewals: BTreeSet<(Instant, u64)>,
    /// `(deadline, cohort)` of every cohort.
    deadlines: BTreeSet<(Instant, u64)>,
    /// The commands of one pipeline and where each ends, reused.
    buf: (Vec<u8>, Vec<usize>),
}

pub(crate) fn spawn(
    connector: Arc<Connector>,
    lease: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> std::io::Result<Renewal> {
    let (doorbell, rung) = crossbeam_channel::bounded(1);
    let inbox = Arc::new(Mutex::new(Inbox::default()));
    let renewer = Renewer {
        inbox: Arc::clone(&inbox),
        idle_wake: (lease / 6).clamp(MIN_TIMEOUT, Duration::from_secs(1)),
        connector,
        connection_timeout,
        response_timeout,
        cons: HashMap::new(),
        held: HashMap::new(),
        cohorts: HashMap::new(),
        next_cohort: 0,
        renewals: BTreeSet::new(),
        deadlines: BTreeSet::new(),
        buf: (Vec::new(), Vec::new()),
    };
    thread::Builder::new()
        .name("fencelock-renewal".to_owned())
        .spawn(move || renewer.run(&rung))?;
    Ok(Renewal { inbox, doorbell })
}

impl Renewer {
    fn run(mut self, doorbell: &Receiver<()>) {
        loop {
            let commands = std::mem::take(&mut lock_inbox(&self.inbox).commands);
            let quiet = commands.is_empty();
            // A lock taken and released since the last pass needs no bookkeeping at all.
            let released: HashSet<u64> = commands
                .iter()
                .filter_map(|c| match c {
                    Command::Forget(id) => Some(*id),
                    _ => None,
                })
                .collect();
            let mut taken_in = Vec::new();
            for command in commands {
                match command {
                    Command::Hold(grant) if released.contains(&grant.id) => {}
                    Command::Hold(grant) => {
                        self.held.insert(grant.id, Arc::clone(&grant));
                        taken_in.push(grant);
                    }
                    Command::Forget(id) => {
                        self.forget(id);
                    }
                    Command::Extend {
                        grant,
                        lease,
                        reply,
                    } => {
                        // Filed first: the extend moves its grant to a cohort of its own.
                        self.file(std::mem::take(&mut taken_in), None);
                        let _ = reply.send(self.extend_one(&grant, lease));
                    }
                }
            }
            self.file(taken_in, None);
            self.expire_overdue();
            self.renew_due();
            // While locks come and go, look at the inbox now and then even with nothing due: a
            // grant made meanwhile then falls due after that look (a third of a lease away) and
            // needs no ring. After a whole quiet period with nothing held, sleep until rung.
            let idle = (!quiet || !self.held.is_empty()).then(|| Instant::now() + self.idle_wake);
            let wake = [self.renewals.first(), self.deadlines.first()]
                .into_iter()
                .flatten()
                .map(|(at, _)| *at)
                .chain(idle)
                .min();
            {
                let mut inbox = lock_inbox(&self.inbox);
                if !inbox.commands.is_empty() {
                    continue;
                }
                inbox.next_wake = wake;
            }
            let rung = match wake {
                Some(at) => doorbell.recv_deadline(at),
                None => doorbell.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            if let Err(RecvTimeoutError::Disconnected) = rung {
                return;
            }
        }
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

    /// Stops tracking a grant: it leaves the renewal thread's books entirely.
    fn forget(&mut self, id: u64) -> Option<Arc<Grant>> {
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

    fn expire_overdue(&mut self) {
        let now = Instant::now();
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
            let alive = self.expire(cohort.members, now);
            if !alive.is_empty() {
                self.file(alive, cohort.next);
            }
        }
    }

    fn renew_due(&mut self) {
        let now = Instant::now();
        // Only once a lease is due: a wake-up for the inbox renewing early would shift leases
        // into ever earlier phases, renewing each more often than every lease/3.
        if self.renewals.first().is_none_or(|(next, _)| *next > now) {
            return;
        }
        // Cohorts due within the next sixth of a lease go now too, so one round trip serves
        // many.
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
        let Some(earliest) = earliest else {
            return;
        };
        // A pipeline goes to one node.
        let mut by_node: BTreeMap<Node, Vec<Arc<Grant>>> = BTreeMap::new();
        for grant in due {
            let node = self.connector.node_of(&grant.keys);
            by_node.entry(node).or_default().push(grant);
        }
        for (node, grants) in by_node {
            let mut grants = grants.into_iter().peekable();
            while grants.peek().is_some() {
                let batch: Vec<Arc<Grant>> = grants.by_ref().take(BATCH).collect();
                self.renew(node, batch, earliest);
            }
        }
    }

    /// Renews one pipeline's worth of grants served by `node`, none with a deadline before
    /// `earliest`, and files each according to its reply.
    fn renew(&mut self, node: Node, mut batch: Vec<Arc<Grant>>, earliest: Instant) {
        // An earlier batch may have taken long enough for deadlines in this one to pass.
        let now = Instant::now();
        if earliest <= now {
            batch = self.expire(batch, now);
        }
        if batch.is_empty() {
            return;
        }
        let sent = Instant::now();
        let leases: Vec<Duration> = batch.iter().map(|g| g.renewal_lease()).collect();
        let replies = match self.extend_all(node, &batch, &leases) {
            Ok(replies) => replies,
            Err(e) => {
                log::debug!(
                    "fencelock: renewing {} lease(s) failed, retrying: {e}",
                    batch.len()
                );
                self.cons.remove(&node);
                self.connector.failed(node, &e);
                let retry = leases.iter().map(|l| retry_delay(*l)).min();
                self.file(batch, retry.map(|r| sent + r));
                return;
            }
        };
        // Confirmed leases make a cohort per lease (nearly always one), filed as they are
        // settled: a batch's grants are touched once here, as this walk over them is what costs
        // (cache misses). A reply lost to a storm of signals is tried again soon.
        let now = Instant::now();
        let mut renewed: Vec<(u64, Cohort)> = Vec::new();
        let mut again = Vec::new();
        for ((grant, lease), reply) in batch.into_iter().zip(leases).zip(replies) {
            match reply {
                Some(Ok(reply)) => match scripts::extended(reply) {
                    Ok(true) if grant.confirm(sent, lease, now) => {
                        // The lease runs at least until `sent + lease` (later if extended since).
                        let deadline = crate::grant::deadline_of(sent, lease);
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
                    Ok(true) => {
                        // Confirmed too late: `confirm` marked it lost.
                        self.forget(grant.id);
                    }
                    Ok(false) => self.lose(&grant, GONE),
                    Err(e) => self.lose(&grant, &refused(&e)),
                },
                // This key alone is broken (a wrong type at the lock key, say): it cannot be
                // renewed, while the rest of a batch can.
                Some(Err(e)) => self.lose(&grant, &refused(&e)),
                None => again.push(grant),
            }
        }
        for (id, cohort) in renewed {
            self.register(id, cohort);
        }
        if let Some(first) = again.first() {
            let retry = sent + retry_delay(first.renewal_lease());
            self.file(again, Some(retry));
        }
    }

    /// Marks lost, and stops tracking, the grants of `grants` whose deadline passed by `now`;
    /// returns the others.
    fn expire(&mut self, grants: Vec<Arc<Grant>>, now: Instant) -> Vec<Arc<Grant>> {
        let (lost, alive): (Vec<_>, Vec<_>) = grants.into_iter().partition(|g| g.deadline() <= now);
        for grant in lost {
            self.lose(&grant, expiry_reason(&grant, now));
        }
        alive
    }

    /// Stops tracking a grant and marks it lost, if it was still tracked.
    fn lose(&mut self, grant: &Grant, why: &str) {
        if self.forget(grant.id).is_some() {
            grant.mark_lost(why);
        }
    }

    /// Files a tracked grant in a cohort of its own: its lease or deadline may differ from its
    /// cohort's now.
    fn refile_alone(&mut self, id: u64) {
        if let Some(grant) = self.forget(id) {
            self.held.insert(id, Arc::clone(&grant));
            self.file(vec![grant], None);
        }
    }

    /// An explicit extend. A connection failure is only reported: the grant stays tracked, and
    /// its renewal (if on) or its deadline takes its course.
    fn extend_one(&mut self, grant: &Arc<Grant>, lease: Duration) -> redis::RedisResult<bool> {
        if !self.held.contains_key(&grant.id) {
            return Ok(false);
        }
        let mut sent = Instant::now();
        let mut reply = self.extend_once(grant, lease);
        for _ in 0..crate::wire::MAX_INTERRUPTS {
            match &reply {
                Err(e) if crate::wire::interrupted(e) => {
                    sent = Instant::now();
                    reply = self.extend_once(grant, lease);
                }
                _ => break,
            }
        }
        match &reply {
            Err(e) if e.is_io_error() => {
                if !crate::wire::interrupted(e) {
                    let node = self.connector.node_of(&grant.keys);
                    self.cons.remove(&node);
                    self.connector.failed(node, e);
                }
                // Any of the extends sent may run, now or later: none can shorten the lease, so
                // the local deadline stands, and renewal (if on) takes its course.
                return reply;
            }
            Ok(true) if grant.confirm(sent, lease, Instant::now()) => {
                grant.renew_with(lease);
                self.refile_alone(grant.id);
            }
            Ok(true) => {
                // Confirmed too late: `confirm` marked it lost.
                self.forget(grant.id);
            }
            Ok(false) => self.lose(grant, GONE),
            Err(e) => self.lose(grant, &refused(e)),
        }
        reply.map(|extended| extended && grant.is_held())
    }

    fn extend_once(&mut self, grant: &Arc<Grant>, lease: Duration) -> redis::RedisResult<bool> {
        let node = self.connector.node_of(&grant.keys);
        let con = self.connection(node, std::slice::from_ref(grant))?;
        scripts::extend(con, &grant.keys, grant.keys.owner(), lease)
    }

    /// One pipeline of extend calls to `node`, with a reply per call (`None`: a signal
    /// interrupted the read of it).
    fn extend_all(
        &mut self,
        node: Node,
        batch: &[Arc<Grant>],
        leases: &[Duration],
    ) -> redis::RedisResult<Vec<Option<redis::RedisResult<redis::Value>>>> {
        let (mut buf, mut ends) = std::mem::take(&mut self.buf);
        buf.clear();
        ends.clear();
        for (grant, lease) in batch.iter().zip(leases) {
            scripts::pack_extend(&mut buf, &grant.keys, grant.keys.owner(), *lease);
            ends.push(buf.len());
        }
        let result = self.connection(node, batch).and_then(|con| {
            scripts::run_pipeline(con, &scripts::EXTEND, &buf, &ends, Interrupted::SendAgain)
        });
        self.buf = (buf, ends);
        result
    }

    fn connection(
        &mut self,
        node: Node,
        batch: &[Arc<Grant>],
    ) -> redis::RedisResult<&mut redis::Connection> {
        // A reply is worth waiting for as long as it can save any lease of the batch: until its
        // last deadline. Bounding it by the *first* deadline instead lets one lease that is nearly
        // out shrink the budget of the whole pipeline, which then times out, and every retry has
        // less time than the one before: under load, the whole batch spirals into loss. Leases
        // whose deadline passes meanwhile are lost all the same: `is_held()` turns false by
        // itself, and a confirmation that comes late cannot revive them. Connecting is bounded
        // the same way.
        let now = Instant::now();
        let last_deadline = batch.iter().map(|g| g.deadline()).max().unwrap_or(now);
        let timeout = last_deadline
            .saturating_duration_since(now)
            .max(MIN_TIMEOUT)
            .min(self.response_timeout);
        let con = match self.cons.remove(&node) {
            Some(con) => con,
            None => {
                let connect_timeout = timeout.min(self.connection_timeout);
                self.connector.connect(node, connect_timeout, timeout)?
            }
        };
        con.set_read_timeout(Some(timeout))?;
        Ok(self.cons.entry(node).or_insert(con))
    }
}

impl Drop for Renewer {
    /// Runs on exit and on unwinding alike: leases nobody renews any more are as good as lost.
    fn drop(&mut self) {
        let waiting = {
            let mut inbox = lock_inbox(&self.inbox);
            inbox.closed = true;
            std::mem::take(&mut inbox.commands)
        };
        let waiting = waiting.into_iter().filter_map(|c| match c {
            Command::Hold(grant) => Some(grant),
            _ => None,
        });
        for grant in self.held.drain().map(|(_, grant)| grant).chain(waiting) {
            grant.mark_lost("the renewal thread stopped");
        }
    }
}

const GONE: &str = "redis reports the key gone or owned by another";

fn refused(e: &redis::RedisError) -> String {
    format!("redis refused to renew it: {e}")
}

/// Why a grant whose local deadline passed at `now` is lost.
fn expiry_reason(grant: &Grant, now: Instant) -> &'static str {
    if grant.renew_until.is_some_and(|until| until <= now) {
        "its maximum hold time passed, so renewal stopped"
    } else if grant.auto_renew {
        "its lease ran out before a renewal was confirmed"
    } else {
        "its lease ran out (renewal is off for it)"
    }
}

/// After a failed renewal, try again soon enough to save the lease several times over.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(2), Duration::from_millis(500))
}
