//! The facade over a fake engine (`engine/fake.rs`), without Redis: what guards, their drop,
//! `with_lock` and its variants, reentrancy and the facade's metrics ask of the engine, and
//! what they make of its answers and failures. The engines themselves are tested against real
//! servers in `tests/`.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::engine::fake::{Fake, Kind};
use crate::{Error, LockClient, LockGuard, LockOptions};

use Kind::{Acquire, Extend, Force, Release, ReleaseDetached, Status};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fake_in(namespace: &str) -> (LockClient, Arc<Fake>) {
    LockClient::over_fake(namespace)
}

fn fake() -> (LockClient, Arc<Fake>) {
    fake_in("fencelock")
}

/// The error a test makes the engine fail with.
fn refused() -> Error {
    Error::Connection("refused by the test".into())
}

/// Whether `e` is [`refused`]'s error, passed through unchanged.
fn is_refused(e: &Error) -> bool {
    matches!(e, Error::Connection(cause) if cause.to_string() == "refused by the test")
}

/// An application's error type, as `with_lock` is meant to be used with.
#[derive(Debug)]
enum AppError {
    Mine(&'static str),
    Lock(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> AppError {
        AppError::Lock(e)
    }
}

// --- unlock and drop ----------------------------------------------------------------------

#[test]
fn unlock_releases_once() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    assert!(fake.is_locked("k"));
    guard.unlock().unwrap();
    assert!(!fake.is_locked("k"));
    // The unlock released; its guard's drop, which comes with it, did not release again.
    assert_eq!(fake.kinds(), [Acquire, Release]);
}

#[test]
fn unlock_reports_the_engines_error_and_releases_once() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    fake.fail_next(Release, refused());
    let e = guard.unlock().unwrap_err();
    assert!(is_refused(&e), "{e:?}");
    assert_eq!(fake.kinds(), [Acquire, Release]);
}

#[test]
fn unlock_of_a_lost_lock_is_lock_lost() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    fake.lose("k");
    let e = guard.unlock().unwrap_err();
    assert!(matches!(&e, Error::LockLost { key } if key == "k"), "{e:?}");
    assert_eq!(fake.kinds(), [Acquire, Release]);
}

#[test]
fn drop_releases_detached_once() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    drop(guard);
    assert!(!fake.is_locked("k"));
    assert_eq!(fake.kinds(), [Acquire, ReleaseDetached]);
}

#[test]
fn drop_does_not_panic_when_the_engine_fails() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    fake.fail_next(ReleaseDetached, refused());
    drop(guard);
    assert_eq!(fake.kinds(), [Acquire, ReleaseDetached]);
    // Nothing reached "Redis": the lock expires with its lease.
    assert!(fake.is_locked("k"));
}

#[test]
fn a_guard_dropped_by_a_panic_releases_once_without_a_second_panic() {
    let (client, fake) = fake();
    fake.fail_next(ReleaseDetached, refused());
    let unwound = panic::catch_unwind(AssertUnwindSafe(|| {
        let _guard = client.lock("k").unwrap();
        panic!("the holder panics");
    }));
    // The holder's own panic, not one from the drop (which would have aborted).
    let payload = unwound.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the holder panics"));
    assert_eq!(fake.kinds(), [Acquire, ReleaseDetached]);
}

#[test]
fn a_lock_guard_moves_to_another_thread_and_releases_there() {
    fn send<T: Send + 'static>(value: T) -> T {
        value
    }
    let (client, fake) = fake();
    let unlocked = send(client.lock("a").unwrap());
    thread::spawn(move || unlocked.unlock())
        .join()
        .unwrap()
        .unwrap();
    let dropped = send(client.lock("b").unwrap());
    thread::spawn(move || drop(dropped)).join().unwrap();
    assert_eq!(
        fake.calls(),
        [
            (Acquire, "a".to_owned()),
            (Release, "a".to_owned()),
            (Acquire, "b".to_owned()),
            (ReleaseDetached, "b".to_owned()),
        ]
    );
}

