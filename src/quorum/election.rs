//! An election on a quorum: its lock is a quorum lock; the leader's record is written on every
//! master and stands where a majority wrote it, as a lock stands where a majority granted it.
//! Observers watch every master, and take each message as a reason to read a majority again:
//! a message from one master says what that master did, not what a majority agreed.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::{Next, Quorum};
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::net::watch::{self, Heard, On};
use crate::scripts::{self, Leading, Proclamation, Who};

impl Quorum {
    /// See [`Engine::proclaim`](crate::engine::Engine::proclaim): recorded where a majority of
    /// masters still hold the leadership's lock.
    pub(crate) fn proclaim(
        &self,
        keys: &LockKeys,
        record: &str,
        p: &Proclamation<'_>,
    ) -> Result<bool> {
        let until = Instant::now() + self.response_timeout;
        let mut packed = Vec::with_capacity(256 + p.value.len());
        scripts::pack_proclaim(&mut packed, keys, record, p);
        let mut round = self.round();
        round.send(self.all(), &scripts::PROCLAIM, packed, until);
        let tally = self.tally(&mut round, until, false);
        if tally.yes >= self.majority {
            return Ok(true);
        }
        if tally.no > self.masters.len() - self.majority {
            return Ok(false);
        }
        Err(no_majority(tally.failed.into_iter().next()))
    }

    /// See [`Engine::resign`](crate::engine::Engine::resign): sent to every master, waited for
    /// until a majority answered.
    pub(crate) fn resign(&self, _keys: &LockKeys, record: &str, owner: &str) -> Result<()> {
        let until = Instant::now() + self.response_timeout;
        let mut packed = Vec::with_capacity(192);
        scripts::pack_resign(&mut packed, record, owner);
        let rx = self.ask(self.all(), &scripts::RESIGN, packed, until, false);
        let mut answered = 0;
        let mut failed = None;
        while answered < self.majority {
            let Ok(reply) = rx.recv_deadline(until) else {
                return Err(no_majority(failed));
            };
            match reply.result {
                Ok(_) => answered += 1,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        Ok(())
    }

    /// See [`Engine::leader`](crate::engine::Engine::leader): the leadership whose lock and
    /// record a majority of masters hold, with the latest proclamation any of them recorded
    /// (a proclamation that reached only some masters may show before it reaches a majority,
    /// and, if it never does, show in one read and not in the next); its lease is what a
    /// majority still has left. Waits for every master but a stalled one, as a grant does.
    pub(crate) fn leader(&self, keys: &LockKeys, record: &str) -> Result<Who> {
        let until = Instant::now() + self.response_timeout;
        let mut packed = Vec::with_capacity(192);
        scripts::pack_leader(&mut packed, keys, record);
        let rx = self.ask(self.all(), &scripts::LEADER, packed, until, false);
        let n = self.masters.len();
        let mut seen: Vec<Option<Leading>> = Vec::with_capacity(n);
        let mut answered = vec![false; n];
        let mut failed = None;
        loop {
            let now = Instant::now();
            if self.waited_for(&answered, now).next().is_none() {
                break;
            }
            let reply = match self.next_reply(&rx, &answered, now, until) {
                Next::Reply(reply) => reply,
                Next::Recount => continue,
                Next::Done => break,
            };
            answered[reply.master] = true;
            match reply.result.and_then(|v| scripts::leading(v, keys)) {
                Ok(who) => seen.push(who.leading()),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if seen.len() < self.majority {
            return Err(no_majority(failed));
        }
        let quorum = self.majority;
        let holders = |owner: &str| {
            seen.iter()
                .flatten()
                .filter(|l| l.owner == owner)
                .collect::<Vec<_>>()
        };
        let nobody = Who::Nobody { after: None };
        let Some(owner) = seen
            .iter()
            .flatten()
            .map(|l| l.owner.as_str())
            .find(|o| holders(o).len() >= quorum)
        else {
            return Ok(nobody);
        };
        let holding = holders(owner);
        let mut pttls: Vec<Option<Duration>> = holding.iter().map(|l| l.pttl).collect();
        // Longest first, no expiry counting as longest: the lease a majority still has.
        pttls.sort_unstable_by(|a, b| match (a, b) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(a), Some(b)) => b.cmp(a),
        });
        let Some(latest) = holding.iter().max_by_key(|l| l.seq) else {
            return Ok(nobody);
        };
        Ok(Who::Leads(Leading {
            pttl: pttls.get(quorum - 1).copied().flatten(),
            ..(*latest).clone()
        }))
    }

    /// See [`Engine::watch`](crate::engine::Engine::watch): one subscription per master, each
    /// message a reason to read a majority again.
    pub(crate) fn watch(
        &self,
        channel: &str,
        inbox: Sender<Heard>,
        alive: Weak<()>,
    ) -> std::io::Result<bool> {
        for master in self.all() {
            watch::spawn(
                Arc::clone(&self.connector),
                On::Master(master),
                channel.to_owned(),
                self.connection_timeout,
                inbox.clone(),
                alive.clone(),
            )?;
        }
        Ok(false)
    }
}

/// No majority answered: the first failure, or a timeout if none failed.
fn no_majority(failed: Option<redis::RedisError>) -> Error {
    match failed {
        Some(e) => Error::from_redis(e),
        None => Error::Timeout("no majority of the masters answered in time".into()),
    }
}
