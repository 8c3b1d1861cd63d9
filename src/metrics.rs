//! Counters and histograms through the [`metrics`](https://docs.rs/metrics) facade, behind the
//! `metrics` feature. docs/metrics.md tables every metric.
//!
//! The rest of the crate calls the functions here where the events happen, one line each, with
//! no `cfg` of its own: without the feature they are empty and inlined away, and `Since` holds
//! nothing, so a build without it reads no extra clock and builds no label.
//!
//! Every metric carries the client's namespace as its `namespace` label: a program with clients
//! for different purposes tells them apart, and the set of values is as small as the set of
//! clients. The metrics of one grant also carry its `grant` label: `lock`, `permit` (a
//! semaphore's), `read` or `write` (a read-write lock's). Lock keys never become labels: they
//! are unbounded.

/// How a lock came to its holder: the `how` label of `fencelock_grants_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// The holder's own acquire script found the key free.
    Attempt,
    /// A release by this client handed it over.
    LocalHandoff,
    /// A release by another client handed it over (heard on the release channel).
    RemoteHandoff,
}

/// What a caller was doing when an error ended it: the `op` label of `fencelock_errors_total`.
// Without the feature, only the call sites outside this module construct it.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// A lock call: `lock`, `try_lock` and their variants.
    Lock,
    /// Releasing a lock: `unlock`, or a guard's drop (in the background if Redis is unreachable).
    Unlock,
    /// `LockGuard::extend`.
    Extend,
    /// A pipeline of the renewal thread; it is retried, and no caller sees the error.
    Renew,
}

#[cfg(feature = "metrics")]
pub(crate) use on::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;

#[cfg(feature = "metrics")]
mod on {
    use std::time::{Duration, Instant};

    use metrics::{counter, histogram, Unit};

    use super::{How, Op};
    use crate::error::{kind_of_redis, Error, Result};
    use crate::key::{GrantKind, LockKeys};
    use crate::scripts::Released;

    const GRANTS: &str = "fencelock_grants_total";
    const TIMEOUTS: &str = "fencelock_lock_timeouts_total";
    const WAIT: &str = "fencelock_wait_seconds";
    const HOLD: &str = "fencelock_hold_seconds";
    const HANDOFFS: &str = "fencelock_handoffs_total";
    const RENEWALS: &str = "fencelock_renewals_total";
    const RENEWAL_ROUND_TRIP: &str = "fencelock_renewal_round_trip_seconds";
    const LOSSES: &str = "fencelock_losses_total";
    const ERRORS: &str = "fencelock_errors_total";

    /// A moment to measure from.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Since(Instant);

    impl Since {
        pub(crate) fn now() -> Since {
            Since(Instant::now())
        }
    }

    /// Registers every metric's unit and description with the recorder installed now, for
    /// exporters that print them (Prometheus' `# HELP`).
    pub(crate) fn describe() {
        use metrics::{describe_counter, describe_histogram};
        describe_counter!(GRANTS, Unit::Count, "Locks granted, by how they came");
        describe_counter!(
            TIMEOUTS,
            Unit::Count,
            "try_lock calls that ended without the lock"
        );
        describe_histogram!(
            WAIT,
            Unit::Seconds,
            "From a lock call to its grant, for calls that got the lock"
        );
        describe_histogram!(
            HOLD,
            Unit::Seconds,
            "From a grant to its release (unlock or drop)"
        );
        describe_counter!(
            HANDOFFS,
            Unit::Count,
            "Releases that handed the lock straight to a waiter"
        );
        describe_counter!(
            RENEWALS,
            Unit::Count,
            "Leases the renewal thread extended, as Redis confirmed"
        );
        describe_histogram!(
            RENEWAL_ROUND_TRIP,
            Unit::Seconds,
            "Round trip of one renewal pipeline (many leases), connecting included"
        );
        describe_counter!(
            LOSSES,
            Unit::Count,
            "Held locks found lost: lease ran out, key gone or another's"
        );
        describe_counter!(ERRORS, Unit::Count, "Errors, by operation and kind");
    }