#[test]
fn status_and_force_unlock_ask_the_engine_for_checked_keys_only() {
    let (client, fake) = fake();
    assert!(client.status("").unwrap_err().is_invalid_argument());
    assert!(client.force_unlock("").unwrap_err().is_invalid_argument());
    assert!(fake.kinds().is_empty());
    let guard = client.lock("k").unwrap();
    let status = client.status("k").unwrap();
    assert!(status.held);
    assert_eq!(status.token, Some(guard.token()));
    assert!(client.force_unlock("k").unwrap());
    assert!(!client.force_unlock("k").unwrap());
    fake.fail_next(Status, refused());
    assert!(is_refused(&client.status("k").unwrap_err()));
    assert_eq!(
        fake.kinds(),
        [Acquire, Status, Force, Force, Status],
        "{:?}",
        fake.calls()
    );
    // The holder is not told; its release finds the lock gone.
    assert!(guard.unlock().unwrap_err().is_lock_lost());
}

// --- extend ---------------------------------------------------------------------------------

#[test]
fn extend_of_a_lost_grant_is_lock_lost() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    fake.lose("k");
    assert!(!guard.is_held());
    assert!(guard.lost().try_recv().is_ok(), "the loss fired");
    let e = guard.extend(ms(2000)).unwrap_err();
    assert!(matches!(&e, Error::LockLost { key } if key == "k"), "{e:?}");
    assert!(!guard.is_held());
    drop(guard);
    assert_eq!(fake.kinds(), [Acquire, Extend, ReleaseDetached]);
}

#[test]
fn extend_passes_the_engines_error_on_and_keeps_the_lease() {
    let (client, fake) = fake();
    let guard = client
        .lock_with("k", &LockOptions::new().lease(ms(20_000)))
        .unwrap();
    fake.fail_next(Extend, refused());
    let e = guard.extend(ms(40_000)).unwrap_err();
    assert!(is_refused(&e), "{e:?}");
    assert_eq!(guard.lease(), ms(20_000));
    guard.extend(ms(40_000)).unwrap();
    assert_eq!(guard.lease(), ms(40_000));
    assert!(guard.is_held());
}

#[test]
fn extend_checks_the_lease_before_asking_the_engine() {
    let (client, fake) = fake();
    let guard = client.lock("k").unwrap();
    for lease in [Duration::ZERO, ms(5), Duration::from_micros(20_500)] {
        let e = guard.extend(lease).unwrap_err();
        assert!(e.is_invalid_argument(), "{lease:?}: {e:?}");
    }
    assert_eq!(fake.kinds(), [Acquire]);
}

// --- with_lock and its variants -------------------------------------------------------------

/// A closure as the with_lock family takes it.
type Body = Box<dyn FnOnce(&LockGuard) -> Result<u32, AppError>>;

fn body(f: impl FnOnce(&LockGuard) -> Result<u32, AppError> + 'static) -> Body {
    Box::new(f)
}

/// A way into `run_locked`; `None`: `f` did not run, as the `try_` forms say.
type Via = fn(&LockClient, &str, Body) -> Result<Option<u32>, AppError>;

/// Each of the four, with a timeout or options that make no difference to a free lock.
const VIAS: [(&str, Via); 4] = [
    ("with_lock", |client, key, f| {
        client.with_lock(key, f).map(Some)
    }),
    ("try_with_lock", |client, key, f| {
        client.try_with_lock(key, Duration::from_secs(5), f)
    }),
    ("with_lock_options", |client, key, f| {
        let options = LockOptions::new().lease(ms(2000));
        client.with_lock_options(key, &options, f).map(Some)
    }),
    ("try_with_lock_options", |client, key, f| {
        let options = LockOptions::new().renew(false);
        client.try_with_lock_options(key, Duration::ZERO, &options, f)
    }),
];

#[test]
fn with_lock_releases_after_ok() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        let ran = via(
            &client,
            "k",
            body(|guard| Ok(guard.token().as_u64() as u32)),
        );
        assert!(matches!(ran, Ok(Some(1))), "{name}: {ran:?}");
        assert_eq!(fake.kinds(), [Acquire, Release], "{name}");
        assert!(!fake.is_locked("k"), "{name}");
    }
}

#[test]
fn with_lock_releases_after_err() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        let ran = via(&client, "k", body(|_| Err(AppError::Mine("failed"))));
        assert!(
            matches!(ran, Err(AppError::Mine("failed"))),
            "{name}: {ran:?}"
        );
        assert_eq!(fake.kinds(), [Acquire, Release], "{name}");
        assert!(!fake.is_locked("k"), "{name}");
    }
}

#[test]
fn with_lock_returns_the_closures_error_when_the_release_fails_too() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        fake.fail_next(Release, refused());
        let ran = via(&client, "k", body(|_| Err(AppError::Mine("failed"))));
        assert!(
            matches!(ran, Err(AppError::Mine("failed"))),
            "{name}: {ran:?}"
        );
        assert_eq!(fake.kinds(), [Acquire, Release], "{name}");
    }
}

