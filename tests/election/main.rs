//! Leader election on one server: one leader at a time, epochs that strictly rise, first come
//! first served, proclaim and resign; observers that see every leader in order and never report
//! a stale one as current; a leader process killed or frozen; Redis restarted; a deposed
//! leader's fenced write refused.
//!
//! Sentinel, Cluster and the quorum have their own election tests in their areas.

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod faults;
mod observe;

use std::time::Duration;

use fencelock::{Leader, Observer};

/// The Redis queue of election `name` under the tests' namespace, as `support::queue_len` takes
/// keys (election tags start with `%election:`).
pub fn queue_of(name: &str) -> String {
    format!("%election:{name}")
}

/// The next change an observer reports, within `limit`.
pub fn next_change(observer: &Observer, limit: Duration) -> Option<Leader> {
    observer
        .changes()
        .recv_timeout(limit)
        .unwrap_or_else(|e| panic!("the observer reported nothing within {limit:?}: {e}"))
}

/// The values of the changes an observer reports until it reports `last` (by value), within
/// `limit` in all; `None` is written as "-".
pub fn changes_until(observer: &Observer, last: &str, limit: Duration) -> Vec<(String, u64)> {
    let until = std::time::Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let change = observer
            .changes()
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {last:?} within {limit:?} (saw {seen:?}): {e}"));
        let entry = match &change {
            Some(l) => (l.value().to_owned(), l.epoch().as_u64()),
            None => ("-".to_owned(), 0),
        };
        let done = entry.0 == last;
        seen.push(entry);
        if done {
            return seen;
        }
    }
}
