//! Handoff: a release grants the lock straight to the next waiter, in queue order across
//! clients, and a waiter that leaves (gives up, is cancelled, dies) does not keep the key.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockOptions;

use crate::support;
use crate::support::{
    await_queue_len, command_calls, example_bin, lock_client, lock_exists, ms, queue_len,
    release_channels, Child, RedisServer,
};

fn reset_stats(con: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
}

/// Each unlock's release script goes out behind a PING (in the same write, which this does not
/// check). Redis writes to the clients it has queued for writing the most recently queued
/// first, so with our connection queued by the PING's reply, a release message to another
/// client's waiter goes out before the script's reply to us, and the waiter's process wakes
/// first (timed in `benches/`, run Q of docs/benchmarks.md, not here). A lock sends none.
///
/// Fails without the PING (checked): no PING reaches Redis.
#[test]
fn unlocks_go_out_behind_a_ping() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    client.lock("warm").unwrap().unlock().unwrap();
    reset_stats(&mut con);
    let unlocks = 20;
    for i in 0..unlocks {
        client.lock(&format!("ping-{i}")).unwrap().unlock().unwrap();
    }
    let pings = command_calls(&mut con, "ping");
    // The pub/sub connection may add one or two: its connecting PING, if it comes up after the
    // reset, and its heartbeat, once a second.
    assert!(
        (unlocks..unlocks + 5).contains(&pings),
        "{pings} PING for {unlocks} unlocks"
    );
}

