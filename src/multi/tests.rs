//! `lock_all` over a fake engine (`engine/fake.rs`), without Redis: the order keys are taken in,
//! what is refused before any call, that a set that cannot be had whole is released, and how a
//! set is extended, released and reports a loss. Against real servers: `tests/api/lock_all.rs`,
//! `tests/cluster/lock_all.rs`, `tests/quorum/lock_all.rs`.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, TryRecvError};

use crate::engine::fake::{Fake, Kind};
use crate::{Error, LockClient, MultiGuard};

use Kind::{Acquire, Extend, Force, Release, ReleaseDetached};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fake() -> (LockClient, Arc<Fake>) {
    LockClient::over_fake("fencelock")
}

fn refused() -> Error {
    Error::Connection("refused by the test".into())
}

fn calls(fake: &Fake) -> Vec<(Kind, String)> {
    fake.calls()
}

fn call(kind: Kind, key: &str) -> (Kind, String) {
    (kind, key.to_owned())
}

#[test]
fn keys_are_taken_in_one_order_whatever_order_they_are_named_in() {
    let (client, fake) = fake();
    let one = client.lock_all(&["c", "a", "b"]).unwrap();
    drop(one);
    let two = client.lock_all(&["b", "c", "a"]).unwrap();
    assert_eq!(two.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    drop(two);
    let acquired: Vec<String> = calls(&fake)
        .into_iter()
        .filter(|(kind, _)| *kind == Acquire)
        .map(|(_, key)| key)
        .collect();
    assert_eq!(acquired, ["a", "b", "c", "a", "b", "c"]);
}

/// The order is the escaped keys' (`{` is `%7B`), the same in every client.
#[test]
fn the_order_is_that_of_the_escaped_keys() {
    let (client, _fake) = fake();
    let set = client.lock_all(&["{", "0", "%"]).unwrap();
    // "%25", "%7B", "0": '%' sorts before '0'.
    assert_eq!(set.keys().collect::<Vec<_>>(), ["%", "{", "0"]);
}

#[test]
fn a_key_named_twice_is_locked_once() {
    let (client, fake) = fake();
    let set = client.lock_all(&["b", "a", "b", "a"]).unwrap();
    assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(fake.count(Acquire), 2);
    set.unlock().unwrap();
    assert_eq!(fake.count(Release), 2);
}

#[test]
fn an_empty_list_and_a_bad_key_are_refused_before_any_call() {
    let (client, fake) = fake();
    let none: [&str; 0] = [];
    let e = client.lock_all(&none).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "keys", .. }),
        "{e:?}"
    );
    let e = client.try_lock_all(&none, ms(10)).unwrap_err();
    assert!(e.is_invalid_argument(), "{e:?}");
    let e = client.lock_all(&["a", ""]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "key", .. }),
        "{e:?}"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn a_key_held_reentrantly_on_this_thread_would_deadlock_before_any_call() {
    let (client, fake) = fake();
    let _held = client.reentrant_lock("b").unwrap();
    let e = client.lock_all(&["a", "b"]).unwrap_err();
    assert!(
        matches!(&e, Error::WouldDeadlock { key } if key == "b"),
        "{e:?}"
    );
    assert_eq!(fake.kinds(), [Acquire]);
    assert!(!fake.is_locked("a"));
}

#[test]
fn each_key_keeps_its_own_token() {
    let (client, _fake) = fake();
    let set = client.lock_all(&["y", "x"]).unwrap();
    let (x, y) = (set.token("x").unwrap(), set.token("y").unwrap());
    assert!(x < y, "x is taken first: {x} {y}");
    assert_eq!(set.token("z"), None);
    drop(set);
    let again = client.lock_all(&["x", "y"]).unwrap();
    assert!(again.token("x").unwrap() > x);
    assert!(again.token("y").unwrap() > y);
}

