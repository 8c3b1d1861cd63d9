//! The local queues alone: no Redis, no sleeps. Races run on real threads, many times over, and
//! check that a grant is never lost: it reaches a waiter that takes it, or its releaser hears
//! that the waiter left without one and gives the lock back.

use std::sync::Barrier;
use std::thread;

use super::*;

const TAG: &str = "k";
const LEASE: Duration = Duration::from_secs(1);
const ROUNDS: usize = 2000;

fn waiters() -> Arc<Waiters> {
    Arc::new(Waiters::default())
}

fn granted(token: u64) -> Wake {
    Wake::Granted {
        token: FencingToken::new(token),
        since: None,
        lease: LEASE,
        local_run: 0,
    }
}

/// Every wake sent to `ticket` and not yet taken, oldest first.
fn pending(ticket: &Ticket) -> Vec<Wake> {
    ticket.place.pending().collect()
}

fn keys(waiters: &Waiters) -> Vec<String> {
    let mut keys: Vec<String> = waiters.queues.lock().keys().cloned().collect();
    keys.sort();
    keys
}

fn queue_len(waiters: &Waiters, tag: &str) -> usize {
    waiters.queues.lock().len(tag)
}

#[test]
fn waiters_queue_in_arrival_order_and_only_the_oldest_is_head() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let c = w.join(TAG, "c", LEASE);
    assert!(a.is_head() && !b.is_head() && !c.is_head());
    assert_eq!(w.next(TAG).unwrap().owner(), "a");

    // A waiter behind the head leaves: headship stays, nobody is woken.
    let _ = b.leave();
    assert!(a.is_head() && !c.is_head());
    assert!(pending(&a).is_empty() && pending(&c).is_empty());

    let _ = a.leave();
    assert!(c.is_head());
    assert_eq!(w.next(TAG).unwrap().owner(), "c");
}

#[test]
fn queues_of_different_keys_are_independent() {
    let w = waiters();
    let a = w.join("x", "a", LEASE);
    let b = w.join("y", "b", LEASE);
    assert!(a.is_head() && b.is_head());
    let _ = a.leave();
    assert!(pending(&b).is_empty(), "leaving x woke y's head");
    assert_eq!(keys(&w), ["y"]);
}

#[test]
fn next_names_the_head_with_its_owner_and_lease() {
    let w = waiters();
    assert!(w.next(TAG).is_none(), "no queue, no head");
    let a = w.join(TAG, "a", Duration::from_millis(1234));
    let b = w.join(TAG, "b", LEASE);
    assert!(!a.named() && !b.named());

    let head = w.next(TAG).unwrap();
    assert_eq!(head.owner(), "a");
    assert_eq!(head.lease(), Duration::from_millis(1234));
    assert!(a.named(), "the head named in a release is marked");
    assert!(!b.named(), "only the head is marked");
    assert!(pending(&a).is_empty(), "naming sends nothing");
    assert!(w.next("other").is_none());
}

#[test]
fn leave_reports_whether_a_release_named_the_waiter() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let _ = w.next(TAG);
    assert_eq!(a.leave(), (None, true));
    assert_eq!(b.leave(), (None, false));
}

#[test]
fn deliver_to_a_waiting_head_reaches_it() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let head = w.next(TAG).unwrap();
    assert_eq!(w.deliver_to(&head, granted(7)), Ok(()));
    assert_eq!(pending(&a), [granted(7)]);
    assert!(pending(&b).is_empty());
}

#[test]
fn deliver_to_a_waiter_that_left_without_a_grant_says_so() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let _b = w.join(TAG, "b", LEASE);
    let head = w.next(TAG).unwrap();
    assert_eq!(a.leave(), (None, true));
    assert_eq!(w.deliver_to(&head, granted(7)), Err(Left::WithoutGrant));
    let queued = Wake::Queued {
        retry_after: LEASE,
        since: Instant::now(),
    };
    assert_eq!(w.deliver_to(&head, queued), Err(Left::WithoutGrant));
}

#[test]
fn deliver_to_a_waiter_dropped_without_leaving_says_it_left_without_a_grant() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    drop(a);
    assert_eq!(w.deliver_to(&head, granted(7)), Err(Left::WithoutGrant));
}

