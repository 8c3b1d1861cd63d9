//! Never more than N permits at once, with many threads on several clients; tokens unique and
//! rising.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{lock_client, RedisServer};

/// One permit held, as the holder saw it: from after the grant to before the release, so
/// within the time Redis counted it held; and from before the acquire call to after the
/// release's reply, so around it.
#[derive(Debug, Clone, Copy)]
struct Held {
    holder: usize,
    token: u64,
    start: Instant,
    end: Instant,
    asked: Instant,
    released: Instant,
}

/// The most permits held at one moment. At equal instants an end counts before a start: each
/// recorded interval lies inside the permit's hold in Redis, so touching ones never overlapped.
fn most_at_once(holds: &[Held]) -> usize {
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Shown to fire: with permit_acquire.lua off by one (`free = count + 1 - held`) it fails with
/// "4 permits held at once, of 3".
#[test]
fn never_more_than_n_permits_with_many_threads_on_several_clients() {
    const N: u32 = 3;
    let server = RedisServer::start();
    let clients = [
        lock_client(&server, 2_000),
        lock_client(&server, 2_000),
        lock_client(&server, 2_000),
    ];
    let holds = Mutex::new(Vec::new());
    let stop = Instant::now() + Duration::from_secs(3);
    thread::scope(|s| {
        for holder in 0..12 {
            let semaphore = clients[holder % clients.len()]
                .semaphore("pool", N)
                .unwrap();
            let holds = &holds;
            s.spawn(move || {
                let mut last = 0;
                while Instant::now() < stop {
                    let asked = Instant::now();
                    let permit = semaphore.acquire().unwrap();
                    let start = Instant::now();
                    assert!(permit.is_held());
                    let token = permit.token().as_u64();
                    assert!(token > last, "thread {holder}: token {token} after {last}");
                    last = token;
                    thread::sleep(Duration::from_micros(500));
                    let end = Instant::now();
                    permit.release().unwrap();
                    holds.lock().unwrap().push(Held {
                        holder,
                        token,
                        start,
                        end,
                        asked,
                        released: Instant::now(),
                    });
                }
            });
        }
    });
    let holds = holds.into_inner().unwrap();
    assert!(
        holds.len() >= 200,
        "only {} grants in 3 s: the test proves little",
        holds.len()
    );
    let most = most_at_once(&holds);
    assert!(most <= N as usize, "{most} permits held at once, of {N}");
    assert_eq!(
        most, N as usize,
        "never {N} permits at once: the test proves little"
    );
    // Unique, and a grant asked for after another's release was confirmed has the larger
    // token.
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "a token was granted twice");
    let mut by_release = holds.clone();
    by_release.sort_by_key(|h| h.released);
    let mut by_ask = holds.clone();
    by_ask.sort_by_key(|h| h.asked);
    // For each hold, the largest token among the holds released before it was asked for.
    let mut highest_ended = 0;
    let mut ended = by_release.iter().peekable();
    for h in &by_ask {
        while let Some(e) = ended.next_if(|e| e.released < h.asked) {
            highest_ended = highest_ended.max(e.token);
        }
        assert!(
            h.token > highest_ended,
            "thread {}: token {} granted after a release of token {highest_ended}",
            h.holder,
            h.token
        );
    }
    for holder in 0..12 {
        assert!(
            holds.iter().any(|h| h.holder == holder),
            "thread {holder} never got a permit"
        );
    }
}

#[test]
fn a_permit_dropped_or_released_is_free_again_and_tokens_rise() {
    let server = RedisServer::start();
    let client = lock_client(&server, 5_000);
    let pool = client.semaphore("pair", 2).unwrap();
    let a = pool.acquire().unwrap();
    let b = pool
        .try_acquire(Duration::ZERO)
        .unwrap()
        .expect("second permit");
    assert!(b.token() > a.token());
    assert!(pool.try_acquire(Duration::ZERO).unwrap().is_none());
    drop(a);
    let c = pool.try_acquire(Duration::ZERO).unwrap().expect("dropped");
    assert!(c.token() > b.token());
    b.release().unwrap();
    let d = pool.try_acquire(Duration::ZERO).unwrap().expect("released");
    assert!(d.token() > c.token());
    assert_eq!(pool.status().unwrap().held, 2);
    drop((c, d));
    let status = pool.status().unwrap();
    assert_eq!((status.held, status.waiters, status.permits), (0, 0, 2));
    // Nothing is left behind once nobody holds or waits, but the fence counter.
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query(&mut con).unwrap();
    assert_eq!(keys, vec!["test:fence:{%semaphore:pair}".to_owned()]);
}
