//! Read-write locks under faults: a holder process frozen (SIGSTOP) past its lease loses its
//! grant and the others proceed, and it knows when it wakes; a reader killed (SIGKILL) with a
//! writer and readers queued behind it hands over in queue order; Redis killed and restarted with
//! AOF keeps the grants, without persistence loses them (the holder hears of it) while tokens
//! still rise; a writer queued behind a frozen reader is not overtaken by the readers that come
//! after it.

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::await_waiting;
use crate::support::{example_bin, lock_client, ms, Child, RedisServer, NAMESPACE};

fn holder(server: &RedisServer, name: &str, mode: &str, lease_ms: u64) -> Child {
    let mut cmd = Command::new(example_bin("hold_rw"));
    cmd.args([name, mode, &lease_ms.to_string()])
        .env("REDIS_URL", server.url())
        .env("FENCELOCK_NAMESPACE", NAMESPACE);
    Child::spawn(cmd)
}

fn token(line: &str) -> u64 {
    line.trim_start_matches("token ").trim().parse().unwrap()
}

/// Shown to fail with a grant's `is_held()` not looking at its local deadline: the reader, woken,
/// says `held=true` before its renewal finds the grant gone.
#[test]
fn a_frozen_reader_loses_its_grant_a_writer_proceeds_and_the_reader_knows_on_waking() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let reader = holder(&server, "frozen-r", "read", 1_000);
    let t_read = token(&reader.expect_line("token ", Duration::from_secs(20)));
    let client = lock_client(&server, 30_000);
    assert!(client
        .try_write_lock("frozen-r", Duration::ZERO)
        .unwrap()
        .is_none());

    reader.pause();
    let frozen = Instant::now();
    let w = client
        .try_write_lock("frozen-r", Duration::from_secs(10))
        .unwrap()
        .expect("the frozen reader's lock, once its lease ran out");
    let took = frozen.elapsed();
    assert!(took < lease + ms(2_000), "came back after {took:?}");
    assert!(w.token().as_u64() > t_read);

    // Woken, the reader finds its grant gone; its unlock says so and leaves the writer alone.
    reader.resume();
    reader.send_line("");
    reader.expect_line("held=false", Duration::from_secs(10));
    reader.expect_line("lost", Duration::from_secs(10));
    assert!(w.is_held());
    let other = lock_client(&server, 30_000);
    assert!(other
        .try_read_lock("frozen-r", Duration::ZERO)
        .unwrap()
        .is_none());
    w.unlock().unwrap();
}

/// Shown to fail as the frozen reader's test is.
#[test]
fn a_frozen_writer_loses_its_grant_readers_proceed_and_the_writer_knows_on_waking() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let writer = holder(&server, "frozen-w", "write", 1_000);
    let t_write = token(&writer.expect_line("token ", Duration::from_secs(20)));
    let a = lock_client(&server, 30_000);
    let b = lock_client(&server, 30_000);
    assert!(a
        .try_read_lock("frozen-w", Duration::ZERO)
        .unwrap()
        .is_none());

    writer.pause();
    let frozen = Instant::now();
    // Two readers on two clients wait for it together.
    let (tx, rx) = mpsc::channel();
    for client in [a.clone(), b.clone()] {
        let tx = tx.clone();
        thread::spawn(move || {
            let got = client.try_read_lock("frozen-w", Duration::from_secs(10));
            let _ = tx.send((Instant::now(), got));
        });
    }
    let mut guards = Vec::new();
    for _ in 0..2 {
        let (at, got) = rx.recv_timeout(Duration::from_secs(15)).expect("an answer");
        let guard = got.unwrap().expect("the frozen writer's lock, to read");
        let took = at.duration_since(frozen);
        assert!(took < lease + ms(2_000), "came back after {took:?}");
        assert!(guard.token().as_u64() > t_write);
        guards.push(guard);
    }
    assert!(guards.iter().all(|g| g.is_held()));

    writer.resume();
    writer.send_line("");
    writer.expect_line("held=false", Duration::from_secs(10));
    writer.expect_line("lost", Duration::from_secs(10));
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.unlock().unwrap();
    }
}