#[test]
fn deliver_to_a_waiter_that_left_granted_says_so() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    a.leave_granted();
    assert_eq!(w.deliver_to(&head, granted(7)), Err(Left::WithGrant));
}

#[test]
fn leave_returns_a_grant_that_arrived_before_it() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    w.wake_head(TAG);
    assert_eq!(w.deliver_to(&head, granted(7)), Ok(()));
    w.wake_head(TAG);
    // The grant among other wakes is the one returned.
    assert_eq!(a.leave(), (Some(granted(7)), true));
    // And it is the last anybody hears of it: a later delivery is refused.
    assert_eq!(w.deliver_to(&head, granted(8)), Err(Left::WithoutGrant));
}

#[test]
fn leave_returns_a_handoff_delivered_by_owner() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    assert!(w.deliver_handoff(TAG, "a", FencingToken::new(9)));
    assert_eq!(a.leave(), (Some(granted(9)), false));
}

#[test]
fn leave_ignores_wakes_that_are_not_grants() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    w.wake_head(TAG);
    let queued = Wake::Queued {
        retry_after: LEASE,
        since: Instant::now(),
    };
    assert_eq!(w.deliver_to(&head, queued), Ok(()));
    assert_eq!(a.leave(), (None, true));
}

#[test]
fn leaving_as_head_without_a_grant_wakes_the_next_to_attempt() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let c = w.join(TAG, "c", LEASE);
    let _ = a.leave();
    assert_eq!(pending(&b), [Wake::Attempt]);
    assert!(pending(&c).is_empty(), "only the new head is woken");
    assert!(b.is_head());
}

#[test]
fn dropping_the_head_wakes_the_next_to_attempt() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    drop(a);
    assert_eq!(pending(&b), [Wake::Attempt]);
}

/// Current behaviour, pinned: a head that finds a late grant when leaving has already woken
/// the next waiter, which then attempts against a lock its own client is about to take.
#[test]
fn leaving_as_head_with_a_late_grant_still_wakes_the_next() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let head = w.next(TAG).unwrap();
    assert_eq!(w.deliver_to(&head, granted(7)), Ok(()));
    assert_eq!(a.leave(), (Some(granted(7)), true));
    assert_eq!(pending(&b), [Wake::Attempt]);
}

#[test]
fn leaving_granted_does_not_wake_the_next() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    a.leave_granted();
    assert!(pending(&b).is_empty());
    assert!(b.is_head(), "the next is head all the same");
}

#[test]
fn leaving_from_behind_the_head_wakes_nobody() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let c = w.join(TAG, "c", LEASE);
    let _ = b.leave();
    assert!(pending(&a).is_empty() && pending(&c).is_empty());
}

#[test]
fn the_key_is_removed_when_its_last_waiter_leaves() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let c = w.join(TAG, "c", LEASE);
    let _ = b.leave();
    assert_eq!(queue_len(&w, TAG), 2);
    a.leave_granted();
    assert_eq!(keys(&w), [TAG]);
    drop(c);
    assert!(keys(&w).is_empty());

    // Each way of leaving removes an only waiter's key.
    let _ = w.join(TAG, "d", LEASE).leave();
    assert!(keys(&w).is_empty());
    w.join(TAG, "e", LEASE).leave_granted();
    assert!(keys(&w).is_empty());
    drop(w.join(TAG, "f", LEASE));
    assert!(keys(&w).is_empty());

    // And a new waiter starts a new queue as its head.
    let g = w.join(TAG, "g", LEASE);
    assert!(g.is_head());
}

