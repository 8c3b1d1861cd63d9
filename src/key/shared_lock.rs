//! How a shared lock's name becomes Redis keys, and each of its grants a lock key of its own. A
//! shared lock is one that several grants may hold at once: a counting semaphore (each permit
//! weighs one of N) or a read-write lock (a reader weighs one of "all but writers", a writer
//! all). Both lay out their keys alike; the kind says which names they take.
//!
//! A shared lock's tag is its kind's prefix (`%semaphore:` or `%rwlock:`, as an election's is
//! `%election:`) before its escaped name. [`escape`](super::escape) writes a `%` only before
//! `25`, `7B` or `7D`, so no lock's tag starts with either: a shared lock, a lock and an election
//! of the same name never share a key, a local queue or a handoff message. The tag holds no
//! brace, so `{<tag>}` is a complete Cluster hash tag and every key below lives in one slot.
//!
//! | semaphore | read-write lock | what |
//! |---|---|---|
//! | `<ns>:permits:{<tag>}` | `<ns>:readers:{<tag>}` | ZSET: the owner id of every (read) grant not released, scored by its token |
//! | `<ns>:permit:{<tag>}:<owner id>` | `<ns>:rwhold:{<tag>}:<owner id>` | one grant: its owner id, with the lease as TTL |
//! | `<ns>:fence:{<tag>}` | the same | the fence counter, one for every grant of the lock |
//! | `<ns>:queue:{<tag>}`, `<ns>:waiters:{<tag>}` | the same | its queue, as a lock's (a read-write lock's entries say read or write) |
//! | `<ns>:limit:{<tag>}` | `<ns>:writers:{<tag>}` | the count of permits in force; the write grants (one live at most) |

use std::time::Duration;

use super::{escape, millis, GrantKind, LockKeys, DEFAULT_IDLE_EXPIRY, MAX_KEY_LEN};
use crate::error::{Error, Result};

/// What a semaphore's tag starts with.
pub(crate) const SEMAPHORE_TAG: &str = "%semaphore:";

/// What a read-write lock's tag starts with.
pub(crate) const RWLOCK_TAG: &str = "%rwlock:";

/// Which shared lock: it picks the scripts, the key names and how a grant weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A counting semaphore of this many permits.
    Semaphore(u32),
    ReadWrite,
}

/// The Redis names of one shared lock.
#[derive(Clone)]
pub(crate) struct SharedLockKeys {
    kind: Kind,
    name: String,
    tag: String,
    /// holders, fence, queue, waiters, and the kind's own (limit, or writers): the scripts'
    /// first KEYS, in that order.
    keys: [String; 5],
    /// `<namespace>:<permit|rwhold>:{<tag>}:`: a grant's key is this and its owner id.
    hold_prefix: String,
    idle_ms: u64,
}

impl SharedLockKeys {
    /// A semaphore's names: checks the name and the count, before any network call.
    pub(crate) fn semaphore(namespace: &str, name: &str, permits: u32) -> Result<SharedLockKeys> {
        if name.is_empty() {
            return Err(Error::invalid("semaphore name", "must not be empty"));
        }
        if name.len() > MAX_KEY_LEN {
            return Err(Error::invalid(
                "semaphore name",
                format!("is {} bytes long, the maximum is {MAX_KEY_LEN}", name.len()),
            ));
        }
        if permits == 0 {
            return Err(Error::invalid(
                "permits",
                "must be at least 1: a semaphore without permits could never be acquired",
            ));
        }
        Ok(SharedLockKeys::laid_out(
            Kind::Semaphore(permits),
            namespace,
            name,
        ))
    }

    /// A read-write lock's names: checks the name (as a lock's key is checked).
    pub(crate) fn rwlock(namespace: &str, name: &str) -> Result<SharedLockKeys> {
        super::validate_key(name)?;
        Ok(SharedLockKeys::laid_out(Kind::ReadWrite, namespace, name))
    }

    fn laid_out(kind: Kind, namespace: &str, name: &str) -> SharedLockKeys {
        let (prefix, [holders, hold, own]) = match kind {
            Kind::Semaphore(_) => (SEMAPHORE_TAG, ["permits", "permit", "limit"]),
            Kind::ReadWrite => (RWLOCK_TAG, ["readers", "rwhold", "writers"]),
        };
        let tag = format!("{prefix}{}", escape(name));
        let key = |kind: &str| format!("{namespace}:{kind}:{{{tag}}}");
        SharedLockKeys {
            kind,
            name: name.to_owned(),
            keys: [
                key(holders),
                key("fence"),
                key("queue"),
                key("waiters"),
                key(own),
            ],
            hold_prefix: format!("{namespace}:{hold}:{{{tag}}}:"),
            tag,
            idle_ms: millis(DEFAULT_IDLE_EXPIRY),
        }
    }

    /// Sets the client's idle expiry, for the fence counter's TTL.
    pub(crate) fn set_idle_expiry(&mut self, idle: Duration) {
        self.idle_ms = millis(idle);
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// What the lock is, for errors and logs: `semaphore` or `read-write lock`.
    pub(crate) fn what(&self) -> &'static str {
        match self.kind {
            Kind::Semaphore(_) => "semaphore",
            Kind::ReadWrite => "read-write lock",
        }
    }