#[test]
fn with_lock_returns_the_release_error_after_ok() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        fake.fail_next(Release, refused());
        let ran = via(&client, "k", body(|_| Ok(7)));
        assert!(
            matches!(&ran, Err(AppError::Lock(e)) if is_refused(e)),
            "{name}: {ran:?}"
        );
        assert_eq!(fake.kinds(), [Acquire, Release], "{name}");
    }
}

#[test]
fn with_lock_drops_the_value_of_a_closure_that_lost_the_lock() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        let taker = Arc::clone(&fake);
        let ran = via(
            &client,
            "k",
            body(move |_| {
                taker.lose("k");
                Ok(7)
            }),
        );
        assert!(
            matches!(&ran, Err(AppError::Lock(Error::LockLost { key })) if key == "k"),
            "{name}: {ran:?}"
        );
        assert_eq!(fake.kinds(), [Acquire, Release], "{name}");
    }
}

#[test]
fn with_lock_does_not_run_the_closure_when_the_lock_call_fails() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        fake.fail_next(Acquire, refused());
        let ran = via(&client, "k", body(|_| panic!("ran without the lock")));
        assert!(
            matches!(&ran, Err(AppError::Lock(e)) if is_refused(e)),
            "{name}: {ran:?}"
        );
        assert_eq!(fake.kinds(), [Acquire], "{name}");
    }
}

#[test]
fn with_lock_releases_when_the_closure_panics() {
    for (name, via) in VIAS {
        let (client, fake) = fake();
        let unwound = panic::catch_unwind(AssertUnwindSafe(|| {
            via(&client, "k", body(|_| panic!("the closure panics")))
        }));
        assert!(unwound.is_err(), "{name}");
        assert_eq!(fake.kinds(), [Acquire, ReleaseDetached], "{name}");
        assert!(!fake.is_locked("k"), "{name}");
    }
}

#[test]
fn try_with_lock_of_a_held_lock_is_none_without_running_the_closure() {
    let (client, fake) = fake();
    let held = client.lock("k").unwrap();
    let ran = Cell::new(false);
    let f = |_: &LockGuard| {
        ran.set(true);
        Ok::<_, Error>(())
    };
    assert!(client
        .try_with_lock("k", Duration::ZERO, f)
        .unwrap()
        .is_none());
    assert!(client.try_with_lock("k", ms(20), f).unwrap().is_none());
    let options = LockOptions::new().lease(ms(2000));
    assert!(client
        .try_with_lock_options("k", ms(20), &options, f)
        .unwrap()
        .is_none());
    assert!(!ran.get());
    // Nothing was released: the holder still holds it.
    assert_eq!(fake.kinds(), [Acquire, Acquire, Acquire, Acquire]);
    assert!(held.is_held());
    assert!(fake.is_locked("k"));
}

// --- reentrancy -----------------------------------------------------------------------------

#[test]
fn nested_reentrant_guards_share_one_grant() {
    let (client, fake) = fake();
    let outer = client.reentrant_lock("k").unwrap();
    let inner = client.reentrant_lock("k").unwrap();
    // A nested guard comes at once, whatever the timeout.
    let third = client
        .try_reentrant_lock("k", Duration::ZERO)
        .unwrap()
        .unwrap();
    assert_eq!(inner.token(), outer.token());
    assert_eq!(third.token(), outer.token());
    assert_eq!(outer.hold_count(), 3);
    assert_eq!(fake.kinds(), [Acquire]);
    drop(third);
    assert_eq!(inner.hold_count(), 2);
    assert_eq!(fake.kinds(), [Acquire]);
}