/// A reader killed while a writer waits, and a reader waits behind the writer: the writer gets it
/// when the dead reader's lease runs out, the reader behind only after the writer's release.
/// Shown to fail with `rw_acquire.lua` letting a reader in past a waiting writer: the reader
/// behind the writer is granted at once and never queues.
#[test]
fn a_killed_reader_hands_over_in_queue_order() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let mut reader = holder(&server, "killed-r", "read", 1_000);
    let t_read = token(&reader.expect_line("token ", Duration::from_secs(20)));
    let w_client = lock_client(&server, 30_000);
    let r_client = lock_client(&server, 30_000);
    let mut con = server.connection();

    let (w_tx, w_rx) = mpsc::channel();
    let wc = w_client.clone();
    thread::spawn(move || {
        let got = wc.try_write_lock("killed-r", Duration::from_secs(10));
        let _ = w_tx.send((Instant::now(), got));
    });
    await_waiting(&mut con, "killed-r", 1);
    let (r_tx, r_rx) = mpsc::channel();
    let rc = r_client.clone();
    thread::spawn(move || {
        let got = rc.try_read_lock("killed-r", Duration::from_secs(15));
        let _ = r_tx.send((Instant::now(), got));
    });
    await_waiting(&mut con, "killed-r", 2);

    reader.kill();
    let killed = Instant::now();
    let (w_at, w) = w_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the writer's answer");
    let w = w.unwrap().expect("the killed reader's lock, to write");
    assert!(
        w_at.duration_since(killed) < lease + ms(2_000),
        "the writer waited {:?}",
        w_at.duration_since(killed)
    );
    assert!(w.token().as_u64() > t_read);
    // The reader behind it waits while the writer holds.
    thread::sleep(ms(200));
    assert!(
        r_rx.try_recv().is_err(),
        "a reader was let in beside the writer"
    );
    let t_write = w.token().as_u64();
    let released = Instant::now();
    w.unlock().unwrap();
    let (r_at, r) = r_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the reader's answer");
    let r = r.unwrap().expect("the lock, to read, after the writer");
    assert!(r_at >= released);
    assert!(r.token().as_u64() > t_write);
}

/// With AOF (`appendfsync always`), grants held across a kill and restart of Redis stay their
/// holders': the writer still holds after the restart, a reader is refused until it unlocks,
/// and then gets the lock with a higher token. Shown to fail with the server started without
/// persistence: the reader is granted beside the writer.
#[test]
fn grants_survive_a_restart_with_aof() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let writer = lock_client(&server, 2_000);
    let reader = lock_client(&server, 2_000);
    let w = writer.write_lock("restart").unwrap();
    let t_write = w.token().as_u64();

    server.kill();
    thread::sleep(ms(200));
    server.restart();
    // Several renewals (a third of the lease apart) after the restart: the grant is still ours.
    let until = Instant::now() + ms(3_000);
    while Instant::now() < until {
        assert!(w.is_held(), "the writer lost its grant across the restart");
        // An error while the reader's client reconnects is no grant either.
        if let Ok(Some(_)) = reader.try_read_lock("restart", Duration::ZERO) {
            panic!("a reader was granted beside the restored writer");
        }
        thread::sleep(ms(100));
    }
    w.unlock().unwrap();
    let r = reader
        .try_read_lock("restart", Duration::from_secs(5))
        .unwrap()
        .expect("the lock after the writer's release");
    assert!(r.token().as_u64() > t_write);

    // The same with readers held: a writer is refused until both release.
    let r2 = writer
        .try_read_lock("restart", Duration::ZERO)
        .unwrap()
        .expect("a second reader");
    let t_reads = r.token().as_u64().max(r2.token().as_u64());
    server.kill();
    thread::sleep(ms(200));
    server.restart();
    let until = Instant::now() + ms(3_000);
    while Instant::now() < until {
        assert!(r.is_held() && r2.is_held(), "a reader lost its grant");
        if let Ok(Some(_)) = writer.try_write_lock("restart", Duration::ZERO) {
            panic!("a writer was granted beside the restored readers");
        }
        thread::sleep(ms(100));
    }
    r.unlock().unwrap();
    r2.unlock().unwrap();
    let w = writer
        .try_write_lock("restart", Duration::from_secs(5))
        .unwrap()
        .expect("the lock after both readers released");
    assert!(w.token().as_u64() > t_reads);
}