#[test]
fn deliver_handoff_caps_the_lease_at_the_handoff_lease() {
    let w = waiters();
    let long = w.join(TAG, "long", HANDOFF_LEASE * 3);
    let short = w.join(TAG, "short", Duration::from_millis(250));
    let exact = w.join(TAG, "exact", HANDOFF_LEASE);
    assert!(w.deliver_handoff(TAG, "long", FencingToken::new(1)));
    assert!(w.deliver_handoff(TAG, "short", FencingToken::new(2)));
    assert!(w.deliver_handoff(TAG, "exact", FencingToken::new(3)));
    let expect = |token, lease| Wake::Granted {
        token: FencingToken::new(token),
        since: None,
        lease,
        local_run: 0,
    };
    assert_eq!(pending(&long), [expect(1, HANDOFF_LEASE)]);
    assert_eq!(pending(&short), [expect(2, Duration::from_millis(250))]);
    assert_eq!(pending(&exact), [expect(3, HANDOFF_LEASE)]);
}

#[test]
fn deliver_handoff_reaches_only_the_named_owner_of_that_key() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let other = w.join("other", "b", LEASE);
    assert!(w.deliver_handoff(TAG, "b", FencingToken::new(5)));
    assert!(pending(&a).is_empty(), "not the head, but the owner named");
    assert_eq!(pending(&b), [granted(5)]);
    assert!(
        pending(&other).is_empty(),
        "the same owner id under another key"
    );

    assert!(!w.deliver_handoff(TAG, "nobody", FencingToken::new(6)));
    assert!(!w.deliver_handoff("nokey", "a", FencingToken::new(6)));
    let _ = b.leave();
    assert!(!w.deliver_handoff(TAG, "b", FencingToken::new(6)), "b left");
    assert!(pending(&a).is_empty());
}

#[test]
fn deliver_reaches_only_the_named_owner_while_it_waits() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    assert!(w.deliver(TAG, "b", granted(4)));
    assert!(pending(&a).is_empty());
    assert_eq!(pending(&b), [granted(4)]);
    assert!(!w.deliver(TAG, "nobody", granted(4)));
    assert!(!w.deliver("nokey", "a", granted(4)));
    b.leave_granted();
    assert!(!w.deliver(TAG, "b", granted(4)));
}

#[test]
fn wake_head_wakes_only_the_head() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    w.wake_head(TAG);
    w.wake_head("nokey");
    assert_eq!(pending(&a), [Wake::Attempt]);
    assert!(pending(&b).is_empty());
}

#[test]
fn wake_all_heads_wakes_each_key_head_once() {
    let w = waiters();
    let a = w.join("x", "a", LEASE);
    let b = w.join("x", "b", LEASE);
    let c = w.join("y", "c", LEASE);
    w.wake_all_heads();
    assert_eq!(pending(&a), [Wake::Attempt]);
    assert!(pending(&b).is_empty());
    assert_eq!(pending(&c), [Wake::Attempt]);
}

/// The transitions of [`State`] alone, row by row of "A waiter's states".
mod state {
    use super::*;

    /// Two moments, the first earlier.
    fn moments() -> (Instant, Instant) {
        let t0 = Instant::now();
        (t0, t0 + Duration::from_millis(1))
    }

    #[test]
    fn a_first_attempt_joins_redis_queue_and_every_later_one_rejoins() {
        let (t0, t1) = moments();
        let mut state = State::Local;
        assert_eq!(state.attempt(t0), JoinQueue::Join);
        assert_eq!(state, State::Joining { since: t0 });
        state.refused();
        assert_eq!(state, State::InRedisQueue { since: t0 });
        assert_eq!(state.attempt(t1), JoinQueue::Rejoin);
        state.refused();
        assert_eq!(
            state,
            State::InRedisQueue { since: t0 },
            "never moved forward"
        );
    }

    #[test]
    fn a_waiter_named_before_attempting_rejoins_from_its_first_attempt() {
        let (_, t1) = moments();
        let mut state = State::Local;
        state.name();
        assert_eq!(state, State::Named { since: None });
        assert_eq!(state.since(), None, "not known: when it joined");
        assert_eq!(state.attempt(t1), JoinQueue::Rejoin);
        assert_eq!(state, State::InRedisQueue { since: t1 });
    }

    #[test]
    fn a_waiter_named_while_its_first_attempt_is_out_stays_named_until_it_hears() {
        let (t0, t1) = moments();
        let mut state = State::Local;
        assert_eq!(state.attempt(t0), JoinQueue::Join);
        state.name();
        assert_eq!(state, State::Named { since: Some(t0) });
        assert_eq!(state.since(), Some(t0));
        let mut refused = state;
        refused.refused();
        assert_eq!(refused, State::InRedisQueue { since: t0 });
        let mut queued = state;
        queued.queued(t1);
        assert_eq!(queued, State::InRedisQueue { since: t0 });
    }

