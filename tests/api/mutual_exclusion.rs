//! Many threads over two clients on one key: the recorded history has no overlapping holds and
//! tokens strictly increase in grant order. And the checker is proven to fire on a broken lock.

use std::thread;
use std::time::{Duration, Instant};

use crate::support::history::{History, Hold};
use crate::support::{lock_client, RedisServer};

#[test]
fn sixteen_threads_on_two_clients_never_overlap() {
    let server = RedisServer::start();
    let clients = [lock_client(&server, 2_000), lock_client(&server, 2_000)];
    let history = History::new();
    let stop = Instant::now() + Duration::from_secs(3);
    thread::scope(|s| {
        for holder in 0..16 {
            let client = clients[holder % 2].clone();
            let history = &history;
            s.spawn(move || {
                while Instant::now() < stop {
                    let guard = client.lock("hot").unwrap();
                    let start = Instant::now();
                    assert!(guard.is_held());
                    thread::sleep(Duration::from_micros(300));
                    let end = Instant::now();
                    history.record(Hold {
                        key: "hot".into(),
                        holder,
                        token: guard.token().as_u64(),
                        start,
                        end,
                    });
                    guard.unlock().unwrap();
                }
            });
        }
    });
    let checked = history
        .check()
        .unwrap_or_else(|e| panic!("history violated: {e}"));
    assert!(
        checked >= 200,
        "only {checked} grants in 3 s: the test proves little"
    );
    for holder in 0..16 {
        let n = history
            .holds()
            .iter()
            .filter(|h| h.holder == holder)
            .count();
        assert!(n > 0, "thread {holder} never got the lock");
    }
}

/// The common first attempt without atomicity: GET, then SET if empty, with a counter bumped by
/// GET + SET. Overlaps and repeated tokens follow, and the checker must say so.
#[test]
fn checker_fires_on_a_broken_lock() {
    let server = RedisServer::start();
    let history = History::new();
    let stop = Instant::now() + Duration::from_secs(1);
    thread::scope(|s| {
        for holder in 0..8 {
            let history = &history;
            let mut con = server.connection();
            s.spawn(move || {
                while Instant::now() < stop {
                    loop {
                        let owner: Option<String> =
                            redis::cmd("GET").arg("k").query(&mut con).unwrap();
                        if owner.is_none() {
                            thread::sleep(Duration::from_micros(500));
                            let _: () = redis::cmd("SET")
                                .arg("k")
                                .arg(holder)
                                .query(&mut con)
                                .unwrap();
                            break;
                        }
                    }
                    let last: Option<u64> = redis::cmd("GET").arg("n").query(&mut con).unwrap();
                    let token = last.unwrap_or(0) + 1;
                    let _: () = redis::cmd("SET")
                        .arg("n")
                        .arg(token)
                        .query(&mut con)
                        .unwrap();
                    let start = Instant::now();
                    thread::sleep(Duration::from_micros(300));
                    let end = Instant::now();
                    history.record(Hold {
                        key: "k".into(),
                        holder,
                        token,
                        start,
                        end,
                    });
                    let _: () = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
                }
            });
        }
    });
    let verdict = history.check();
    assert!(
        verdict.is_err(),
        "checker passed a broken lock over {} holds",
        history.len()
    );
}