#[test]
fn a_set_that_times_out_releases_what_it_took() {
    let (client, fake) = fake();
    let other = client.lock("b").unwrap();
    assert!(client
        .try_lock_all(&["c", "b", "a"], ms(50))
        .unwrap()
        .is_none());
    assert!(!fake.is_locked("a"));
    assert!(!fake.is_locked("c"));
    assert!(fake.is_locked("b"));
    // "c" was never asked for; "a" was released.
    assert_eq!(
        calls(&fake)[1..],
        [
            call(Acquire, "a"),
            call(Acquire, "b"),
            call(ReleaseDetached, "a")
        ]
    );
    // A zero timeout: one attempt at each key in order, no more.
    assert!(client
        .try_lock_all(&["a", "b"], Duration::ZERO)
        .unwrap()
        .is_none());
    assert!(!fake.is_locked("a"));
    drop(other);
    assert!(client
        .try_lock_all(&["a", "b"], Duration::ZERO)
        .unwrap()
        .is_some());
}

/// A set of "a" and "b" whose acquire of "b" fails with `error`: "a" is granted first (the set
/// waits for it while another guard holds it, and the failure is queued only then).
fn second_key_fails(error: Error) -> (Error, Arc<Fake>) {
    let (client, fake) = fake();
    let a = client.lock("a").unwrap();
    let waiting = {
        let client = client.clone();
        thread::spawn(move || client.try_lock_all(&["b", "a"], Duration::from_secs(10)))
    };
    // Bounded: 10 s.
    for _ in 0..1000 {
        if fake.count(Acquire) == 2 {
            break;
        }
        thread::sleep(ms(10));
    }
    assert_eq!(fake.count(Acquire), 2, "the set never asked for \"a\"");
    fake.fail_next(Acquire, error);
    drop(a);
    let e = waiting.join().unwrap().unwrap_err();
    assert!(!fake.is_locked("a") && !fake.is_locked("b"));
    assert_eq!(
        calls(&fake)[2..],
        [
            call(ReleaseDetached, "a"),
            call(Acquire, "b"),
            call(ReleaseDetached, "a")
        ]
    );
    (e, fake)
}

#[test]
fn a_set_whose_key_fails_releases_what_it_took_and_reports_the_error() {
    let (e, _) = second_key_fails(refused());
    assert!(matches!(e, Error::Connection(_)), "{e:?}");
}

/// The fake hears no cancel signal while it waits: its failure stands in for the engines'.
#[test]
fn a_cancelled_wait_releases_what_was_taken() {
    let (e, _) = second_key_fails(Error::Cancelled);
    assert!(matches!(e, Error::Cancelled), "{e:?}");
}

#[test]
fn losing_one_key_loses_the_set_and_fires_lost_once() {
    let (client, fake) = fake();
    let set = client.lock_all(&["a", "b", "c"]).unwrap();
    let lost = set.lost().clone();
    assert!(set.is_held());
    assert_eq!(lost.try_recv(), Err(TryRecvError::Empty));
    fake.lose("b");
    assert!(!set.is_held());
    assert_eq!(lost.recv_timeout(ms(1000)), Ok(()));
    fake.lose("c");
    // Once: the channel disconnects after its one message.
    assert_eq!(
        lost.recv_timeout(ms(1000)),
        Err(RecvTimeoutError::Disconnected)
    );
    // The release reports the first loss it meets; every key is released all the same.
    let e = set.unlock().unwrap_err();
    assert!(e.is_lock_lost(), "{e:?}");
    assert!(!fake.is_locked("a"));
    assert_eq!(fake.count(Release), 3);
}

#[test]
fn lost_asked_for_after_the_loss_is_ready_at_once() {
    let (client, fake) = fake();
    let set = client.lock_all(&["a", "b"]).unwrap();
    fake.lose("a");
    assert_eq!(set.lost().try_recv(), Ok(()));
    assert_eq!(set.lost().try_recv(), Err(TryRecvError::Disconnected));
}

#[test]
fn extend_extends_every_key_in_order_and_checks_the_lease_first() {
    let (client, fake) = fake();
    let set = client.lock_all(&["b", "c", "a"]).unwrap();
    set.extend(ms(60_000)).unwrap();
    assert_eq!(
        calls(&fake)[3..],
        [call(Extend, "a"), call(Extend, "b"), call(Extend, "c")]
    );
    for bad in [ms(1), Duration::from_micros(10_500)] {
        let e = set.extend(bad).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { what: "lease", .. }),
            "{e:?}"
        );
    }
    assert_eq!(fake.count(Extend), 3, "a bad lease reached the engine");
    assert!(set.is_held());
}