    #[test]
    fn naming_a_waiter_in_redis_queue_or_gone_changes_nothing() {
        let (t0, _) = moments();
        for state in [
            State::Named { since: Some(t0) },
            State::InRedisQueue { since: t0 },
            State::Left(Left::WithGrant),
            State::Left(Left::WithoutGrant),
        ] {
            let mut named = state;
            named.name();
            assert_eq!(named, state);
        }
    }

    #[test]
    fn being_queued_by_a_release_keeps_the_earliest_moment() {
        let (t0, t1) = moments();
        let cases = [
            (State::Local, State::InRedisQueue { since: t1 }),
            (
                State::Named { since: None },
                State::InRedisQueue { since: t1 },
            ),
            (
                State::Named { since: Some(t0) },
                State::InRedisQueue { since: t0 },
            ),
            (
                State::Joining { since: t0 },
                State::InRedisQueue { since: t0 },
            ),
            (
                State::InRedisQueue { since: t0 },
                State::InRedisQueue { since: t0 },
            ),
            (State::Left(Left::WithGrant), State::Left(Left::WithGrant)),
        ];
        for (before, after) in cases {
            let mut state = before;
            state.queued(t1);
            assert_eq!(state, after, "from {before:?}");
        }
    }

    #[test]
    fn only_a_local_waiter_or_one_gone_has_nothing_in_redis_queue_to_undo() {
        let (t0, _) = moments();
        for (state, in_redis_queue) in [
            (State::Local, false),
            (State::Joining { since: t0 }, true),
            (State::Named { since: None }, true),
            (State::Named { since: Some(t0) }, true),
            (State::InRedisQueue { since: t0 }, true),
            (State::Left(Left::WithGrant), false),
            (State::Left(Left::WithoutGrant), false),
        ] {
            assert_eq!(state.in_redis_queue(), in_redis_queue, "{state:?}");
        }
    }
}

#[test]
fn leave_after_an_attempt_reports_the_waiter_in_redis_queue() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    assert_eq!(a.attempt(Instant::now()), JoinQueue::Join);
    assert_eq!(a.leave(), (None, true));
}

#[test]
fn a_ticket_says_how_it_attempts_and_whether_a_naming_came_during_its_first_attempt() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    assert_eq!(a.attempt(Instant::now()), JoinQueue::Join);
    assert!(!a.named());
    let head = w.next(TAG).unwrap();
    assert!(
        a.named(),
        "a grant of this attempt may leave an entry behind"
    );
    a.leave_granted();
    assert_eq!(w.deliver_to(&head, granted(1)), Err(Left::WithGrant));

    // Named before its first attempt: the attempt rejoins, and takes its entry out.
    let head = w.next(TAG).unwrap();
    assert_eq!(head.owner(), "b");
    assert_eq!(b.attempt(Instant::now()), JoinQueue::Rejoin);
    assert!(!b.named());
    b.leave_granted();
}

#[test]
fn since_is_when_it_joined_until_it_attempts_or_a_release_queues_it() {
    let w = waiters();
    let before = Instant::now();
    let a = w.join(TAG, "a", LEASE);
    let joined = a.since();
    assert!(joined >= before);
    let _ = w.next(TAG);
    assert_eq!(a.since(), joined, "named, but not told when it was queued");
    let queued_at = joined + Duration::from_millis(5);
    a.queued(queued_at);
    assert_eq!(a.since(), queued_at);
    assert_eq!(a.attempt(queued_at + LEASE), JoinQueue::Rejoin);
    a.refused();
    assert_eq!(a.since(), queued_at, "never moved forward");
    assert_eq!(a.state(), State::InRedisQueue { since: queued_at });
}

