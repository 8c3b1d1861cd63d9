//! How a user's key becomes Redis keys: validation, escaping and the Cluster hash tag; and the
//! fence counter's idle expiry, in the milliseconds the scripts take with the keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

mod shared_lock;

pub(crate) use shared_lock::{Kind, SharedLockKeys};

/// What one grant is: a plain lock's (an election's and a set's keys included), or a shared
/// lock's permit, read or write. Carried with a grant's names for the metrics' `grant` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantKind {
    Lock,
    Permit,
    Read,
    Write,
}

/// Longest user key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// Longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// What the tag of an election starts with. Every kind of lock but the plain lock tags its keys
/// `%<kind>:<escaped name>` (elections here, semaphores and read-write locks in
/// `key/shared_lock.rs`); a plain lock's tag is its escaped key alone. The escaping of user keys
/// never writes a `%` but before `25`, `7B` or `7D`, so no lock's tag starts like any of these,
/// and no two kinds' prefixes start alike.
pub(crate) const ELECTION_TAG: &str = "%election:";

/// The idle expiry of a client whose builder did not set one: how long a fence counter outlives
/// its last grant (see [`LockKeys::idle_ms`]).
pub(crate) const DEFAULT_IDLE_EXPIRY: Duration = Duration::from_secs(24 * 60 * 60);

/// A duration in the whole milliseconds that the scripts take (leases, the idle expiry, a
/// `WAIT`'s timeout). Leases are validated to whole milliseconds well inside `u64`, so this never
/// saturates in use.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The Redis names derived from one user key, in one allocation, and how long its fence counter
/// may sit idle: a lock call makes one of these, and every script call it makes takes it whole.
///
/// The tag is the user key with `%`, `{` and `}` percent-escaped. The escaping is injective (two
/// user keys never share a tag) and leaves no `}` inside the braces, so `{tag}` is always a
/// complete Cluster hash tag and the lock key and fence key of one user key share a slot,
/// whatever bytes the user key holds.
#[derive(Clone)]
pub(crate) struct LockKeys {
    /// The user key, the tag, the four Redis keys and the owner id, one after another.
    names: String,
    /// Where each of them ends in `names`.
    ends: [usize; 7],
    /// The client's idle expiry in ms (`Builder::idle_expiry`; the default until
    /// [`set_idle_expiry`](LockKeys::set_idle_expiry)): the scripts that grant arm the fence
    /// counter's TTL with it. Carried here because every such call already takes the keys.
    idle_ms: u64,
    /// What the grant these names are for is (the metrics' label).
    kind: GrantKind,
}

impl LockKeys {
    pub(crate) fn new(namespace: &str, key: &str) -> Result<LockKeys> {
        LockKeys::of_kind(namespace, "", key)
    }

    /// The names of election `name`: its lock, fence counter and queue are a lock's, under a
    /// tag of their own ([`ELECTION_TAG`] before the escaped name), so that no lock key, however
    /// spelled, names the same Redis keys.
    pub(crate) fn election(namespace: &str, name: &str) -> Result<LockKeys> {
        LockKeys::of_kind(namespace, ELECTION_TAG, name)
    }

    fn of_kind(namespace: &str, kind: &str, key: &str) -> Result<LockKeys> {
        validate_key(key)?;
        let tag = kind.to_owned() + &escape(key);
        // Room for the owner id too: "<32 hex digits>:<counter>".
        let mut names =
            String::with_capacity(key.len() + 5 * tag.len() + 4 * namespace.len() + 40 + 56);
        let mut ends = [0; 7];
        names.push_str(key);
        ends[0] = names.len();
        names.push_str(&tag);
        ends[1] = names.len();
        for (i, kind) in ["lock", "fence", "queue", "waiters"]
            .into_iter()
            .enumerate()
        {
            names.push_str(namespace);
            names.push(':');
            names.push_str(kind);
            names.push_str(":{");
            names.push_str(&tag);
            names.push('}');
            ends[i + 2] = names.len();
        }
        ends[6] = names.len();
        Ok(LockKeys {
            names,
            ends,
            idle_ms: millis(DEFAULT_IDLE_EXPIRY),
            kind: GrantKind::Lock,
        })
    }

    /// Names made elsewhere (a shared lock's grant, `key/shared_lock.rs`): `keys` are what
    /// [`all`](LockKeys::all) returns, the first of them what [`lock`](LockKeys::lock) returns.
    pub(crate) fn assembled(
        kind: GrantKind,
        user: &str,
        tag: &str,
        keys: [&str; 4],
        owner: &str,
        idle_ms: u64,
    ) -> LockKeys {
        let mut names = String::with_capacity(
            user.len() + tag.len() + keys.iter().map(|k| k.len()).sum::<usize>() + owner.len(),
        );
        let mut ends = [0; 7];
        for (i, part) in [user, tag, keys[0], keys[1], keys[2], keys[3], owner]
            .into_iter()
            .enumerate()
        {
            names.push_str(part);
            ends[i] = names.len();
        }
        LockKeys {
            names,
            ends,
            idle_ms,
            kind,
        }
    }