    fn label(kind: GrantKind) -> &'static str {
        match kind {
            GrantKind::Lock => "lock",
            GrantKind::Permit => "permit",
            GrantKind::Read => "read",
            GrantKind::Write => "write",
        }
    }

    /// A lock call that started at `since` ended: with the lock, without it at its timeout, or
    /// with an error.
    pub(crate) fn acquired<T>(namespace: &str, since: Since, result: &Result<Option<T>>) {
        acquired_as(namespace, GrantKind::Lock, since, result);
    }

    /// [`acquired`] for a call that asks for a grant of `kind`.
    pub(crate) fn acquired_as<T>(
        namespace: &str,
        kind: GrantKind,
        since: Since,
        result: &Result<Option<T>>,
    ) {
        let (namespace, grant) = (namespace.to_owned(), label(kind));
        match result {
            Ok(Some(_)) => histogram!(WAIT, "namespace" => namespace, "grant" => grant)
                .record(since.0.elapsed().as_secs_f64()),
            Ok(None) => {
                counter!(TIMEOUTS, "namespace" => namespace, "grant" => grant).increment(1);
            }
            Err(e) => failed(&namespace, Op::Lock, e),
        }
    }

    pub(crate) fn granted(namespace: &str, how: How) {
        granted_as(namespace, GrantKind::Lock, how);
    }

    /// [`granted`] for a grant of `kind`.
    pub(crate) fn granted_as(namespace: &str, kind: GrantKind, how: How) {
        let how = match how {
            How::Attempt => "attempt",
            How::LocalHandoff => "local_handoff",
            How::RemoteHandoff => "remote_handoff",
        };
        let (namespace, grant) = (namespace.to_owned(), label(kind));
        counter!(GRANTS, "namespace" => namespace, "how" => how, "grant" => grant).increment(1);
    }

    /// A grant made at `since` ends: its holder releases it.
    pub(crate) fn held(keys: &LockKeys, since: Since) {
        let (namespace, grant) = (keys.namespace().to_owned(), label(keys.kind()));
        histogram!(HOLD, "namespace" => namespace, "grant" => grant)
            .record(since.0.elapsed().as_secs_f64());
    }

    /// What one run of the release script did; `local`: whether its new owner, if any, is a
    /// waiter of this client.
    pub(crate) fn released(keys: &LockKeys, released: &Released, local: impl FnOnce(&str) -> bool) {
        if let Released::HandedOver { owner, .. } = released {
            handed_over(keys.namespace(), keys.kind(), local(owner));
        }
    }

    /// A release handed a grant of `kind` straight to a waiter: of this client (`local`), or
    /// of another.
    pub(crate) fn handed_over(namespace: &str, kind: GrantKind, local: bool) {
        let to = if local { "local" } else { "remote" };
        let (namespace, grant) = (namespace.to_owned(), label(kind));
        counter!(HANDOFFS, "namespace" => namespace, "to" => to, "grant" => grant).increment(1);
    }

    /// One renewal pipeline came back after `round_trip`, with `renewed` leases confirmed ours.
    pub(crate) fn renewed(keys: &LockKeys, round_trip: Duration, renewed: u64) {
        let namespace = keys.namespace();
        histogram!(RENEWAL_ROUND_TRIP, "namespace" => namespace.to_owned())
            .record(round_trip.as_secs_f64());
        counter!(RENEWALS, "namespace" => namespace.to_owned()).increment(renewed);
    }

    pub(crate) fn lost(keys: &LockKeys) {
        let (namespace, grant) = (keys.namespace().to_owned(), label(keys.kind()));
        counter!(LOSSES, "namespace" => namespace, "grant" => grant).increment(1);
    }

    /// Counts `result` if it is an error; see [`failed`].
    pub(crate) fn outcome<T>(namespace: &str, op: Op, result: &Result<T>) {
        if let Err(e) = result {
            failed(namespace, op, e);
        }
    }

    /// An error returned to a caller, or met by a background thread.
    pub(crate) fn failed(namespace: &str, op: Op, error: &Error) {
        count_error(namespace, op, error.kind());
    }

    /// A renewal pipeline failed with `error`.
    pub(crate) fn renewal_failed(keys: &LockKeys, error: &redis::RedisError) {
        count_error(keys.namespace(), Op::Renew, kind_of_redis(error));
    }

    fn count_error(namespace: &str, op: Op, kind: &'static str) {
        let op = match op {
            Op::Lock => "lock",
            Op::Unlock => "unlock",
            Op::Extend => "extend",
            Op::Renew => "renew",
        };
        let namespace = namespace.to_owned();
        counter!(ERRORS, "namespace" => namespace, "op" => op, "kind" => kind).increment(1);
    }
}

/// The same functions, empty.
#[cfg(not(feature = "metrics"))]
mod off {
    use std::time::Duration;

    use super::{How, Op};
    use crate::error::{Error, Result};
    use crate::key::{GrantKind, LockKeys};
    use crate::scripts::Released;

    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Since;

    impl Since {
        #[inline(always)]
        pub(crate) fn now() -> Since {
            Since
        }
    }

    #[inline(always)]
    pub(crate) fn describe() {}

    #[inline(always)]
    pub(crate) fn acquired<T>(_: &str, _: Since, _: &Result<Option<T>>) {}

    #[inline(always)]
    pub(crate) fn acquired_as<T>(_: &str, _: GrantKind, _: Since, _: &Result<Option<T>>) {}

    #[inline(always)]
    pub(crate) fn granted(_: &str, _: How) {}

    #[inline(always)]
    pub(crate) fn granted_as(_: &str, _: GrantKind, _: How) {}

    #[inline(always)]
    pub(crate) fn handed_over(_: &str, _: GrantKind, _: bool) {}

    #[inline(always)]
    pub(crate) fn held(_: &LockKeys, _: Since) {}

    #[inline(always)]
    pub(crate) fn released(_: &LockKeys, _: &Released, _: impl FnOnce(&str) -> bool) {}

    #[inline(always)]
    pub(crate) fn renewed(_: &LockKeys, _: Duration, _: u64) {}

    #[inline(always)]
    pub(crate) fn lost(_: &LockKeys) {}

    #[inline(always)]
    pub(crate) fn outcome<T>(_: &str, _: Op, _: &Result<T>) {}

    #[inline(always)]
    pub(crate) fn failed(_: &str, _: Op, _: &Error) {}

    #[inline(always)]
    pub(crate) fn renewal_failed(_: &LockKeys, _: &redis::RedisError) {}
}