#[test]
fn wait_returns_every_piled_up_wake_oldest_first() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    let queued = Wake::Queued {
        retry_after: LEASE,
        since: Instant::now(),
    };
    w.wake_head(TAG);
    assert_eq!(w.deliver_to(&head, queued), Ok(()));
    assert_eq!(w.deliver_to(&head, granted(3)), Ok(()));
    w.wake_head(TAG);
    match a.wait(None, None) {
        Waited::Woken(wakes) => {
            assert_eq!(wakes, [Wake::Attempt, queued, granted(3), Wake::Attempt])
        }
        _ => panic!("expected the piled-up wakes"),
    }
    assert!(pending(&a).is_empty(), "all were taken");
}

#[test]
fn wait_times_out_at_its_deadline() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    assert!(matches!(
        a.wait(Some(Instant::now()), None),
        Waited::TimedOut
    ));
    let past = Instant::now().checked_sub(Duration::from_secs(1));
    if let Some(past) = past {
        assert!(matches!(a.wait(Some(past), None), Waited::TimedOut));
    }
    // A deadline ahead is waited for, and not much longer.
    let (_cancel_tx, cancel) = crossbeam_channel::unbounded::<()>();
    let until = Instant::now() + Duration::from_millis(30);
    assert!(matches!(
        a.wait(Some(until), Some(&cancel)),
        Waited::TimedOut
    ));
    assert!(Instant::now() >= until);
}

#[test]
fn wait_takes_a_piled_up_wake_even_past_its_deadline() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    w.wake_head(TAG);
    match a.wait(Some(Instant::now()), None) {
        Waited::Woken(wakes) => assert_eq!(wakes, [Wake::Attempt]),
        _ => panic!("a ready wake loses to a deadline already past"),
    }
}

#[test]
fn wait_is_cancelled_by_a_ready_cancel_and_takes_its_message() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let (cancel_tx, cancel) = crossbeam_channel::unbounded();
    cancel_tx.send(()).unwrap();
    assert!(matches!(a.wait(None, Some(&cancel)), Waited::Cancelled));
    assert!(cancel.is_empty(), "the cancel message was taken");
    // With a deadline too.
    cancel_tx.send(()).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    assert!(matches!(
        a.wait(Some(until), Some(&cancel)),
        Waited::Cancelled
    ));
}

#[test]
fn wait_is_cancelled_by_a_disconnected_cancel() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let (cancel_tx, cancel) = crossbeam_channel::unbounded::<()>();
    drop(cancel_tx);
    assert!(matches!(a.wait(None, Some(&cancel)), Waited::Cancelled));
    let until = Instant::now() + Duration::from_secs(60);
    assert!(matches!(
        a.wait(Some(until), Some(&cancel)),
        Waited::Cancelled
    ));
}

#[test]
fn wait_blocks_until_another_thread_wakes_it() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let head = w.next(TAG).unwrap();
    thread::scope(|s| {
        s.spawn(|| assert_eq!(w.deliver_to(&head, granted(11)), Ok(())));
        match a.wait(None, None) {
            Waited::Woken(wakes) => assert_eq!(wakes, [granted(11)]),
            _ => panic!("expected the grant"),
        }
    });
}

#[test]
fn wait_is_cancelled_from_another_thread() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let (cancel_tx, cancel) = crossbeam_channel::unbounded::<()>();
    thread::scope(|s| {
        s.spawn(move || drop(cancel_tx));
        assert!(matches!(a.wait(None, Some(&cancel)), Waited::Cancelled));
    });
}

/// A grant and a cancel both ready: the wait may end either way, but a grant it did not
/// return stays for `leave` to find.
#[test]
fn a_grant_ready_with_a_cancel_is_returned_by_wait_or_by_leave() {
    let (mut woken, mut cancelled) = (0, 0);
    for round in 0..200u64 {
        let w = waiters();
        let a = w.join(TAG, "a", LEASE);
        let head = w.next(TAG).unwrap();
        let (cancel_tx, cancel) = crossbeam_channel::unbounded();
        cancel_tx.send(()).unwrap();
        assert_eq!(w.deliver_to(&head, granted(round)), Ok(()));
        match a.wait(None, Some(&cancel)) {
            Waited::Woken(wakes) => {
                woken += 1;
                assert_eq!(wakes, [granted(round)]);
                assert_eq!(a.leave(), (None, true));
            }
            Waited::Cancelled => {
                cancelled += 1;
                assert_eq!(a.leave(), (Some(granted(round)), true));
            }
            Waited::TimedOut => panic!("no deadline"),
        }
    }
    assert_eq!(woken + cancelled, 200);
}

