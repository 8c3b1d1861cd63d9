//! The renewal thread: one per client, extending every held lease about every lease/3.
//!
//! Guards register and deregister through an inbox the thread reads whenever it wakes; the
//! thread sleeps until the next lease is due, then extends every lease that is due, or nearly
//! so, in pipelines of up to [`BATCH`](schedule::BATCH) owner-checked extend calls, one pipeline
//! per node: one round trip renews many locks. It uses connections of its own, so callers
//! exhausting the pool cannot starve it. A lease that Redis reports gone or re-owned, or whose
//! local deadline passes without a confirmed renewal (Redis unreachable, this thread stalled), is
//! reported lost through its guard's signal.
//!
//! The bookkeeping is a [`Schedule`], which does no I/O and reads no clock: it says which grants
//! are due and which are lost, and is told the replies. Renewal times and deadlines are kept
//! there in ordered sets, so each tick costs time in proportion to the leases it renews, not to
//! all leases held. This file is the thread around it: the inbox, the doorbell, the connections
//! and the wire.
//!
//! Taking and releasing a lock costs no wake-up of this thread, which on a small machine would
//! compete with the caller and Redis for a core: a new grant rings the thread's doorbell (a
//! crossbeam channel) only if its first renewal falls due before the thread would wake anyway.
//!
//! The thread holds no reference to the client: when the client and all its guards are dropped,
//! the doorbell disconnects and the thread exits.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::Error;
use crate::grant::Grant;
use crate::metrics;
use crate::net::connector::{Connector, Node, Redirect};
use crate::net::wire::{self, Arg, Interrupted};
use crate::scripts::{self, ReplicaAcks};

mod schedule;

