//! Locks on several keys at once: [`MultiGuard`], a set of grants taken all or none, written once
//! over the engine seam as a handful of plain lock calls.
//!
//! Deadlock freedom is the classic resource order: every set is taken in one order, sorted by
//! the keys' escaped forms (`LockKeys::tag`), whatever order the caller named them in. A caller
//! waits only for a key that sorts after every key it holds, so the holder it waits for, if it
//! waits in turn, waits for a key that sorts later still: no cycle can close. Each key is waited
//! for as `lock` waits for it, in its key's local queue and Redis' queue, so callers of single
//! keys that came later queue behind the set's caller, and it is not starved by them.
//!
//! What a set adds to single grants is small: its grants share one loss signal (each fires it
//! as it fires its own, `grant::SharedLoss`), and the set is held while each of them is.

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::error::{Error, Result};
use crate::grant::SharedLoss;
use crate::guard::LockGuard;
use crate::key::LockKeys;
use crate::metrics::Op;
use crate::options::validate_lease;
use crate::token::FencingToken;

/// Locks held on several keys at once, taken all or none by
/// [`LockClient::lock_all`](crate::LockClient::lock_all) and
/// [`try_lock_all`](crate::LockClient::try_lock_all). Releases them all when dropped;
/// [`unlock`](MultiGuard::unlock) releases them and reports how that went.
///
/// Each key keeps its own grant and its own [`FencingToken`] ([`token`](MultiGuard::token)):
/// storage checks each resource's token as it does for a single lock. The set is renewed with
/// the client's other locks and held as one: losing any key is losing the set, so
/// [`is_held`](MultiGuard::is_held) turns false and [`lost`](MultiGuard::lost) fires once when
/// any key is lost. A key named twice is locked once. Like [`LockGuard`], the guard has no
/// lifetime and may move to another thread.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let accounts = client.lock_all(&["acct:7", "acct:1"])?; // in any order
/// let from = accounts.token("acct:7").expect("locked above");
/// let to = accounts.token("acct:1").expect("locked above");
/// // ... debit acct:7 with token `from`, credit acct:1 with token `to` ...
/// # let _ = (from, to);
/// accounts.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    /// In the order they were taken: by escaped key.
    guards: Vec<LockGuard>,
    lost: OnceLock<Receiver<()>>,
}