/// The race of a release's delivery and the named waiter's leaving: the grant reaches the
/// waiter (and `leave` returns it) or the releaser hears `WithoutGrant`; exactly one.
#[test]
fn a_grant_racing_leave_is_taken_or_given_back_never_lost() {
    let (mut taken, mut given_back) = (0, 0);
    for round in 0..ROUNDS as u64 {
        let w = waiters();
        let a = w.join(TAG, "a", LEASE);
        let b = w.join(TAG, "b", LEASE);
        let head = w.next(TAG).unwrap();
        let start = Barrier::new(2);
        let (delivered, (late, named)) = thread::scope(|s| {
            let releaser = s.spawn(|| {
                start.wait();
                w.deliver_to(&head, granted(round))
            });
            start.wait();
            let left = a.leave();
            (releaser.join().unwrap(), left)
        });
        assert!(named);
        match (delivered, late) {
            (Ok(()), Some(wake)) => {
                assert_eq!(wake, granted(round));
                taken += 1;
            }
            (Err(Left::WithoutGrant), None) => given_back += 1,
            other => panic!("round {round}: grant lost or doubled: {other:?}"),
        }
        // Either way the next waiter is head and was woken to attempt.
        assert!(b.is_head());
        assert_eq!(pending(&b), [Wake::Attempt]);
    }
    assert_eq!(taken + given_back, ROUNDS);
}

/// A hazard, pinned: a ticket dropped without `leave` (only an unwinding panic does that in
/// `acquire.rs`) throws away a grant delivered before the drop. The releaser was told
/// `Ok`, so nobody gives the lock back; it stays taken until its lease runs out. After the
/// drop, a delivery is refused as usual.
#[test]
fn dropping_a_ticket_strands_a_grant_delivered_before_it() {
    let w = waiters();
    let a = w.join(TAG, "a", LEASE);
    let b = w.join(TAG, "b", LEASE);
    let head = w.next(TAG).unwrap();
    assert_eq!(w.deliver_to(&head, granted(7)), Ok(()));
    drop(a);
    // The releaser believes the grant reached a waiter; the waiter is gone with it, and
    // the next one was woken only to attempt against a lock now held by nobody alive.
    assert_eq!(pending(&b), [Wake::Attempt]);
    assert_eq!(w.deliver_to(&head, granted(8)), Err(Left::WithoutGrant));
}

/// A handoff from another client's release, delivered by the listener, racing the waiter's
/// leaving: `deliver_handoff` says `true` exactly when `leave` returns the grant.
#[test]
fn a_handoff_racing_leave_is_taken_or_refused_never_lost() {
    let mut outcomes = [0usize; 2];
    for round in 0..ROUNDS as u64 {
        let w = waiters();
        let a = w.join(TAG, "a", LEASE);
        let start = Barrier::new(2);
        let (delivered, (late, named)) = thread::scope(|s| {
            let listener = s.spawn(|| {
                start.wait();
                w.deliver_handoff(TAG, "a", FencingToken::new(round))
            });
            start.wait();
            let left = a.leave();
            (listener.join().unwrap(), left)
        });
        assert!(!named);
        assert_eq!(delivered, late.is_some(), "round {round}");
        if let Some(wake) = late {
            assert_eq!(wake, granted(round));
        }
        outcomes[usize::from(delivered)] += 1;
        assert!(keys(&w).is_empty());
    }
    assert_eq!(outcomes[0] + outcomes[1], ROUNDS);
}

