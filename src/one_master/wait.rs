//! Waiting without polling: local FIFO queues per key, a queue per key in Redis, and handoff.
//!
//! Threads of one client that wait for one key queue here in arrival order, and only the head of
//! the queue talks to Redis. A refused attempt puts the head's owner id in the key's queue in
//! Redis (one entry per waiting client), and a release grants the lock straight to the oldest
//! entry there, in the same script: the waiter learns its token without another round trip.
//! A release by this client hands the lock to its own next waiter itself (when Redis' queue is
//! empty; otherwise that waiter joins the back of it), so threads of one process pass a lock
//! from one to the next with one script call per acquisition. A handoff to another client's
//! waiter is published on that client's own channel, `"<token> <owner> <tag>"`, so it wakes no
//! other process; the client's listener thread (`listener.rs`), subscribed to it, delivers it to
//! the waiter.
//!
//! No handoff can be missed for good: while the pub/sub connection is down messages are lost, so
//! every (re)subscription wakes every head to attempt again, and an attempt that finds the lock
//! already its own takes it. Since a crashed holder releases nothing, the head also attempts
//! when the holder's lease (as Redis reported it) runs out. A waiter that gives up leaves the
//! queue in Redis, releasing the lock if a handoff reached it meanwhile.
//!
//! The local queue itself (arrival order, who is head, who wakes whom as waiters leave) is the
//! one both engines share, `queue.rs`; this file keeps beside each waiter what this engine needs
//! of it. A waiter's state is one [`State`], from joining the local queue to leaving it; its
//! variants are the rows of "A waiter's states" in docs/design.md, and its methods the moves
//! between them.

use std::sync::{Arc, PoisonError};
#[cfg(not(test))]
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(test)]
use crate::model::{Mutex, MutexGuard};

use crossbeam_channel::Receiver;

use crate::grant::Waiting;
use crate::queue::{self, Place, Queues};
use crate::scripts::{JoinQueue, HANDOFF_LEASE};
use crate::token::FencingToken;

pub(crate) use crate::queue::Left;

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The key may be free: try now.
    Attempt,
    /// A release by this client served another client's waiter and put this one in Redis' queue
    /// behind it. `retry_after`: the new holder's lease. `since`: when that release was sent.
    Queued {
        retry_after: Duration,
        since: Instant,
    },
    /// The lock was handed to this waiter with `token`, and Redis set its lease to `lease`. The
    /// lease started no earlier than `since`, when the handing release was sent; `None` when
    /// another client's release did it. `local_run`: see `Grant::local_run`.
    Granted {
        token: FencingToken,
        since: Option<Instant>,
        lease: Duration,
        local_run: u32,
    },
}

impl queue::Wake for Wake {
    const ATTEMPT: Self = Wake::Attempt;
}

/// How a wait ended.
pub(crate) type Waited = queue::Waited<Wake>;

/// What this engine keeps of each waiter in its key's queue.
struct Entry {
    owner: String,
    lease: Duration,
    /// Where the waiter stands. Its own thread moves it between attempts; a release naming it, a
    /// delivery and leaving hold the queues' lock too (taken first), so that a waiter still in
    /// the queue has not left, and one that left is in no queue.
    state: Mutex<State>,
}

/// A waiter, as its key's queue holds it.
type Waiter = queue::Waiter<Entry, Wake>;

/// A waiter's state from joining its key's local queue to leaving it: the rows of "A waiter's
/// states" in docs/design.md, with the transitions as methods. Being the head is its place in
/// the queue, not part of this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Nothing of it is in Redis: it has not attempted, and no release of its client named it.
    Local,
    /// Its first attempt, sent at `since`, is out. Refused, the script puts it in Redis' queue;
    /// granted, it has no entry there.
    Joining { since: Instant },
    /// A release of its client named it as the next waiter, so it may stand in Redis' queue
    /// from a moment it learns only from [`Wake::Queued`]. `since`: its first attempt, if one
    /// was out when it was named; a grant of that attempt leaves the entry behind.
    Named { since: Option<Instant> },
    /// It may stand in Redis' queue, since `since`: its first attempt, or the release that put
    /// it there, whichever came first. Each attempt takes the entry out if granted.
    InRedisQueue { since: Instant },
    /// It left the local queue.
    Left(Left),
}

impl State {
    /// The head attempts, sending at `sent`. Only its first attempt may join Redis' queue
    /// without taking out an entry when granted: every other one may stand there already.
    fn attempt(&mut self, sent: Instant) -> JoinQueue {
        match *self {
            State::Local => {
                *self = State::Joining { since: sent };
                JoinQueue::Join
            }
            State::Joining { since } | State::InRedisQueue { since } => {
                *self = State::InRedisQueue { since };
                JoinQueue::Rejoin
            }
            State::Named { since } => {
                *self = State::InRedisQueue {
                    since: since.unwrap_or(sent),
                };
                JoinQueue::Rejoin
            }
            // A waiter that left attempts no more.
            State::Left(_) => JoinQueue::Rejoin,
        }
    }