impl MultiGuard {
    /// The fencing token of `key`'s grant, or `None` if `key` is not one of this guard's keys.
    /// Keys are compared as given to [`lock_all`](crate::LockClient::lock_all).
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|guard| guard.key() == key)
            .map(LockGuard::token)
    }

    /// The keys held, each once, in the order they were taken (sorted by their escaped form,
    /// which for keys without `%`, `{` and `}` is byte order).
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.guards.iter().map(LockGuard::key)
    }

    /// Whether every key is still ours, as far as this process can know without asking Redis:
    /// false as soon as any one of them is lost (see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// A channel that becomes ready when any of the keys is lost, to block or `select!` on.
    ///
    /// One `()` is sent when the first key is found lost, and then the channel disconnects, so
    /// any result from `recv` means lost, however many keys go. Ready at once if a key was lost
    /// before the first call. As with [`LockGuard::lost`], no thread watches the set: each key's
    /// grant fires the signal when its renewal finds it lost.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use fencelock::crossbeam_channel::{select, unbounded};
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let guards = client.lock_all(&["shelf:1", "shelf:2"])?;
    /// let (_work_tx, work_done) = unbounded::<()>();
    /// select! {
    ///     recv(work_done) -> _ => guards.unlock()?,
    ///     recv(guards.lost()) -> _ => eprintln!("lost a shelf; abandoning the restock"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> &Receiver<()> {
        self.lost.get_or_init(|| {
            let (signal, lost) = SharedLoss::new();
            for guard in &self.guards {
                guard.share_loss(&signal);
            }
            lost
        })
    }

    /// Makes every key's lease run at least `lease` from now, as [`LockGuard::extend`] does for
    /// one key; renewal (if on) keeps re-arming this lease for each of them from then on.
    ///
    /// The keys are extended one at a time, in the order they were taken
    /// ([`keys`](MultiGuard::keys)), and the first key whose extend fails ends the call with its
    /// error; the keys after it are not asked. What the failure means for the set depends on
    /// what it says:
    ///
    /// - [`Error::LockLost`]: that key is no longer ours, so the set is lost, as when renewal
    ///   finds a key gone: [`is_held`](MultiGuard::is_held) is false from then on and
    ///   [`lost`](MultiGuard::lost) fires, whether or not the keys before it were extended.
    ///   A set already known lost fails this way before any network call. Release it (drop or
    ///   [`unlock`](MultiGuard::unlock)) to free the keys that are still ours.
    /// - A connection error, a timeout or
    ///   [`Error::NotReplicated`](crate::Error::NotReplicated): whether that key's extend took
    ///   effect is unknown, so it keeps the lease it was known to have, and renewal (if on) goes
    ///   on re-arming its old lease. The set stays held, but only as long as its shortest lease:
    ///   the keys before it have the new lease, that key and the ones after it their old one, and
    ///   `is_held()` turns false when the first of those runs out unrenewed. Call `extend` again
    ///   to retry.
    /// - An error reply that renewal cannot get past either (an ACL that refuses the script, say)
    ///   loses that key, as it would at a renewal, and so the set.
    ///
    /// Either way, `is_held()` never reports the set held for longer than every key is ours.
    ///
    /// As with one key, an extend never shortens a lease: a key with more than `lease` left keeps
    /// what it has.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// let shelves = client.lock_all(&["shelf:1", "shelf:2"])?;
    /// // A step that may stall for a while: every shelf's lease covers it, or none is relied on.
    /// shelves.extend(Duration::from_secs(120))?;
    /// // ... the long restock, with shelves.token("shelf:1") and shelves.token("shelf:2") ...
    /// shelves.unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease out of range, before any network call;
    /// [`Error::LockLost`] if any key is no longer ours (the set is then lost, see above); the
    /// other errors of [`LockGuard::extend`], for the first key that fails.
    pub fn extend(&self, lease: Duration) -> Result<()> {
        let checked = validate_lease(lease).and_then(|()| {
            match self.guards.iter().find(|guard| !guard.is_held()) {
                Some(lost) => Err(Error::LockLost {
                    key: lost.key().to_owned(),
                }),
                None => Ok(()),
            }
        });
        if let Err(e) = checked {
            // Counted once, as a failed extend of one key is (a set is never empty).
            if let Some(first) = self.guards.first() {
                first.count_failed(Op::Extend, &e);
            }
            return Err(e);
        }
        for guard in &self.guards {
            if let Err(e) = guard.extend(lease) {
                if e.is_lock_lost() {
                    // The engines mark a grant lost when they report it so; the set's word that
                    // it is lost must not rest on that alone.
                    guard.mark_lost("it was no longer ours at an extend of its set");
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Releases every key now, each as [`LockGuard::unlock`] does, and waits for Redis to
    /// confirm them. All are released, whatever happens to any one of them.
    ///
    /// # Errors
    /// The first error among the keys' releases, as [`LockGuard::unlock`] reports them:
    /// [`Error::LockLost`] if that key was no longer ours, connection errors and timeouts
    /// (that key then expires with its lease).
    pub fn unlock(mut self) -> Result<()> {
        let mut first = None;
        // Last taken first: a caller waiting for the same set, queued at its first key, finds
        // the others free once it gets that one.
        while let Some(guard) = self.guards.pop() {
            if let Err(e) = guard.unlock() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Releases every key, best effort, last taken first, as dropping each
/// [`LockGuard`] would: failures are logged and those keys expire with their leases.
impl Drop for MultiGuard {
    fn drop(&mut self) {
        while let Some(guard) = self.guards.pop() {
            drop(guard);
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Keys<'a>(&'a [LockGuard]);
        impl fmt::Debug for Keys<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|g| (g.key(), g.token())))
                    .finish()
            }
        }
        f.debug_struct("MultiGuard")
            .field("tokens", &Keys(&self.guards))
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

/// Every `lock_all` call, given how the client checks one key (`prepare`: the key, the
/// options, reentrancy) and takes it (`take`: the engine's acquire until the call's deadline):
/// checks every key before any network call, then takes them one by one in their canonical
/// order. `None` when a key could not be had by the deadline, and on any error the error:
/// either way, what was taken is released first (by the partial set's drop).
pub(crate) fn acquire<K: AsRef<str>>(
    keys: &[K],
    prepare: impl FnMut(&str) -> Result<LockKeys>,
    mut take: impl FnMut(LockKeys) -> Result<Option<LockGuard>>,
) -> Result<Option<MultiGuard>> {
    let keys = in_order(keys, prepare)?;
    let mut set = MultiGuard {
        guards: Vec::with_capacity(keys.len()),
        lost: OnceLock::new(),
    };
    for keys in keys {
        match take(keys)? {
            Some(guard) => set.guards.push(guard),
            None => return Ok(None),
        }
        // A key taken earlier may have been lost while this one was waited for (its renewals
        // failed): the set was never held whole, and is not handed out.
        if let Some(lost) = set.guards.iter().find(|guard| !guard.is_held()) {
            return Err(Error::LockLost {
                key: lost.key().to_owned(),
            });
        }
    }
    Ok(Some(set))
}

/// Checks every key with `prepare`, and puts them in the order they are taken in: sorted by
/// tag, each once. The tag is an injective escaping of the key, so equal tags are equal keys,
/// and the order is the same in every client.
fn in_order<K: AsRef<str>>(
    keys: &[K],
    prepare: impl FnMut(&str) -> Result<LockKeys>,
) -> Result<Vec<LockKeys>> {
    if keys.is_empty() {
        return Err(Error::invalid(
            "keys",
            "none given; a set needs at least one",
        ));
    }
    let mut prepared = keys
        .iter()
        .map(AsRef::as_ref)
        .map(prepare)
        .collect::<Result<Vec<_>>>()?;
    prepared.sort_unstable_by(|a, b| a.tag().cmp(b.tag()));
    prepared.dedup_by(|a, b| a.tag() == b.tag());
    Ok(prepared)
}

#[cfg(test)]
mod tests;
