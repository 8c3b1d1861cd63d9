//! One grant of a shared lock, held: what a [`Permit`](crate::Permit), a
//! [`ReadGuard`](crate::ReadGuard) and a [`WriteGuard`](crate::WriteGuard) each wrap, written once
//! over the engine seam (`engine.rs`; on one master, `one_master/shared_lock.rs`). The guards add
//! only their names and documentation.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::key::SharedLockKeys;
use crate::metrics::{self, Op, Since};
use crate::options::{validate_lease, Deadline, LockOptions};
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
    /// [`take`](Held::take) with a call's [`LockOptions`]: a lease of the grant's own and a
    /// cancel channel. `renew(false)` and `max_hold` are refused: a shared grant is renewed until
    /// it is released.
    pub(crate) fn take_with(
        shared: &Arc<Shared>,
        keys: &Arc<SharedLockKeys>,
        access: Access,
        deadline: Deadline,
        options: &LockOptions,
    ) -> Result<Option<Held>> {
        options.validate()?;
        if options.no_renewal || options.max_hold.is_some() {
            return Err(Error::invalid(
                "options",
                format!(
                    "a grant of a {} is renewed until released: renew(false) and max_hold do \
                     not apply",
                    keys.what()
                ),
            ));
        }
        if options.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let lease = options.lease.unwrap_or(shared.config.lease);
        Held::take(
            shared,
            keys,
            access,
            lease,
            deadline,
            options.cancel.as_ref(),
        )
    }

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

/// The methods a guard of a shared lock has as a [`LockGuard`](crate::LockGuard) has them, over
/// its `held` field: `token`, `lease`, `is_held`, `lost` and `extend`. `$grant` names the grant
/// in the docs ("permit", "grant"), `$token` is what its token is above, and `$take` an
/// expression that takes one from a `client`, for the example.
macro_rules! held_guard {
    ($guard:ident, $grant:literal, $token:literal, $take:literal) => {
        impl $guard {
            #[doc = concat!("The fencing token of this grant: larger than that of every earlier ", $token, ".")]
            /// Storage that refuses a token below the largest it has seen refuses a stalled
            /// holder's late writes.
            pub fn token(&self) -> $crate::FencingToken {
                self.held.token()
            }

            #[doc = concat!("The lease renewals re-arm: the one this ", $grant, " was taken with, or the last")]
            #[doc = concat!("[`extend`](", stringify!($guard), "::extend)'s.")]
            pub fn lease(&self) -> std::time::Duration {
                self.held.lease()
            }

            #[doc = concat!("Whether the ", $grant, " is still ours, as far as this process can know without")]
            /// asking Redis: exactly as [`LockGuard::is_held`](crate::LockGuard::is_held) says of
            /// a lock. False once renewal found it gone, or the local deadline passed without a
            /// confirmed renewal.
            pub fn is_held(&self) -> bool {
                self.held.is_held()
            }

            #[doc = concat!("A channel that becomes ready when the ", $grant, " is lost, to block or `select!`")]
            /// on: one `()`, then it disconnects, as [`LockGuard::lost`](crate::LockGuard::lost)
            /// does. Ready at once if it was lost before the first call.
            pub fn lost(&self) -> &crossbeam_channel::Receiver<()> {
                self.held.lost()
            }

            #[doc = concat!("Makes the ", $grant, "'s lease run at least `lease` from now, if it is still ours;")]
            /// renewal keeps re-arming this lease from then on. Exactly as
            /// [`LockGuard::extend`](crate::LockGuard::extend) does for a lock: useful to
            /// lengthen a lease before a step that may stall, and it never shortens a lease (a
            /// late, shorter extend could otherwise let Redis free the grant while this guard
            /// still says held).
            ///
            /// ```no_run
            /// # fn main() -> Result<(), fencelock::Error> {
            /// use std::time::Duration;
            ///
            /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
            #[doc = concat!("let guard = ", $take, ";")]
            /// guard.extend(Duration::from_secs(120))?; // a long step ahead
            /// assert_eq!(guard.lease(), Duration::from_secs(120));
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease out of
            /// range, before any network call; [`Error::LockLost`](crate::Error::LockLost) if
            /// the grant is no longer ours; [`Error::NotReplicated`](crate::Error::NotReplicated)
            /// as for a lock's extend; connection errors and timeouts as for any command.
            pub fn extend(&self, lease: std::time::Duration) -> $crate::Result<()> {
                self.held.extend(lease)
            }
        }
    };
}

pub(crate) use held_guard;
