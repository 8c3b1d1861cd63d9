//! The edges of honouring timeouts: a deadline-cut read does not outlive its call, URLs redis-rs
//! accepts stay accepted, a busy server is not a configuration error, and a drop or a deadline
//! never waits for a Redis that stopped answering.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::support;
use crate::support::{lock_key, ms, RedisServer, NAMESPACE};

fn client(url: &str, pool_size: u32, response_timeout: Duration) -> LockClient {
    LockClient::builder(url)
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(10))
        .pool_size(pool_size)
        .connection_timeout(Duration::from_secs(5))
        .response_timeout(response_timeout)
        .build()
        .unwrap_or_else(|e| panic!("client for {url}: {e}"))
}

/// A try_lock whose attempt gets an error reply (here WRONGTYPE: the lock key is a list) puts its
/// connection back with the response timeout restored, not cut to the try_lock's deadline: the
/// next call on that connection, with no deadline of its own, waits the whole response timeout.
#[test]
fn an_error_reply_under_a_deadline_leaves_no_short_read_timeout_in_the_pool() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("RPUSH")
        .arg(lock_key("wrongtype"))
        .arg("x")
        .query(&mut admin)
        .unwrap();
    let client = client(&server.url(), 1, Duration::from_secs(5));
    // Warm the one pooled connection.
    drop(client.lock("warm").unwrap());
    let e = client.try_lock("wrongtype", ms(50)).unwrap_err();
    assert!(e.is_redis(), "{e:?}");
    // Redis is slow for 300 ms: well within the 5 s response timeout.
    server.pause();
    let resume = thread::spawn({
        let pid = server.pid();
        move || {
            thread::sleep(ms(300));
            // SAFETY: the pid of our own unreaped child; SIGCONT only.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        }
    });
    let started = Instant::now();
    let result = client.lock("other");
    let took = started.elapsed();
    resume.join().unwrap();
    server.resume();
    let guard = result.unwrap_or_else(|e| {
        panic!("lock() with a 5 s response timeout failed after {took:?}: {e:?}")
    });
    drop(guard);
}

/// The same connection also serves unlocks (combined): an unlock during a short stall waits the
/// response timeout, not the try_lock's deadline.
#[test]
fn an_error_reply_under_a_deadline_does_not_make_a_later_unlock_time_out() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("RPUSH")
        .arg(lock_key("wrongtype"))
        .arg("x")
        .query(&mut admin)
        .unwrap();
    let client = client(&server.url(), 1, Duration::from_secs(5));
    let guard = client.lock("held").unwrap();
    let e = client.try_lock("wrongtype", ms(50)).unwrap_err();
    assert!(e.is_redis(), "{e:?}");
    server.pause();
    let resume = thread::spawn({
        let pid = server.pid();
        move || {
            thread::sleep(ms(300));
            // SAFETY: the pid of our own unreaped child; SIGCONT only.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        }
    });
    let started = Instant::now();
    let result = guard.unlock();
    let took = started.elapsed();
    resume.join().unwrap();
    server.resume();
    result.unwrap_or_else(|e| {
        panic!("unlock() with a 5 s response timeout failed after {took:?}: {e:?}")
    });
}

/// URLs redis-rs accepts stay accepted (a trailing newline from a file, an upper-case scheme, ...).
/// Each names the server the test started.
#[test]
fn urls_redis_rs_accepts_are_not_refused() {
    let sock_dir = support::unique_temp_dir("fencelock-url-sock");
    let sock = sock_dir.join("redis.sock");
    let server = RedisServer::start_with(&["--unixsocket", sock.to_str().unwrap()]);
    let port = server.port();
    let mut refused = Vec::new();
    for url in [
        // A URL read from a file or a secret often ends in a newline; the url crate strips it.
        format!("redis://127.0.0.1:{port}/\n"),
        format!("redis://127.0.0.1:{port}\n"),
        format!(" redis://127.0.0.1:{port}/"),
        // Schemes are case-insensitive.
        format!("REDIS://127.0.0.1:{port}/"),
        // redis-rs trims slashes around the database.
        format!("redis://127.0.0.1:{port}/0/"),
        // Valkey's schemes.
        format!("valkey://127.0.0.1:{port}/"),
        format!("valkey+unix://{}", sock.display()),
        // A file URL without an authority.
        format!("unix:{}", sock.display()),
    ] {
        assert!(
            redis::Client::open(url.as_str()).is_ok(),
            "redis-rs refuses {url:?} too"
        );
        match LockClient::builder(url.as_str())
            .namespace(NAMESPACE)
            .build()
        {
            Ok(client) => drop(client.lock("k").unwrap()),
            Err(e) => refused.push(format!("{url:?}: {e}")),
        }
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
}

/// A long-running script makes Redis answer BUSY to most commands until it ends or is killed:
/// transient, not a rejected set-up, whether the URL names a database (BUSY at SELECT, which
/// redis-rs reports as "refused to switch database") or not (BUSY at the PING of connect).
#[test]
fn a_busy_server_is_not_a_rejected_set_up() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "busy-reply-threshold", "10"])
        .query(&mut admin)
        .unwrap();
    let mut busy = server.connection();
    let script = thread::spawn(move || {
        let _ = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query::<()>(&mut busy);
    });
    // Busy once the script has run past the threshold: other callers are answered BUSY.
    support::poll_until(Duration::from_secs(10), ms(10), || {
        match redis::cmd("PING").query::<String>(&mut admin) {
            Err(e) if e.code() == Some("BUSY") => Ok(()),
            other => Err(format!("PING: {other:?}")),
        }
    })
    .unwrap_or_else(|why| panic!("the script never made the server busy: {why}"));
    let mut seen = Vec::new();
    for url in [
        format!("redis://127.0.0.1:{}/", server.port()),
        format!("redis://127.0.0.1:{}/3", server.port()),
    ] {
        let e = client(&url, 4, Duration::from_secs(5))
            .lock("k")
            .unwrap_err();
        seen.push((url, e));
    }
    let _: () = redis::cmd("SCRIPT").arg("KILL").query(&mut admin).unwrap();
    script.join().unwrap();
    let rejected: Vec<_> = seen.iter().filter(|(_, e)| e.is_rejected()).collect();
    assert!(rejected.is_empty(), "BUSY reported as rejected: {seen:#?}");
}

