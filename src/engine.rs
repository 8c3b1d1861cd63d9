//! The seam between a client and its deployment: every lock operation, at the height of a whole
//! call, and the one place that knows which engine a client has.
//!
//! Two engines fill it, with the same method names:
//!
//! | | one master ([`OneMaster`]): a single server, Sentinel, Cluster | a quorum of masters ([`Quorum`]) |
//! |---|---|---|
//! | acquire, until a deadline | `one_master/acquire.rs`: the acquire script; a refused waiter joins Redis' queue for the key | `quorum/acquire.rs`: acquire on every master, confirm the largest token on a majority |
//! | wait | `one_master/wait.rs`: a waiter's states, and handoff by the release script (`one_master/listener.rs` hears other clients') | `quorum/wait.rs`: waiters woken by release messages |
//! | hold, renew, extend | `one_master/renew.rs`: one thread, pipelined extends per node | `quorum/renew.rs`: one thread, extends on every master, a majority keeps it |
//! | release | `one_master/release.rs`: hands the lock to the next waiter in the same script | `quorum/release.rs`: deletes on every master, publishes the release |
//! | a shared lock's grants (a semaphore's permits, a read-write lock's reads and writes) | `one_master/shared_lock.rs`: the same queues, listener and renewal, with the shared lock's scripts | refused: see [`NO_QUORUM_SEMAPHORES`], [`NO_QUORUM_RW_LOCKS`] |
//!
//! Single server, Sentinel and Cluster differ only in how bytes reach a master (`net/`): which
//! node a key lives on, and how a failover is ridden. What the engines share is below them:
//! [`Grant`] (one grant's lease state), the local key queue (`queue.rs`), the scripts, the keys,
//! and how bytes reach Redis (`net/`, with the pub/sub loop in `net/subscriber.rs`).
//!
//! An election's lock is a lock; what it adds has its own file in each engine's folder
//! (`election.rs`): the leader's record (proclaim, resign, who leads) and a watch on its
//! channel.
//!
//! An engine returns grants, never guards: the guard is the facade's (`guard.rs`), written once
//! over any engine. So a third engine, built only for unit tests (`engine/fake.rs`: no Redis, an
//! in-memory map, failures on demand), tests the guards, `with_lock` and reentrancy
//! (`client/tests.rs`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::config::Config;
use crate::error::Result;
use crate::grant::Grant;
use crate::key::{Kind, LockKeys, SharedLockKeys};
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::net::watch::Heard;
use crate::one_master::OneMaster;
use crate::options::{Deadline, LockOptions};
use crate::quorum::Quorum;
use crate::scripts::shared_lock::{Access, Status as SharedStatus};
use crate::scripts::{Proclamation, Who};
use crate::status::LockStatus;

#[cfg(test)]
pub(crate) mod fake;

/// A client's engine, picked once from its topology.
pub(crate) enum Engine {
    OneMaster(Arc<OneMaster>),
    Quorum(Arc<Quorum>),
    #[cfg(test)]
    Fake(Arc<fake::Fake>),
}

impl Engine {
    /// Starts the engine the topology calls for, with its threads.
    pub(crate) fn start(connector: Arc<Connector>, config: &Config) -> Result<Engine> {
        Ok(if connector.masters() > 0 {
            Engine::Quorum(Quorum::start(connector, config)?)
        } else {
            Engine::OneMaster(OneMaster::start(connector, config)?)
        })
    }

    /// Waits in the key's local queue until granted or `deadline`, or the caller's cancel
    /// signal. The grant is held (renewal runs, unless the options say otherwise); `None` at the
    /// deadline.
    pub(crate) fn acquire(
        &self,
        keys: LockKeys,
        lease: Duration,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<Arc<Grant>>> {
        match self {
            Engine::OneMaster(m) => m.acquire(keys, lease, deadline, options),
            Engine::Quorum(q) => q.acquire(keys, lease, deadline, options),
            #[cfg(test)]
            Engine::Fake(f) => f.acquire(keys, lease, deadline, options),
        }
    }

    /// Extends a held grant's lease to `lease` from now, and renewals re-arm that much from then
    /// on.
    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        match self {
            Engine::OneMaster(m) => m.extend(grant, lease),
            Engine::Quorum(q) => q.extend(grant, lease),
            #[cfg(test)]
            Engine::Fake(f) => f.extend(grant, lease),
        }
    }

