//! The renewal thread: one per client, extending every held lease about every lease/3.
//!
//! Guards register and deregister over a crossbeam channel; the thread sleeps until the next
//! lease is due (or a command arrives), then extends every lease that is due, or nearly so, in
//! pipelines of up to [`BATCH`] owner-checked extend calls: one round trip renews many locks. It
//! uses a connection of its own, so callers exhausting the pool cannot starve it. A lease that
//! Redis reports gone or re-owned, or whose local deadline passes without a confirmed renewal
//! (Redis unreachable, this thread stalled), is reported lost through its guard's signal.
//!
//! Renewal times and deadlines are kept in ordered sets, so each tick costs time in proportion
//! to the leases it renews, not to all leases held.
//!
//! The thread holds no reference to the client: when the client and all its guards are dropped,
//! the command channel disconnects and the thread exits.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::grant::Grant;
use crate::scripts;

/// Most extend calls in one pipeline (one round trip).
const BATCH: usize = 1000;
/// Shortest read or connect timeout the thread uses.
const MIN_TIMEOUT: Duration = Duration::from_millis(5);

pub(crate) enum Command {
    /// Keep this grant's lease alive until told otherwise.
    Hold(Arc<Grant>),
    /// Stop renewing the grant with this id (it is being released).
    Forget(u64),
}

struct Held {
    grant: Arc<Grant>,
    next: Instant,
    deadline: Instant,
}

struct Renewer {
    client: redis::Client,
    connection_timeout: Duration,
    response_timeout: Duration,
    con: Option<redis::Connection>,
    held: HashMap<u64, Held>,
    /// `(next renewal, id)` of every held grant.
    renewals: BTreeSet<(Instant, u64)>,
    /// `(local deadline, id)` of every held grant.
    deadlines: BTreeSet<(Instant, u64)>,
}

pub(crate) fn spawn(
    client: redis::Client,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> std::io::Result<Sender<Command>> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let renewer = Renewer {
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
        .spawn(move || renewer.run(&rx))?;
    Ok(tx)
}

impl Renewer {
    fn run(mut self, commands: &Receiver<Command>) {
        loop {
            let wake = [self.renewals.first(), self.deadlines.first()]
                .into_iter()
                .flatten()
                .map(|(at, _)| *at)
                .min();
            let command = match wake {
                Some(at) => commands.recv_deadline(at),
                None => commands.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match command {
                Ok(command) => self.apply(command),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            // Take in the whole backlog before working, so a burst of grants costs one pass.
            for command in commands.try_iter() {
                self.apply(command);
            }
            self.expire_overdue();
            self.renew_due();
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Hold(grant) => {
                let id = grant.id;
                let next = grant.confirmed() + grant.lease / 3;
                let deadline = grant.deadline();
                self.renewals.insert((next, id));
                self.deadlines.insert((deadline, id));
                self.held.insert(
                    id,
                    Held {
                        grant,
                        next,
                        deadline,
                    },
                );
            }
            Command::Forget(id) => {
                self.remove(id);
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
            if let Some(grant) = self.remove(id) {
                grant.mark_lost("its lease ran out before a renewal was confirmed");
            }
        }
    }

    fn renew_due(&mut self) {
        let now = Instant::now();
        // Leases due within the next sixth of a lease go now too, so one round trip serves many.
        let due: Vec<Arc<Grant>> = self
            .renewals
            .iter()
            .map_while(|(next, id)| {
                let grant = &self.held.get(id)?.grant;
                (*next <= now + grant.lease / 6).then(|| Arc::clone(grant))
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
        let replies = match self.extend_all(batch) {
            Ok(replies) => replies,
            Err(e) => {
                log::debug!(
                    "fencelock: renewing {} lease(s) failed, retrying: {e}",
                    batch.len()
                );
                self.con = None;
                for grant in batch {
                    self.reschedule(grant.id, sent + retry_delay(grant.lease));
                }
                return;
            }
        };
        for (grant, reply) in batch.iter().zip(replies) {
            match reply {
                Ok(true) => {
                    if grant.confirm(sent) {
                        self.confirmed(grant, sent);
                    } else {
                        self.remove(grant.id);
                    }
                }
                Ok(false) => {
                    if self.remove(grant.id).is_some() {
                        grant.mark_lost("redis reports the key gone or owned by another");
                    }
                }
                Err(e) => {
                    // This key alone is broken (a wrong type at the lock key, say): it cannot be
                    // renewed, while the rest of the batch can.
                    if self.remove(grant.id).is_some() {
                        grant.mark_lost(&format!("redis refused to renew it: {e}"));
                    }
                }
            }
        }
    }

    fn confirmed(&mut self, grant: &Grant, sent: Instant) {
        if let Some(held) = self.held.get_mut(&grant.id) {
            self.deadlines.remove(&(held.deadline, grant.id));
            held.deadline = grant.deadline();
            self.deadlines.insert((held.deadline, grant.id));
        }
        self.reschedule(grant.id, sent + grant.lease / 3);
    }

    fn reschedule(&mut self, id: u64, next: Instant) {
        if let Some(held) = self.held.get_mut(&id) {
            self.renewals.remove(&(held.next, id));
            held.next = next;
            self.renewals.insert((next, id));
        }
    }

    /// One pipeline of extend calls, with a reply per call; loads the script and retries once
    /// after NOSCRIPT.
    fn extend_all(
        &mut self,
        batch: &[Arc<Grant>],
    ) -> redis::RedisResult<Vec<redis::RedisResult<bool>>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for grant in batch {
            scripts::pipe_extend(&mut pipe, &grant.keys, &grant.owner, grant.lease);
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
        // A reply that arrives after a third of the shortest lease is too late to be useful:
        // time out and reconnect while the leases can still be saved. Connecting is bounded the
        // same way, so the thread is never stuck past a deadline it has to report.
        let shortest = batch
            .iter()
            .map(|g| g.lease)
            .min()
            .unwrap_or(self.response_timeout);
        let timeout = (shortest / 3).max(MIN_TIMEOUT).min(self.response_timeout);
        let con = match self.con.take() {
            Some(con) => con,
            None => {
                let connect_timeout = timeout.min(self.connection_timeout);
                crate::pool::connect(&self.client, connect_timeout, timeout)?
            }
        };
        con.set_read_timeout(Some(timeout))?;
        Ok(self.con.insert(con))
    }
}

impl Drop for Renewer {
    /// Runs on exit and on unwinding alike: leases nobody renews any more are as good as lost.
    fn drop(&mut self) {
        for (_, held) in self.held.drain() {
            held.grant.mark_lost("the renewal thread stopped");
        }
    }
}

/// After a failed renewal, try again soon enough to save the lease several times over.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(2), Duration::from_millis(500))
}