/// Whether thread `tid` sleeps on a futex (Linux; elsewhere assumed).
fn parked(tid: i32) -> bool {
    #[cfg(target_os = "linux")]
    return support::parked_now(tid).0;
    #[cfg(not(target_os = "linux"))]
    {
        let _ = tid;
        true
    }
}

/// try_lock(k, 300 ms) on a key held elsewhere: it attempts (Redis answers), waits in the queue,
/// and Redis freezes meanwhile. Leaving Redis' queue at the deadline waits for Redis at most a
/// moment, then leaves it to the background thread: the deadline holds.
#[test]
fn try_lock_holds_its_deadline_when_redis_freezes_while_it_waits() {
    let server = RedisServer::start();
    let holder = client(&server.url(), 4, Duration::from_secs(5));
    let _held = holder.lock("k").unwrap();
    let waiter = client(&server.url(), 4, Duration::from_secs(5));
    // The waiter's client subscribes to its release channel at its first refused attempt, and
    // every subscription wakes its waiters to attempt again: had that happened after the freeze
    // below, the attempt would be in flight at the deadline (`Err(Timeout)`, as documented)
    // rather than the waiter waiting. So it subscribes first, on another key.
    let warm = holder.lock("warm").unwrap();
    assert!(waiter.try_lock("warm", ms(50)).unwrap().is_none());
    drop(warm);
    let mut watch = server.connection();
    support::poll_until(Duration::from_secs(10), ms(5), || {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut watch)
            .map_err(|e| e.to_string())?;
        if list.lines().any(|l| l.contains(" sub=1 ")) {
            Ok(())
        } else {
            Err(format!("no subscriber yet: {list}"))
        }
    })
    .unwrap();
    let started = Instant::now();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let result = thread::scope(|s| {
        let waiting = s.spawn(|| {
            tid_tx.send(support::own_tid()).unwrap();
            waiter.try_lock("k", ms(300))
        });
        let tid = tid_rx.recv().unwrap();
        // Frozen once the waiter stands in the queue and waits there, parked (seen twice in a
        // row), unless a starved test thread missed that and the wait is over.
        let mut con = server.connection();
        let mut seen = 0;
        let _ = support::poll_until(Duration::from_secs(10), ms(2), || {
            if waiting.is_finished() {
                return Ok(());
            }
            let waits = support::queue_len(&mut con, "k") == 1 && parked(tid);
            seen = if waits { seen + 1 } else { 0 };
            if seen >= 2 {
                Ok(())
            } else {
                Err(String::new())
            }
        });
        server.pause();
        waiting.join().unwrap()
    });
    let took = started.elapsed();
    server.resume();
    assert!(matches!(result, Ok(None)), "{result:?}");
    assert!(
        took < Duration::from_secs(2),
        "try_lock(300 ms) took {took:?}"
    );
}

/// Redis stops answering while a guard is held, and renewal reports the guard lost: dropping
/// the lost guard does not wait for Redis (its release goes to the background thread).
#[test]
fn dropping_a_guard_renewal_already_lost_does_not_wait_for_redis() {
    let server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .namespace(NAMESPACE)
        .lease(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = client.lock("k").unwrap();
    server.pause();
    let lost = guard.lost().recv_timeout(Duration::from_secs(5));
    assert!(lost.is_ok() || !guard.is_held(), "renewal never noticed");
    let started = Instant::now();
    drop(guard);
    let took = started.elapsed();
    server.resume();
    assert!(
        took < Duration::from_secs(1),
        "dropping a guard already known lost took {took:?}"
    );
}

/// A drop whose release queued behind a batch of unlocks that then got no reply is not sent:
/// it would wait for the response timeout once more. The background thread releases it later.
#[test]
fn a_drop_behind_a_batch_that_timed_out_does_not_wait_again() {
    let server = RedisServer::start();
    let client = client(&server.url(), 4, Duration::from_secs(1));
    // Two pooled connections, so that the second batch need not connect.
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(|| client.lock("a").unwrap());
        let b = s.spawn(|| client.lock("b").unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    server.pause();
    let first = thread::spawn(move || drop(a));
    thread::sleep(ms(100));
    let started = Instant::now();
    drop(b);
    let took = started.elapsed();
    first.join().unwrap();
    server.resume();
    assert!(
        took < Duration::from_millis(1500),
        "the second drop took {took:?} with a response timeout of 1 s"
    );
}
