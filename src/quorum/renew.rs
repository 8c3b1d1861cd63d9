//! The renewal thread of a quorum client: keeps every grant's lease alive on a majority, and
//! reports a grant lost the moment it cannot be.
//!
//! A round of one grant sends `extend` to every master at `s`; the first majority of `1`s moves
//! the grant's deadline to `s + lease − drift` (never back) and ends the round. Replies that come
//! after, or belong to an earlier round, count for nothing.
//!
//! | in a round | what happens |
//! |---|---|
//! | a majority answers `1` | the deadline moves; the next round a third of a lease later |
//! | more than N − majority answer `0` (the key gone or another's) | lost at once: no majority can hold it any more |
//! | neither, within the response timeout or a third of the lease, whichever is shorter (masters frozen, down) | the round ends; the next starts a tenth of a lease later |
//! | the deadline passes | lost: `is_held()` says false from the deadline on, and `lost()` fires |
//!
//! A grant that does not renew (`LockOptions::renew(false)`, or past its maximum hold) is
//! watched only for its deadline, so that `lost()` fires on time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::masters::{Call, Masters, Reply};
use super::{Quorum, Tally};
use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::scripts;

/// The least time between two passes over every grant.
const TICK: Duration = Duration::from_millis(1);

pub(crate) enum Command {
    Hold(Arc<Grant>),
    Forget(u64),
}

/// The most commands left for the thread before it is woken to take them.
const MAX_PENDING: usize = 1024;

/// Grants held and forgotten since the thread last looked, and when it looks next. A lock call
/// and its unlock leave their grant here without waking the thread (a wake-up is a context
/// switch each, on the caller's core as often as not), unless the grant is due before the thread
/// looks anyway.
struct Inbox {
    commands: Vec<Command>,
    /// When the thread looks next, unless woken.
    wake: Instant,
}

/// The client's handle on the thread; the thread ends when it is dropped.
pub(crate) struct Renewal {
    /// Wakes the thread (an empty message); its end ends the thread.
    wakes: Sender<()>,
    inbox: Arc<Mutex<Inbox>>,
}

impl Renewal {
    pub(crate) fn spawn(
        masters: Arc<Masters>,
        quorum: usize,
        response_timeout: Duration,
    ) -> std::io::Result<Renewal> {
        let (wakes, woken) = crossbeam_channel::unbounded();
        let (replies_tx, replies) = crossbeam_channel::unbounded();
        let inbox = Arc::new(Mutex::new(Inbox {
            commands: Vec::new(),
            wake: Instant::now(),
        }));
        let pending = Arc::clone(&inbox);
        thread::Builder::new()
            .name("fencelock-renew".into())
            .spawn(move || {
                Renewer {
                    masters,
                    quorum,
                    response_timeout,
                    held: HashMap::new(),
                    rounds: HashMap::new(),
                    replies_tx,
                    next_round: 0,
                }
                .run(&pending, &woken, &replies);
            })?;
        Ok(Renewal { wakes, inbox })
    }

    /// Leaves `command` for the thread; wakes it if `due` is before it looks, or too much
    /// waits. False if the thread is gone.
    fn leave(&self, command: Command, due: Option<Instant>) -> bool {
        let wake = {
            let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            inbox.commands.push(command);
            due.is_some_and(|due| due < inbox.wake) || inbox.commands.len() > MAX_PENDING
        };
        !wake || self.wakes.send(()).is_ok()
    }

    /// Keeps `grant` alive until forgotten; false if the thread is gone.
    pub(crate) fn hold(&self, grant: Arc<Grant>) -> bool {
        let due = grant.next_renewal().min(grant.deadline());
        self.leave(Command::Hold(grant), Some(due))
    }

    pub(crate) fn forget(&self, id: u64) {
        let _ = self.leave(Command::Forget(id), None);
    }
}

struct Held {
    grant: Arc<Grant>,
    round: Option<Round>,
    /// No round before this (after one that failed).
    not_before: Instant,
}

struct Round {
    tag: u64,
    sent: Instant,
    lease: Duration,
    yes: usize,
    no: usize,
    failed: usize,
}

