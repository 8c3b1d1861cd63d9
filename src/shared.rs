//! What one client shares among its clones and its guards: its configuration and its engine.
//!
//! [`LockClient`](crate::LockClient) is the public face of a `Shared`; every guard holds a share
//! of it, as `lock_api` guards hold their raw lock, so that releasing and extending go to the
//! engine below the facade, whichever thread the guard has moved to.
//!
//! No map records which thread holds which key: a [`LockGuard`](crate::LockGuard) can move to
//! another thread without telling anyone, so such a map would be wrong as soon as one did. The
//! one exact same-thread check is `reentrant.rs`'s, for guards that cannot move.

use std::sync::Arc;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::Result;
use crate::key::LockKeys;
use crate::net::connector::Connector;

/// One client's shared state: see the module docs.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) engine: Engine,
}

impl Shared {
    /// Starts the client's engine: its threads, and its connections as they are first needed.
    pub(crate) fn start(connector: Arc<Connector>, config: Config) -> Result<Arc<Shared>> {
        crate::metrics::describe();
        let engine = Engine::start(connector, &config)?;
        Ok(Arc::new(Shared { config, engine }))
    }

    /// Tells clients apart (clones share one `Shared`): its address, stable while any client or
    /// guard of it lives.
    pub(crate) fn identity(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The Redis names of the user's `key` in this client's namespace, checked.
    pub(crate) fn keys(&self, key: &str) -> Result<LockKeys> {
        let mut keys = LockKeys::new(&self.config.namespace, key)?;
        keys.set_idle_expiry(self.config.idle_expiry);
        Ok(keys)
    }
}