/// A release naming the head while it leaves: `next` finds it (and the delivery's outcome
/// then tells what became of the grant) or finds the waiter behind it.
#[test]
fn naming_racing_leave_names_a_waiter_that_hears_or_reports_back() {
    for round in 0..ROUNDS as u64 {
        let w = waiters();
        let a = w.join(TAG, "a", LEASE);
        let b = w.join(TAG, "b", LEASE);
        let start = Barrier::new(2);
        let (named_a, delivered, (late, a_named)) = thread::scope(|s| {
            let releaser = s.spawn(|| {
                start.wait();
                let head = w.next(TAG).unwrap();
                let delivered = w.deliver_to(&head, granted(round));
                (head.owner() == "a", delivered)
            });
            start.wait();
            let left = a.leave();
            let (named_a, delivered) = releaser.join().unwrap();
            (named_a, delivered, left)
        });
        let b_wakes = pending(&b);
        if named_a {
            assert!(a_named);
            match (delivered, late) {
                (Ok(()), Some(_)) | (Err(Left::WithoutGrant), None) => {}
                other => panic!("round {round}: {other:?}"),
            }
            assert_eq!(b_wakes, [Wake::Attempt]);
            assert!(!b.named());
        } else {
            // a had left: b was head, named and handed the grant, after its Attempt wake.
            assert_eq!(late, None);
            assert!(!a_named);
            assert_eq!(delivered, Ok(()));
            assert!(b.named());
            assert_eq!(b_wakes, [Wake::Attempt, granted(round)]);
        }
    }
}

/// Headship passes down a queue of waiters on their own threads: each, woken to attempt,
/// gives up and leaves, which wakes the next. Nobody is left asleep and the key goes away.
#[test]
fn each_head_leaving_wakes_the_next_down_the_whole_queue() {
    const N: usize = 16;
    for _ in 0..50 {
        let w = waiters();
        let tickets: Vec<Ticket> = (0..N)
            .map(|i| w.join(TAG, &format!("w{i}"), LEASE))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        thread::scope(|s| {
            let threads: Vec<_> = tickets
                .into_iter()
                .map(|t| {
                    s.spawn(move || {
                        let woken = t.wait(Some(deadline), None);
                        assert!(t.is_head());
                        let _ = t.leave();
                        woken
                    })
                })
                .collect();
            w.wake_head(TAG);
            for t in threads {
                match t.join().unwrap() {
                    Waited::Woken(wakes) => assert_eq!(wakes, [Wake::Attempt]),
                    _ => panic!("a waiter was never woken"),
                }
            }
        });
        assert!(keys(&w).is_empty());
    }
}

/// Many threads join and leave one key at once, some granted: the map ends empty and every
/// waiter that left as head without a grant woke one successor.
#[test]
fn concurrent_joins_and_leaves_leave_no_queue_behind() {
    let w = waiters();
    thread::scope(|s| {
        for t in 0..8 {
            let w = &w;
            s.spawn(move || {
                for i in 0..200 {
                    let ticket = w.join(TAG, &format!("t{t}-{i}"), LEASE);
                    if i % 3 == 0 {
                        ticket.leave_granted();
                    } else {
                        let _ = ticket.leave();
                    }
                }
            });
        }
    });
    assert!(keys(&w).is_empty());
}

/// The races above under Shuttle's exhaustive (DFS) scheduler: every interleaving of the
/// queues' mutexes (`crate::model`), not just those the OS happens to produce. The channels are
/// crossbeam's and not modelled: their non-blocking operations (`send` on an unbounded
/// channel, `try_iter`) run whole between two scheduling points, which is sound for a
/// linearizable channel. Nothing here blocks on a channel, which Shuttle could not schedule.
mod model {
    use shuttle::thread;

    use super::*;

    fn check(f: impl Fn() + Send + Sync + 'static) {
        shuttle::check_dfs(f, None);
    }

    #[test]
    fn a_grant_racing_leave_is_taken_or_given_back_in_every_interleaving() {
        check(|| {
            let w = waiters();
            let a = w.join(TAG, "a", LEASE);
            let b = w.join(TAG, "b", LEASE);
            let head = w.next(TAG).unwrap();
            let releaser = {
                let w = Arc::clone(&w);
                thread::spawn(move || w.deliver_to(&head, granted(1)))
            };
            let (late, named) = a.leave();
            assert!(named);
            match (releaser.join().unwrap(), late) {
                (Ok(()), Some(wake)) => assert_eq!(wake, granted(1)),
                (Err(Left::WithoutGrant), None) => {}
                other => panic!("grant lost or doubled: {other:?}"),
            }
            assert!(b.is_head());
            assert_eq!(pending(&b), [Wake::Attempt]);
        });
    }

