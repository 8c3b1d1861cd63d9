//! The renewal thread: one per client, extending every held lease about every lease/3.
//!
//! Guards register and deregister over a crossbeam channel; the thread sleeps until the next
//! lease is due (or a command arrives), then extends every lease that is due, or nearly so, in
//! pipelines of up to [`BATCH`] owner-checked extend calls: one round trip renews many locks. It
//! uses a connection of its own, so callers exhausting the pool cannot starve it. A lease that
//! Redis reports gone or re-owned, or whose local deadline passes without a confirmed renewal
//! (Redis unreachable, this thread stalled), is reported lost at once through its guard's signal.
//!
//! The thread holds no reference to the client: when the client and all its guards are dropped,
//! the command channel disconnects and the thread exits.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::grant::Grant;
use crate::scripts;

/// Most extend calls in one pipeline (one round trip).
const BATCH: usize = 1000;

pub(crate) enum Command {
    /// Keep this grant's lease alive until told otherwise.
    Hold(Arc<Grant>),
    /// Stop renewing the grant with this id (it is being released).
    Forget(u64),
}

struct Held {
    grant: Arc<Grant>,
    next: Instant,
}

struct Renewer {
    client: redis::Client,
    connection_timeout: Duration,
    response_timeout: Duration,
    con: Option<redis::Connection>,
    held: HashMap<u64, Held>,
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
    };
    thread::Builder::new()
        .name("fencelock-renewal".to_owned())
        .spawn(move || renewer.run(&rx))?;
    Ok(tx)
}

impl Renewer {
    fn run(mut self, commands: &Receiver<Command>) {
        loop {
            let command = match self.next_wake() {
                Some(at) => commands.recv_deadline(at),
                None => commands.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match command {
                Ok(Command::Hold(grant)) => {
                    let next = grant.confirmed() + grant.lease / 3;
                    self.held.insert(grant.id, Held { grant, next });
                }
                Ok(Command::Forget(id)) => {
                    self.held.remove(&id);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.expire_overdue();
            self.renew_due();
        }
    }

    /// When something is next due: a renewal, or a local deadline to report.
    fn next_wake(&self) -> Option<Instant> {
        self.held
            .values()
            .map(|h| h.next.min(h.grant.deadline()))
            .min()
    }

    fn expire_overdue(&mut self) {
        let now = Instant::now();
        self.held.retain(|_, h| {
            if now < h.grant.deadline() {
                return true;
            }
            h.grant
                .mark_lost("its lease ran out before a renewal was confirmed");
            false
        });
    }

    fn renew_due(&mut self) {
        let now = Instant::now();
        // Leases due within the next sixth of a lease go now too, so one round trip serves many.
        let mut due: Vec<Arc<Grant>> = self
            .held
            .values()
            .filter(|h| h.next <= now + h.grant.lease / 6)
            .map(|h| Arc::clone(&h.grant))
            .collect();
        due.sort_by_key(|g| g.id);
        for batch in due.chunks(BATCH) {
            self.renew(batch);
        }
    }

    fn renew(&mut self, batch: &[Arc<Grant>]) {
        let started = Instant::now();
        match self.extend_all(batch) {
            Ok(replies) => {
                for (grant, extended) in batch.iter().zip(replies) {
                    if extended {
                        grant.confirm(started);
                        if let Some(h) = self.held.get_mut(&grant.id) {
                            h.next = started + grant.lease / 3;
                        }
                    } else if self.held.remove(&grant.id).is_some() {
                        grant.mark_lost("redis reports the key gone or owned by another");
                    }
                }
            }
            Err(e) => {
                log::debug!(
                    "fencelock: renewing {} lease(s) failed, retrying: {e}",
                    batch.len()
                );
                self.con = None;
                for grant in batch {
                    if let Some(h) = self.held.get_mut(&grant.id) {
                        h.next = started + retry_delay(grant.lease);
                    }
                }
            }
        }
    }

    /// One pipeline of extend calls; loads the script and retries once after NOSCRIPT.
    fn extend_all(&mut self, batch: &[Arc<Grant>]) -> redis::RedisResult<Vec<bool>> {
        let mut pipe = redis::pipe();
        for grant in batch {
            scripts::pipe_extend(&mut pipe, &grant.keys, &grant.owner, grant.lease);
        }
        let con = self.connection(batch)?;
        match pipe.query::<Vec<bool>>(con) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                scripts::EXTEND.prepare_invoke().load(con)?;
                pipe.query(con)
            }
            other => other,
        }
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
        let timeout = (shortest / 3).clamp(Duration::from_millis(5), self.response_timeout);
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

/// After a failed renewal, try again soon enough to save the lease several times over.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(2), Duration::from_millis(500))
}
