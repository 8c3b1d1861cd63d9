//! How a semaphore's name becomes Redis keys, and each of its permits a lock key of its own.
//!
//! A semaphore's tag is its escaped name behind `%S`. [`escape`](super::escape) writes a `%` only
//! before `25`, `7B` or `7D`, so no lock's tag starts with `%S`: a semaphore and a lock of the
//! same name never share a key, a local queue or a handoff message, and the tag holds no brace,
//! so `{<tag>}` is a complete Cluster hash tag and every key below lives in one slot.
//!
//! | key | what |
//! |---|---|
//! | `<namespace>:permits:{<tag>}` | ZSET: the owner id of every permit granted and not released, scored by its token |
//! | `<namespace>:permit:{<tag>}:<owner id>` | one permit: its owner id, with the lease as TTL |
//! | `<namespace>:fence:{<tag>}` | the semaphore's fence counter |
//! | `<namespace>:queue:{<tag>}`, `<namespace>:waiters:{<tag>}` | its queue, as a lock's |
//! | `<namespace>:limit:{<tag>}` | the count of permits in force |

use std::time::Duration;

use super::{escape, millis, LockKeys, DEFAULT_IDLE_EXPIRY, MAX_KEY_LEN};
use crate::error::{Error, Result};

/// The Redis names of one semaphore, and its count of permits.
#[derive(Clone)]
pub(crate) struct PermitKeys {
    name: String,
    tag: String,
    /// holders, fence, queue, waiters, limit: the scripts' KEYS, in that order.
    keys: [String; 5],
    /// `<namespace>:permit:{<tag>}:`: a permit's key is this and its owner id.
    permit_prefix: String,
    count: u32,
    idle_ms: u64,
}

impl PermitKeys {
    /// Checks the name and the count, before any network call.
    pub(crate) fn new(namespace: &str, name: &str, count: u32) -> Result<PermitKeys> {
        if name.is_empty() {
            return Err(Error::invalid("semaphore name", "must not be empty"));
        }
        if name.len() > MAX_KEY_LEN {
            return Err(Error::invalid(
                "semaphore name",
                format!("is {} bytes long, the maximum is {MAX_KEY_LEN}", name.len()),
            ));
        }
        if count == 0 {
            return Err(Error::invalid(
                "permits",
                "must be at least 1: a semaphore without permits could never be acquired",
            ));
        }
        let tag = format!("%S{}", escape(name));
        let key = |kind: &str| format!("{namespace}:{kind}:{{{tag}}}");
        Ok(PermitKeys {
            name: name.to_owned(),
            keys: [
                key("permits"),
                key("fence"),
                key("queue"),
                key("waiters"),
                key("limit"),
            ],
            permit_prefix: format!("{namespace}:permit:{{{tag}}}:"),
            tag,
            count,
            idle_ms: millis(DEFAULT_IDLE_EXPIRY),
        })
    }

    /// Sets the client's idle expiry, for the fence counter's TTL.
    pub(crate) fn set_idle_expiry(&mut self, idle: Duration) {
        self.idle_ms = millis(idle);
    }

    /// The name as the user gave it.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Names the semaphore in this client's local queues and in handoff messages.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// The count of permits this handle was made with.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    pub(crate) fn idle_ms(&self) -> u64 {
        self.idle_ms
    }

    /// The holders' ZSET: routes the semaphore's calls (every key of it is in its slot).
    pub(crate) fn holders(&self) -> &str {
        &self.keys[0]
    }

    /// The queue's entries (HASH owner id -> expiry and lease).
    pub(crate) fn waiters(&self) -> &str {
        &self.keys[3]
    }

    /// The count in force.
    pub(crate) fn limit(&self) -> &str {
        &self.keys[4]
    }

    /// holders, fence, queue, waiters, limit.
    pub(crate) fn all(&self) -> [&str; 5] {
        let [a, b, c, d, e] = &self.keys;
        [a, b, c, d, e]
    }

    /// The names of the permit that `owner` holds or waits for, as a grant carries them: its
    /// lock key is the permit's own key, which renewal extends as it extends a lock's.
    pub(crate) fn permit(&self, owner: &str) -> LockKeys {
        let permit = format!("{}{owner}", self.permit_prefix);
        let [_, fence, queue, waiters, _] = self.all();
        LockKeys::assembled(
            &self.name,
            &self.tag,
            [&permit, fence, queue, waiters],
            owner,
            self.idle_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_tag(key: &str) -> &str {
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
    }

    #[test]
    fn every_key_of_a_semaphore_shares_one_hash_tag_and_none_is_a_lock_key() {
        for name in ["uploads", "{", "}", "a}b{c", "%7D", "%S", "ключ"] {
            let k = PermitKeys::new("ns", name, 3).unwrap();
            let p = k.permit("c0ffee:7");
            for key in k.all().into_iter().chain([p.lock()]) {
                assert_eq!(slot_tag(key), k.tag(), "{name:?} {key:?}");
            }
            assert!(k.tag().starts_with("%S"));
            // No lock's tag starts with "%S", whatever its key.
            for lock in [name, "%S", "%Suploads"] {
                let lock = LockKeys::new("ns", lock).unwrap();
                assert_ne!(lock.tag(), k.tag());
            }
        }
    }

    #[test]
    fn a_permit_reads_as_a_lock_of_its_own() {
        let k = PermitKeys::new("a:b", "up{loads}", 4).unwrap();
        let p = k.permit("c0ffee:7");
        assert_eq!(p.lock(), "a:b:permit:{%Sup%7Bloads%7D}:c0ffee:7");
        assert_eq!(p.owner(), "c0ffee:7");
        assert_eq!(p.user(), "up{loads}");
        assert_eq!(p.tag(), "%Sup%7Bloads%7D");
        assert_eq!(p.namespace(), "a:b");
        assert_eq!(k.holders(), "a:b:permits:{%Sup%7Bloads%7D}");
        assert_eq!(k.limit(), "a:b:limit:{%Sup%7Bloads%7D}");
        assert_eq!(p.fence(), "a:b:fence:{%Sup%7Bloads%7D}");
    }

    #[test]
    fn names_and_counts_are_checked() {
        assert!(PermitKeys::new("ns", "", 1)
            .err()
            .unwrap()
            .is_invalid_argument());
        assert!(PermitKeys::new("ns", &"k".repeat(MAX_KEY_LEN + 1), 1)
            .err()
            .unwrap()
            .is_invalid_argument());
        assert!(PermitKeys::new("ns", "a", 0)
            .err()
            .unwrap()
            .is_invalid_argument());
        assert!(PermitKeys::new("ns", "a", u32::MAX).is_ok());
    }
}