#[test]
fn a_reentrant_lock_is_released_once_when_its_last_guard_goes_in_any_order() {
    // (unlock rather than drop, the first guard goes first)
    for (unlock, outer_first) in [(false, false), (false, true), (true, false), (true, true)] {
        let case = format!("unlock: {unlock}, outer first: {outer_first}");
        let (client, fake) = fake();
        let outer = client.reentrant_lock("k").unwrap();
        let inner = client.reentrant_lock("k").unwrap();
        let (first, last) = if outer_first {
            (outer, inner)
        } else {
            (inner, outer)
        };
        let give_up = |guard: crate::ReentrantGuard| {
            if unlock {
                guard.unlock().unwrap();
            } else {
                drop(guard);
            }
        };
        give_up(first);
        assert_eq!(last.hold_count(), 1, "{case}");
        assert!(last.is_held(), "{case}");
        // The thread still holds it reentrantly: nesting still works, a plain lock still fails.
        let nested = client.try_reentrant_lock("k", Duration::ZERO).unwrap();
        assert_eq!(nested.map(|g| g.token()), Some(last.token()), "{case}");
        let e = client.try_lock("k", Duration::ZERO).unwrap_err();
        assert!(e.is_would_deadlock(), "{case}: {e:?}");
        assert_eq!(fake.kinds(), [Acquire], "{case}");
        give_up(last);
        let release = if unlock { Release } else { ReleaseDetached };
        assert_eq!(fake.kinds(), [Acquire, release], "{case}");
        assert!(!fake.is_locked("k"), "{case}");
        // The hold is gone: the next reentrant lock is a new grant.
        let again = client.reentrant_lock("k").unwrap();
        assert_eq!(again.hold_count(), 1, "{case}");
        assert_eq!(fake.count(Acquire), 2, "{case}");
    }
}

#[test]
fn a_plain_lock_of_a_key_held_reentrantly_on_this_thread_would_deadlock() {
    let (client, fake) = fake();
    let _held = client.reentrant_lock("k").unwrap();
    let would_deadlock = |e: &Error| matches!(e, Error::WouldDeadlock { key } if key == "k");
    let e = client.lock("k").unwrap_err();
    assert!(would_deadlock(&e), "{e:?}");
    let e = client.try_lock("k", Duration::ZERO).unwrap_err();
    assert!(would_deadlock(&e), "{e:?}");
    // Clones are one client.
    let e = client.clone().lock("k").unwrap_err();
    assert!(would_deadlock(&e), "{e:?}");
    let ran = client.with_lock("k", |_| -> Result<(), AppError> { panic!("ran") });
    assert!(
        matches!(&ran, Err(AppError::Lock(e)) if would_deadlock(e)),
        "{ran:?}"
    );
    // Refused before the engine was asked.
    assert_eq!(fake.kinds(), [Acquire]);
    // Another key is no concern.
    drop(client.lock("other").unwrap());
}

#[test]
fn a_key_held_reentrantly_on_another_thread_is_waited_for_not_refused() {
    let (client, fake) = fake();
    let held = client.reentrant_lock("k").unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            assert!(client.try_lock("k", Duration::ZERO).unwrap().is_none());
            assert!(client.try_lock("k", ms(20)).unwrap().is_none());
            assert!(client
                .try_reentrant_lock("k", Duration::ZERO)
                .unwrap()
                .is_none());
        });
    });
    assert_eq!(fake.kinds(), [Acquire, Acquire, Acquire, Acquire]);
    assert_eq!(held.hold_count(), 1);
}

#[test]
fn nesting_on_a_lost_reentrant_hold_is_lock_lost() {
    let (client, fake) = fake();
    let outer = client.reentrant_lock("k").unwrap();
    fake.lose("k");
    let e = client.reentrant_lock("k").unwrap_err();
    assert!(matches!(&e, Error::LockLost { key } if key == "k"), "{e:?}");
    assert!(!outer.is_held());
    assert_eq!(outer.hold_count(), 1);
    assert_eq!(fake.kinds(), [Acquire]);
}

// --- metrics --------------------------------------------------------------------------------

/// The facade's and the grants' metrics, recorded by a recorder of the test's own thread (the
/// fake has no threads); what the engines count is tested in `tests/metrics/`.
#[cfg(feature = "metrics")]
mod metrics {
    use std::collections::HashMap;
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;

    use super::{fake_in, ms, refused, Acquire};
    use crate::LockClient;

    /// A series: name and labels, sorted.
    type Series = (String, Vec<(String, String)>);

    /// What `f` recorded: each counter's total, and each histogram's sample count.
    struct Recorded {
        counters: HashMap<Series, u64>,
        samples: HashMap<Series, usize>,
    }

    impl Recorded {
        fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
            self.counters
                .get(&series(name, labels))
                .copied()
                .unwrap_or(0)
        }