struct Renewer {
    masters: Arc<Masters>,
    quorum: usize,
    response_timeout: Duration,
    held: HashMap<u64, Held>,
    /// The grant of each round under way, by the round's tag.
    rounds: HashMap<u64, u64>,
    replies_tx: Sender<Reply>,
    next_round: u64,
}

impl Renewer {
    fn run(mut self, inbox: &Mutex<Inbox>, woken: &Receiver<()>, replies: &Receiver<Reply>) {
        // Looking over every grant costs a pass over all of them: done when something is due
        // (or a grant came), not for every reply, and at most every millisecond.
        let mut wake = Instant::now();
        let mut commands = Vec::new();
        loop {
            let now = Instant::now();
            // Commands first: a grant forgotten must not be renewed by this pass.
            for command in commands.drain(..) {
                match command {
                    Command::Hold(grant) => {
                        let id = grant.id;
                        wake = wake.min(grant.next_renewal()).min(grant.deadline());
                        self.held.insert(
                            id,
                            Held {
                                grant,
                                round: None,
                                not_before: now,
                            },
                        );
                    }
                    Command::Forget(id) => {
                        if let Some(Round { tag, .. }) = self.held.remove(&id).and_then(|h| h.round)
                        {
                            self.rounds.remove(&tag);
                        }
                    }
                }
            }
            if now >= wake {
                self.tick(now);
                wake = self.next_wake(now).max(now + TICK);
            }
            {
                // What came meanwhile is taken before sleeping; what comes after sees `wake`.
                let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
                if !inbox.commands.is_empty() {
                    std::mem::swap(&mut commands, &mut inbox.commands);
                    continue;
                }
                inbox.wake = wake;
            }
            crossbeam_channel::select! {
                recv(woken) -> woke => {
                    // The client is gone, and every guard with it.
                    if woke.is_err() {
                        return;
                    }
                    let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
                    std::mem::swap(&mut commands, &mut inbox.commands);
                },
                recv(replies) -> reply => {
                    if let Ok(reply) = reply {
                        if let Some(next) = self.reply(reply) {
                            wake = wake.min(next);
                        }
                    }
                },
                default(wake.saturating_duration_since(Instant::now())) => {
                    let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
                    std::mem::swap(&mut commands, &mut inbox.commands);
                }
            }
        }
    }

    /// Starts the rounds that are due, ends those that ran out of time, and reports losses.
    fn tick(&mut self, now: Instant) {
        let mut lost = Vec::new();
        for (id, held) in &mut self.held {
            let grant = &held.grant;
            if !grant.is_held() {
                // is_held marked it lost at its deadline.
                lost.push(*id);
                continue;
            }
            if let Some(round) = &held.round {
                if now >= round.sent + round_time(self.response_timeout, round.lease) {
                    self.rounds.remove(&round.tag);
                    held.round = None;
                    held.not_before = now + grant.renewal_lease() / 10;
                }
                continue;
            }
            if !renews(grant, now) || now < held.not_before || now < grant.next_renewal() {
                continue;
            }
            let tag = self.next_round;
            self.next_round += 1;
            let lease = grant.renewal_lease();
            let mut packed = Vec::with_capacity(128);
            scripts::pack_extend(&mut packed, &grant.keys, grant.keys.owner(), lease);
            let call = Call {
                script: &scripts::EXTEND,
                packed,
                expires: now + round_time(self.response_timeout, lease),
                reply: &self.replies_tx,
                tag,
                once: false,
            };
            self.masters.send(0..self.masters.len(), call);
            self.rounds.insert(tag, *id);
            held.round = Some(Round {
                tag,
                sent: now,
                lease,
                yes: 0,
                no: 0,
                failed: 0,
            });
        }
        for id in lost {
            if let Some(Round { tag, .. }) = self.held.remove(&id).and_then(|h| h.round) {
                self.rounds.remove(&tag);
            }
        }
    }