    /// Its attempt was refused: the script put it in Redis' queue.
    fn refused(&mut self) {
        if let State::Joining { since } | State::Named { since: Some(since) } = *self {
            *self = State::InRedisQueue { since };
        }
    }

    /// A release of its client names it as the next waiter.
    fn name(&mut self) {
        match *self {
            State::Local => *self = State::Named { since: None },
            State::Joining { since } => *self = State::Named { since: Some(since) },
            // Its attempts take its entry out when granted, and a waiter that left is in no
            // queue to be named from.
            State::Named { .. } | State::InRedisQueue { .. } | State::Left(_) => {}
        }
    }

    /// A release of its client put it in Redis' queue at `since` ([`Wake::Queued`]). The
    /// earliest moment is kept: a handoff message can arrive after later attempts.
    fn queued(&mut self, since: Instant) {
        match *self {
            State::Local | State::Named { since: None } => *self = State::InRedisQueue { since },
            State::Joining { since } | State::Named { since: Some(since) } => {
                *self = State::InRedisQueue { since };
            }
            State::InRedisQueue { .. } | State::Left(_) => {}
        }
    }

    /// The earliest a handoff from Redis' queue can have been made to it, if known; otherwise
    /// not before it joined the local queue.
    fn since(&self) -> Option<Instant> {
        match *self {
            State::Joining { since }
            | State::Named { since: Some(since) }
            | State::InRedisQueue { since } => Some(since),
            State::Local | State::Named { since: None } | State::Left(_) => None,
        }
    }

    /// Whether its owner id may stand in Redis' queue: leaving without a grant must take it out.
    fn in_redis_queue(&self) -> bool {
        match self {
            State::Joining { .. } | State::Named { .. } | State::InRedisQueue { .. } => true,
            State::Local | State::Left(_) => false,
        }
    }
}

/// A waiter named in a release: the head of its key's queue at the time.
pub(crate) struct Head {
    waiter: Arc<Waiter>,
}

/// How many times in a row a client hands a lock to its own next waiter while other clients'
/// waiters may be queued in Redis. A local handoff costs no pub/sub message and no thread of
/// another process, so under contention it keeps the lock busy more of the time; the bound
/// keeps other clients from waiting longer than this many holds for their turn. The count
/// travels with the lock (`Grant::local_run`): threads that take turns empty the key's local
/// queue between turns, so a count kept there would start again each time.
pub(crate) const MAX_LOCAL_RUN: u32 = 8;

impl Head {
    pub(crate) fn owner(&self) -> &str {
        &self.waiter.owner
    }

    pub(crate) fn lease(&self) -> Duration {
        self.waiter.lease
    }
}

/// Every queue of one client, by escaped key.
#[derive(Default)]
pub(crate) struct Waiters {
    queues: Arc<Queues<Entry, Wake>>,
}

impl Waiters {
    /// Joins the queue of `tag` as `owner`, wanting `lease`; the returned ticket leaves the
    /// queue when dropped.
    pub(crate) fn join(&self, tag: &str, owner: &str, lease: Duration) -> Ticket {
        // Before it is queued, where a release can name it.
        let joined = Instant::now();
        let entry = Entry {
            owner: owner.to_owned(),
            lease,
            state: Mutex::new(State::Local),
        };
        Ticket {
            place: self.queues.join(tag, entry),
            joined,
        }
    }

    /// The head of `tag`'s queue, to be named in a release.
    pub(crate) fn next(&self, tag: &str) -> Option<Head> {
        let queues = self.queues.lock();
        let head = queues.head(tag)?;
        lock_state(head).name();
        Some(Head {
            waiter: Arc::clone(head),
        })
    }

    /// Delivers `wake` to a waiter named in a release; how it left if it no longer waits.
    pub(crate) fn deliver_to(&self, next: &Head, wake: Wake) -> Result<(), Left> {
        let _queues = self.queues.lock();
        match *lock_state(&next.waiter) {
            State::Left(left) => Err(left),
            _ => {
                next.waiter.wake(wake);
                Ok(())
            }
        }
    }

    /// Delivers `wake` to the waiter `owner` of `tag`; `false` if it is no longer waiting.
    pub(crate) fn deliver(&self, tag: &str, owner: &str, wake: Wake) -> bool {
        self.queues
            .lock()
            .find(tag, |w| w.owner == owner)
            .is_some_and(|waiter| waiter.wake(wake))
    }

    /// Delivers a handoff by another client's release to our waiter `owner` of `tag`: Redis
    /// set its lease to its own, capped at [`HANDOFF_LEASE`]. `false` if it is no longer
    /// waiting.
    pub(crate) fn deliver_handoff(&self, tag: &str, owner: &str, token: FencingToken) -> bool {
        let queues = self.queues.lock();
        let Some(waiter) = queues.find(tag, |w| w.owner == owner) else {
            return false;
        };
        waiter.wake(Wake::Granted {
            token,
            since: None,
            lease: waiter.lease.min(HANDOFF_LEASE),
            local_run: 0,
        })
    }

