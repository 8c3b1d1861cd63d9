//! How a user's key becomes Redis keys: validation, escaping and the Cluster hash tag.

use crate::error::{Error, Result};

/// Longest user key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// Longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// The Redis names derived from one user key.
///
/// `tag` is the user key with `%`, `{` and `}` percent-escaped. The escaping is injective (two
/// user keys never share a tag) and leaves no `}` inside the braces, so `{tag}` is always a
/// complete Cluster hash tag and the lock key and fence key of one user key share a slot,
/// whatever bytes the user key holds.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The key as the user gave it, for errors and logs.
    pub(crate) user: String,
    pub(crate) tag: String,
    /// `<namespace>:lock:{<tag>}`: the owner id of the current grant, with the lease as TTL.
    pub(crate) lock: String,
    /// `<namespace>:fence:{<tag>}`: the fencing counter; never expires.
    pub(crate) fence: String,
    /// `<namespace>:queue:{<tag>}`: the owner ids of waiters (one per waiting client), oldest
    /// first, to which a release hands the lock.
    pub(crate) queue: String,
    /// `<namespace>:waiters:{<tag>}`: each queued owner id's expiry and lease.
    pub(crate) entries: String,
}

impl LockKeys {
    pub(crate) fn new(namespace: &str, key: &str) -> Result<LockKeys> {
        validate_key(key)?;
        let tag = escape(key);
        Ok(LockKeys {
            user: key.to_owned(),
            lock: format!("{namespace}:lock:{{{tag}}}"),
            fence: format!("{namespace}:fence:{{{tag}}}"),
            queue: format!("{namespace}:queue:{{{tag}}}"),
            entries: format!("{namespace}:waiters:{{{tag}}}"),
            tag,
        })
    }
}

/// `<namespace>:released`: where a release that hands a lock to another client's waiter says so.
pub(crate) fn release_channel(namespace: &str) -> String {
    format!("{namespace}:released")
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

    fn slot_tag(key: &str) -> &str {
        // Redis Cluster: the tag is what lies between the first '{' and the first '}' after it.
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
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
            assert_eq!(slot_tag(&k.lock), slot_tag(&k.fence), "{key:?}");
            assert_eq!(slot_tag(&k.lock), k.tag, "{key:?}");
            assert!(!k.tag.contains('}') && !k.tag.contains('{'), "{key:?}");
        }
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
