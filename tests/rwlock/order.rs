//! The queue's policy: first come, first served. A writer is not starved by a steady stream of
//! readers; a writer's release admits every reader waiting at the head of the queue at once, up
//! to the next writer; the last reader's release hands over to that writer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{lock_client, ms, RedisServer};
use crate::{await_waiting, tag};

/// Shown to fire: with rw_acquire.lua letting a reader in past a waiting writer (the
/// `writer_before` check removed) the writer waits until the readers stop.
#[test]
fn a_writer_is_not_starved_by_a_steady_stream_of_readers() {
    let server = RedisServer::start();
    // Long leases: nothing here comes back by a lease running out.
    let readers = [lock_client(&server, 30_000), lock_client(&server, 30_000)];
    let writer = lock_client(&server, 30_000);
    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    let (wrote_tx, wrote) = mpsc::channel();
    thread::scope(|s| {
        for i in 0..6 {
            let (client, stop, reads) = (&readers[i % 2], &stop, &reads);
            s.spawn(move || {
                // Bounded: the test stops the readers within 20 s at most.
                let until = Instant::now() + Duration::from_secs(20);
                // Staggered starts and unequal holds: some reader holds at every moment.
                thread::sleep(ms(5 * i as u64));
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    let guard = client.read_lock("stream").unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(ms(25 + 4 * i as u64));
                    drop(guard);
                }
            });
        }
        // Readers overlap all the time now.
        let start = Instant::now();
        while reads.load(Ordering::Relaxed) < 30 {
            assert!(start.elapsed() < Duration::from_secs(10), "readers stalled");
            thread::sleep(ms(5));
        }
        let (writer, wrote_tx) = (&writer, wrote_tx);
        s.spawn(move || {
            let asked = Instant::now();
            let guard = writer.write_lock("stream").unwrap();
            wrote_tx.send((asked.elapsed(), guard.token())).unwrap();
            thread::sleep(ms(50));
            drop(guard);
        });
        let got = wrote.recv_timeout(Duration::from_secs(5));
        let reads_then = reads.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        let (took, _) = got.expect("the writer waited 5 s behind a stream of readers");
        assert!(took < Duration::from_secs(3), "the writer waited {took:?}");
        assert!(reads_then >= 30, "{reads_then} reads");
    });
}

#[test]
fn a_writers_release_admits_every_waiting_reader_at_once_up_to_the_next_writer() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // Long leases: a waiter asks again by itself only after 5 s, so a grant within that comes
    // from a release.
    let first = lock_client(&server, 30_000);
    let w1 = first.write_lock("batch").unwrap();
    let (tx, granted) = mpsc::channel();
    let mut waiters = Vec::new();
    let mut waiting = 0;
    // Four readers, a writer, a reader: each on a client of its own, queued in that order.
    for (i, write) in [false, false, false, false, true, false]
        .into_iter()
        .enumerate()
    {
        let client = lock_client(&server, 30_000);
        let tx = tx.clone();
        let (go_tx, go) = mpsc::channel::<()>();
        waiters.push((
            go_tx,
            thread::spawn(move || {
                let (token, held) = if write {
                    let guard = client.write_lock("batch").unwrap();
                    tx.send((i, Instant::now(), guard.token().as_u64()))
                        .unwrap();
                    go.recv().unwrap();
                    (guard.token(), guard.is_held())
                } else {
                    let guard = client.read_lock("batch").unwrap();
                    tx.send((i, Instant::now(), guard.token().as_u64()))
                        .unwrap();
                    go.recv().unwrap();
                    (guard.token(), guard.is_held())
                };
                assert!(held, "waiter {i} lost its grant while held");
                token
            }),
        ));
        waiting += 1;
        await_waiting(&mut con, "batch", waiting);
    }
    let w1_token = w1.token().as_u64();
    let released = Instant::now();
    w1.unlock().unwrap();
    let mut batch = Vec::new();
    for _ in 0..4 {
        let (i, at, token) = granted.recv_timeout(Duration::from_secs(10)).unwrap();
        let took = at - released;
        assert!(
            took < ms(2_500),
            "reader {i} got in {took:?} after the release"
        );
        assert!(token > w1_token);
        batch.push(i);
    }
    batch.sort_unstable();
    assert_eq!(batch, vec![0, 1, 2, 3], "not the four readers first");
    // The writer and the reader behind it still wait: the four hold together.
    assert!(granted.recv_timeout(ms(300)).is_err());
    assert_eq!(crate::support::queue_len(&mut con, &tag("batch")), 2);
    let readers: Vec<_> = waiters.drain(..4).collect();
    let mut read_tokens = Vec::new();
    let last = readers.len() - 1;
    for (n, (go, handle)) in readers.into_iter().enumerate() {
        go.send(()).unwrap();
        read_tokens.push(handle.join().unwrap().as_u64());
        if n < last {
            assert!(
                granted.recv_timeout(ms(100)).is_err(),
                "the writer got in beside a reader"
            );
        }
    }
    // The last reader's release hands over to the writer, the writer's to the last reader.
    let (i, _, w2_token) = granted.recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(i, 4);
    assert!(read_tokens.iter().all(|t| *t < w2_token));
    assert!(granted.recv_timeout(ms(100)).is_err());
    let (go, handle) = waiters.remove(0);
    go.send(()).unwrap();
    handle.join().unwrap();
    let (i, _, r_token) = granted.recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(i, 5);
    assert!(r_token > w2_token);
    let (go, handle) = waiters.remove(0);
    go.send(()).unwrap();
    handle.join().unwrap();
}

#[test]
fn a_writer_giving_up_at_the_head_of_the_queue_lets_the_readers_behind_it_in_at_once() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // Long leases: a waiter asks again by itself only after 5 s.
    let (holder, writer, reader) = (
        lock_client(&server, 30_000),
        lock_client(&server, 30_000),
        lock_client(&server, 30_000),
    );
    let held = holder.read_lock("leave").unwrap();
    let gave_up = thread::spawn(move || {
        let got = writer.try_write_lock("leave", ms(1_000)).unwrap();
        assert!(got.is_none(), "the writer got in beside a reader");
        Instant::now()
    });
    await_waiting(&mut con, "leave", 1);
    let waiting = thread::spawn(move || {
        let guard = reader.read_lock("leave").unwrap();
        (Instant::now(), guard)
    });
    await_waiting(&mut con, "leave", 2);
    let gave_up = gave_up.join().unwrap();
    let (at, guard) = waiting.join().unwrap();
    let took = at.saturating_duration_since(gave_up);
    assert!(
        took < ms(2_500),
        "the reader got in {took:?} after the writer gave up"
    );
    assert!(guard.is_held() && held.is_held());
}
