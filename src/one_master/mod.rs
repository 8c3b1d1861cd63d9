//! The one-master engine: every lock lives on one master at a time, found by the connector (a
//! single server, the master Sentinel names, or the Cluster node that serves the key's slot).
//!
//! | file | what it does |
//! |---|---|
//! | `acquire.rs` | a lock call: attempt, wait in the key's local queue, take the grant |
//! | `wait.rs` | what this engine keeps of each waiter in its key's local queue (`queue.rs`): its state, the moves between them, and the handoffs delivered to it |
//! | `listener.rs` (+ `listener/sharded.rs` on a Cluster) | hears other clients' handoffs to our waiters |
//! | `release.rs` | release, handoff to the next waiter, the background thread for releases no caller waits for |
//! | `renew.rs` (+ `renew/schedule.rs`) | the renewal thread, and explicit extends |
//! | `election.rs` | what an election adds to its lock: the leader's record, and the channel observers watch |
//! | `shared_lock.rs` | a shared lock's grants (a semaphore's permits, a read-write lock's reads and writes): acquire, wait, release admitting the next waiters, status, over the same queues, listener and renewal |
//!
//! A quorum client has none of these; see `quorum/`.
//!
//! Lock order: the local queues (`queue.rs`), a grant's lease state and the renewal inbox are
//! each taken alone, never one inside another, except that the queues' lock is held while a
//! waiter's state is read or set (`wait.rs`).

mod acquire;
mod election;
mod listener;
mod release;
mod renew;
mod shared_lock;
mod wait;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use uuid::Uuid;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::grant::{Grant, NewGrant, Waiting};
use crate::key::{release_channel, LockKeys, Owners, SharedLockKeys};
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::options::{Deadline, LockOptions};
use crate::scripts::shared_lock::{Access, Status as SharedStatus};
use crate::scripts::{self, Leaving, Released};
use crate::status::LockStatus;

use listener::Sharded;
use release::Job;
use renew::Renewal;
use wait::{Waiters, MAX_LOCAL_RUN};

/// A one-master client's engine: its pool, its local queues, its threads.
pub(crate) struct OneMaster {
    config: Config,
    owners: Owners,
    router: Arc<Router>,
    waiters: Arc<Waiters>,
    /// On a cluster, the subscriptions to the channels of the keys our waiters wait on.
    sharded: Option<Sharded>,
    renewal: Renewal,
    next_grant: AtomicU64,
    /// The background thread for releases no caller waits for (`release.rs`), started at its
    /// first use; `None` if it could not be started.
    background: OnceLock<Option<Sender<Job>>>,
}

impl OneMaster {
    /// Starts a client's threads (the release channel's listener and renewal) and its pool.
    pub(crate) fn start(connector: Arc<Connector>, config: &Config) -> Result<Arc<OneMaster>> {
        let thread_error = |e: std::io::Error| Error::Connection(Box::new(e));
        let waiters = Arc::new(Waiters::default());
        // One random id per client names the channel on which handoffs to it come.
        let client_id = Uuid::new_v4().simple().to_string();
        // On a cluster, an id starting with 's' tells a release to hand over on the key's shard
        // channel (`listener/sharded.rs`) rather than broadcast to every node. Clients of
        // versions without it get classic messages, and so does this one from them.
        let client_id = if connector.routes() {
            format!("s{client_id}")
        } else {
            client_id
        };
        let owners = Owners::new(&client_id);
        listener::spawn(
            Arc::clone(&connector),
            release_channel(&config.namespace, &client_id),
            owners.prefix().to_owned(),
            config.connection_timeout,
            Arc::downgrade(&waiters),
        )
        .map_err(thread_error)?;
        let sharded = connector.routes().then(|| {
            Sharded::new(
                Arc::clone(&connector),
                &config.namespace,
                &client_id,
                owners.prefix().to_owned(),
                config.connection_timeout,
                config.response_timeout,
                Arc::downgrade(&waiters),
            )
        });
        let renewal = renew::spawn(
            Arc::clone(&connector),
            config.lease,
            config.connection_timeout,
            config.response_timeout,
            config.replica_acks,
        )
        .map_err(thread_error)?;
        Ok(Arc::new(OneMaster {
            router: Arc::new(Router::new(
                connector,
                config.pool_size,
                config.connection_timeout,
                config.response_timeout,
            )),
            config: config.clone(),
            owners,
            waiters,
            sharded,
            renewal,
            next_grant: AtomicU64::new(0),
            background: OnceLock::new(),
        }))
    }