/// Threads of one client pass the lock on with one script call each: the release names the next
/// local waiter and grants it the lock in the same call. (Without handoff each acquisition took
/// an acquire, a release and, under contention, failed attempts: about three.)
#[test]
fn local_waiters_cost_one_script_call_per_acquisition() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    reset_stats(&mut con);
    let per_thread = 50;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || {
                for _ in 0..per_thread {
                    let guard = client.lock("relay").unwrap();
                    thread::sleep(ms(1));
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let acquisitions = 8 * per_thread;
    let calls = command_calls(&mut con, "evalsha");
    // Each acquisition has one release; a few first attempts (while nobody held) come on top.
    assert!(
        calls <= acquisitions + 16,
        "{calls} script calls for {acquisitions} acquisitions"
    );
    assert_eq!(
        command_calls(&mut con, "publish"),
        0,
        "local handoffs published"
    );
}

/// Two clients contending: every acquisition still costs about one script call. A release hands
/// the lock to the client's own next waiter up to 8 times in a row, then to the other client's
/// queued waiter, which hears of it by pub/sub and makes no attempt of its own.
#[test]
fn waiters_of_other_clients_are_granted_without_another_attempt() {
    let server = RedisServer::start();
    let clients = [lock_client(&server, 30_000), lock_client(&server, 30_000)];
    let mut con = server.connection();
    reset_stats(&mut con);
    let per_thread = 40;
    let last = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let client = clients[i % 2].clone();
            let last = Arc::clone(&last);
            thread::spawn(move || {
                for _ in 0..per_thread {
                    let guard = client.lock("relay").unwrap();
                    let token = guard.token().as_u64();
                    let before = last.swap(token, Ordering::SeqCst);
                    assert!(token > before, "token {token} after {before}");
                    thread::sleep(ms(1));
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let acquisitions = 8 * per_thread as u64;
    let calls = command_calls(&mut con, "evalsha");
    // A refused attempt joins the queue (the script's one HSET). How many a run takes depends
    // on scheduling: a thread that was not yet waiting when its client's turn ended asks again.
    // On a busy machine that was 45-86 per run; the rest stayed within one call per acquisition.
    let joins = command_calls(&mut con, "hset");
    assert!(
        calls - joins.min(calls) <= acquisitions + 16,
        "{calls} script calls ({joins} of them refused attempts) for {acquisitions} acquisitions"
    );
    assert!(
        joins <= acquisitions / 2,
        "{joins} refused attempts for {acquisitions} acquisitions"
    );
    // At least one handoff between the clients per 9 acquisitions, less a margin for the times
    // one client had nobody waiting.
    let publishes = command_calls(&mut con, "publish");
    assert!(
        publishes >= acquisitions / 18,
        "{publishes} handoffs between clients in {acquisitions} acquisitions"
    );
}

/// A handoff to another client's waiter is published on that client's own channel, so it wakes
/// no other client's dispatcher: each client has a channel, and only its dispatcher listens.
#[test]
fn a_handoff_is_published_only_to_the_waiters_client() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    let _bystander = lock_client(&server, 30_000);
    let mut con = server.connection();
    let start = Instant::now();
    while release_channels(&mut con).len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "three clients subscribed to {:?}",
            release_channels(&mut con)
        );
        thread::sleep(ms(5));
    }
    let channels = release_channels(&mut con);
    assert_eq!(channels.len(), 3, "one channel per client: {channels:?}");
    assert!(
        channels.iter().all(|(_, subscribers)| *subscribers == 1),
        "one subscriber per channel: {channels:?}"
    );

    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub
        .psubscribe(format!("{}:released:*", support::NAMESPACE))
        .unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let guard = holder.lock("k").unwrap();
    let t = thread::spawn(move || {
        let guard = waiter.lock("k").unwrap();
        let token = guard.token().as_u64();
        guard.unlock().unwrap();
        token
    });
    await_queue_len(&mut con, "k", 1);
    guard.unlock().unwrap();
    // Read before joining: a handoff published elsewhere would leave the waiter waiting a lease.
    let message = pubsub.get_message().expect("the handoff message");
    let token = t.join().unwrap();
    let payload: String = message.get_payload().unwrap();
    let parts: Vec<&str> = payload.split(' ').collect();
    assert_eq!(parts.len(), 3, "\"<token> <owner> <tag>\": {payload:?}");
    assert_eq!(parts[0], token.to_string(), "{payload:?}");
    let client_id = parts[1].split(':').next().unwrap();
    let channel = message.get_channel_name().to_owned();
    assert_eq!(
        channel,
        format!("{}:released:{client_id}", support::NAMESPACE),
        "published on the waiter's client's channel"
    );
    assert!(
        channels.iter().any(|(c, _)| *c == channel),
        "{channel:?} is a client's channel: {channels:?}"
    );
    // One handoff, one message: the waiter's own unlock (nobody waiting) publishes nothing.
    pubsub.set_read_timeout(Some(ms(300))).unwrap();
    let more = pubsub.get_message();
    assert!(
        more.as_ref().is_err_and(|e| e.is_timeout()),
        "a second message: {more:?}"
    );
}

/// A client passing a lock among its own busy threads lets another client's waiter in after at
/// most 8 local handoffs.
#[test]
fn local_handoffs_in_a_row_are_bounded() {
    let server = RedisServer::start();
    let busy = lock_client(&server, 30_000);
    let outsider = lock_client(&server, 30_000);
    let acquisitions = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (busy, acquisitions, stop) =
                (busy.clone(), Arc::clone(&acquisitions), Arc::clone(&stop));
            thread::spawn(move || {
                let start = Instant::now();
                while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    let guard = busy.lock("busy").unwrap();
                    acquisitions.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(ms(2));
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    thread::sleep(ms(100));
    let counted = Arc::clone(&acquisitions);
    let waiter = thread::spawn(move || {
        let guard = outsider.lock("busy").unwrap();
        let at_grant = counted.load(Ordering::SeqCst);
        guard.unlock().unwrap();
        at_grant
    });
    // Its first attempt queues it in Redis: count the holds from then to its grant. (Counting
    // from before its call counted holds that ran while its thread waited to be scheduled.)
    let mut con = server.connection();
    let _ = support::poll_until(Duration::from_secs(10), ms(1), || {
        if support::queue_len(&mut con, "busy") >= 1 || waiter.is_finished() {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    let before = acquisitions.load(Ordering::SeqCst);
    let passed = waiter.join().unwrap().saturating_sub(before);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    // 8 local handoffs, plus the hold that was running when it queued, plus one being granted
    // while it was told.
    assert!(
        passed <= 10,
        "{passed} local holds went before the queued waiter"
    );
}

/// Waiters of different clients are served in the order they started waiting.
#[test]
fn clients_are_served_in_the_order_they_queued() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = holder.lock("turns").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..5u64 {
        let client = lock_client(&server, 30_000);
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let got = client.lock("turns").unwrap();
            tx.send((i, got.token().as_u64())).unwrap();
            thread::sleep(ms(10));
            got.unlock().unwrap();
        }));
        await_queue_len(&mut con, "turns", i + 1);
    }
    guard.unlock().unwrap();
    let served: Vec<(u64, u64)> = (0..5)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let order: Vec<u64> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, vec![0, 1, 2, 3, 4], "not served in queue order");
    assert!(
        served.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens not increasing: {served:?}"
    );
    assert_eq!(queue_len(&mut con, "turns"), 0);
}

/// A waiter that gave up (timeout) or was cancelled leaves the queue in Redis: the next release
/// frees the key instead of granting it to somebody who is gone.
#[test]
fn a_waiter_that_leaves_is_not_handed_the_lock() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let quitter = lock_client(&server, 30_000);
    let other = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = holder.lock("left").unwrap();

    assert!(quitter.try_lock("left", ms(200)).unwrap().is_none());
    assert_eq!(queue_len(&mut con, "left"), 0, "the waiter stayed queued");
    let (cancel_tx, cancel_rx) = crossbeam_channel::bounded(1);
    let cancelled = {
        let quitter = quitter.clone();
        thread::spawn(move || quitter.lock_with("left", &LockOptions::new().cancel(cancel_rx)))
    };
    await_queue_len(&mut con, "left", 1);
    cancel_tx.send(()).unwrap();
    assert!(cancelled.join().unwrap().unwrap_err().is_cancelled());
    assert_eq!(queue_len(&mut con, "left"), 0, "a waiter stayed queued");

    guard.unlock().unwrap();
    assert!(
        !lock_exists(&mut con, "left"),
        "handed to a waiter that left"
    );
    assert!(other.try_lock("left", Duration::ZERO).unwrap().is_some());
}