    /// Counts a reply; returns when to look at its grant again if this ended its round.
    fn reply(&mut self, reply: Reply) -> Option<Instant> {
        let Some(&id) = self.rounds.get(&reply.tag) else {
            // A round that ended.
            return None;
        };
        let (n, quorum) = (self.masters.len(), self.quorum);
        let Some(held) = self.held.get_mut(&id) else {
            // A grant forgotten.
            self.rounds.remove(&reply.tag);
            return None;
        };
        let round = held.round.as_mut()?;
        match reply.result.map(scripts::extended) {
            Ok(Ok(true)) => round.yes += 1,
            Ok(Ok(false)) => round.no += 1,
            Ok(Err(e)) | Err(e) => {
                log::debug!(
                    "fencelock: renewing {:?} on quorum master {} failed: {e}",
                    held.grant.keys.user(),
                    reply.master
                );
                round.failed += 1;
            }
        }
        let over = round.yes >= quorum
            || round.no > n - quorum
            || round.yes + round.no + round.failed == n;
        if over {
            self.rounds.remove(&reply.tag);
        }
        if round.yes >= quorum {
            let (sent, lease) = (round.sent, round.lease);
            held.round = None;
            if !held.grant.confirm(sent, lease, Instant::now()) {
                self.held.remove(&id);
                return None;
            }
            return Some(held.grant.next_renewal());
        } else if round.no > n - quorum {
            held.grant
                .mark_lost("a majority of the masters no longer hold it");
            self.held.remove(&id);
        } else if round.yes + round.no + round.failed == n {
            // Every master answered, and no majority renewed: try again soon, until the
            // deadline says otherwise.
            held.round = None;
            held.not_before = Instant::now() + held.grant.renewal_lease() / 10;
            return Some(held.not_before);
        }
        None
    }

    /// When to look again: the next round due, the end of a round's wait, or a deadline.
    fn next_wake(&self, now: Instant) -> Instant {
        let mut wake = now + Duration::from_secs(1);
        for held in self.held.values() {
            let grant = &held.grant;
            wake = wake.min(grant.deadline());
            match &held.round {
                Some(round) => {
                    wake = wake.min(round.sent + round_time(self.response_timeout, round.lease))
                }
                None if renews(grant, now) => {
                    wake = wake.min(grant.next_renewal().max(held.not_before));
                }
                None => {}
            }
        }
        wake
    }
}

/// How long a round waits for a majority: the response timeout, but no more than a third of
/// the lease, so that a master that answers neither way (frozen) holds up no round for long;
/// the next one asks every master again.
fn round_time(response_timeout: Duration, lease: Duration) -> Duration {
    response_timeout.min(lease / 3)
}

/// Whether `grant` is still renewed: renewal on, and its maximum hold not reached.
fn renews(grant: &Grant, now: Instant) -> bool {
    grant.auto_renew && grant.renew_until.is_none_or(|until| now < until)
}

/// Re-arms `grant`'s lease to `lease` on every master; held while a majority does.
pub(super) fn extend(q: &Quorum, grant: &Grant, lease: Duration) -> Result<()> {
    let lost = || Error::LockLost {
        key: grant.keys.user().to_owned(),
    };
    if !grant.is_held() {
        return Err(lost());
    }
    let sent = Instant::now();
    let until = (sent + q.response_timeout).min(grant.deadline());
    let mut packed = Vec::with_capacity(128);
    scripts::pack_extend(&mut packed, &grant.keys, grant.keys.owner(), lease);
    let mut round = q.round();
    round.send(q.all(), &scripts::EXTEND, packed, until);
    let n = q.masters.len();
    let Tally { yes, no, failed } = q.tally(&mut round, until, false);
    if yes >= q.majority {
        if grant.confirm(sent, lease, Instant::now()) {
            grant.renew_with(lease);
            return Ok(());
        }
        return Err(lost());
    }
    if no > n - q.majority {
        grant.mark_lost("a majority of the masters no longer hold it");
        return Err(lost());
    }
    Err(match failed.into_iter().next() {
        Some(e) => Error::from_redis(e),
        None => Error::Timeout("no majority of the masters answered in time".into()),
    })
}
