//! Quorum mode: one lock on N independent masters, granted by a majority, with fencing tokens
//! that never go back (see [`Topology::quorum`](crate::Topology::quorum)).
//!
//! The protocol, its assumptions and the argument for it are in docs/design.md ("Quorum
//! mode") and model/README.md, which spin checks. In short:
//!
//! ```text
//! attempt ─► acquire on all N, ────► a majority granted in time? ──► a majority took P?
//!            proposing token P        no: release on all N,          yes: granted with token P
//!            (propose.rs)             retry later (wait.rs)          no: T = the largest token,
//!                                                                        confirm(T) on those
//!                                                                        that granted ──► a
//!                                                                        majority confirmed in
//!                                                                        time? yes: granted
//!                                                                        with token T; no:
//!                                                                        release on all N, retry
//! held ─► renew.rs: extend on all N, a majority keeps it ─► release: on all N, wake waiters
//! ```
//!
//! | step | counts | ends the step early | gives up |
//! |---|---|---|---|
//! | acquire | grants `{1, token, taken}`; refusals by holder | a majority of grants; or, once no majority of grants can come, a majority refused for one holder (held) or none can (split); a stalled master (masters.rs) that has not answered counts as failed | the validity (lease − elapsed − drift) or the caller's deadline ran out, or no majority answered for a connection and a response timeout since the call's first unanswered attempt |
//! | confirm (only when fewer than a majority of the grants took the proposal) | `1`s | a majority of `1`s, or too many `0`s, failures or stalled masters for one | as acquire, counted from the acquire's start |
//! | renew (renew.rs) | `1`s | a majority of `1`s; lost at once on more than N − majority `0`s | the deadline |
//! | release | `1`s | every master answered or is stalled, or a majority released | a response timeout (`unlock`); never waited for (`drop`) |
//!
//! Every attempt has an owner id of its own: a release of a failed attempt that runs late must
//! not delete the next attempt's key.
//!
//! | file | what it does |
//! |---|---|
//! | `acquire.rs` | one attempt (acquire, then confirm unless a majority took the proposal), and the lock call's loop around it |
//! | `propose.rs` | the token an attempt proposes: from the masters' clocks and the tokens seen |
//! | `wait.rs` | what this engine keeps of the key's local queue (`queue.rs`), and the subscriptions that hear releases |
//! | `renew.rs` | the renewal thread, and explicit extends |
//! | `release.rs` | release, and what a failed attempt leaves behind; force_unlock |
//! | `status.rs` | how the lock stands on a majority |
//! | `election.rs` | what an election adds to its lock: the leader's record on a majority, and a watch on every master |
//! | `round.rs` | a lock call's rounds, written to every master at once on lanes, the replies read as they come (`poll`) |
//! | `lanes.rs` | lanes: connections the calling thread drives itself, and each master's pool of idle ones |
//! | `masters.rs` | one worker thread per master, that sends what lanes cannot, and the calls nobody waits for |

mod acquire;
mod election;
mod lanes;
mod masters;
mod propose;
mod release;
mod renew;
mod round;
mod status;
mod wait;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use redis::RedisError;
use uuid::Uuid;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant};
use crate::key::{LockKeys, Owners};
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::options::{Deadline, LockOptions};
use crate::scripts;
use crate::status::LockStatus;

use masters::{Call, Masters, Reply};
use propose::Proposer;
use renew::Renewal;
use round::Round;
use wait::Waiters;

/// A quorum client's engine: its masters' workers, its renewal thread and its waiters.
pub(crate) struct Quorum {
    masters: Arc<Masters>,
    /// How many masters make a majority: N / 2 + 1.
    majority: usize,
    renewal: Renewal,
    waiters: Arc<Waiters>,
    owners: Owners,
    /// The token each attempt proposes (propose.rs).
    proposer: Proposer,
    next_grant: AtomicU64,
    connector: Arc<Connector>,
    namespace: String,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Quorum {
    pub(crate) fn start(connector: Arc<Connector>, config: &Config) -> Result<Arc<Quorum>> {
        let thread_error = |e: std::io::Error| Error::Connection(Box::new(e));
        let masters = Arc::new(
            Masters::start(
                &connector,
                config.connection_timeout,
                config.response_timeout,
            )
            .map_err(thread_error)?,
        );
        let majority = masters.len() / 2 + 1;
        let proposer = Proposer::new(masters.len());
        let renewal = Renewal::spawn(Arc::clone(&masters), majority, config.response_timeout)
            .map_err(thread_error)?;
        Ok(Arc::new(Quorum {
            masters,
            majority,
            renewal,
            waiters: Arc::new(Waiters::new(&config.namespace)),
            owners: Owners::new(&Uuid::new_v4().simple().to_string()),
            proposer,
            next_grant: AtomicU64::new(0),
            connector,
            namespace: config.namespace.clone(),
            connection_timeout: config.connection_timeout,
            response_timeout: config.response_timeout,
        }))
    }

    /// See [`Engine::acquire`](crate::engine::Engine::acquire).
    pub(crate) fn acquire(
        &self,
        keys: LockKeys,
        lease: Duration,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<Arc<Grant>>> {
        match deadline {
            Deadline::Now => acquire::once(self, keys, lease, options),
            Deadline::At(at) => acquire::until(self, keys, lease, Some(at), options),
            Deadline::Never => acquire::until(self, keys, lease, None, options),
        }
    }

    /// Makes the grant and hands it to the renewal thread. A quorum has no handoff: every grant
    /// is its holder's own attempt, and its loss wakes no waiter (the head looks again within
    /// a second).
    fn hold(&self, new: NewGrant) -> Arc<Grant> {
        let id = self.next_grant.fetch_add(1, Ordering::Relaxed);
        Grant::held(id, new, crate::grant::nobody(), |grant| {
            self.renewal.hold(grant)
        })
    }

    /// See [`Engine::extend`](crate::engine::Engine::extend).
    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        renew::extend(self, grant, lease)
    }

