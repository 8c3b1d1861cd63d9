//! One grant of a shared lock, held: what a [`Permit`](crate::Permit), a
//! [`ReadGuard`](crate::ReadGuard) and a [`WriteGuard`](crate::WriteGuard) each wrap, written once
//! over the engine seam (`engine.rs`; on one master, `one_master/shared_lock.rs`). The guards add
//! only their names and documentation.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::error::Result;
use crate::grant::Grant;
use crate::key::SharedLockKeys;
use crate::metrics::{self, Op, Since};
use crate::options::{validate_lease, Deadline};
use crate::scripts::shared_lock::Access;
use crate::shared::Shared;
use crate::token::FencingToken;

/// One grant of a shared lock, held until released or dropped.
pub(crate) struct Held {
    shared: Arc<Shared>,
    keys: Arc<SharedLockKeys>,
    grant: Arc<Grant>,
    lost: OnceLock<Receiver<()>>,
    released: bool,
}

impl Held {
    /// Takes a grant of `keys` as `access` says, under `lease`, waiting until `deadline` (for
    /// ever: until granted) or `cancel`.
    pub(crate) fn take(
        shared: &Arc<Shared>,
        keys: &Arc<SharedLockKeys>,
        access: Access,
        lease: Duration,
        deadline: Deadline,
        cancel: Option<&Receiver<()>>,
    ) -> Result<Option<Held>> {
        let called = Since::now();
        let taken = loop {
            let grant = shared
                .engine
                .acquire_shared(keys, access, lease, deadline, cancel);
            match (grant, deadline) {
                (Ok(None), Deadline::Never) => continue,
                (grant, _) => break grant,
            }
        };
        metrics::acquired_as(&shared.config.namespace, access.kind(), called, &taken);
        Ok(taken?.map(|grant| Held {
            shared: Arc::clone(shared),
            keys: Arc::clone(keys),
            grant,
            lost: OnceLock::new(),
            released: false,
        }))
    }

    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.grant.token
    }

    pub(crate) fn lease(&self) -> Duration {
        self.grant.renewal_lease()
    }

    pub(crate) fn is_held(&self) -> bool {
        self.grant.is_held()
    }

    pub(crate) fn lost(&self) -> &Receiver<()> {
        self.lost.get_or_init(|| self.grant.watch())
    }

    /// As [`LockGuard::extend`](crate::LockGuard::extend): the grant's key is extended as a
    /// lock key is.
    pub(crate) fn extend(&self, lease: Duration) -> Result<()> {
        let extended =
            validate_lease(lease).and_then(|()| self.shared.engine.extend(&self.grant, lease));
        metrics::outcome(self.grant.keys.namespace(), Op::Extend, &extended);
        extended
    }

    pub(crate) fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.shared.engine.release_shared(&self.keys, &self.grant)
    }

    pub(crate) fn debug(&self, f: &mut fmt::Formatter<'_>, guard: &str, name: &str) -> fmt::Result {
        f.debug_struct(guard)
            .field(name, &self.keys.name())
            .field("token", &self.grant.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

/// Releases the grant, best effort, as a [`LockGuard`](crate::LockGuard)'s drop does.
impl Drop for Held {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared
            .engine
            .release_shared_detached(&self.keys, &self.grant);
    }
}

/// The deadline of a wait of `timeout` from now: one attempt for zero, none for a timeout too
/// long to count.
pub(crate) fn deadline(timeout: Duration) -> Deadline {
    match Instant::now().checked_add(timeout) {
        _ if timeout.is_zero() => Deadline::Now,
        Some(at) => Deadline::At(at),
        None => Deadline::Never,
    }
}