/// A handoff reaches a waiter that has been waiting longer than half its lease: the waiter cannot
/// tell how much of the handed lease is left, so it confirms the lease before returning, and the
/// guard it gets is held and stays held.
#[test]
fn a_long_wait_ends_in_a_confirmed_lease() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let waiter = lock_client(&server, 30_000);
    let guard = holder.lock("long").unwrap();
    let t = thread::spawn(move || {
        let got = waiter
            .lock_with("long", &LockOptions::new().lease(ms(300)))
            .unwrap();
        let held_at_once = got.is_held();
        thread::sleep(ms(600));
        (held_at_once, got.is_held(), got.unlock())
    });
    // The waiter waits in Redis' queue: the lock is handed to it.
    await_queue_len(&mut server.connection(), "long", 1);
    guard.unlock().unwrap();
    let (at_once, later, unlocked) = t.join().unwrap();
    assert!(at_once, "the handed-over guard was not held");
    assert!(later, "the handed-over lease was not renewed");
    unlocked.unwrap();
}

/// A waiter whose process dies while queued is handed the lock like any other; nobody renews
/// it, so the key is free again once that waiter's lease runs out. This is the cost of a grant
/// without a second round trip, bounded by the dead waiter's lease.
#[test]
fn a_waiter_that_dies_holds_the_key_for_at_most_its_lease() {
    let server = RedisServer::start();
    let holder = lock_client(&server, 30_000);
    let next = lock_client(&server, 30_000);
    let mut con = server.connection();
    let guard = holder.lock("dead-waiter").unwrap();
    let mut child = Child::spawn({
        let mut cmd = Command::new(example_bin("hold"));
        cmd.args(["dead-waiter", "1000"])
            .env("REDIS_URL", server.url())
            .env("FENCELOCK_NAMESPACE", support::NAMESPACE);
        cmd
    });
    await_queue_len(&mut con, "dead-waiter", 1);
    child.kill();
    guard.unlock().unwrap();
    assert!(lock_exists(&mut con, "dead-waiter"), "not handed over");
    let released = Instant::now();
    let got = next.lock("dead-waiter").unwrap();
    let waited = released.elapsed();
    assert!(
        waited <= Duration::from_millis(2_500),
        "waited {waited:?} behind a dead waiter with a 1 s lease"
    );
    got.unlock().unwrap();
}

/// A waiter's first attempt joins the queue, its reply is lost with the connection, and the
/// attempt runs again once the lock is free: the grant takes the waiter out of the queue.
/// Otherwise its entry stays, and a later release hands the lock to a finished owner, which then
/// holds the key for a whole lease.
#[test]
fn a_first_attempt_run_again_leaves_no_queue_entry() {
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port());
    let holder = lock_client(&server, 60_000);
    let _held = holder
        .lock_with("rerun", &LockOptions::new().renew(false))
        .unwrap();
    // Requests reach Redis 1 s after they are sent, replies the caller 1 s after that.
    proxy.set_mode(support::proxy::Mode::Delay(ms(1_000)));
    let waiter = fencelock::LockClient::builder(proxy.url())
        .namespace(support::NAMESPACE)
        .lease(ms(5_000))
        .connection_timeout(ms(20_000))
        .response_timeout(ms(20_000))
        .build()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let guard = waiter.lock("rerun");
        tx.send(guard.is_ok()).unwrap();
        guard.map(|g| g.unlock())
    });
    let mut con = server.connection();
    // The first attempt found the lock held and queued the waiter; its reply is on its way.
    let start = Instant::now();
    while queue_len(&mut con, "rerun") == 0 {
        assert!(start.elapsed() < ms(30_000), "the waiter never queued");
        thread::sleep(ms(2));
    }
    // The holder's lease ends (as if it ran out), and the reply is lost: the attempt runs again,
    // on a new connection, and finds the lock free.
    let _: () = redis::cmd("DEL")
        .arg(support::lock_key("rerun"))
        .query(&mut con)
        .unwrap();
    proxy.set_mode(support::proxy::Mode::Reset);
    proxy.set_mode(support::proxy::Mode::Pass);
    assert!(
        rx.recv_timeout(ms(30_000)).unwrap(),
        "the waiter got no lock"
    );
    assert!(lock_exists(&mut con, "rerun"));
    assert_eq!(
        queue_len(&mut con, "rerun"),
        0,
        "the granted waiter is still queued"
    );
    let entries: u64 = redis::cmd("HLEN")
        .arg(format!("{}:waiters:{{rerun}}", support::NAMESPACE))
        .query(&mut con)
        .unwrap();
    assert_eq!(entries, 0);
    handle.join().unwrap().unwrap().unwrap();
}