#[test]
fn extend_of_a_set_with_a_key_gone_loses_the_set() {
    let (client, fake) = fake();
    let set = client.lock_all(&["a", "b", "c"]).unwrap();
    let lost = set.lost().clone();
    // Deleted behind the holder's back: nothing has told the grant yet.
    assert!(client.force_unlock("b").unwrap());
    assert!(set.is_held());
    let e = set.extend(ms(60_000)).unwrap_err();
    assert!(matches!(&e, Error::LockLost { key } if key == "b"), "{e:?}");
    assert!(!set.is_held());
    assert_eq!(lost.try_recv(), Ok(()));
    // "c" was not asked: the set was lost at "b".
    assert_eq!(
        calls(&fake)[3..],
        [call(Force, "b"), call(Extend, "a"), call(Extend, "b")]
    );
    // Known lost now: the next extend fails before any call.
    let e = set.extend(ms(60_000)).unwrap_err();
    assert!(e.is_lock_lost(), "{e:?}");
    assert_eq!(fake.count(Extend), 2);
}

#[test]
fn extend_that_fails_to_reach_a_key_reports_it_and_keeps_the_set_held() {
    let (client, fake) = fake();
    let set = client.lock_all(&["a", "b", "c"]).unwrap();
    let lost = set.lost().clone();
    fake.fail_next(Extend, refused());
    let e = set.extend(ms(60_000)).unwrap_err();
    assert!(matches!(e, Error::Connection(_)), "{e:?}");
    // Its outcome unknown, "a" keeps the lease it had; so do "b" and "c", not asked.
    assert_eq!(calls(&fake)[3..], [call(Extend, "a")]);
    assert!(set.is_held());
    assert_eq!(lost.try_recv(), Err(TryRecvError::Empty));
    set.extend(ms(60_000)).unwrap();
    assert_eq!(fake.count(Extend), 4);
}

#[test]
fn unlock_releases_every_key_last_taken_first_and_reports_the_first_error() {
    let (client, fake) = fake();
    let set = client.lock_all(&["a", "b", "c"]).unwrap();
    fake.fail_next(Release, refused());
    let e = set.unlock().unwrap_err();
    assert!(matches!(e, Error::Connection(_)), "{e:?}");
    assert_eq!(
        calls(&fake)[3..],
        [call(Release, "c"), call(Release, "b"), call(Release, "a")]
    );
    // "c"'s release failed as if Redis never saw it; the others went.
    assert!(fake.is_locked("c"));
    assert!(!fake.is_locked("b") && !fake.is_locked("a"));
}

#[test]
fn drop_releases_every_key_last_taken_first() {
    let (client, fake) = fake();
    let set = client.lock_all(&["b", "a"]).unwrap();
    drop(set);
    assert_eq!(
        calls(&fake)[2..],
        [call(ReleaseDetached, "b"), call(ReleaseDetached, "a")]
    );
    assert!(!fake.is_locked("a") && !fake.is_locked("b"));
}

#[test]
fn a_set_moves_to_another_thread_and_releases_there() {
    fn send<T: Send + Sync + 'static>(value: T) -> T {
        value
    }
    let (client, fake) = fake();
    let set: MultiGuard = send(client.lock_all(&["a", "b"]).unwrap());
    thread::spawn(move || set.unlock()).join().unwrap().unwrap();
    assert!(!fake.is_locked("a") && !fake.is_locked("b"));
}

#[test]
fn debug_shows_keys_and_tokens_only() {
    let (client, _fake) = fake();
    let set = client.lock_all(&["a"]).unwrap();
    let shown = format!("{set:?}");
    assert!(
        shown.starts_with("MultiGuard { tokens: {\"a\": "),
        "{shown}"
    );
    assert!(shown.contains("held: true"), "{shown}");
}