    /// The name as the user gave it.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Names the lock in this client's local queues and in handoff messages.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// A semaphore's count of permits, as this handle was made with; 0 for a read-write lock.
    pub(crate) fn count(&self) -> u32 {
        match self.kind {
            Kind::Semaphore(permits) => permits,
            Kind::ReadWrite => 0,
        }
    }

    pub(crate) fn idle_ms(&self) -> u64 {
        self.idle_ms
    }

    /// The (read) holders' ZSET: routes the lock's calls (every key of it is in its slot).
    pub(crate) fn holders(&self) -> &str {
        &self.keys[0]
    }

    /// The queue's entries (HASH owner id -> expiry, lease and, for a read-write lock, r or w).
    pub(crate) fn waiters(&self) -> &str {
        &self.keys[3]
    }

    /// The kind's own key: a semaphore's count in force, a read-write lock's writers' ZSET.
    pub(crate) fn own(&self) -> &str {
        &self.keys[4]
    }

    /// What a grant's key is, before its owner id.
    pub(crate) fn hold_prefix(&self) -> &str {
        &self.hold_prefix
    }

    /// holders, fence, queue, waiters, and the kind's own key.
    pub(crate) fn all(&self) -> [&str; 5] {
        let [a, b, c, d, e] = &self.keys;
        [a, b, c, d, e]
    }

    /// The names of the grant (of `kind`) that `owner` holds or waits for, as a grant carries
    /// them: its lock key is the grant's own key, which renewal extends as it extends a lock's.
    pub(crate) fn hold(&self, owner: &str, kind: GrantKind) -> LockKeys {
        let hold = format!("{}{owner}", self.hold_prefix);
        let [_, fence, queue, waiters, _] = self.all();
        LockKeys::assembled(
            kind,
            &self.name,
            &self.tag,
            [&hold, fence, queue, waiters],
            owner,
            self.idle_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::tests::slot_tag;

    #[test]
    fn every_key_of_a_shared_lock_shares_one_hash_tag_and_none_is_another_kinds() {
        let names = ["uploads", "{", "}", "a}b{c", "%7D", "%S", "%R", "ключ"];
        for name in names {
            let s = SharedLockKeys::semaphore("ns", name, 3).unwrap();
            let r = SharedLockKeys::rwlock("ns", name).unwrap();
            for k in [&s, &r] {
                let h = k.hold("c0ffee:7", GrantKind::Permit);
                for key in k.all().into_iter().chain([h.lock()]) {
                    assert_eq!(slot_tag(key), k.tag(), "{name:?} {key:?}");
                }
            }
            assert!(s.tag().starts_with(SEMAPHORE_TAG));
            assert!(r.tag().starts_with(RWLOCK_TAG));
            assert_ne!(s.tag(), r.tag());
            // No lock's or election's tag is a shared lock's, whatever its key.
            for other in [
                name,
                "%semaphore:uploads",
                "%rwlock:uploads",
                s.tag(),
                r.tag(),
            ] {
                let lock = LockKeys::new("ns", other).unwrap();
                let election = LockKeys::election("ns", other).unwrap();
                for tag in [lock.tag(), election.tag()] {
                    assert_ne!(tag, s.tag());
                    assert_ne!(tag, r.tag());
                }
            }
        }
    }

    #[test]
    fn a_grant_reads_as_a_lock_of_its_own() {
        let k = SharedLockKeys::semaphore("a:b", "up{loads}", 4).unwrap();
        let p = k.hold("c0ffee:7", GrantKind::Permit);
        assert_eq!(p.lock(), "a:b:permit:{%semaphore:up%7Bloads%7D}:c0ffee:7");
        assert_eq!(p.owner(), "c0ffee:7");
        assert_eq!(p.user(), "up{loads}");
        assert_eq!(p.tag(), "%semaphore:up%7Bloads%7D");
        assert_eq!(p.namespace(), "a:b");
        assert_eq!(k.holders(), "a:b:permits:{%semaphore:up%7Bloads%7D}");
        assert_eq!(k.own(), "a:b:limit:{%semaphore:up%7Bloads%7D}");
        assert_eq!(p.fence(), "a:b:fence:{%semaphore:up%7Bloads%7D}");

        let k = SharedLockKeys::rwlock("a:b", "con{fig}").unwrap();
        let h = k.hold("c0ffee:7", GrantKind::Permit);
        assert_eq!(h.lock(), "a:b:rwhold:{%rwlock:con%7Bfig%7D}:c0ffee:7");
        assert_eq!(h.user(), "con{fig}");
        assert_eq!(h.namespace(), "a:b");
        assert_eq!(h.fence(), "a:b:fence:{%rwlock:con%7Bfig%7D}");
        assert_eq!(k.holders(), "a:b:readers:{%rwlock:con%7Bfig%7D}");
        assert_eq!(k.own(), "a:b:writers:{%rwlock:con%7Bfig%7D}");
    }

    #[test]
    fn names_and_counts_are_checked() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        for bad in [
            SharedLockKeys::semaphore("ns", "", 1),
            SharedLockKeys::semaphore("ns", &long, 1),
            SharedLockKeys::semaphore("ns", "a", 0),
            SharedLockKeys::rwlock("ns", ""),
            SharedLockKeys::rwlock("ns", &long),
        ] {
            assert!(bad.err().unwrap().is_invalid_argument());
        }
        assert!(SharedLockKeys::semaphore("ns", "a", u32::MAX).is_ok());
    }
}