    /// `tag` may be free: wake the head of its queue, if any.
    pub(crate) fn wake_head(&self, tag: &str) {
        self.queues.wake_head(tag);
    }

    /// Whether a waiter of ours waits for `tag`.
    pub(crate) fn waits_on(&self, tag: &str) -> bool {
        self.queues.waits_on(tag)
    }

    /// Handoffs may have gone unheard: wake every head.
    pub(crate) fn wake_all_heads(&self) {
        self.queues.wake_all_heads();
    }
}

/// A lost grant wakes the head of its key's queue, which asks Redis at once.
impl Waiting for Waiters {
    fn wake_head(&self, tag: &str) {
        Waiters::wake_head(self, tag);
    }
}

/// One thread's place in one key's queue.
pub(crate) struct Ticket {
    place: Place<Entry, Wake>,
    /// No handoff can have reached it before this.
    joined: Instant,
}

impl Ticket {
    pub(crate) fn is_head(&self) -> bool {
        self.place.is_head()
    }

    /// Blocks until woken, until `until`, or until `cancel` is ready (a message or its
    /// disconnection).
    pub(crate) fn wait(&self, until: Option<Instant>, cancel: Option<&Receiver<()>>) -> Waited {
        self.place.wait(until, cancel)
    }

    /// Its state now.
    pub(crate) fn state(&self) -> State {
        *lock_state(self.place.waiter())
    }

    /// The head attempts, sending at `sent`: how the attempt joins Redis' queue. Called before
    /// sending, so that leaving takes the entry out even if the reply is lost.
    pub(crate) fn attempt(&self, sent: Instant) -> JoinQueue {
        lock_state(self.place.waiter()).attempt(sent)
    }

    /// Its attempt was refused: it stands in Redis' queue.
    pub(crate) fn refused(&self) {
        lock_state(self.place.waiter()).refused();
    }

    /// A release of this client put it in Redis' queue at `since` ([`Wake::Queued`]).
    pub(crate) fn queued(&self, since: Instant) {
        lock_state(self.place.waiter()).queued(since);
    }

    /// Whether a release of this client named it while it did not know itself in Redis' queue
    /// (see [`State::Named`]): an attempt granted now may leave its entry there.
    pub(crate) fn named(&self) -> bool {
        matches!(self.state(), State::Named { .. })
    }

    /// The earliest a handoff from Redis' queue can have been made to it. Never moved forward:
    /// a handoff message can arrive late, after later attempts.
    pub(crate) fn since(&self) -> Instant {
        self.state().since().unwrap_or(self.joined)
    }

    /// Leaves the queue as the winner. The next in line is not woken: our release hands the
    /// lock to it, and should we lose the lock instead, the loss wakes it (see `Grant`).
    pub(crate) fn leave_granted(self) {
        self.remove(Left::WithGrant);
    }

    /// Leaves the queue without a grant. Returns a grant that arrived meanwhile, if any (a
    /// [`Wake::Granted`]), and whether its owner id may stand in Redis' queue (it attempted, or
    /// a release of this client named it).
    pub(crate) fn leave(self) -> (Option<Wake>, bool) {
        let was = self.remove(Left::WithoutGrant);
        // Nobody can send after the removal, so this sees every wake there will ever be.
        let granted = self
            .place
            .pending()
            .find(|w| matches!(w, Wake::Granted { .. }));
        (granted, was.in_redis_queue())
    }

    /// Takes the waiter out of its queue, as `how` says; returns its state before.
    fn remove(&self, how: Left) -> State {
        let mut was = State::Left(how);
        self.place.leave(how, |entry| {
            was = std::mem::replace(&mut *lock_state(entry), State::Left(how));
            !matches!(was, State::Left(_))
        });
        was
    }
}

fn lock_state(entry: &Entry) -> MutexGuard<'_, State> {
    entry.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Only a panic unwinding through a wait drops a ticket without `leave` or `leave_granted`. A
/// grant that reached it before cannot be given back from here (that takes a round trip): it
/// runs out with its lease, and the drop says so.
impl Drop for Ticket {
    fn drop(&mut self) {
        let left = matches!(self.state(), State::Left(_));
        if left {
            return;
        }
        self.remove(Left::WithoutGrant);
        if let Some(Wake::Granted { token, .. }) = self
            .place
            .pending()
            .find(|w| matches!(w, Wake::Granted { .. }))
        {
            log::warn!(
                "fencelock: a waiter for {:?} was dropped holding a handoff (token {token}); \
                 the lock runs out with its lease",
                self.place.tag()
            );
        }
    }
}

#[cfg(test)]
mod tests;
