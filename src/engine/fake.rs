//! An engine with no Redis, for unit tests of what lies above the seam: the guards, their drop,
//! `with_lock`, reentrancy and the metrics the facade records (`client/tests.rs`). It plays the
//! part r2d2's fake `ManageConnection` plays for r2d2's pool.
//!
//! Locks live in an in-memory map from key to grant, tokens come from a counter, and a waiter
//! waits on a condition variable for a release or its deadline. Every call is recorded in order,
//! and a test can make the next call of a kind fail with an error of its choice, or take a lock
//! away from its holder as an expired lease would.
//!
//! It keeps the engines' contract, as `engine.rs` states it: a release ends the grant (which
//! records its hold time) before anything can fail, and a release or extend that finds the lock
//! no longer ours marks the grant lost and reports [`Error::LockLost`]. A call that fails by
//! request changes nothing in the map, as if Redis never saw it. What the real engines count
//! themselves (grants, handoffs, renewals, failed releases) the fake does not count: those are
//! checked against a real server (`tests/metrics/`). Nothing renews a grant, so a lock is held
//! for its lease, the client's 30 s unless a test asks for less; a wait does not hear its cancel
//! signal.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::grant::{self, Grant, NewGrant};
use crate::key::LockKeys;
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::options::{Deadline, LockOptions};
use crate::status::LockStatus;
use crate::token::FencingToken;

/// What was asked of the engine: one for each of its methods that takes a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Acquire,
    Extend,
    Release,
    ReleaseDetached,
    Force,
    Status,
}

pub(crate) struct Fake {
    state: Mutex<State>,
    /// Notified whenever a key is freed, for acquires that wait.
    freed: Condvar,
    /// Never dialled: only a fenced store would use it.
    router: Arc<Router>,
}

#[derive(Default)]
struct State {
    /// The held locks, by key tag.
    held: HashMap<String, Arc<Grant>>,
    /// The last token handed out.
    token: u64,
    /// Every call, in order, with its key as the user gave it.
    calls: Vec<(Kind, String)>,
    /// Errors that the next calls of a kind return, first in first out.
    failures: HashMap<Kind, VecDeque<Error>>,
}

