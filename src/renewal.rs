//! The renewal thread: one per client, extending every held lease about every lease/3.
//!
//! Guards register and deregister through an inbox the thread reads whenever it wakes; the
//! thread sleeps until the next lease is due, then extends every lease that is due, or nearly so, in
//! pipelines of up to [`BATCH`] owner-checked extend calls: one round trip renews many locks. It
//! uses a connection of its own, so callers exhausting the pool cannot starve it. A lease that
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::grant::Grant;
use crate::scripts;

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
    /// here so that every PEXPIRE of a grant goes out on one connection, in order.
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
            let mut inbox = lock(&self.inbox);
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

fn lock(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Held {
    grant: Arc<Grant>,
    next: Instant,
    deadline: Instant,
}

struct Renewer {
    inbox: Arc<Mutex<Inbox>>,
    /// Longest sleep: a sixth of the client's lease, at most a second.
    idle_wake: Duration,
    client: redis::Client,
    connection_timeout: Duration,
    response_timeout: Duration,
    con: Option<redis::Connection>,
    held: HashMap<u64, Held>,
    /// `(next renewal, id)` of every grant that is renewed.
    renewals: BTreeSet<(Instant, u64)>,
    /// `(local deadline, id)` of every held grant.
    deadlines: BTreeSet<(Instant, u64)>,
}

pub(crate) fn spawn(
    client: redis::Client,
    lease: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> std::io::Result<Renewal> {
    let (doorbell, rung) = crossbeam_channel::bounded(1);
    let inbox = Arc::new(Mutex::new(Inbox::default()));
    let renewer = Renewer {
        inbox: Arc::clone(&inbox),
        idle_wake: (lease / 6).clamp(MIN_TIMEOUT, Duration::from_secs(1)),
        client,
        connection_timeout,
        response_timeout,
        con: None,
        held: HashMap::new(),
        renewals: BTreeSet::new(),
        deadlines: BTreeSet::new(),
    };
    thread::Builder::new()
        .name("fencelock-renewal".to_owned())
        .spawn(move || renewer.run(&rung))?;
    Ok(Renewal { inbox, doorbell })
}

impl Renewer {
    fn run(mut self, doorbell: &Receiver<()>) {
        loop {
            let commands = std::mem::take(&mut lock(&self.inbox).commands);
            let quiet = commands.is_empty();
            // A lock taken and released since the last pass needs no bookkeeping at all.
            let released: HashSet<u64> = commands
                .iter()
                .filter_map(|c| match c {
                    Command::Forget(id) => Some(*id),
                    _ => None,
                })
                .collect();
            for command in commands {
                match command {
                    Command::Hold(grant) if released.contains(&grant.id) => {}
                    command => self.apply(command),
                }
            }
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
                let mut inbox = lock(&self.inbox);
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

    fn apply(&mut self, command: Command) {
        match command {
            Command::Hold(grant) => {
                let id = grant.id;
                let deadline = grant.deadline();
                let next = grant.next_renewal();
                self.deadlines.insert((deadline, id));
                self.held.insert(
                    id,
                    Held {
                        grant,
                        next,
                        deadline,
                    },
                );
                self.reschedule(id, next);
            }
            Command::Forget(id) => {
                self.remove(id);
            }
            Command::Extend {
                grant,
                lease,
                reply,
            } => {
                let _ = reply.send(self.extend_one(&grant, lease));
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Grant>> {
        let held = self.held.remove(&id)?;
        self.renewals.remove(&(held.next, id));
        self.deadlines.remove(&(held.deadline, id));
        Some(held.grant)
    }

    fn expire_overdue(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let Some(grant) = self.remove(id) else {
                // Not held (cannot happen): drop the stray entry rather than meet it again.
                self.deadlines.remove(&(deadline, id));
                continue;
            };
            let why = if grant.renew_until.is_some_and(|until| until <= now) {
                "its maximum hold time passed, so renewal stopped"
            } else if grant.auto_renew {
                "its lease ran out before a renewal was confirmed"
            } else {
                "its lease ran out (renewal is off for it)"
            };
            grant.mark_lost(why);
        }
    }

    fn renew_due(&mut self) {
        let now = Instant::now();
        // Only once a lease is due: a wake-up for the inbox renewing early would shift leases
        // into ever earlier phases, renewing each more often than every lease/3.
        if self.renewals.first().is_none_or(|(next, _)| *next > now) {
            return;
        }
        // Leases due within the next sixth of a lease go now too, so one round trip serves many.
        let due: Vec<Arc<Grant>> = self
            .renewals
            .iter()
            .map_while(|(next, id)| {
                let grant = &self.held.get(id)?.grant;
                (*next <= now + grant.lease() / 6).then(|| Arc::clone(grant))
            })
            .collect();
        for batch in due.chunks(BATCH) {
            // An earlier batch may have taken long enough for deadlines in this one to pass.
            self.expire_overdue();
            let batch: Vec<Arc<Grant>> = batch
                .iter()
                .filter(|g| self.held.contains_key(&g.id))
                .cloned()
                .collect();
            if !batch.is_empty() {
                self.renew(&batch);
            }
        }
    }

    fn renew(&mut self, batch: &[Arc<Grant>]) {
        let sent = Instant::now();
        let leases: Vec<Duration> = batch.iter().map(|g| g.lease()).collect();
        let replies = match self.extend_all(batch, &leases) {
            Ok(replies) => replies,
            Err(e) => {
                log::debug!(
                    "fencelock: renewing {} lease(s) failed, retrying: {e}",
                    batch.len()
                );
                self.con = None;
                for (grant, lease) in batch.iter().zip(&leases) {
                    self.reschedule(grant.id, sent + retry_delay(*lease));
                }
                return;
            }
        };
        for ((grant, lease), reply) in batch.iter().zip(leases).zip(replies) {
            self.settle(grant, sent, lease, reply);
        }
    }

    /// Books the reply to one extend sent at `sent`.
    fn settle(
        &mut self,
        grant: &Arc<Grant>,
        sent: Instant,
        lease: Duration,
        reply: redis::RedisResult<bool>,
    ) {
        match reply {
            Ok(true) => {
                if !grant.confirm(sent, lease) {
                    self.remove(grant.id);
                    return;
                }
                if let Some(held) = self.held.get_mut(&grant.id) {
                    self.deadlines.remove(&(held.deadline, grant.id));
                    held.deadline = grant.deadline();
                    self.deadlines.insert((held.deadline, grant.id));
                }
                self.reschedule(grant.id, sent + lease / 3);
            }
            Ok(false) => {
                if self.remove(grant.id).is_some() {
                    grant.mark_lost("redis reports the key gone or owned by another");
                }
            }
            Err(e) => {
                // This key alone is broken (a wrong type at the lock key, say): it cannot be
                // renewed, while the rest of a batch can.
                if self.remove(grant.id).is_some() {
                    grant.mark_lost(&format!("redis refused to renew it: {e}"));
                }
            }
        }
    }

    /// An explicit extend. A connection failure is only reported: the grant stays tracked, and
    /// its renewal (if on) or its deadline takes its course.
    fn extend_one(&mut self, grant: &Arc<Grant>, lease: Duration) -> redis::RedisResult<bool> {
        if !self.held.contains_key(&grant.id) {
            return Ok(false);
        }
        let sent = Instant::now();
        let reply = self
            .connection(std::slice::from_ref(grant))
            .and_then(|con| scripts::extend(con, &grant.keys, &grant.owner, lease));
        if let Err(e) = &reply {
            if e.is_io_error() || e.is_timeout() {
                self.con = None;
                return reply;
            }
        }
        self.settle(grant, sent, lease, reply.clone());
        reply.map(|extended| extended && grant.is_held())
    }

    /// Schedules the next renewal, unless the grant is not renewed or is past its maximum hold.
    fn reschedule(&mut self, id: u64, next: Instant) {
        if let Some(held) = self.held.get_mut(&id) {
            self.renewals.remove(&(held.next, id));
            held.next = next;
            let grant = &held.grant;
            if grant.auto_renew && grant.renew_until.is_none_or(|until| next < until) {
                self.renewals.insert((next, id));
            }
        }
    }

    /// One pipeline of extend calls, with a reply per call; loads the script and retries once
    /// after NOSCRIPT.
    fn extend_all(
        &mut self,
        batch: &[Arc<Grant>],
        leases: &[Duration],
    ) -> redis::RedisResult<Vec<redis::RedisResult<bool>>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (grant, lease) in batch.iter().zip(leases) {
            scripts::pipe_extend(&mut pipe, &grant.keys, &grant.owner, *lease);
        }
        let con = self.connection(batch)?;
        let replies: Vec<redis::RedisResult<bool>> = pipe.query(con)?;
        let no_script = |r: &redis::RedisResult<bool>| {
            r.as_ref().is_err_and(|e| {
                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            })
        };
        if replies.iter().any(no_script) {
            scripts::EXTEND.prepare_invoke().load(con)?;
            return pipe.query(con);
        }
        Ok(replies)
    }

    fn connection(&mut self, batch: &[Arc<Grant>]) -> redis::RedisResult<&mut redis::Connection> {
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
        let con = match self.con.take() {
            Some(con) => con,
            None => {
                let connect_timeout = timeout.min(self.connection_timeout);
                let mut con = crate::pool::connect(&self.client, connect_timeout, timeout)?;
                // A restarted server has no scripts: load now, rather than losing a whole
                // pipeline of extends to NOSCRIPT.
                scripts::EXTEND.prepare_invoke().load(&mut con)?;
                con
            }
        };
        con.set_read_timeout(Some(timeout))?;
        Ok(self.con.insert(con))
    }
}

impl Drop for Renewer {
    /// Runs on exit and on unwinding alike: leases nobody renews any more are as good as lost.
    fn drop(&mut self) {
        let waiting = {
            let mut inbox = lock(&self.inbox);
            inbox.closed = true;
            std::mem::take(&mut inbox.commands)
        };
        let waiting = waiting.into_iter().filter_map(|c| match c {
            Command::Hold(grant) => Some(grant),
            _ => None,
        });
        for grant in self.held.drain().map(|(_, held)| held.grant).chain(waiting) {
            grant.mark_lost("the renewal thread stopped");
        }
    }
}

/// After a failed renewal, try again soon enough to save the lease several times over.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(2), Duration::from_millis(500))
}
