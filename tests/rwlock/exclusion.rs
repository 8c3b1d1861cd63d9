//! Never a writer beside readers or another writer, checked over recorded intervals with many
//! threads on several clients; readers do hold together; tokens follow the writes.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{lock_client, RedisServer};

/// One grant, as the holder saw it: from after the grant to before the release, so within the
/// time Redis counted it held.
#[derive(Debug, Clone, Copy)]
struct Held {
    holder: usize,
    write: bool,
    token: u64,
    start: Instant,
    end: Instant,
}

/// The first pair of grants that overlap with a write among them, if any. Each recorded
/// interval lies inside the grant's hold in Redis, so touching ones never overlapped.
fn write_overlap(holds: &[Held]) -> Option<(Held, Held)> {
    let mut by_start = holds.to_vec();
    by_start.sort_by_key(|h| h.start);
    // The grant ending last among those started so far, and the write ending last.
    let mut last: Option<Held> = None;
    let mut last_write: Option<Held> = None;
    for h in by_start {
        if let Some(w) = last_write.filter(|w| w.end > h.start) {
            return Some((w, h));
        }
        if let Some(g) = last.filter(|g| h.write && g.end > h.start) {
            return Some((g, h));
        }
        if last.is_none_or(|g| h.end > g.end) {
            last = Some(h);
        }
        if h.write && last_write.is_none_or(|w| h.end > w.end) {
            last_write = Some(h);
        }
    }
    None
}

/// The most readers that held at one moment.
fn most_readers_at_once(holds: &[Held]) -> usize {
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .filter(|h| !h.write)
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

/// Shown to fire: with rw_acquire.lua letting a writer in beside live readers (the `reading > 0`
/// check removed) it fails with "a write overlapped another grant".
#[test]
fn never_a_writer_beside_readers_or_another_writer() {
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
            let client = &clients[holder % clients.len()];
            let holds = &holds;
            s.spawn(move || {
                let mut round = 0usize;
                while Instant::now() < stop {
                    // One grant in four a write, at different rounds on different threads.
                    let write = (round + holder).is_multiple_of(4);
                    round += 1;
                    let (token, start, end) = if write {
                        let guard = client.write_lock("config").unwrap();
                        let start = Instant::now();
                        assert!(guard.is_held());
                        thread::sleep(Duration::from_micros(300));
                        let end = Instant::now();
                        let token = guard.token().as_u64();
                        guard.unlock().unwrap();
                        (token, start, end)
                    } else {
                        let guard = client.read_lock("config").unwrap();
                        let start = Instant::now();
                        assert!(guard.is_held());
                        thread::sleep(Duration::from_millis(2));
                        let end = Instant::now();
                        let token = guard.token().as_u64();
                        guard.unlock().unwrap();
                        (token, start, end)
                    };
                    holds.lock().unwrap().push(Held {
                        holder,
                        write,
                        token,
                        start,
                        end,
                    });
                }
            });
        }
    });
    let holds = holds.into_inner().unwrap();
    let writes = holds.iter().filter(|h| h.write).count();
    let reads = holds.len() - writes;
    assert!(
        writes >= 30 && reads >= 90,
        "only {writes} writes and {reads} reads in 3 s: the test proves little"
    );
    if let Some((a, b)) = write_overlap(&holds) {
        panic!("a write overlapped another grant: {a:?} and {b:?}");
    }
    let most = most_readers_at_once(&holds);
    assert!(
        most >= 2,
        "readers never held together: the test proves little"
    );

    // Unique tokens; and around each write, every grant that started before it has a smaller
    // token and every one after it a larger: a write excludes the others, so its recorded
    // interval orders it against each of them as Redis granted them.
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "a token was granted twice");
    let mut by_start = holds.clone();
    by_start.sort_by_key(|h| h.start);
    for (i, w) in by_start.iter().enumerate().filter(|(_, h)| h.write) {
        let before = by_start[..i].iter().map(|h| h.token).max().unwrap_or(0);
        let after = by_start[i + 1..]
            .iter()
            .map(|h| h.token)
            .min()
            .unwrap_or(u64::MAX);
        assert!(
            before < w.token && w.token < after,
            "thread {}: write token {} between grants of tokens {before} and {after}",
            w.holder,
            w.token
        );
    }
    for holder in 0..12 {
        assert!(
            holds.iter().any(|h| h.holder == holder && h.write),
            "thread {holder} never wrote"
        );
    }
}