    /// Releases a grant and waits for the reply (`unlock`): an error says what happened to it.
    pub(crate) fn release(&self, grant: &Arc<Grant>) -> Result<()> {
        match self {
            Engine::OneMaster(m) => m.release(grant),
            Engine::Quorum(q) => q.release(grant),
            #[cfg(test)]
            Engine::Fake(f) => f.release(grant),
        }
    }

    /// Releases a grant without waiting for more than a reply Redis sends at once (a guard's
    /// drop): what fails is retried in the background or left to the lease, and logged.
    pub(crate) fn release_detached(&self, grant: &Arc<Grant>) {
        match self {
            Engine::OneMaster(m) => m.release_detached(grant),
            Engine::Quorum(q) => q.release_detached(grant),
            #[cfg(test)]
            Engine::Fake(f) => f.release_detached(grant),
        }
    }

    /// Deletes the lock on `keys` whoever holds it: whether anyone did.
    pub(crate) fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        match self {
            Engine::OneMaster(m) => m.force_unlock(keys),
            Engine::Quorum(q) => q.force_unlock(keys),
            #[cfg(test)]
            Engine::Fake(f) => f.force_unlock(keys),
        }
    }

    pub(crate) fn status(&self, keys: &LockKeys) -> Result<LockStatus> {
        match self {
            Engine::OneMaster(m) => m.status(keys),
            Engine::Quorum(q) => q.status(keys),
            #[cfg(test)]
            Engine::Fake(f) => f.status(keys),
        }
    }

    /// Records and publishes a leadership's proclamation if its lock is still held: `false`
    /// when it is not.
    pub(crate) fn proclaim(
        &self,
        keys: &LockKeys,
        record: &str,
        p: &Proclamation<'_>,
    ) -> Result<bool> {
        match self {
            Engine::OneMaster(m) => m.proclaim(keys, record, p),
            Engine::Quorum(q) => q.proclaim(keys, record, p),
            #[cfg(test)]
            Engine::Fake(_) => Err(crate::engine::fake::no_elections()),
        }
    }

    /// Withdraws `owner`'s record, if it is the one recorded, and tells observers.
    pub(crate) fn resign(&self, keys: &LockKeys, record: &str, owner: &str) -> Result<()> {
        match self {
            Engine::OneMaster(m) => m.resign(keys, record, owner),
            Engine::Quorum(q) => q.resign(keys, record, owner),
            #[cfg(test)]
            Engine::Fake(_) => Err(crate::engine::fake::no_elections()),
        }
    }

    /// Who leads the election whose lock is `keys`: nobody when nobody has proclaimed since the
    /// lock was last granted.
    pub(crate) fn leader(&self, keys: &LockKeys, record: &str) -> Result<Who> {
        match self {
            Engine::OneMaster(m) => m.leader(keys, record),
            Engine::Quorum(q) => q.leader(keys, record),
            #[cfg(test)]
            Engine::Fake(_) => Err(crate::engine::fake::no_elections()),
        }
    }

    /// Starts watching `channel` until `alive` is gone, passing what is heard to `inbox`.
    /// Whether a message's content can be taken as it says (one master published it in the
    /// script that made it true), or only as a reason to read again (a quorum's master speaks
    /// for itself).
    pub(crate) fn watch(
        &self,
        channel: &str,
        inbox: Sender<Heard>,
        alive: Weak<()>,
    ) -> Result<bool> {
        let started = match self {
            Engine::OneMaster(m) => m.watch(channel, inbox, alive),
            Engine::Quorum(q) => q.watch(channel, inbox, alive),
            #[cfg(test)]
            Engine::Fake(_) => return Err(crate::engine::fake::no_elections()),
        };
        started.map_err(|e| crate::error::Error::Connection(Box::new(e)))
    }

    /// Whether the server of `keys` last failed to answer: a drop then does not wait for it.
    /// A quorum's calls wait at most a response timeout, and are always sent.
    pub(crate) fn unreachable(&self, keys: &LockKeys) -> bool {
        match self {
            Engine::OneMaster(m) => m.router().unreachable(keys.lock()),
            Engine::Quorum(_) => false,
            #[cfg(test)]
            Engine::Fake(_) => false,
        }
    }

    /// Whether this engine has shared locks of `keys`' kind: one master counts their holders;
    /// a quorum refuses (see [`NO_QUORUM_SEMAPHORES`] and [`NO_QUORUM_RW_LOCKS`]).
    pub(crate) fn shared_locks(&self, keys: &SharedLockKeys) -> Result<()> {
        match self {
            Engine::OneMaster(_) => Ok(()),
            _ => Err(no_shared_locks(keys)),
        }
    }

    /// Waits for a grant of the shared lock `keys`, as `access` says, until granted,
    /// `deadline`, or `cancel` is ready (`Error::Cancelled`); the grant is held (renewal runs).
    /// `None` at the deadline.
    pub(crate) fn acquire_shared(
        &self,
        keys: &SharedLockKeys,
        access: Access,
        lease: Duration,
        deadline: Deadline,
        cancel: Option<&Receiver<()>>,
    ) -> Result<Option<Arc<Grant>>> {
        match self {
            Engine::OneMaster(m) => m.acquire_shared(keys, access, lease, deadline, cancel),
            _ => Err(no_shared_locks(keys)),
        }
    }

    /// Releases a shared lock's grant and waits for the reply (`release`, `unlock`).
    pub(crate) fn release_shared(&self, keys: &SharedLockKeys, grant: &Arc<Grant>) -> Result<()> {
        match self {
            Engine::OneMaster(m) => m.release_shared(keys, grant),
            _ => Err(no_shared_locks(keys)),
        }
    }

    /// Releases a shared lock's grant without waiting for a Redis that stopped answering (a
    /// guard's drop).
    pub(crate) fn release_shared_detached(&self, keys: &SharedLockKeys, grant: &Arc<Grant>) {
        if let Engine::OneMaster(m) = self {
            m.release_shared_detached(keys, grant);
        }
    }

    /// How the shared lock `keys` stands.
    pub(crate) fn shared_status(&self, keys: &SharedLockKeys) -> Result<SharedStatus> {
        match self {
            Engine::OneMaster(m) => m.shared_status(keys),
            _ => Err(no_shared_locks(keys)),
        }
    }

    /// Where a fenced store that shares the client's connections sends its writes. A quorum has
    /// no one server to store on: its router refuses every call.
    pub(crate) fn router(&self) -> Arc<Router> {
        match self {
            Engine::OneMaster(m) => m.router(),
            Engine::Quorum(q) => q.router(),
            #[cfg(test)]
            Engine::Fake(f) => f.router(),
        }
    }
}

/// Why a quorum client has no semaphores.
pub(crate) const NO_QUORUM_SEMAPHORES: &str = "semaphores need one master to count their \
     permits (a single server, Sentinel or Cluster): on a quorum of masters, permits granted on \
     a majority of masters that each admit N add up to nearly 2N";

/// Why a quorum client has no read-write locks.
pub(crate) const NO_QUORUM_RW_LOCKS: &str = "read-write locks need one master (a single \
     server, Sentinel or Cluster): on a quorum of masters, shared grants would need a majority \
     protocol of their own (a read token confirmed on a majority, a writer's release admitting \
     readers on every master), which this crate does not have";

/// The error of every call on a shared lock of `keys`' kind on an engine without them.
fn no_shared_locks(keys: &SharedLockKeys) -> crate::error::Error {
    let why = match keys.kind() {
        Kind::Semaphore(_) => NO_QUORUM_SEMAPHORES,
        Kind::ReadWrite => NO_QUORUM_RW_LOCKS,
    };
    crate::error::Error::invalid("topology", why)
}
