//! A thread-safe record of lock holds, and a mutual-exclusion / fencing checker.
//!
//! Record each hold with `start` taken right after the lock was granted and
//! `end` taken right before it is released, so the recorded interval lies
//! inside the real one: if recorded intervals overlap, real ones did too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How many violations `History::check` describes.
const MAX_REPORTED: usize = 5;

/// One lock hold.
#[derive(Clone, Debug)]
pub struct Hold {
    pub key: String,
    /// Who held it (thread / process index), for messages.
    pub holder: usize,
    /// The fencing token granted with the lock.
    pub token: u64,
    /// Taken right after the lock was granted.
    pub start: Instant,
    /// Taken right before the lock was released.
    pub end: Instant,
}

/// A cloneable, thread-safe list of [`Hold`]s.
#[derive(Clone, Debug, Default)]
pub struct History {
    holds: Arc<Mutex<Vec<Hold>>>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    pub fn record(&self, hold: Hold) {
        self.lock().push(hold);
    }

    /// A copy of every hold recorded so far, in recording order.
    pub fn holds(&self) -> Vec<Hold> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Checks, per key:
    /// 1. no two holds overlap in time: sorted by start, each start must be
    ///    `>=` the latest end of the holds before it;
    /// 2. tokens strictly increase in grant (start) order.
    ///
    /// (Also: every hold's `end >= start`.)
    ///
    /// Returns `Ok(number of holds checked)`, or `Err` describing the first
    /// violations (up to 5) and how many there were in all.
    pub fn check(&self) -> Result<usize, String> {
        let holds = self.holds();
        let total = holds.len();
        let mut by_key: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
        for hold in &holds {
            by_key.entry(hold.key.as_str()).or_default().push(hold);
        }
        let origin = holds.iter().map(|h| h.start).min();
        let at = |t: Instant| -> String {
            match origin {
                Some(o) => format!(
                    "{:.3}ms",
                    t.saturating_duration_since(o).as_secs_f64() * 1e3
                ),
                None => "?".to_string(),
            }
        };
        let describe = |h: &Hold| -> String {
            format!(
                "holder {} token {} [{} .. {}]",
                h.holder,
                h.token,
                at(h.start),
                at(h.end)
            )
        };

        let mut violations: Vec<String> = Vec::new();
        for (key, mut list) in by_key {
            // Stable sort: equal starts keep recording order.
            list.sort_by_key(|h| h.start);
            for h in &list {
                if h.end < h.start {
                    violations.push(format!(
                        "key {key:?}: hold ends before it starts: {}",
                        describe(h)
                    ));
                }
            }
            // The hold with the latest end so far (it is the one a new start
            // must not precede).
            let mut latest: Option<&Hold> = None;
            for pair in list.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                latest = match latest {
                    Some(l) if l.end >= prev.end => Some(l),
                    _ => Some(prev),
                };
                if let Some(l) = latest {
                    if next.start < l.end {
                        violations.push(format!(
                            "key {key:?}: overlapping holds: {} and {}",
                            describe(l),
                            describe(next)
                        ));
                    }
                }
                if next.token <= prev.token {
                    violations.push(format!(
                        "key {key:?}: token not increasing in grant order: {} then {}",
                        describe(prev),
                        describe(next)
                    ));
                }
            }
        }

        if violations.is_empty() {
            return Ok(total);
        }
        let mut msg = format!(
            "{} violation(s) in {total} hold(s); first {}:",
            violations.len(),
            violations.len().min(MAX_REPORTED)
        );
        for v in violations.iter().take(MAX_REPORTED) {
            let _ = write!(msg, "\n  - {v}");
        }
        Err(msg)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Hold>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }
}