    /// What the grant these names are for is.
    pub(crate) fn kind(&self) -> GrantKind {
        self.kind
    }

    /// Names the owner of this lock call: `<prefix><n>`.
    pub(crate) fn set_owner(&mut self, prefix: &str, n: u64) {
        use std::fmt::Write as _;
        self.names.truncate(self.ends[5]);
        self.names.push_str(prefix);
        // Writing to a String cannot fail.
        let _ = write!(self.names, "{n}");
        self.ends[6] = self.names.len();
    }

    /// Sets the client's idle expiry (validated by `Builder::build`), for the scripts that grant.
    pub(crate) fn set_idle_expiry(&mut self, idle: Duration) {
        self.idle_ms = millis(idle);
    }

    /// The owner id stored at the lock key while this lock call holds it: fresh for every lock
    /// call. Never logged above debug.
    pub(crate) fn owner(&self) -> &str {
        self.part(6)
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    /// The key as the user gave it, for errors and logs.
    pub(crate) fn user(&self) -> &str {
        self.part(0)
    }

    /// The escaped user key: names the key in this client's queues and in release messages.
    pub(crate) fn tag(&self) -> &str {
        self.part(1)
    }

    /// The client's namespace, as the Redis keys start with it.
    pub(crate) fn namespace(&self) -> &str {
        // The lock key is `<namespace>:<kind>:{<tag>}...` (a shared lock's grant key has more
        // after the tag). The namespace may hold `:` but never `{`, so the first `{` opens the
        // tag, and the namespace ends at the `:` before the kind.
        let lock = self.lock();
        let before = lock.find('{').map_or(lock, |open| &lock[..open]);
        let before = before.strip_suffix(':').unwrap_or(before);
        before.rfind(':').map_or(before, |colon| &before[..colon])
    }

    /// `<namespace>:lock:{<tag>}`: the owner id of the current grant, with the lease as TTL.
    pub(crate) fn lock(&self) -> &str {
        self.part(2)
    }

    /// `<namespace>:fence:{<tag>}`: the fencing counter; expires [`idle_ms`](LockKeys::idle_ms)
    /// after the server clock passes its value in microseconds.
    pub(crate) fn fence(&self) -> &str {
        self.part(3)
    }

    /// How long, in ms, the fence counter outlives the server clock's passing it; the acquire
    /// and release scripts take it as an argument and re-arm the counter's TTL on every grant.
    pub(crate) fn idle_ms(&self) -> u64 {
        self.idle_ms
    }

    /// KEYS of the acquire and release scripts, in order: the lock key, the fence key, then
    /// `<namespace>:queue:{<tag>}` (the owner ids of waiters, one per waiting client, oldest
    /// first, to which a release hands the lock) and `<namespace>:waiters:{<tag>}` (each queued
    /// owner id's expiry and lease).
    pub(crate) fn all(&self) -> [&str; 4] {
        [self.part(2), self.part(3), self.part(4), self.part(5)]
    }
}

/// The owner ids of one client: its random id, `:`, and a counter. Ids never repeat, cost no
/// system call each, are not derivable from the key, and name the client whose waiter an id is.
pub(crate) struct Owners {
    prefix: String,
    next: AtomicU64,
}

impl Owners {
    pub(crate) fn new(client_id: &str) -> Owners {
        Owners {
            prefix: format!("{client_id}:"),
            next: AtomicU64::new(0),
        }
    }

    /// What every owner id of this client starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Gives `keys` a fresh owner id: one per lock call, or per attempt where a late release of
    /// an earlier one must not touch the next.
    pub(crate) fn next(&self, keys: &mut LockKeys) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        keys.set_owner(&self.prefix, n);
    }

    /// A fresh owner id, as [`next`](Owners::next) gives one (a shared lock's grant is named by
    /// it).
    pub(crate) fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}{n}", self.prefix)
    }
}

/// `<namespace>:released:<client id>`: where a release that hands a lock to a waiter of the
/// client `client_id` (the part of its owner ids before the ':') says so. One channel per client,
/// so that a handoff wakes only the process it is for.
pub(crate) fn release_channel(namespace: &str, client_id: &str) -> String {
    format!("{namespace}:released:{client_id}")
}

