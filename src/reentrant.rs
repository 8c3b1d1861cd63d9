//! Reentrant locks: one grant shared by nested guards of one thread.
//!
//! The hold count is kept in-process, in a thread-local map from (client, key) to the shared
//! hold, rather than in a Redis hash as Redisson does: a nested `reentrant_lock` then costs no
//! round trip, and the count cannot drift from the guards that exist, since it *is* the number of
//! guards (`Rc` strong count). The guard is `!Send` because the count belongs to one thread.
//!
//! Because a reentrant guard never leaves its thread, the map also answers exactly whether the
//! calling thread holds a key reentrantly: a plain lock of such a key returns
//! `Error::WouldDeadlock` ([`held_here`]). Plain guards can move, so nothing tracks them by thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::rc::{Rc, Weak};

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::key::LockKeys;
use crate::token::FencingToken;

/// (client identity, escaped key) of a reentrant hold.
pub(crate) type HoldId = (usize, String);

thread_local! {
    static HOLDS: RefCell<HashMap<HoldId, Weak<Hold>>> = RefCell::new(HashMap::new());
}

struct Hold {
    guard: LockGuard,
    id: HoldId,
}

/// A reentrant lock held by the current thread; made by
/// [`LockClient::reentrant_lock`](crate::LockClient::reentrant_lock) and
/// [`LockClient::try_reentrant_lock`](crate::LockClient::try_reentrant_lock).
///
/// Taking the same key again on the same thread, through the same client, returns another guard
/// of the *same* grant at once: same fencing token, no round trip. The lock is released in Redis
/// when the last of these guards is dropped or unlocked, in whatever order they go. The guard is
/// `!Send`: a hold count belongs to one thread.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let outer = client.reentrant_lock("account:9")?;
/// let inner = client.reentrant_lock("account:9")?; // no deadlock
/// assert_eq!(inner.token(), outer.token());
/// assert_eq!(outer.hold_count(), 2);
/// inner.unlock()?; // still held
/// outer.unlock()?; // released in Redis
/// # Ok(()) }
/// ```
///
/// It cannot be sent to another thread:
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<fencelock::ReentrantGuard>();
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct ReentrantGuard {
    hold: Rc<Hold>,
}

/// Another guard of this thread's hold of `key`, or, if it has none, the id under which to
/// record a new one.
pub(crate) fn nested(
    client: usize,
    keys: &LockKeys,
) -> Result<std::result::Result<ReentrantGuard, HoldId>> {
    let id = (client, keys.tag().to_owned());
    // While the thread exits, its map is gone: no nesting to find, and none to record.
    let nested = HOLDS
        .try_with(|holds| holds.try_borrow().ok()?.get(&id).and_then(Weak::upgrade))
        .ok()
        .flatten();
    match nested {
        // A share of a lost grant would claim a lock nobody holds; and no new grant can be
        // had while the old shares live.
        Some(hold) if !hold.guard.is_held() => Err(Error::LockLost {
            key: keys.user().to_owned(),
        }),
        Some(hold) => Ok(Ok(ReentrantGuard { hold })),
        None => Ok(Err(id)),
    }
}

/// Makes `guard` this thread's hold `id`, and its first share.
pub(crate) fn record(id: HoldId, guard: LockGuard) -> ReentrantGuard {
    let hold = Rc::new(Hold {
        guard,
        id: id.clone(),
    });
    let _ = HOLDS.try_with(|holds| {
        if let Ok(mut holds) = holds.try_borrow_mut() {
            holds.insert(id, Rc::downgrade(&hold));
        }
    });
    ReentrantGuard { hold }
}

impl ReentrantGuard {
    /// The key this guard holds.
    pub fn key(&self) -> &str {
        self.hold.guard.key()
    }

    /// The fencing token of the grant, the same for every nested guard.
    pub fn token(&self) -> FencingToken {
        self.hold.guard.token()
    }

    /// How many guards of this thread share the grant, this one included.
    pub fn hold_count(&self) -> usize {
        Rc::strong_count(&self.hold)
    }

    /// As [`LockGuard::is_held`].
    pub fn is_held(&self) -> bool {
        self.hold.guard.is_held()
    }

    /// As [`LockGuard::lost`].
    pub fn lost(&self) -> &Receiver<()> {
        self.hold.guard.lost()
    }

    /// Gives up this guard's share. The last share releases the lock in Redis and reports as
    /// [`LockGuard::unlock`] does; an inner one returns `Ok(())` and leaves the lock held.
    ///
    /// # Errors
    /// As for [`LockGuard::unlock`], from the last share only.
    pub fn unlock(self) -> Result<()> {
        let hold = Rc::clone(&self.hold);
        // Our share goes; with the clone alive, Drop sees another share and leaves the map be.
        drop(self);
        match Rc::try_unwrap(hold) {
            Ok(Hold { guard, id }) => {
                forget(&id);
                guard.unlock()
            }
            Err(_) => Ok(()),
        }
    }
}

impl Drop for ReentrantGuard {
    fn drop(&mut self) {
        if Rc::strong_count(&self.hold) == 1 {
            forget(&self.hold.id);
        }
        // The last share's Hold drops with this field, and its LockGuard releases the lock.
    }
}

/// Whether the calling thread holds `tag` of the client `client` through a [`ReentrantGuard`].
/// Exact, since those guards never leave their thread. False while the thread is exiting.
pub(crate) fn held_here(client: usize, tag: &str) -> bool {
    HOLDS
        .try_with(|holds| {
            let Ok(holds) = holds.try_borrow() else {
                return false;
            };
            // Most threads hold nothing reentrantly: no key to build for them.
            !holds.is_empty()
                && holds
                    .get(&(client, tag.to_owned()))
                    .is_some_and(|hold| hold.strong_count() > 0)
        })
        .unwrap_or(false)
}

/// Removes a hold from this thread's map; quietly does nothing while the thread is exiting.
fn forget(id: &HoldId) {
    let _ = HOLDS.try_with(|holds| {
        if let Ok(mut holds) = holds.try_borrow_mut() {
            holds.remove(id);
        }
    });
}

impl fmt::Debug for ReentrantGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantGuard")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("hold_count", &self.hold_count())
            .finish_non_exhaustive()
    }
}