        fn samples(&self, name: &str, labels: &[(&str, &str)]) -> usize {
            self.samples
                .get(&series(name, labels))
                .copied()
                .unwrap_or(0)
        }
    }

    fn series(name: &str, labels: &[(&str, &str)]) -> Series {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        (name.to_owned(), labels)
    }

    fn record(f: impl FnOnce()) -> Recorded {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, f);
        let mut recorded = Recorded {
            counters: HashMap::new(),
            samples: HashMap::new(),
        };
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *recorded.counters.entry(series).or_default() += n;
                }
                (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                    *recorded.samples.entry(series).or_default() += values.len();
                }
                _ => {}
            }
        }
        recorded
    }

    const NS: (&str, &str) = ("namespace", "counted");
    /// The `grant` label of a plain lock's series.
    const LOCK: (&str, &str) = ("grant", "lock");

    fn client() -> (LockClient, std::sync::Arc<crate::engine::fake::Fake>) {
        fake_in("counted")
    }

    #[test]
    fn a_grant_is_one_wait_sample_and_its_release_one_hold_sample() {
        let (client, _fake) = client();
        let recorded = record(|| {
            client.lock("a").unwrap().unlock().unwrap();
            drop(client.try_lock("b", Duration::ZERO).unwrap().unwrap());
            client
                .with_lock("c", |_| Ok::<_, crate::Error>(()))
                .unwrap();
            // Nested reentrant guards share their grant: one sample each.
            let outer = client.reentrant_lock("d").unwrap();
            drop(client.reentrant_lock("d").unwrap());
            drop(outer);
        });
        assert_eq!(recorded.samples("fencelock_wait_seconds", &[NS, LOCK]), 4);
        assert_eq!(recorded.samples("fencelock_hold_seconds", &[NS, LOCK]), 4);
        assert_eq!(
            recorded.counter("fencelock_lock_timeouts_total", &[NS, LOCK]),
            0
        );
        assert_eq!(recorded.counter("fencelock_losses_total", &[NS, LOCK]), 0);
    }

    #[test]
    fn a_try_lock_that_times_out_counts_a_timeout_and_no_wait() {
        let (client, _fake) = client();
        let _held = client.lock("k").unwrap();
        let recorded = record(|| {
            assert!(client.try_lock("k", Duration::ZERO).unwrap().is_none());
            assert!(client.try_lock("k", ms(10)).unwrap().is_none());
        });
        assert_eq!(
            recorded.counter("fencelock_lock_timeouts_total", &[NS, LOCK]),
            2
        );
        assert_eq!(recorded.samples("fencelock_wait_seconds", &[NS, LOCK]), 0);
    }

    #[test]
    fn errors_count_by_operation_and_kind() {
        let (client, fake) = client();
        let recorded = record(|| {
            fake.fail_next(Acquire, refused());
            assert!(client.lock("k").unwrap_err().is_connection());
            fake.fail_next(Acquire, crate::Error::Timeout("no reply".into()));
            assert!(client.try_lock("k", ms(10)).unwrap_err().is_timeout());
            assert!(client.lock("").unwrap_err().is_invalid_argument());
            let held = client.reentrant_lock("r").unwrap();
            assert!(client.lock("r").unwrap_err().is_would_deadlock());
            drop(held);
            let guard = client.lock("k").unwrap();
            assert!(guard.extend(Duration::ZERO).is_err());
            fake.lose("k");
            assert!(guard.extend(ms(2000)).unwrap_err().is_lock_lost());
        });
        let errors = |op, kind| {
            recorded.counter("fencelock_errors_total", &[NS, ("op", op), ("kind", kind)])
        };
        assert_eq!(errors("lock", "connection"), 1);
        assert_eq!(errors("lock", "timeout"), 1);
        assert_eq!(errors("lock", "invalid_argument"), 1);
        assert_eq!(errors("lock", "would_deadlock"), 1);
        assert_eq!(errors("extend", "invalid_argument"), 1);
        assert_eq!(errors("extend", "lock_lost"), 1);
        let all: u64 = recorded
            .counters
            .iter()
            .filter(|((name, _), _)| name == "fencelock_errors_total")
            .map(|(_, n)| n)
            .sum();
        assert_eq!(all, 6);
    }

    #[test]
    fn a_loss_counts_once_whoever_finds_it() {
        let (client, fake) = client();
        let recorded = record(|| {
            let guard = client.lock("k").unwrap();
            fake.lose("k");
            assert!(!guard.is_held());
            assert!(guard.extend(ms(2000)).unwrap_err().is_lock_lost());
            assert!(guard.unlock().unwrap_err().is_lock_lost());
        });
        assert_eq!(recorded.counter("fencelock_losses_total", &[NS, LOCK]), 1);
        // The hold of a lost lock is recorded all the same.
        assert_eq!(recorded.samples("fencelock_hold_seconds", &[NS, LOCK]), 1);
    }
}