/// `<namespace>:leader:{<tag>}` of an election's keys: both the Redis key that records the
/// leader's last proclamation and the pub/sub channel on which observers hear of each change.
pub(crate) fn leader_record(keys: &LockKeys) -> String {
    format!("{}:leader:{{{}}}", keys.namespace(), keys.tag())
}

fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key", "must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            "key",
            format!("is {} bytes long, the maximum is {MAX_KEY_LEN}", key.len()),
        ));
    }
    Ok(())
}

pub(crate) fn validate_namespace(namespace: &str) -> Result<()> {
    if namespace.is_empty() {
        return Err(Error::invalid("namespace", "must not be empty"));
    }
    if namespace.len() > MAX_NAMESPACE_LEN {
        return Err(Error::invalid(
            "namespace",
            format!(
                "is {} bytes long, the maximum is {MAX_NAMESPACE_LEN}",
                namespace.len()
            ),
        ));
    }
    if let Some(bad) = namespace
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(Error::invalid(
            "namespace",
            format!("contains {bad:?}; allowed are ASCII letters, digits, '_', '-', '.' and ':'"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn slot_tag(key: &str) -> &str {
        // Redis Cluster: the tag is what lies between the first '{' and the first '}' after it.
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
    }

    #[test]
    fn the_namespace_reads_back_whatever_the_key_and_namespace_hold() {
        for namespace in ["ns", "a:b", "x:lock:", "a.b-c_d"] {
            for key in ["a", "{", "}", ":lock:{", "a}b{c", "%7D", "ключ"] {
                let k = LockKeys::new(namespace, key).unwrap();
                assert_eq!(k.namespace(), namespace, "{namespace:?} {key:?}");
            }
        }
    }

    #[test]
    fn lock_and_fence_share_a_hash_tag_for_hostile_keys() {
        for key in [
            "a",
            "{",
            "}",
            "}{",
            "a}b{c",
            "{x}",
            "%7D",
            "nul\0cr\r\nlf",
            "ключ",
            "%",
        ] {
            let k = LockKeys::new("ns", key).unwrap();
            assert_eq!(slot_tag(k.lock()), slot_tag(k.fence()), "{key:?}");
            assert_eq!(slot_tag(k.lock()), k.tag(), "{key:?}");
            assert!(!k.tag().contains('}') && !k.tag().contains('{'), "{key:?}");
        }
    }

    #[test]
    fn every_name_of_a_key_is_laid_out_as_documented() {
        let k = LockKeys::new("ns", "a{b}%").unwrap();
        let mut k = k;
        k.set_owner("c0ffee:", 42);
        assert_eq!(k.owner(), "c0ffee:42");
        k.set_owner("c0ffee:", 7);
        assert_eq!(k.owner(), "c0ffee:7");
        assert_eq!(k.idle_ms(), 24 * 60 * 60 * 1000);
        k.set_idle_expiry(Duration::from_secs(60));
        assert_eq!(k.idle_ms(), 60_000);
        assert_eq!(k.user(), "a{b}%");
        assert_eq!(k.tag(), "a%7Bb%7D%25");
        assert_eq!(k.lock(), "ns:lock:{a%7Bb%7D%25}");
        assert_eq!(k.fence(), "ns:fence:{a%7Bb%7D%25}");
        assert_eq!(
            k.all(),
            [
                "ns:lock:{a%7Bb%7D%25}",
                "ns:fence:{a%7Bb%7D%25}",
                "ns:queue:{a%7Bb%7D%25}",
                "ns:waiters:{a%7Bb%7D%25}",
            ]
        );
    }

    #[test]
    fn an_election_never_names_a_locks_keys() {
        let e = LockKeys::election("ns", "a{b").unwrap();
        assert_eq!(e.user(), "a{b");
        assert_eq!(e.tag(), "%election:a%7Bb");
        assert_eq!(e.lock(), "ns:lock:{%election:a%7Bb}");
        for key in ["%election:a{b", "%election:a%7Bb", "a{b"] {
            assert_ne!(LockKeys::new("ns", key).unwrap().tag(), e.tag(), "{key:?}");
        }
        assert!(LockKeys::election("ns", "").is_err());
    }

    #[test]
    fn escaping_is_injective_on_tricky_pairs() {
        let pairs = [("%7D", "}"), ("%7B", "{"), ("%25", "%"), ("%257D", "%}")];
        for (a, b) in pairs {
            assert_ne!(escape(a), escape(b), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn key_limits() {
        assert!(validate_key("").unwrap_err().is_invalid_argument());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
    }

    #[test]
    fn namespace_rules() {
        assert!(validate_namespace("orders.v2:eu-1_a").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "ä", "a*"] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
    }
}
