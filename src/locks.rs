//! The state one client shares among its lock calls, its guards and its threads.
//!
//! [`LockClient`](crate::LockClient) is the public face of a `Locks`; every guard holds a share
//! of it, as `lock_api` guards hold their raw lock, so that releasing and extending go to the
//! layer below the facade. The work on it lives in files that name it:
//!
//! - `acquire.rs`: a lock call — attempt, wait in the key's local queue, take a grant;
//! - `release.rs`: release, handoff to the next waiter, explicit extend;
//! - `renewal.rs`, `listener.rs`: the threads that serve every grant and waiter of the client
//!   (two, and on a cluster one more per master with waited keys: `listener/sharded.rs`).
//!
//! Lock order: the local queues (`wait.rs`), a grant's lease state and the renewal inbox are each
//! taken alone, never one inside another, except that the local queues' lock is held while a
//! waiter's `left` flag is read or set.
//!
//! No map records which thread holds which key: a [`LockGuard`](crate::LockGuard) can move to
//! another thread without telling anyone, so such a map would be wrong as soon as one did. The
//! one exact same-thread check is `reentrant.rs`'s, for guards that cannot move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::Sender;

use uuid::Uuid;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::key::{release_channel, LockKeys};
use crate::listener::{self, Sharded};
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::quorum::Quorum;
use crate::release::Later;
use crate::renewal::{self, Renewal};
use crate::wait::Waiters;

/// One client's shared state: see the module docs.
pub(crate) struct Locks {
    pub(crate) config: Config,
    /// Every owner id of this client starts with this: a random id for the client, and `:`.
    pub(crate) owner_prefix: String,
    pub(crate) next_owner: AtomicU64,
    pub(crate) router: Arc<Router>,
    pub(crate) waiters: Arc<Waiters>,
    /// On a cluster, the subscriptions to the channels of the keys our waiters wait on.
    pub(crate) sharded: Option<Sharded>,
    /// On a quorum of masters, what serves every lock call instead (`quorum.rs`).
    pub(crate) quorum: Option<Quorum>,
    pub(crate) renewal: Renewal,
    pub(crate) next_grant: AtomicU64,
    /// The background thread for releases no caller waits for (`release.rs`), started at its
    /// first use; `None` if it could not be started.
    pub(crate) later: OnceLock<Option<Sender<Later>>>,
}

impl Locks {
    /// Starts a client's threads (the release channel's listener and renewal) and its pool.
    pub(crate) fn start(connector: Arc<Connector>, config: Config) -> Result<Arc<Locks>> {
        let thread_error = |e: std::io::Error| Error::Connection(Box::new(e));
        crate::metrics::describe();
        let waiters = Arc::new(Waiters::default());
        // One random id per client, a counter per lock call: owner ids never repeat, cost no
        // system call each, and name the channel on which handoffs to this client come.
        let client_id = Uuid::new_v4().simple().to_string();
        // On a cluster, an id starting with 's' tells a release to hand over on the key's shard
        // channel (`listener/sharded.rs`) rather than broadcast to every node. Clients of
        // versions without it get classic messages, and so does this one from them.
        let client_id = if connector.routes() {
            format!("s{client_id}")
        } else {
            client_id
        };
        let owner_prefix = format!("{client_id}:");
        let quorum = if connector.masters() > 0 {
            Some(
                Quorum::start(
                    &connector,
                    &config.namespace,
                    config.connection_timeout,
                    config.response_timeout,
                )
                .map_err(thread_error)?,
            )
        } else {
            listener::spawn(
                Arc::clone(&connector),
                release_channel(&config.namespace, &client_id),
                owner_prefix.clone(),
                config.connection_timeout,
                Arc::downgrade(&waiters),
            )
            .map_err(thread_error)?;
            None
        };
        let sharded = connector.routes().then(|| {
            Sharded::new(
                Arc::clone(&connector),
                &config.namespace,
                &client_id,
                owner_prefix.clone(),
                config.connection_timeout,
                config.response_timeout,
                Arc::downgrade(&waiters),
            )
        });
        let renewal = renewal::spawn(
            Arc::clone(&connector),
            config.lease,
            config.connection_timeout,
            config.response_timeout,
            config.replica_acks,
        )
        .map_err(thread_error)?;
        Ok(Arc::new(Locks {
            router: Arc::new(Router::new(
                connector,
                config.pool_size,
                config.connection_timeout,
                config.response_timeout,
            )),
            config,
            owner_prefix,
            next_owner: AtomicU64::new(0),
            waiters,
            sharded,
            quorum,
            renewal,
            next_grant: AtomicU64::new(0),
            later: OnceLock::new(),
        }))
    }

    /// Tells clients apart (clones share one `Locks`): its address, stable while any client or
    /// guard of it lives.
    pub(crate) fn identity(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// A fresh owner id for every lock call: never reused, and not derivable from the key.
    pub(crate) fn new_owner(&self, keys: &mut LockKeys) {
        let n = self.next_owner.fetch_add(1, Ordering::Relaxed);
        keys.set_owner(&self.owner_prefix, n);
    }
}