    /// See [`Engine::acquire`](crate::engine::Engine::acquire).
    pub(crate) fn acquire(
        self: &Arc<Self>,
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

    /// Makes the grant and hands it to the renewal thread; its loss wakes our next waiter for
    /// the key.
    fn hold(&self, new: NewGrant) -> Arc<Grant> {
        let id = self.next_grant.fetch_add(1, Ordering::Relaxed);
        let waiters: Weak<dyn Waiting> = Arc::downgrade(&self.waiters) as _;
        Grant::held(id, new, waiters, |grant| self.renewal.hold(grant))
    }

    /// See [`Engine::extend`](crate::engine::Engine::extend): the renewal thread sends it, on
    /// its own connections, so that it is ordered with the renewals of the same lease.
    pub(crate) fn extend(&self, grant: &Arc<Grant>, lease: Duration) -> Result<()> {
        let lost = || Error::LockLost {
            key: grant.keys.user().to_owned(),
        };
        if !grant.is_held() {
            return Err(lost());
        }
        let answer = self.renewal.extend(Arc::clone(grant), lease);
        let patience = self.config.response_timeout * 3 + self.config.connection_timeout;
        match answer.recv_timeout(patience) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(lost()),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Disconnected) => Err(lost()),
            Err(RecvTimeoutError::Timeout) => Err(Error::Connection(
                "the renewal thread did not answer in time".into(),
            )),
        }
    }

    /// See [`Engine::release`](crate::engine::Engine::release).
    pub(crate) fn release(&self, grant: &Arc<Grant>) -> Result<()> {
        let was_held = self.stop(grant);
        release::release(self, grant, was_held)
    }

    /// See [`Engine::release_detached`](crate::engine::Engine::release_detached).
    pub(crate) fn release_detached(self: &Arc<Self>, grant: &Arc<Grant>) {
        let was_held = self.stop(grant);
        release::release_detached(self, grant, was_held);
    }

    /// Ends the grant's renewal: whether it was held until now.
    fn stop(&self, grant: &Grant) -> bool {
        let was_held = grant.end();
        self.renewal.forget(grant.id);
        was_held
    }

    /// See [`Engine::force_unlock`](crate::engine::Engine::force_unlock).
    pub(crate) fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let (released, _) = release::hand_over(
            self,
            keys,
            self.owners.prefix(),
            Leaving::Forced,
            MAX_LOCAL_RUN,
            None,
        )?;
        Ok(!matches!(released, Released::NotOurs))
    }

    /// See [`Engine::status`](crate::engine::Engine::status).
    pub(crate) fn status(&self, keys: &LockKeys) -> Result<LockStatus> {
        let status = self
            .router
            .run(keys.lock(), |con, _| scripts::status(con, keys))?;
        Ok(LockStatus {
            held: status.held,
            token: status.token,
            remaining_lease: status.pttl,
            waiters: status.waiters,
        })
    }

    pub(crate) fn router(&self) -> Arc<Router> {
        Arc::clone(&self.router)
    }

    /// Confirms a grant a release handed to `keys`' owner: one extend re-arms `lease` on our
    /// connection and, with replica acks, WAITs behind it (the handoff was written on the
    /// releaser's connection, and WAIT counts only what its own connection wrote). Whether the
    /// grant is ours, and with acks how many replicas acknowledged. A reply that has not come
    /// by `deadline` (the caller's, if it has one) is a timeout.
    fn confirm(
        &self,
        keys: &LockKeys,
        lease: Duration,
        deadline: Option<Instant>,
    ) -> Result<(bool, Option<u32>)> {
        // Before a deadline, the WAIT ends in three quarters of the time left (never 0 ms,
        // which would block for good), as a renewal's does in its budget: too few
        // acknowledgements by then is `NotReplicated`, not a reply cut off by the deadline.
        let acks = self.config.replica_acks.map(|acks| match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let timeout = acks
                    .timeout
                    .min(left - left / 4)
                    .max(Duration::from_millis(1));
                scripts::ReplicaAcks { timeout, ..acks }
            }
            None => acks,
        });
        self.router
            .run_until(keys.lock(), deadline, |con, _| match acks {
                Some(acks) => scripts::extend_acked(con, keys, keys.owner(), lease, acks)
                    .map(|(ours, acked)| (ours, Some(acked))),
                None => scripts::extend(con, keys, keys.owner(), lease).map(|ours| (ours, None)),
            })
    }

    /// See [`Engine::acquire_shared`](crate::engine::Engine::acquire_shared).
    pub(crate) fn acquire_shared(
        self: &Arc<Self>,
        keys: &SharedLockKeys,
        access: Access,
        lease: Duration,
        deadline: Deadline,
        cancel: Option<&Receiver<()>>,
    ) -> Result<Option<Arc<Grant>>> {
        shared_lock::acquire(self, keys, access, lease, deadline, cancel)
    }

    /// See [`Engine::release_shared`](crate::engine::Engine::release_shared).
    pub(crate) fn release_shared(&self, keys: &SharedLockKeys, grant: &Arc<Grant>) -> Result<()> {
        let was_held = self.stop(grant);
        shared_lock::release(self, keys, grant, was_held)
    }

    /// See [`Engine::release_shared_detached`](crate::engine::Engine::release_shared_detached).
    pub(crate) fn release_shared_detached(
        self: &Arc<Self>,
        keys: &SharedLockKeys,
        grant: &Arc<Grant>,
    ) {
        let was_held = self.stop(grant);
        shared_lock::release_detached(self, keys, grant, was_held);
    }

    /// See [`Engine::shared_status`](crate::engine::Engine::shared_status).
    pub(crate) fn shared_status(&self, keys: &SharedLockKeys) -> Result<SharedStatus> {
        shared_lock::status(self, keys)
    }
}