/// Without persistence a restart forgets every grant: a writer held across it hears of the loss
/// (`lost()`) within about a lease, a reader is granted, and every token is still above every
/// earlier one (the clock floor: the fence counter restarted at zero). Shown to fail with the
/// token taken from the counter alone (no clock floor in `grant.lua`): the first grant after the
/// restart repeats token 1.
#[test]
fn without_persistence_a_restart_loses_the_grants_and_tokens_still_rise() {
    let mut server = RedisServer::start();
    let lease = ms(1_000);
    let writer = lock_client(&server, 1_000);
    let reader = lock_client(&server, 1_000);
    let mut last = 0;
    for round in 0..3 {
        let w = writer.write_lock("empty").unwrap();
        assert!(
            w.token().as_u64() > last,
            "round {round}: {} after {last}",
            w.token()
        );
        last = w.token().as_u64();
        server.kill();
        thread::sleep(ms(200));
        server.restart();
        let restarted = Instant::now();
        w.lost()
            .recv_timeout(lease + ms(3_000))
            .expect("the writer to hear that its grant is gone");
        assert!(!w.is_held());
        assert!(restarted.elapsed() < lease + ms(3_000));
        let r = reader
            .try_read_lock("empty", Duration::from_secs(5))
            .unwrap()
            .expect("a reader after the restart");
        assert!(
            r.token().as_u64() > last,
            "round {round}: {} after {last}",
            r.token()
        );
        last = r.token().as_u64();
        // The lost writer's unlock says so, and leaves the reader alone.
        assert!(w.unlock().unwrap_err().is_lock_lost());
        assert!(r.is_held());
        r.unlock().unwrap();
    }
}

/// A writer queued behind a frozen reader, and a steady stream of readers after it: none of them
/// is granted before the writer, which gets the lock when the frozen reader's lease runs out.
/// Shown to fail with `rw_acquire.lua` letting a reader in past a waiting writer: the stream's
/// readers join the frozen one and the writer waits behind them.
#[test]
fn a_writer_behind_a_frozen_reader_is_not_overtaken_by_the_readers_after_it() {
    let server = RedisServer::start();
    let lease = ms(1_000);
    let frozen = holder(&server, "stream-f", "read", 1_000);
    let t_frozen = token(&frozen.expect_line("token ", Duration::from_secs(20)));
    frozen.pause();
    let w_client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let (w_tx, w_rx) = mpsc::channel();
    let wc = w_client.clone();
    thread::spawn(move || {
        let got = wc.try_write_lock("stream-f", Duration::from_secs(10));
        let grant_at = Instant::now();
        let out = got.map(|g| {
            g.map(|g| {
                let t = g.token().as_u64();
                thread::sleep(ms(50));
                g.unlock().unwrap();
                t
            })
        });
        let _ = w_tx.send((grant_at, out));
    });
    await_waiting(&mut con, "stream-f", 1);
    let queued = Instant::now();

    // Readers on three clients, asking one after another until the writer is through.
    let (r_tx, r_rx) = mpsc::channel();
    let readers: Vec<_> = (0..3).map(|_| lock_client(&server, 30_000)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for (i, client) in readers.into_iter().enumerate() {
        let (r_tx, stop) = (r_tx.clone(), stop.clone());
        handles.push(thread::spawn(move || {
            thread::sleep(ms(10 * i as u64));
            let until = Instant::now() + Duration::from_secs(15);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                let asked = Instant::now();
                if let Ok(Some(g)) = client.try_read_lock("stream-f", Duration::from_secs(5)) {
                    let _ = r_tx.send((asked, g.token().as_u64()));
                    thread::sleep(ms(20));
                    drop(g);
                }
            }
        }));
    }
    let (w_at, w) = w_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the writer's answer");
    let t_write = w
        .unwrap()
        .expect("the writer, once the frozen reader's lease ran out");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let took = w_at.duration_since(queued);
    assert!(took < lease + ms(2_000), "the writer waited {took:?}");
    assert!(t_write > t_frozen);
    let reads: Vec<(Instant, u64)> = r_rx.try_iter().collect();
    assert!(!reads.is_empty(), "no reader after the writer");
    for (asked, t) in reads {
        // Every reader asked after the writer queued: granted after it, with a higher token.
        assert!(asked >= queued);
        assert!(
            t > t_write,
            "a reader (token {t}) was granted before the writer ({t_write})"
        );
    }
    frozen.resume();
}