impl State {
    /// Records a call; the error it is to fail with, if a test asked for one.
    fn call(&mut self, kind: Kind, keys: &LockKeys) -> Result<()> {
        self.calls.push((kind, keys.user().to_owned()));
        match self.failures.get_mut(&kind).and_then(VecDeque::pop_front) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn holds(&self, grant: &Arc<Grant>) -> bool {
        self.held
            .get(grant.keys.tag())
            .is_some_and(|held| Arc::ptr_eq(held, grant))
    }
}

impl Fake {
    /// A fake engine for a client of `config`; `connector` (nothing dialled) serves only the
    /// router a fenced store would use.
    pub(crate) fn new(connector: Arc<Connector>, config: &Config) -> Arc<Fake> {
        Arc::new(Fake {
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
            router: Arc::new(Router::new(
                connector,
                1,
                config.connection_timeout,
                config.response_timeout,
            )),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the next call of `kind` fail with `error`; a drop's release swallows it, as the
    /// real engines log theirs.
    pub(crate) fn fail_next(&self, kind: Kind, error: Error) {
        self.state()
            .failures
            .entry(kind)
            .or_default()
            .push_back(error);
    }

    /// Takes the lock on `key` from its holder, as a lease that ran out does: the key is free,
    /// and the grant is marked lost.
    pub(crate) fn lose(&self, key: &str) {
        let grant = {
            let mut state = self.state();
            let tag = state
                .held
                .iter()
                .find(|(_, grant)| grant.keys.user() == key)
                .map(|(tag, _)| tag.clone());
            tag.and_then(|tag| state.held.remove(&tag))
        };
        let grant = grant.expect("lose: the key is held");
        self.freed.notify_all();
        grant.mark_lost("the test took it away");
    }

    /// Every call so far, in order, with its key.
    pub(crate) fn calls(&self) -> Vec<(Kind, String)> {
        self.state().calls.clone()
    }

    /// The kinds of every call so far, in order.
    pub(crate) fn kinds(&self) -> Vec<Kind> {
        self.state().calls.iter().map(|(kind, _)| *kind).collect()
    }

    /// How many calls of `kind` were made.
    pub(crate) fn count(&self, kind: Kind) -> usize {
        self.state()
            .calls
            .iter()
            .filter(|(k, _)| *k == kind)
            .count()
    }

    /// Whether `key` is held in the fake's map (its "Redis").
    pub(crate) fn is_locked(&self, key: &str) -> bool {
        self.state()
            .held
            .values()
            .any(|grant| grant.keys.user() == key)
    }

    pub(crate) fn acquire(
        &self,
        keys: LockKeys,
        lease: Duration,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<Arc<Grant>>> {
        let mut state = self.state();
        state.call(Kind::Acquire, &keys)?;
        loop {
            if !state.held.contains_key(keys.tag()) {
                state.token += 1;
                let grant = Arc::new(Grant::new(
                    state.token,
                    NewGrant {
                        token: FencingToken::new(state.token),
                        sent: Instant::now(),
                        granted: lease,
                        lease,
                        auto_renew: !options.no_renewal,
                        max_hold: options.max_hold,
                        queued: false,
                        local_run: 0,
                        keys,
                    },
                    grant::nobody(),
                ));
                state
                    .held
                    .insert(grant.keys.tag().to_owned(), Arc::clone(&grant));
                return Ok(Some(grant));
            }
            state = match deadline {
                Deadline::Now => return Ok(None),
                Deadline::At(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.freed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                Deadline::Never => self
                    .freed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        let mut state = self.state();
        state.call(Kind::Extend, &grant.keys)?;
        if !(state.holds(grant) && grant.is_held()) {
            drop(state);
            grant.mark_lost("it was no longer ours at an extend");
            return Err(Error::LockLost {
                key: grant.keys.user().to_owned(),
            });
        }
        let now = Instant::now();
        grant.confirm(now, lease, now);
        grant.renew_with(lease);
        Ok(())
    }

    pub(crate) fn release(&self, grant: &Arc<Grant>) -> Result<()> {
        grant.end();
        let mut state = self.state();
        state.call(Kind::Release, &grant.keys)?;
        self.free(state, grant)
    }

    pub(crate) fn release_detached(&self, grant: &Arc<Grant>) {
        grant.end();
        let mut state = self.state();
        if state.call(Kind::ReleaseDetached, &grant.keys).is_ok() {
            let _ = self.free(state, grant);
        }
    }

    /// Frees `grant`'s key if it is still ours; marks it lost if not.
    fn free(&self, mut state: MutexGuard<'_, State>, grant: &Arc<Grant>) -> Result<()> {
        if state.holds(grant) {
            state.held.remove(grant.keys.tag());
            drop(state);
            self.freed.notify_all();
            Ok(())
        } else {
            drop(state);
            grant.mark_lost("it was no longer ours at release");
            Err(Error::LockLost {
                key: grant.keys.user().to_owned(),
            })
        }
    }

    pub(crate) fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let mut state = self.state();
        state.call(Kind::Force, keys)?;
        let held = state.held.remove(keys.tag()).is_some();
        drop(state);
        self.freed.notify_all();
        Ok(held)
    }

    pub(crate) fn status(&self, keys: &LockKeys) -> Result<LockStatus> {
        let mut state = self.state();
        state.call(Kind::Status, keys)?;
        let held = state.held.get(keys.tag());
        Ok(LockStatus {
            held: held.is_some(),
            token: held.map(|grant| grant.token),
            remaining_lease: held
                .map(|grant| grant.deadline().saturating_duration_since(Instant::now())),
            waiters: 0,
        })
    }

    pub(crate) fn router(&self) -> Arc<Router> {
        Arc::clone(&self.router)
    }
}

/// The fake engine keeps no election records: elections are tested against real servers.
pub(crate) fn no_elections() -> crate::error::Error {
    crate::error::Error::invalid("election", "the fake engine has no elections")
}