    #[test]
    fn naming_and_a_grant_racing_leave_never_lose_it() {
        check(|| {
            let w = waiters();
            let a = w.join(TAG, "a", LEASE);
            let b = w.join(TAG, "b", LEASE);
            let releaser = {
                let w = Arc::clone(&w);
                thread::spawn(move || {
                    let head = w.next(TAG).unwrap();
                    let delivered = w.deliver_to(&head, granted(1));
                    (head.owner().to_owned(), delivered)
                })
            };
            let (late, a_named) = a.leave();
            let (named, delivered) = releaser.join().unwrap();
            let b_wakes = pending(&b);
            if named == "a" {
                assert!(a_named);
                match (delivered, late) {
                    (Ok(()), Some(_)) | (Err(Left::WithoutGrant), None) => {}
                    other => panic!("grant lost or doubled: {other:?}"),
                }
                assert_eq!(b_wakes, [Wake::Attempt]);
            } else {
                assert_eq!((late, a_named, delivered), (None, false, Ok(())));
                assert_eq!(b_wakes, [Wake::Attempt, granted(1)]);
            }
        });
    }

    #[test]
    fn a_handoff_racing_leave_is_taken_or_refused_in_every_interleaving() {
        check(|| {
            let w = waiters();
            let a = w.join(TAG, "a", LEASE);
            let listener = {
                let w = Arc::clone(&w);
                thread::spawn(move || w.deliver_handoff(TAG, "a", FencingToken::new(1)))
            };
            let (late, _) = a.leave();
            let delivered = listener.join().unwrap();
            assert_eq!(delivered, late.is_some());
            assert!(keys(&w).is_empty());
        });
    }

    /// A release names the head while the head makes its first attempt. The release's
    /// script runs after the naming, the attempt's after `attempt`; when the release's ran
    /// first, it may have put the waiter in Redis' queue, and a grant of a first attempt
    /// does not take that entry out: the waiter must know, whether it is granted (the
    /// grant's release takes the entry out) or refused (its leaving does).
    #[test]
    fn a_naming_before_a_first_attempt_runs_is_never_forgotten() {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Ran {
            Release,
            Attempt,
        }
        for granted in [true, false] {
            check(move || {
                let w = waiters();
                let a = w.join(TAG, "a", LEASE);
                let ran = Arc::new(Mutex::new(Vec::new()));
                let releaser = {
                    let (w, ran) = (Arc::clone(&w), Arc::clone(&ran));
                    thread::spawn(move || {
                        let named = w.next(TAG).is_some();
                        ran.lock().unwrap().push(Ran::Release);
                        named
                    })
                };
                let queue = a.attempt(Instant::now());
                ran.lock().unwrap().push(Ran::Attempt);
                let knows = if granted {
                    let queued = a.named();
                    a.leave_granted();
                    queued
                } else {
                    a.refused();
                    a.leave().1
                };
                let named = releaser.join().unwrap();
                let release_first = ran.lock().unwrap().first() == Some(&Ran::Release);
                if named && release_first {
                    assert!(
                        queue == JoinQueue::Rejoin || knows,
                        "a naming was forgotten: {queue:?}, granted: {granted}"
                    );
                }
            });
        }
    }

    /// The head and the waiter behind it leave at once: the one left is woken exactly once,
    /// whichever goes first.
    #[test]
    fn two_leaving_at_once_wake_the_one_left_exactly_once() {
        check(|| {
            let w = waiters();
            let a = w.join(TAG, "a", LEASE);
            let b = w.join(TAG, "b", LEASE);
            let c = w.join(TAG, "c", LEASE);
            let other = thread::spawn(move || {
                let _ = b.leave();
            });
            let _ = a.leave();
            other.join().unwrap();
            assert!(c.is_head());
            assert_eq!(pending(&c), [Wake::Attempt]);
        });
    }
}
