//! How a read-write lock's name becomes Redis keys, and each of its grants a lock key of its own.
//!
//! A read-write lock's tag is its escaped name behind `%R`. [`escape`](super::escape) writes a
//! `%` only before `25`, `7B` or `7D`, so no lock's tag starts with `%R` (nor a semaphore's,
//! which start with `%S`): a read-write lock, a lock and a semaphore of the same name never share
//! a key, a local queue or a handoff message. The tag holds no brace, so `{<tag>}` is a complete
//! Cluster hash tag and every key below lives in one slot.
//!
//! | key | what |
//! |---|---|
//! | `<namespace>:readers:{<tag>}` | ZSET: the owner id of every read grant not released, scored by its token |
//! | `<namespace>:writers:{<tag>}` | ZSET: the same for write grants (one live at most) |
//! | `<namespace>:rwhold:{<tag>}:<owner id>` | one grant, read or write: its owner id, with the lease as TTL |
//! | `<namespace>:fence:{<tag>}` | the lock's fence counter, one for reads and writes |
//! | `<namespace>:queue:{<tag>}`, `<namespace>:waiters:{<tag>}` | its queue, as a lock's; each entry says whether it waits to read or to write |

use std::time::Duration;

use super::{escape, millis, LockKeys, DEFAULT_IDLE_EXPIRY};
use crate::error::Result;

/// The Redis names of one read-write lock.
#[derive(Clone)]
pub(crate) struct RwKeys {
    name: String,
    tag: String,
    /// readers, writers, fence, queue, waiters: the scripts' first KEYS, in that order.
    keys: [String; 5],
    /// `<namespace>:rwhold:{<tag>}:`: a grant's key is this and its owner id.
    hold_prefix: String,
    idle_ms: u64,
}

impl RwKeys {
    /// Checks the name (as a lock's key is checked), before any network call.
    pub(crate) fn new(namespace: &str, name: &str) -> Result<RwKeys> {
        super::validate_key(name)?;
        let tag = format!("%R{}", escape(name));
        let key = |kind: &str| format!("{namespace}:{kind}:{{{tag}}}");
        Ok(RwKeys {
            name: name.to_owned(),
            keys: [
                key("readers"),
                key("writers"),
                key("fence"),
                key("queue"),
                key("waiters"),
            ],
            hold_prefix: format!("{namespace}:rwhold:{{{tag}}}:"),
            tag,
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

    /// Names the lock in this client's local queues and in handoff messages.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    pub(crate) fn idle_ms(&self) -> u64 {
        self.idle_ms
    }

    /// The readers' ZSET: routes the lock's calls (every key of it is in its slot).
    pub(crate) fn readers(&self) -> &str {
        &self.keys[0]
    }

    /// readers, writers, fence, queue, waiters.
    pub(crate) fn all(&self) -> [&str; 5] {
        let [a, b, c, d, e] = &self.keys;
        [a, b, c, d, e]
    }

    /// The names of the grant that `owner` holds or waits for, as a grant carries them: its
    /// lock key is the grant's own key, which renewal extends as it extends a lock's.
    pub(crate) fn hold(&self, owner: &str) -> LockKeys {
        let hold = format!("{}{owner}", self.hold_prefix);
        let [_, _, fence, queue, waiters] = self.all();
        LockKeys::assembled(
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
    use crate::key::{PermitKeys, MAX_KEY_LEN};

    fn slot_tag(key: &str) -> &str {
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
    }

    #[test]
    fn every_key_of_a_rw_lock_shares_one_hash_tag_and_none_is_a_lock_or_semaphore_key() {
        for name in ["config", "{", "}", "a}b{c", "%7D", "%R", "%S", "ключ"] {
            let k = RwKeys::new("ns", name).unwrap();
            let h = k.hold("c0ffee:7");
            for key in k.all().into_iter().chain([h.lock()]) {
                assert_eq!(slot_tag(key), k.tag(), "{name:?} {key:?}");
            }
            assert!(k.tag().starts_with("%R"));
            for other in [name, "%R", "%Rconfig"] {
                let lock = LockKeys::new("ns", other).unwrap();
                assert_ne!(lock.tag(), k.tag());
                let semaphore = PermitKeys::new("ns", other, 1).unwrap();
                assert_ne!(semaphore.tag(), k.tag());
            }
        }
    }

    #[test]
    fn a_grant_reads_as_a_lock_of_its_own() {
        let k = RwKeys::new("a:b", "con{fig}").unwrap();
        let h = k.hold("c0ffee:7");
        assert_eq!(h.lock(), "a:b:rwhold:{%Rcon%7Bfig%7D}:c0ffee:7");
        assert_eq!(h.owner(), "c0ffee:7");
        assert_eq!(h.user(), "con{fig}");
        assert_eq!(h.tag(), "%Rcon%7Bfig%7D");
        assert_eq!(h.namespace(), "a:b");
        assert_eq!(h.fence(), "a:b:fence:{%Rcon%7Bfig%7D}");
        assert_eq!(k.readers(), "a:b:readers:{%Rcon%7Bfig%7D}");
    }

    #[test]
    fn names_are_checked() {
        assert!(RwKeys::new("ns", "").err().unwrap().is_invalid_argument());
        assert!(RwKeys::new("ns", &"k".repeat(MAX_KEY_LEN + 1))
            .err()
            .unwrap()
            .is_invalid_argument());
    }
}