    /// See [`Engine::release`](crate::engine::Engine::release).
    pub(crate) fn release(&self, grant: &Arc<Grant>) -> Result<()> {
        self.stop(grant);
        release::release(self, grant)
    }

    /// See [`Engine::release_detached`](crate::engine::Engine::release_detached): each master's
    /// worker sends it, and nobody waits.
    pub(crate) fn release_detached(&self, grant: &Arc<Grant>) {
        self.stop(grant);
        release::release_keys(self, &grant.keys, None);
    }

    /// Ends the grant's renewal.
    fn stop(&self, grant: &Grant) {
        grant.end();
        self.renewal.forget(grant.id);
    }

    /// See [`Engine::force_unlock`](crate::engine::Engine::force_unlock).
    pub(crate) fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        release::force_unlock(self, keys)
    }

    /// See [`Engine::status`](crate::engine::Engine::status).
    pub(crate) fn status(&self, keys: &LockKeys) -> Result<LockStatus> {
        status::status(self, keys)
    }

    /// A quorum has no one server for a fenced store: this router's connector refuses every
    /// call.
    pub(crate) fn router(&self) -> Arc<Router> {
        Arc::new(Router::new(
            Arc::clone(&self.connector),
            1,
            self.connection_timeout,
            self.response_timeout,
        ))
    }

    /// When a call whose masters have been asked without a majority answering since `quiet`
    /// stops asking: a connection and a response timeout later.
    fn gives_up_at(&self, quiet: Instant) -> Instant {
        quiet + self.connection_timeout + self.response_timeout
    }

    fn all(&self) -> std::ops::Range<usize> {
        0..self.masters.len()
    }

    /// The masters a step still waits for at `now`: not `done` (answered, or not asked), and
    /// not stalled (see [`Masters::is_stalled`]).
    fn waited_for<'a>(
        &'a self,
        done: &'a [bool],
        now: Instant,
    ) -> impl Iterator<Item = usize> + 'a {
        self.all()
            .filter(move |m| !done[*m] && !self.masters.is_stalled(*m, now))
    }

    /// The next reply on `rx`, waiting no later than `until`, nor past the moment a master the
    /// step still waits for stalls: the step then counts again without it.
    fn next_reply(
        &self,
        rx: &Receiver<Reply>,
        done: &[bool],
        now: Instant,
        until: Instant,
    ) -> Next {
        let look = self.masters.next_stall(self.waited_for(done, now), now);
        match rx.recv_deadline(look.min(until)) {
            Ok(reply) => Next::Reply(reply),
            Err(RecvTimeoutError::Timeout) if look < until => Next::Recount,
            Err(_) => Next::Done,
        }
    }

    /// A round of calls from this thread to the masters, on lanes where it can.
    fn round(&self) -> Round<'_> {
        Round::new(&self.masters, self.response_timeout)
    }

    /// Sends one call to the masters `to` through their workers; replies come on the returned
    /// channel.
    fn ask(
        &self,
        to: impl IntoIterator<Item = usize>,
        script: &'static redis::Script,
        packed: Vec<u8>,
        expires: Instant,
        once: bool,
    ) -> Receiver<Reply> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let call = Call {
            script,
            packed,
            expires,
            reply: &tx,
            tag: 0,
            once,
        };
        self.masters.send(to, call);
        rx
    }

    /// Counts the `1`/`0` replies of an extend or release sent to every master in `round`,
    /// until a majority said either, every master answered, or `until`; with
    /// `retried_is_yes`, a `0` from a request sent twice counts as `1`.
    fn tally(&self, round: &mut Round<'_>, until: Instant, retried_is_yes: bool) -> Tally {
        let n = self.masters.len();
        let mut tally = Tally {
            yes: 0,
            no: 0,
            failed: Vec::new(),
        };
        let mut answered = vec![false; n];
        // A stalled master that has not answered is not waited for once every other one has.
        loop {
            let now = Instant::now();
            if tally.yes >= self.majority
                || tally.no > n - self.majority
                || round.waited_for(&answered, now).next().is_none()
            {
                break;
            }
            let reply = match round.next(&answered, until) {
                Next::Reply(reply) => reply,
                Next::Recount => continue,
                Next::Done => break,
            };
            answered[reply.master] = true;
            match reply.result.map(scripts::extended) {
                Ok(Ok(true)) => tally.yes += 1,
                Ok(Ok(false)) if retried_is_yes && reply.retried => tally.yes += 1,
                Ok(Ok(false)) => tally.no += 1,
                Ok(Err(e)) | Err(e) => tally.failed.push(e),
            }
        }
        tally
    }
}

/// The `1`s, `0`s and failures among the replies to one call sent to every master.
struct Tally {
    yes: usize,
    no: usize,
    failed: Vec<RedisError>,
}

/// What [`Quorum::next_reply`] brought.
enum Next {
    Reply(Reply),
    /// A master the step waited for has stalled: count again without it.
    Recount,
    /// `until` came, or no master can answer any more.
    Done,
}