use schedule::{Loss, Reply, Schedule};

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
        reply: Sender<Result<bool, Error>>,
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
    ) -> Receiver<Result<bool, Error>> {
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

struct Renewer {
    inbox: Arc<Mutex<Inbox>>,
    /// Longest sleep: a sixth of the client's lease, at most a second.
    idle_wake: Duration,
    connector: Arc<Connector>,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// Replicas that must acknowledge a renewal before it counts
    /// ([`Builder::min_replica_acks`](crate::Builder::min_replica_acks)).
    acks: Option<ReplicaAcks>,
    /// One connection per node, made when first needed and dropped when it fails or its node
    /// moves to another server (with the connector's epoch when it was made).
    cons: HashMap<Node, (u64, redis::Connection)>,
    /// Every grant tracked: when each falls due, by when each must be confirmed.
    schedule: Schedule,
    /// The commands of one pipeline and where each ends, reused.
    buf: (Vec<u8>, Vec<usize>),
}

pub(crate) fn spawn(
    connector: Arc<Connector>,
    lease: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
    acks: Option<ReplicaAcks>,
) -> std::io::Result<Renewal> {
    let (doorbell, rung) = crossbeam_channel::bounded(1);
    let inbox = Arc::new(Mutex::new(Inbox::default()));
    let renewer = Renewer {
        inbox: Arc::clone(&inbox),
        idle_wake: (lease / 6).clamp(MIN_TIMEOUT, Duration::from_secs(1)),
        connector,
        connection_timeout,
        response_timeout,
        acks,
        cons: HashMap::new(),
        schedule: Schedule::default(),
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
                    Command::Hold(grant) => taken_in.push(grant),
                    Command::Forget(id) => {
                        self.schedule.forget(id);
                    }
                    Command::Extend {
                        grant,
                        lease,
                        reply,
                    } => {
                        // Filed first: the extend moves its grant to a cohort of its own.
                        self.schedule.hold(std::mem::take(&mut taken_in));
                        let _ = reply.send(self.extend_one(&grant, lease));
                    }
                }
            }
            self.schedule.hold(taken_in);
            report(self.schedule.expire_overdue(Instant::now()));
            self.renew_due();
            // While locks come and go, look at the inbox now and then even with nothing due: a
            // grant made meanwhile then falls due after that look (a third of a lease away) and
            // needs no ring. After a whole quiet period with nothing held, sleep until rung.
            let idle =
                (!quiet || !self.schedule.is_empty()).then(|| Instant::now() + self.idle_wake);
            let wake = self.schedule.next_wake().into_iter().chain(idle).min();
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

    /// Renews every lease due, in pipelines, and files each by its reply. With more than one
    /// node due (a cluster's masters), each node's pipelines go out on a thread of their own and
    /// are filed as they are answered: a node that does not answer holds up the renewal of its
    /// own leases, not the others'. (The next round still waits for it: at most the response
    /// timeout, or its batch's last deadline.)
    fn renew_due(&mut self) {
        if self
            .schedule
            .next_wake()
            .is_some_and(|at| at <= Instant::now())
        {
            // A cluster's map suspect (a node failed, a slot moved): ask for it before the
            // grants are grouped by node.
            self.connector.refresh(self.connection_timeout);
        }
        let connector = &self.connector;
        let due = self
            .schedule
            .due(Instant::now(), |grant| connector.node_of(&grant.keys));
        let Some(round) = due else {
            return;
        };
        let mut nodes: Vec<Node> = round.pipelines.iter().map(|(node, _)| *node).collect();
        nodes.dedup();
        if nodes.len() <= 1 {
            for (node, batch) in round.pipelines {
                // An earlier batch may have taken long enough for deadlines in this one to pass.
                let (batch, lost) = self
                    .schedule
                    .unexpired(batch, round.earliest, Instant::now());
                report(lost);
                if !batch.is_empty() {
                    self.renew(node, batch);
                }
            }
            return;
        }
        let mut by_node: Vec<(Node, Held, Batches)> = Vec::new();
        for (node, batch) in round.pipelines {
            let (batch, lost) = self
                .schedule
                .unexpired(batch, round.earliest, Instant::now());
            report(lost);
            if batch.is_empty() {
                continue;
            }
            match by_node.iter_mut().find(|(n, ..)| *n == node) {
                Some((.., batches)) => batches.push(batch),
                None => by_node.push((node, self.cons.remove(&node), vec![batch])),
            }
        }
        // Each node's work in a slot of its own, taken by the thread that does it (or by this
        // one, if no thread could be started); each node's replies are filed as they come, so
        // that a node that answers at once is not held up by one that does not.
        type Work = (Held, Batches);
        type Done = (Node, Held, Vec<Sent>);
        let slots: Vec<(Node, Mutex<Option<Work>>)> = by_node
            .into_iter()
            .map(|(node, held, batches)| (node, Mutex::new(Some((held, batches)))))
            .collect();
        let connector = Arc::clone(&self.connector);
        let link = Link {
            connector: &connector,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
            acks: self.acks,
        };
        let work = |node: Node, slot: &Mutex<Option<Work>>| -> Option<Done> {
            let (mut held, batches) = slot.lock().unwrap_or_else(PoisonError::into_inner).take()?;
            let mut buf = (Vec::new(), Vec::new());
            let sent: Vec<Sent> = batches
                .into_iter()
                .map(|batch| link.send(node, batch, &mut held, &mut buf))
                .collect();
            Some((node, held, sent))
        };
        let work = &work;
        let (finished, results) = crossbeam_channel::unbounded::<Done>();
        thread::scope(|scope| {
            for (node, slot) in &slots {
                let to_us = finished.clone();
                let spawned = thread::Builder::new()
                    .name("fencelock-renew-node".to_owned())
                    .spawn_scoped(scope, move || {
                        if let Some(done) = work(*node, slot) {
                            let _ = to_us.send(done);
                        }
                    });
                if spawned.is_err() {
                    // No thread: here, in turn.
                    if let Some(done) = work(*node, slot) {
                        let _ = finished.send(done);
                    }
                }
            }
            // The results end when every thread has ended.
            drop(finished);
            for (node, held, pipelines) in results.iter() {
                if let Some(held) = held {
                    self.cons.insert(node, held);
                }
                for sent in pipelines {
                    self.file(node, sent);
                }
            }
        });
    }

    /// Renews one pipeline's worth of grants served by `node`, and files each according to its
    /// reply.
    fn renew(&mut self, node: Node, batch: Vec<Arc<Grant>>) {
        let mut held = self.cons.remove(&node);
        let mut buf = std::mem::take(&mut self.buf);
        let sent = self.link().send(node, batch, &mut held, &mut buf);
        self.buf = buf;
        if let Some(held) = held {
            self.cons.insert(node, held);
        }
        self.file(node, sent);
    }

    /// Files each grant of a pipeline sent to `node` according to its reply.
    fn file(&mut self, node: Node, sent: Sent) {
        let Sent {
            batch,
            leases,
            sent,
            replies,
            epoch,
        } = sent;
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                metrics::renewal_failed(&batch[0].keys, &e);
                log::debug!(
                    "fencelock: renewing {} lease(s) failed, retrying: {e}",
                    batch.len()
                );
                self.connector.failed(node, epoch, &e);
                self.schedule.retry(batch, &leases, sent);
                return;
            }
        };
        let (replies, short) = self.acknowledged(replies);
        if let Some(acked) = short {
            log::debug!(
                "fencelock: renewals of {} lease(s) reached {acked} of the replicas required; \
                 not counted, retrying",
                batch.len()
            );
        }
        let (now, first) = (Instant::now(), Arc::clone(&batch[0]));
        // A cluster master frozen while its replica took over answers what waited in its socket
        // when it wakes, and then drops what that wrote: a renewal that slow is not counted.
        let slow = self.connector.suspect_reply(now - sent);
        let mut renewed = 0;
        // Extends a cluster node sent on with ASK (their keys moved to a node importing the
        // slot): sent there at once, behind an ASKING, since the map will not name that node
        // until the migration ends.
        let mut asked = Vec::new();
        let sent_on: Vec<(Arc<Grant>, Duration)> = if self.connector.routes() {
            batch.iter().cloned().zip(leases.iter().copied()).collect()
        } else {
            Vec::new()
        };
        let replies = replies
            .into_iter()
            .enumerate()
            .map(|(i, reply)| match reply {
                Some(Ok(reply)) => match scripts::extended(reply) {
                    // Re-armed on the master only: a failover now would bring back the lease as it
                    // was, so the deadline stays where the last acknowledged renewal put it.
                    Ok(true) if short.is_some() || slow => Reply::Unknown,
                    reply => Reply::from(&reply),
                },
                // A cluster node that does not serve the key (no longer, not yet, or not now):
                // refused unrun, and sent again where the map says once it learnt from the reply.
                Some(Err(e)) => match self.connector.redirect(&e, node) {
                    Some(Redirect::Ask(_)) => {
                        asked.push(i);
                        Reply::Unknown
                    }
                    Some(_) => Reply::Unknown,
                    None => Reply::Refused(e.to_string()),
                },
                // A signal interrupted the read of it.
                None => Reply::Unknown,
            });
        let replies =
            replies.inspect(|reply| renewed += u64::from(matches!(reply, Reply::Extended)));
        report(self.schedule.settle(batch, leases, replies, sent, now));
        metrics::renewed(&first.keys, now - sent, renewed);
        for i in asked {
            let (grant, lease) = &sent_on[i];
            if let Err(e) = self.extend_one(grant, *lease) {
                log::debug!("fencelock: renewing a lease on a migrating slot failed: {e}");
            }
        }
    }

    /// Splits the reply of the trailing `WAIT` off a pipeline's replies, when replica
    /// acknowledgement is on; the second value is the count acknowledged when it is too low
    /// (an unread or refused `WAIT` counts as none).
    fn acknowledged(
        &self,
        mut replies: Vec<Option<redis::RedisResult<redis::Value>>>,
    ) -> (Vec<Option<redis::RedisResult<redis::Value>>>, Option<u32>) {
        let Some(acks) = self.acks else {
            return (replies, None);
        };
        let acked = match replies.pop() {
            Some(Some(Ok(value))) => redis::from_redis_value::<u32>(value).unwrap_or(0),
            _ => 0,
        };
        (replies, (acked < acks.replicas).then_some(acked))
    }

    /// An explicit extend. A connection failure is only reported: the grant stays tracked, and
    /// its renewal (if on) or its deadline takes its course. So does an extend too few replicas
    /// acknowledged, which is answered with [`Error::NotReplicated`].
    fn extend_one(&mut self, grant: &Arc<Grant>, lease: Duration) -> Result<bool, Error> {
        if !self.schedule.tracks(grant.id) {
            return Ok(false);
        }
        let mut sent = Instant::now();
        let mut reply = self.extend_once(grant, lease, None);
        // The node that answered last.
        let mut from = self.connector.node_of(&grant.keys);
        for _ in 0..wire::MAX_INTERRUPTS {
            let asking = match &reply {
                Err(e) if wire::interrupted(e) => None,
                // A cluster's redirect: the extend did not run; it goes where the reply says.
                Err(e) => match self.connector.redirect(e, from) {
                    Some(Redirect::Moved(_)) => None,
                    Some(Redirect::Ask(node)) => Some(node),
                    Some(Redirect::Later) => {
                        thread::sleep(Duration::from_millis(10));
                        None
                    }
                    None => break,
                },
                _ => break,
            };
            sent = Instant::now();
            from = asking.unwrap_or_else(|| self.connector.node_of(&grant.keys));
            reply = self.extend_once(grant, lease, asking);
        }
        let outcome = match &reply {
            // Still redirected after the tries above (a CLUSTERDOWN that lasts, say): the lease
            // stands unconfirmed, as after a broken connection.
            Err(e) if self.connector.redirect(e, from).is_some() => Reply::Unknown,
            Err(e) if e.is_io_error() || self.connector.not_master(e) => {
                if !wire::interrupted(e) {
                    let node = self.connector.node_of(&grant.keys);
                    let epoch = self.made(node);
                    self.connector.failed(node, epoch, e);
                }
                Reply::Unknown
            }
            Err(e) => Reply::Refused(e.to_string()),
            Ok((true, Some(_))) => Reply::Unknown,
            // As for a renewal: too slow to count (see `renew`).
            Ok((true, None)) if self.connector.suspect_reply(sent.elapsed()) => Reply::Unknown,
            Ok((true, None)) => Reply::Extended,
            Ok((false, _)) => Reply::Gone,
        };
        report(
            self.schedule
                .extended(grant, lease, outcome, sent, Instant::now()),
        );
        match reply {
            Ok((true, Some(acked))) => Err(Error::NotReplicated {
                acked,
                required: self.acks.map_or(0, |a| a.replicas),
            }),
            Ok((extended, _)) => Ok(extended && grant.is_held()),
            Err(e) => Err(Error::from_redis(e)),
        }
    }

    /// One extend call (and `WAIT`, with replica acknowledgement on): whether the lease was
    /// re-armed, and the count acknowledged when it is too low. `asking`: a cluster node that
    /// an `ASK` redirect named, to send it to behind an `ASKING`.
    fn extend_once(
        &mut self,
        grant: &Arc<Grant>,
        lease: Duration,
        asking: Option<Node>,
    ) -> redis::RedisResult<(bool, Option<u32>)> {
        let node = asking.unwrap_or_else(|| self.connector.node_of(&grant.keys));
        let acks = self.wait_for(std::slice::from_ref(grant));
        let con = self.connection(node, std::slice::from_ref(grant))?;
        if asking.is_some() {
            redis::cmd("ASKING").query::<()>(con)?;
        }
        let owner = grant.keys.owner();
        match acks {
            None => scripts::extend(con, &grant.keys, owner, lease).map(|ours| (ours, None)),
            Some(acks) => scripts::extend_acked(con, &grant.keys, owner, lease, acks)
                .map(|(ours, acked)| (ours, (acked < acks.replicas).then_some(acked))),
        }
    }

    /// What the connections need (see [`Link`]).
    fn link(&self) -> Link<'_> {
        Link {
            connector: &self.connector,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
            acks: self.acks,
        }
    }

    /// See [`Link::wait_for`].
    fn wait_for(&self, batch: &[Arc<Grant>]) -> Option<ReplicaAcks> {
        self.link().wait_for(batch)
    }

    /// Drops the connection to `node` after a failure; returns the connector epoch it was made
    /// at (the current one if there was none: connecting failed).
    fn made(&mut self, node: Node) -> u64 {
        match self.cons.remove(&node) {
            Some((epoch, _)) => epoch,
            None => self.connector.epoch(node),
        }
    }

    /// The connection to `node`, made or kept (see [`Link::ready`]).
    fn connection(
        &mut self,
        node: Node,
        batch: &[Arc<Grant>],
    ) -> redis::RedisResult<&mut redis::Connection> {
        let mut held = self.cons.remove(&node);
        Link {
            connector: &self.connector,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
            acks: self.acks,
        }
        .ready(node, batch, &mut held)?;
        match held {
            Some(held) => Ok(&mut self.cons.entry(node).or_insert(held).1),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no renewal connection",
            ))),
        }
    }
}

/// A renewal connection to a node, with the connector epoch it was made at, if there is one.
type Held = Option<(u64, redis::Connection)>;

/// One node's pipelines of a round.
type Batches = Vec<Vec<Arc<Grant>>>;

/// The settings the renewal's connections need, and the connector: what a thread sending one
/// node's pipelines gets.
#[derive(Clone, Copy)]
struct Link<'a> {
    connector: &'a Connector,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// Replicas that must acknowledge a renewal before it counts.
    acks: Option<ReplicaAcks>,
}

/// A pipeline of extends sent, and what came of it.
struct Sent {
    batch: Vec<Arc<Grant>>,
    leases: Vec<Duration>,
    sent: Instant,
    /// A reply per extend (`None`: a signal interrupted the read of it), and with replica
    /// acknowledgement on, the `WAIT`'s last; an error if the pipeline failed as a whole (or
    /// was refused unrun by a server that is no master any more).
    replies: redis::RedisResult<Vec<Option<redis::RedisResult<redis::Value>>>>,
    /// The connector epoch of the connection it went on (the current one if none was made).
    epoch: u64,
}

impl Link<'_> {
    /// Sends one pipeline renewing `batch` to `node` on `held` (made or replaced first if need
    /// be), `buf` its reused encoding. A connection that failed is dropped (`held` left empty).
    fn send(
        &self,
        node: Node,
        batch: Vec<Arc<Grant>>,
        held: &mut Option<(u64, redis::Connection)>,
        buf: &mut (Vec<u8>, Vec<usize>),
    ) -> Sent {
        let sent = Instant::now();
        let leases: Vec<Duration> = batch.iter().map(|g| g.renewal_lease()).collect();
        let replies = self
            .extend_all(node, &batch, &leases, held, buf)
            .and_then(|replies| {
                // Refused unrun by a server that is no longer the master: as if the connection
                // had failed, the batch goes again, to the new master.
                match replies.iter().find_map(|r| match r {
                    Some(Err(e)) if self.connector.not_master(e) => Some(e.clone()),
                    _ => None,
                }) {
                    Some(e) => Err(e),
                    None => Ok(replies),
                }
            });
        let epoch = held
            .as_ref()
            .map_or_else(|| self.connector.epoch(node), |(epoch, _)| *epoch);
        if replies.is_err() {
            *held = None;
        }
        Sent {
            batch,
            leases,
            sent,
            replies,
            epoch,
        }
    }

    /// One pipeline of extend calls to `node`, with a reply per call (`None`: a signal
    /// interrupted the read of it), and with replica acknowledgement on, a `WAIT` behind them
    /// and its reply last: the extends are this connection's writes, so it counts the replicas
    /// that have all of them.
    fn extend_all(
        &self,
        node: Node,
        batch: &[Arc<Grant>],
        leases: &[Duration],
        held: &mut Option<(u64, redis::Connection)>,
        (buf, ends): &mut (Vec<u8>, Vec<usize>),
    ) -> redis::RedisResult<Vec<Option<redis::RedisResult<redis::Value>>>> {
        buf.clear();
        ends.clear();
        for (grant, lease) in batch.iter().zip(leases) {
            scripts::pack_extend(buf, &grant.keys, grant.keys.owner(), *lease);
            ends.push(buf.len());
        }
        // A WAIT sent again by itself would count nothing of ours: with one, an interrupted read
        // leaves its command unanswered (and its lease unconfirmed) instead.
        let on_interrupt = match self.wait_for(batch) {
            None => Interrupted::SendAgain,
            Some(acks) => {
                wire::pack(
                    buf,
                    &[
                        Arg::Str("WAIT"),
                        Arg::Int(u64::from(acks.replicas)),
                        Arg::Int(crate::key::millis(acks.timeout)),
                    ],
                );
                ends.push(buf.len());
                Interrupted::LeaveUnanswered
            }
        };
        self.ready(node, batch, held)?;
        let Some((_, con)) = held.as_mut() else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no renewal connection",
            )));
        };
        scripts::run_pipeline(con, &scripts::EXTEND, buf, ends, on_interrupt)
    }

    /// How long a reply to a pipeline renewing `batch` is worth waiting for: until the last
    /// deadline of the batch, within the response timeout (see [`ready`](Self::ready)).
    fn budget(&self, batch: &[Arc<Grant>]) -> Duration {
        let now = Instant::now();
        let last_deadline = batch.iter().map(|g| g.deadline()).max().unwrap_or(now);
        last_deadline
            .saturating_duration_since(now)
            .max(MIN_TIMEOUT)
            .min(self.response_timeout)
    }

    /// The `WAIT` to send behind a pipeline renewing `batch`, if replicas must acknowledge: its
    /// timeout cut to well within the pipeline's read budget, so that replicas too slow for the
    /// deadline come back as too few acknowledgements, not as a timed-out (dropped) connection.
    fn wait_for(&self, batch: &[Arc<Grant>]) -> Option<ReplicaAcks> {
        let acks = self.acks?;
        let budget = self.budget(batch);
        // Never 0 ms: that would make WAIT block for good.
        let timeout = acks
            .timeout
            .min(budget - budget / 4)
            .max(Duration::from_millis(1));
        Some(ReplicaAcks { timeout, ..acks })
    }

    /// Makes `held` a connection to `node` of the current epoch, whose reads wait as long as a
    /// reply can save a lease of `batch`: kept if it is one, made anew otherwise (left empty on
    /// failure).
    fn ready(
        &self,
        node: Node,
        batch: &[Arc<Grant>],
        held: &mut Option<(u64, redis::Connection)>,
    ) -> redis::RedisResult<()> {
        // A reply is worth waiting for as long as it can save any lease of the batch: until its
        // last deadline. Bounding it by the *first* deadline instead lets one lease that is nearly
        // out shrink the budget of the whole pipeline, which then times out, and every retry has
        // less time than the one before: under load, the whole batch spirals into loss. Leases
        // whose deadline passes meanwhile are lost all the same: `is_held()` turns false by
        // itself, and a confirmation that comes late cannot revive them. Connecting is bounded
        // the same way.
        let timeout = self.budget(batch);
        let epoch = self.connector.epoch(node);
        let con = match held.take() {
            Some((made, con)) if made == epoch => con,
            _ => {
                let connect_timeout = timeout.min(self.connection_timeout);
                let mut con = self.connector.connect(node, connect_timeout, timeout)?;
                // A new connection often follows a restart, and a restarted server has no
                // scripts. Loading now costs a round trip here, where a pipeline refused with
                // NOSCRIPT and sent again would take it out of leases that may be nearly out.
                scripts::EXTEND.load(&mut con)?;
                con
            }
        };
        con.set_read_timeout(Some(timeout))?;
        *held = Some((epoch, con));
        Ok(())
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
        for grant in self.schedule.drain().chain(waiting) {
            grant.mark_lost("the renewal thread stopped");
        }
    }
}

/// Marks lost the grants the schedule gave up.
fn report(lost: impl IntoIterator<Item = Loss>) {
    for Loss { grant, why } in lost {
        grant.mark_lost(&why.to_string());
    }
}

impl From<&redis::RedisResult<bool>> for Reply {
    /// The reply to one extend call that was read.
    fn from(reply: &redis::RedisResult<bool>) -> Reply {
        match reply {
            Ok(true) => Reply::Extended,
            Ok(false) => Reply::Gone,
            Err(e) => Reply::Refused(e.to_string()),
        }
    }
}
