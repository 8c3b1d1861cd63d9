//! `pg`: fencelock against PostgreSQL advisory locks (`pg_advisory_lock` /
//! `pg_advisory_unlock`), in turns in one run: fencelock, then PostgreSQL, `PG_ROUNDS` times.
//! Each round measures, for both:
//!
//! - cross-process handoff: a holder in this process releases while a waiter in another process
//!   is blocked in `lock()` / `pg_advisory_lock`; the time from the start of the release call to
//!   the waiter's grant;
//! - uncontended lock + unlock from one thread, each paired with two round trips of the same
//!   system sent just before it from the same thread;
//! - T threads on one key, critical section S, think time W (16, 100 µs, 1 ms by default):
//!   acquisitions/s (fencelock: the threads over C clients; PostgreSQL: a connection per thread,
//!   as a session-level advisory lock needs);
//!
//! and each system's round trip: a no-op `EVALSHA` on a plain Redis connection, a prepared
//! `SELECT 1` on a PostgreSQL connection of the same kind as the locks' (one round trip each).
//!
//! **The other process** is this bench binary run again with `FENCELOCK_BENCH_ROLE` set (see
//! [`run_role`]): it reads `go` lines on stdin and answers on stdout. Timestamps cross the process
//! boundary as raw `CLOCK_MONOTONIC` readings, which are system-wide on Linux.
//!
//! **Where fencelock's handoff time goes** is measured in pieces on plain connections, in the
//! same shape as the library's path: the holder's `unlock()` alone (the release script, which
//! publishes the grant), a `PUBLISH` from this process reaching a reader thread blocked on a
//! `SUBSCRIBE` connection in another process, and that thread passing it on through a crossbeam
//! channel to a thread blocked in `recv` (the listener thread delivering to the waiting thread),
//! and the order of Redis' writes: a script that publishes, as the release script does (Redis
//! writes the caller's reply first), against a no-op script followed by a `PUBLISH` in one
//! pipeline and a `PING` followed by the script in one pipeline, as the library sends its unlocks
//! (both write the message first).
//! Every sample is taken after the same 3-6 ms of idle time as the handoffs. Then the handoff
//! again, traced: the waiter's process also runs a thread of its own subscribed by pattern to the
//! release channels ([`spy`]), which times when the release message reaches that process, and
//! the waiter reports when its `lock()` returned.
//!
//! PostgreSQL is at `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`); if it
//! cannot be reached the benchmark says so and skips itself. The handoff latencies of both
//! systems are also drawn as one CDF, `docs/benchmarks-pg-handoff.svg`.

use std::io::BufRead;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;
use postgres::{NoTls, Statement};

use crate::contention::{run_contention, Locker};
use crate::handoff::wait_for_attempt;
use crate::measure::Noise;
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, Child, RedisServer, NOOP};
use crate::stats::{jitter, mix, pct, sorted};

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Selects the role of a child process; see [`run_role`].
const ROLE: &str = "FENCELOCK_BENCH_ROLE";
const ROLE_URL: &str = "FENCELOCK_BENCH_URL";
const ROLE_KEY: &str = "FENCELOCK_BENCH_KEY";
/// Set for a `fencelock-waiter` that also timestamps the release messages (see [`spy`]).
const ROLE_SPY: &str = "FENCELOCK_BENCH_SPY";
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the CDF of both systems' handoff latencies is written.
const PLOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/docs/benchmarks-pg-handoff.svg"
);

const PG_LOCK: &str = "SELECT pg_advisory_lock($1)";
const PG_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
const PG_SELECT1: &str = "SELECT 1";

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the machine.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `timespec` through a pointer to a live, writable one.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn since(from_ns: u64, to_ns: u64) -> Duration {
    Duration::from_nanos(to_ns.saturating_sub(from_ns))
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

fn pg_connect(url: &str) -> Result<postgres::Client, postgres::Error> {
    let mut config: postgres::Config = url.parse()?;
    config.connect_timeout(Duration::from_secs(3));
    config.connect(NoTls)
}

/// A PostgreSQL connection with the advisory lock statements prepared, so that each call is one
/// round trip (Bind/Execute/Sync), as `SELECT 1` is.
struct Pg {
    con: postgres::Client,
    lock: Statement,
    unlock: Statement,
}

impl Pg {
    fn connect(url: &str) -> Pg {
        let mut con = pg_connect(url).expect("PostgreSQL connection");
        let lock = con.prepare(PG_LOCK).expect("prepare lock");
        let unlock = con.prepare(PG_UNLOCK).expect("prepare unlock");
        Pg { con, lock, unlock }
    }
    fn lock(&mut self, key: i64) {
        self.con
            .execute(&self.lock, &[&key])
            .expect("pg_advisory_lock");
    }
    fn unlock(&mut self, key: i64) {
        let row = self
            .con
            .query_one(&self.unlock, &[&key])
            .expect("pg_advisory_unlock");
        assert!(row.get::<_, bool>(0), "pg_advisory_unlock: not held");
    }
}

/// A lock name as an advisory lock key, offset by this process's id so that two runs on one
/// database do not share keys.
fn pg_key(name: &str) -> i64 {
    let h = name
        .bytes()
        .fold(u64::from(std::process::id()), |h, b| mix(h ^ u64::from(b)));
    h as i64
}

impl Locker for Pg {
    type Held = i64;
    fn acquire(&mut self, key: &str) -> i64 {
        let k = pg_key(key);
        self.lock(k);
        k
    }
    fn release(&mut self, _key: &str, held: i64) {
        self.unlock(held);
    }
}

// ---------------------------------------------------------------------------------------------
// the other process
// ---------------------------------------------------------------------------------------------

/// Runs the role `FENCELOCK_BENCH_ROLE` names, if any, and returns whether it did (the process
/// then exits). Roles:
///
/// - `fencelock-waiter`: a client on `FENCELOCK_BENCH_URL`; prints `ready`; on each `go` line,
///   `lock(FENCELOCK_BENCH_KEY)`, prints `granted <CLOCK_MONOTONIC ns>`, unlocks.
/// - `pg-waiter`: the same with `pg_advisory_lock` on a connection to `FENCELOCK_BENCH_URL`;
///   prints `ready <backend pid>` so that the holder can see it wait in `pg_locks`.
/// - `subscriber`: subscribes to channel `FENCELOCK_BENCH_KEY` on a plain connection, prints
///   `ready`; for each message, the reader thread takes a timestamp and sends it over a crossbeam
///   channel to a thread blocked in `recv`, which prints `heard <read ns> <running ns>`.
pub fn run_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    let url = std::env::var(ROLE_URL).expect(ROLE_URL);
    let key = std::env::var(ROLE_KEY).expect(ROLE_KEY);
    let go = || {
        std::io::stdin()
            .lock()
            .lines()
            .map_while(Result::ok)
            .filter(|l| l == "go")
    };
    match role.as_str() {
        "fencelock-waiter" => {
            let c = client(&url);
            c.lock("pg:warm").expect("lock").unlock().expect("unlock");
            let spy = std::env::var_os(ROLE_SPY).map(|_| spy(&url));
            println!("ready");
            for _ in go() {
                if let Some(spy) = &spy {
                    while spy.try_recv().is_ok() {}
                }
                let guard = c.lock(&key).expect("waiter lock");
                let granted = mono_ns();
                let heard = spy.as_ref().map_or(0, |spy| {
                    spy.recv_timeout(Duration::from_secs(1)).unwrap_or(0)
                });
                println!("granted {granted} {heard}");
                guard.unlock().expect("waiter unlock");
            }
        }
        "pg-waiter" => {
            let mut pg = Pg::connect(&url);
            let pid: i32 = pg
                .con
                .query_one("SELECT pg_backend_pid()", &[])
                .expect("pg_backend_pid")
                .get(0);
            let key: i64 = key.parse().expect("key");
            println!("ready {pid}");
            for _ in go() {
                pg.lock(key);
                println!("granted {}", mono_ns());
                pg.unlock(key);
            }
        }
        "subscriber" => {
            let mut con = redis::Client::open(url.as_str())
                .expect("url")
                .get_connection()
                .expect("connection");
            let mut pubsub = con.as_pubsub();
            pubsub.subscribe(&key).expect("subscribe");
            let (tx, rx) = crossbeam_channel::unbounded::<u64>();
            thread::spawn(move || {
                while let Ok(read) = rx.recv() {
                    println!("heard {read} {}", mono_ns());
                }
            });
            println!("ready");
            while pubsub.get_message().is_ok() {
                if tx.send(mono_ns()).is_err() {
                    break;
                }
            }
        }
        other => panic!("{ROLE}={other:?}: unknown role"),
    }
    true
}

/// A thread of the waiter's process reading every release message of the benches' namespace on
/// a plain connection of its own: when the release's PUBLISH reaches the waiter's process.
/// Redis writes a message to channel subscribers (the client's wake thread) before pattern
/// subscribers (this one). Returns once subscribed.
fn spy(url: &str) -> crossbeam_channel::Receiver<u64> {
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_connection()
        .expect("connection");
    let (tx, rx) = crossbeam_channel::unbounded();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(0);
    thread::spawn(move || {
        let mut pubsub = con.as_pubsub();
        pubsub.psubscribe("bench:released:*").expect("psubscribe");
        ready_tx.send(()).expect("ready");
        while pubsub.get_message().is_ok() {
            if tx.send(mono_ns()).is_err() {
                break;
            }
        }
    });
    ready_rx.recv().expect("spy subscribed");
    rx
}

fn spawn_role(role: &str, url: &str, key: &str, spy: bool) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.env(ROLE, role).env(ROLE_URL, url).env(ROLE_KEY, key);
    if spy {
        cmd.env(ROLE_SPY, "1");
    }
    Child::spawn(cmd)
}

/// The numbers after `prefix` on the child's next line that starts with it.
fn expect_ns(child: &Child, prefix: &str) -> Vec<u64> {
    let line = child.expect_line(prefix, CHILD_TIMEOUT);
    line[prefix.len()..]
        .split_whitespace()
        .map(|v| v.parse().expect("a number"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// handoff
// ---------------------------------------------------------------------------------------------

/// Idle time before each release: the waiter has blocked, the machine has settled.
fn idle(i: usize) {
    thread::sleep(jitter(
        i as u64,
        Duration::from_millis(3),
        Duration::from_millis(6),
    ));
}

/// Samples of a fencelock handoff to a waiter in another process.
#[derive(Default)]
struct FlHandoff {
    /// Release call started → the waiter's `lock()` returned.
    grant: Vec<Duration>,
    /// The holder's `unlock()` alone.
    unlock: Vec<Duration>,
    /// With `spy`: release call started → the PUBLISH read by a thread of the waiter's process.
    published: Vec<Duration>,
    /// With `spy`: the PUBLISH read there → the waiter's `lock()` returned.
    delivered: Vec<Duration>,
}

fn handoff_fencelock(
    server: &RedisServer,
    holder: &LockClient,
    key: &str,
    n: usize,
    spy: bool,
) -> FlHandoff {
    let waiter = spawn_role("fencelock-waiter", &server.url(), key, spy);
    waiter.expect_line("ready", CHILD_TIMEOUT);
    let mut stats = server.connection();
    let mut out = FlHandoff::default();
    for i in 0..n + 5 {
        let guard = holder.lock(key).expect("holder lock");
        let before = command_calls(&mut stats, "evalsha");
        waiter.send_line("go");
        wait_for_attempt(&mut stats, "evalsha", before);
        idle(i);
        let released = mono_ns();
        guard.unlock().expect("holder unlock");
        let unlocked = mono_ns();
        let granted = expect_ns(&waiter, "granted ");
        if i >= 5 {
            out.grant.push(since(released, granted[0]));
            out.unlock.push(since(released, unlocked));
            if spy && granted[1] > 0 {
                out.published.push(since(released, granted[1]));
                out.delivered.push(since(granted[1], granted[0]));
            }
        }
    }
    out
}

/// The same with `pg_advisory_lock`: the holder waits until `pg_locks` shows the waiter's
/// backend waiting for the lock.
fn handoff_pg(url: &str, key: &str, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let k = pg_key(key);
    let waiter = spawn_role("pg-waiter", url, &k.to_string(), false);
    let line = waiter.expect_line("ready ", CHILD_TIMEOUT);
    let waiter_pid: i32 = line["ready ".len()..].trim().parse().expect("backend pid");
    let mut holder = Pg::connect(url);
    let mut stats = pg_connect(url).expect("PostgreSQL connection");
    let waiting = stats
        .prepare(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND pid = $1",
        )
        .expect("prepare");
    let mut out = Vec::with_capacity(n);
    let mut unlocks = Vec::with_capacity(n);
    for i in 0..n + 5 {
        holder.lock(k);
        waiter.send_line("go");
        let deadline = Instant::now() + CHILD_TIMEOUT;
        loop {
            let count: i64 = stats
                .query_one(&waiting, &[&waiter_pid])
                .expect("pg_locks")
                .get(0);
            if count > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the PostgreSQL waiter never waited"
            );
            thread::sleep(Duration::from_micros(200));
        }
        idle(i);
        let released = mono_ns();
        holder.unlock(k);
        let unlocked = mono_ns();
        let granted = expect_ns(&waiter, "granted ")[0];
        if i >= 5 {
            out.push(since(released, granted));
            unlocks.push(since(released, unlocked));
        }
    }
    (out, unlocks)
}

/// The pieces of a cross-process handoff on plain connections, each after the same idle time as
/// a handoff.
struct Pieces {
    /// A `PUBLISH` from this process → a reader thread in another one.
    publish_to_reader: Vec<Duration>,
    /// That thread's crossbeam hand-off → a thread blocked in `recv`.
    reader_to_thread: Vec<Duration>,
    publish_rtt: Vec<Duration>,
    cold_evalsha: Vec<Duration>,
    /// A script that publishes, as the release script does → the reader. Redis writes the
    /// caller's reply before the message: the message's client was queued for writing first, and
    /// Redis writes the most recently queued client first.
    script_publish_to_reader: Vec<Duration>,
    /// A no-op script, then `PUBLISH`, in one pipeline → the reader: the same work, but the
    /// message is written before the caller's reply.
    script_then_publish_to_reader: Vec<Duration>,
    /// `PING`, then the script that publishes, in one pipeline → the reader, as the library
    /// sends its unlocks: the `PING`'s reply queues the caller first, so the message is written
    /// first.
    ping_then_script_to_reader: Vec<Duration>,
}

fn handoff_pieces(server: &RedisServer, n: usize) -> Pieces {
    let channel = "pg:pieces";
    let sub = spawn_role("subscriber", &server.url(), channel, false);
    sub.expect_line("ready", CHILD_TIMEOUT);
    let mut con = server.connection();
    let noop = redis::Script::new(NOOP);
    let _: i64 = noop.invoke(&mut con).expect("noop");
    let publishes = redis::Script::new("return redis.call('PUBLISH', KEYS[1], ARGV[1])");
    let _: i64 = publishes
        .key("pg:nobody")
        .arg("x")
        .invoke(&mut con)
        .expect("load");
    let heard = |sub: &Child| -> (u64, u64) {
        let line = sub.expect_line("heard ", CHILD_TIMEOUT);
        let mut f = line["heard ".len()..].split_whitespace();
        let read: u64 = f.next().and_then(|v| v.parse().ok()).expect("read ns");
        let running: u64 = f.next().and_then(|v| v.parse().ok()).expect("running ns");
        (read, running)
    };
    let mut p = Pieces {
        publish_to_reader: Vec::with_capacity(n),
        reader_to_thread: Vec::with_capacity(n),
        publish_rtt: Vec::with_capacity(n),
        cold_evalsha: Vec::with_capacity(n),
        script_publish_to_reader: Vec::with_capacity(n),
        script_then_publish_to_reader: Vec::with_capacity(n),
        ping_then_script_to_reader: Vec::with_capacity(n),
    };
    for i in 0..n + 5 {
        idle(i);
        let t = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let cold = t.elapsed();
        idle(i + 1);
        let sent = mono_ns();
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg("1 x y")
            .query(&mut con)
            .expect("PUBLISH");
        let replied = mono_ns();
        assert_eq!(receivers, 1, "one subscriber");
        let (read, running) = heard(&sub);
        // The message written after the caller's reply, then before it two ways, in a random
        // order each time, so that none always follows another.
        let mut after_before = [Duration::ZERO; 3];
        let mut order = [0, 1, 2];
        for k in (1..3).rev() {
            order.swap(k, (mix(i as u64 * 3 + k as u64) % (k as u64 + 1)) as usize);
        }
        for j in order {
            idle(i + 2 + j);
            let sent = mono_ns();
            if j == 0 {
                let _: i64 = publishes
                    .key(channel)
                    .arg("1 x y")
                    .invoke(&mut con)
                    .expect("publishing script");
            } else if j == 2 {
                let _: (String, i64) = redis::pipe()
                    .cmd("PING")
                    .cmd("EVALSHA")
                    .arg(publishes.get_hash())
                    .arg(1)
                    .arg(channel)
                    .arg("1 x y")
                    .query(&mut con)
                    .expect("PING, then the publishing script");
            } else {
                let _: (i64, i64) = redis::pipe()
                    .cmd("EVALSHA")
                    .arg(noop.get_hash())
                    .arg(0)
                    .cmd("PUBLISH")
                    .arg(channel)
                    .arg("1 x y")
                    .query(&mut con)
                    .expect("script, then PUBLISH");
            }
            after_before[j] = since(sent, heard(&sub).0);
        }
        if i >= 5 {
            p.publish_to_reader.push(since(sent, read));
            p.reader_to_thread.push(since(read, running));
            p.publish_rtt.push(since(sent, replied));
            p.cold_evalsha.push(cold);
            p.script_publish_to_reader.push(after_before[0]);
            p.script_then_publish_to_reader.push(after_before[1]);
            p.ping_then_script_to_reader.push(after_before[2]);
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------
// round trips and uncontended
// ---------------------------------------------------------------------------------------------

/// Round trips of a no-op EVALSHA and of a prepared `SELECT 1`, in alternating blocks of one
/// system each after short sleeps, the first samples of each block dropped. Blocks rather than
/// alternate calls: a call to one server after a call to the other finds its server's process
/// asleep, which on this kind of VM costs PostgreSQL's backend several times its round trip;
/// lock calls come back to back from one system, as in a block.
fn round_trips(
    server: &RedisServer,
    pg: &mut Pg,
    samples: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    const BLOCKS: usize = 20;
    let mut con = server.connection();
    let noop = redis::Script::new(NOOP);
    let select1 = pg.con.prepare(PG_SELECT1).expect("prepare");
    let mut redis_rt = Vec::with_capacity(samples);
    let mut pg_rt = Vec::with_capacity(samples);
    for block in 0..BLOCKS {
        thread::sleep(Duration::from_millis(2));
        for i in 0..2 * samples / BLOCKS + 20 {
            let t = Instant::now();
            if block % 2 == 0 {
                let _: i64 = noop.invoke(&mut con).expect("noop");
            } else {
                pg.con.query_one(&select1, &[]).expect("SELECT 1");
            }
            if i >= 20 {
                let rt = t.elapsed();
                if block % 2 == 0 {
                    redis_rt.push(rt);
                } else {
                    pg_rt.push(rt);
                }
            }
        }
    }
    (redis_rt, pg_rt)
}

/// `(lock + unlock, two round trips just before it)` from one thread, fencelock on fresh keys.
fn uncontended_fencelock(
    server: &RedisServer,
    n: usize,
    round: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let c = client(&server.url());
    for i in 0..100 {
        c.lock(&format!("pgu:warm:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    let mut con = server.connection();
    let noop = redis::Script::new(NOOP);
    let _: i64 = noop.invoke(&mut con).expect("noop");
    let mut both = Vec::with_capacity(n);
    let mut pairs = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("pgu:{round}:{i}");
        let t = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let t0 = Instant::now();
        c.lock(&key).expect("lock").unlock().expect("unlock");
        both.push(t0.elapsed());
        pairs.push(t0 - t);
    }
    (both, pairs)
}

/// The same with `pg_advisory_lock` + `pg_advisory_unlock` and two `SELECT 1`.
fn uncontended_pg(pg: &mut Pg, n: usize, round: usize) -> (Vec<Duration>, Vec<Duration>) {
    let select1 = pg.con.prepare(PG_SELECT1).expect("prepare");
    for i in 0..100 {
        let k = pg_key(&format!("pgu:warm:{i}"));
        pg.lock(k);
        pg.unlock(k);
    }
    let mut both = Vec::with_capacity(n);
    let mut pairs = Vec::with_capacity(n);
    for i in 0..n {
        let k = pg_key(&format!("pgu:{round}:{i}"));
        let t = Instant::now();
        pg.con.query_one(&select1, &[]).expect("SELECT 1");
        pg.con.query_one(&select1, &[]).expect("SELECT 1");
        let t0 = Instant::now();
        pg.lock(k);
        pg.unlock(k);
        both.push(t0.elapsed());
        pairs.push(t0 - t);
    }
    (both, pairs)
}

// ---------------------------------------------------------------------------------------------
// the plot
// ---------------------------------------------------------------------------------------------

/// A CDF of each series on one log-scale time axis, as a standalone SVG.
fn cdf_svg(title: &str, series: &[(&str, &str, &[Duration])]) -> String {
    use std::fmt::Write as _;
    let (w, h) = (760.0, 440.0);
    let (left, right, top, bottom) = (70.0, 30.0, 50.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let us = |d: Duration| (d.as_secs_f64() * 1e6).max(1.0);
    let all = series.iter().flat_map(|s| s.2.iter().copied());
    let lo = all.clone().map(us).fold(f64::INFINITY, f64::min);
    let hi = all.map(us).fold(0.0, f64::max);
    let ticks = [
        10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10_000.0, 20_000.0, 50_000.0,
    ];
    let x_lo = ticks
        .iter()
        .rev()
        .copied()
        .find(|t| *t <= lo)
        .unwrap_or(10.0);
    let x_hi = ticks.iter().copied().find(|t| *t >= hi).unwrap_or(hi);
    let x = |v: f64| left + pw * (v.ln() - x_lo.ln()) / (x_hi.ln() - x_lo.ln());
    let y = |q: f64| top + ph * (1.0 - q);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="15">{title}</text>"#,
        w / 2.0
    );
    for t in ticks.iter().filter(|t| **t >= x_lo && **t <= x_hi) {
        let label = if *t >= 1000.0 {
            format!("{} ms", t / 1000.0)
        } else {
            format!("{t} µs")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1}" stroke="#ddd"/><text x="{0:.1}" y="{2}" text-anchor="middle">{label}</text>"##,
            x(*t),
            top + ph,
            top + ph + 18.0
        );
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{q}</text>"##,
            y(q),
            left + pw,
            left - 6.0,
            y(q) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">release-to-grant latency (log scale)</text>"#,
        left + pw / 2.0,
        h - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">fraction of handoffs</text>"#,
        top + ph / 2.0
    );
    for (_, color, samples) in series {
        let n = samples.len().max(1) as f64;
        let mut points = String::new();
        for (j, d) in samples.iter().enumerate() {
            let _ = write!(
                points,
                "{:.1},{:.1} {:.1},{:.1} ",
                x(us(*d)),
                y(j as f64 / n),
                x(us(*d)),
                y((j + 1) as f64 / n)
            );
        }
        let _ = writeln!(
            s,
            r#"<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>"#
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{}" y="{}" width="424" height="{}" fill="white" stroke="#999"/>"##,
        left + pw - 430.0,
        top + ph - 14.0 - 20.0 * series.len() as f64,
        20.0 * series.len() as f64 + 8.0
    );
    for (i, (name, color, samples)) in series.iter().enumerate() {
        // Bottom right: a CDF's curves are near the bottom only at short latencies.
        let ly = top + ph - 20.0 * (series.len() - i) as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{2}" y="{3}">{name}: p50 {4}, p99 {5}</text>"#,
            left + pw - 424.0,
            left + pw - 399.0,
            left + pw - 392.0,
            ly + 4.0,
            fmt_d(pct(samples, 0.5)),
            fmt_d(pct(samples, 0.99)),
        );
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------------------------------------
// the benchmark
// ---------------------------------------------------------------------------------------------

fn p50s(rounds: &[Vec<Duration>]) -> String {
    rounds
        .iter()
        .map(|v| fmt_d(pct(&sorted(v.clone()), 0.5)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pooled(rounds: &[Vec<Duration>]) -> Vec<Duration> {
    sorted(rounds.concat())
}

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "6 pg";
    let url = database_url();
    section(&format!(
        "6. fencelock against PostgreSQL advisory locks, in turns, {} rounds",
        p.pg_rounds
    ));
    let mut pg = match pg_connect(&url) {
        Ok(con) => {
            drop(con);
            Pg::connect(&url)
        }
        Err(e) => {
            let cause = std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            println!("  PostgreSQL at {url} is not reachable ({e}{cause}): skipping `pg`");
            return;
        }
    };
    let version: String = pg
        .con
        .query_one("SHOW server_version", &[])
        .expect("server_version")
        .get(0);
    println!("  PostgreSQL {version} at {url}");
    let noise = Noise::start(server.pid());
    let holder = client(&server.url());
    let (mut redis_rt, mut pg_rt) = (Vec::new(), Vec::new());
    let (mut fl_h, mut pg_h, mut fl_unlock, mut pg_unlock) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fl_u, mut fl_pair, mut pg_u, mut pg_pair) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fl_rate, mut pg_rate) = (Vec::new(), Vec::new());
    let mut pieces = Vec::new();
    let mut traced = Vec::new();
    for round in 0..p.pg_rounds {
        println!(" -- round {}", round + 1);
        let (a, b) = round_trips(server, &mut pg, p.rtt_samples / 5);
        redis_rt.push(a);
        pg_rt.push(b);

        let h = handoff_fencelock(server, &holder, &format!("pg:h:{round}"), p.handoffs, false);
        fl_h.push(h.grant);
        fl_unlock.push(h.unlock);
        let (h, u) = handoff_pg(&url, &format!("pg:h:{round}"), p.handoffs);
        pg_h.push(h);
        pg_unlock.push(u);
        pieces.push(handoff_pieces(server, p.handoffs));
        traced.push(handoff_fencelock(
            server,
            &holder,
            &format!("pg:t:{round}"),
            p.handoffs,
            true,
        ));

        let (u, pair) = uncontended_fencelock(server, p.uncontended, round);
        fl_u.push(u);
        fl_pair.push(pair);
        let (u, pair) = uncontended_pg(&mut pg, p.uncontended, round);
        pg_u.push(u);
        pg_pair.push(pair);

        let key = format!("pg:hot:{round}");
        let lockers: Vec<LockClient> = {
            let clients: Vec<LockClient> = (0..p.clients).map(|_| client(&server.url())).collect();
            (0..p.threads)
                .map(|i| clients[i % clients.len()].clone())
                .collect()
        };
        let fl = run_contention(&[server], lockers, &key, p.critical, p.think, p.duration);
        assert_eq!(fl.overlaps, 0, "fencelock: overlapping holds");
        fl_rate.push(fl.rate());
        let lockers: Vec<Pg> = (0..p.threads).map(|_| Pg::connect(&url)).collect();
        let pgc = run_contention(&[server], lockers, &key, p.critical, p.think, p.duration);
        assert_eq!(pgc.overlaps, 0, "PostgreSQL: overlapping holds");
        pg_rate.push(pgc.rate());
        println!(
            "    handoff p50 {} / {}, uncontended p50 {} / {}, contended {:.0}/s / {:.0}/s (fencelock / PostgreSQL)",
            fmt_d(pct(&sorted(fl_h[round].clone()), 0.5)),
            fmt_d(pct(&sorted(pg_h[round].clone()), 0.5)),
            fmt_d(pct(&sorted(fl_u[round].clone()), 0.5)),
            fmt_d(pct(&sorted(pg_u[round].clone()), 0.5)),
            fl.rate(),
            pgc.rate()
        );
    }

    // Round trips: each system's unit.
    let rt_redis = pct(&pooled(&redis_rt), 0.5);
    let rt_pg = pct(&pooled(&pg_rt), 0.5);
    let in_rt = |d: Duration, rt: Duration| d.as_secs_f64() / rt.as_secs_f64();
    r.info(
        B,
        "round trip p50: no-op EVALSHA; SELECT 1 (by round)",
        format!(
            "{}; {} ({}; {})",
            fmt_d(rt_redis),
            fmt_d(rt_pg),
            p50s(&redis_rt),
            p50s(&pg_rt)
        ),
    );

    // Handoff.
    let (flh, pgh) = (pooled(&fl_h), pooled(&pg_h));
    let lat = |d: Duration, rt: Duration| format!("{} ({:.2}× own RT)", fmt_d(d), in_rt(d, rt));
    r.info(
        B,
        "handoff across processes: fencelock p50 / p99",
        format!(
            "{} / {}",
            lat(pct(&flh, 0.5), rt_redis),
            lat(pct(&flh, 0.99), rt_redis)
        ),
    );
    r.info(
        B,
        "handoff across processes: PostgreSQL p50 / p99",
        format!(
            "{} / {}",
            lat(pct(&pgh, 0.5), rt_pg),
            lat(pct(&pgh, 0.99), rt_pg)
        ),
    );
    r.info(
        B,
        "handoff p50 by round: fencelock; PostgreSQL",
        format!("{}; {}", p50s(&fl_h), p50s(&pg_h)),
    );
    let ratio50 = in_rt(pct(&flh, 0.5), pct(&pgh, 0.5));
    let ratio99 = in_rt(pct(&flh, 0.99), pct(&pgh, 0.99));
    r.check(
        B,
        "handoff p50: fencelock / PostgreSQL",
        format!("{ratio50:.2}"),
        "≤ 0.8",
        ratio50 <= 0.8,
    );
    r.check(
        B,
        "handoff p99: fencelock / PostgreSQL",
        format!("{ratio99:.2}"),
        "≤ 1.5",
        ratio99 <= 1.5,
    );
    r.info(
        B,
        "of which the holder's release call: fencelock; PostgreSQL p50",
        format!(
            "{}; {}",
            fmt_d(pct(&pooled(&fl_unlock), 0.5)),
            fmt_d(pct(&pooled(&pg_unlock), 0.5))
        ),
    );

    // Where fencelock's handoff goes: the pieces on plain connections.
    let piece = |f: fn(&Pieces) -> &Vec<Duration>| {
        sorted(pieces.iter().flat_map(|p| f(p).iter().copied()).collect())
    };
    let to_reader = piece(|p| &p.publish_to_reader);
    let to_thread = piece(|p| &p.reader_to_thread);
    let publish_rtt = piece(|p| &p.publish_rtt);
    let cold = piece(|p| &p.cold_evalsha);
    r.info(
        B,
        "pieces: no-op EVALSHA after the same idle time: p50",
        fmt_d(pct(&cold, 0.5)),
    );
    r.info(
        B,
        "pieces: PUBLISH round trip: p50",
        fmt_d(pct(&publish_rtt, 0.5)),
    );
    r.info(
        B,
        "pieces: PUBLISH sent → reader thread of another process: p50 / p99",
        format!(
            "{} / {}",
            fmt_d(pct(&to_reader, 0.5)),
            fmt_d(pct(&to_reader, 0.99))
        ),
    );
    r.info(
        B,
        "pieces: reader thread → a thread blocked in recv: p50 / p99",
        format!(
            "{} / {}",
            fmt_d(pct(&to_thread, 0.5)),
            fmt_d(pct(&to_thread, 0.99))
        ),
    );
    let after = piece(|p| &p.script_publish_to_reader);
    let before = piece(|p| &p.script_then_publish_to_reader);
    r.info(
        B,
        "pieces: a script that publishes → reader: p50 / p99 (message after the reply)",
        format!("{} / {}", fmt_d(pct(&after, 0.5)), fmt_d(pct(&after, 0.99))),
    );
    r.info(
        B,
        "pieces: a script, then PUBLISH, one pipeline → reader: p50 / p99 (message first)",
        format!(
            "{} / {}",
            fmt_d(pct(&before, 0.5)),
            fmt_d(pct(&before, 0.99))
        ),
    );
    let ping = piece(|p| &p.ping_then_script_to_reader);
    r.info(
        B,
        "pieces: PING, then that script, one pipeline → reader: p50 / p99 (as unlocks go)",
        format!("{} / {}", fmt_d(pct(&ping, 0.5)), fmt_d(pct(&ping, 0.99))),
    );
    let t_grant = sorted(traced.iter().flat_map(|t| t.grant.clone()).collect());
    let t_pub = sorted(traced.iter().flat_map(|t| t.published.clone()).collect());
    let t_unlock = sorted(traced.iter().flat_map(|t| t.unlock.clone()).collect());
    let t_delivered = sorted(traced.iter().flat_map(|t| t.delivered.clone()).collect());
    r.info(
        B,
        "traced handoffs: release call → PUBLISH read in the waiter's process: p50 / p99",
        format!("{} / {}", fmt_d(pct(&t_pub, 0.5)), fmt_d(pct(&t_pub, 0.99))),
    );
    r.info(
        B,
        "traced handoffs: PUBLISH read there → lock() returns: p50 / p99",
        format!(
            "{} / {}",
            fmt_d(pct(&t_delivered, 0.5)),
            fmt_d(pct(&t_delivered, 0.99))
        ),
    );
    r.info(
        B,
        "traced handoffs: release call → unlock() returns; → lock() returns: p50",
        format!(
            "{}; {} ({} samples)",
            fmt_d(pct(&t_unlock, 0.5)),
            fmt_d(pct(&t_grant, 0.5)),
            t_grant.len()
        ),
    );
    r.info(
        B,
        "pieces: sum of the two p50; fencelock's handoff p50",
        format!(
            "{}; {}",
            fmt_d(pct(&to_reader, 0.5) + pct(&to_thread, 0.5)),
            fmt_d(pct(&flh, 0.5))
        ),
    );

    // Uncontended.
    let (flu, flp, pgu, pgp) = (
        pooled(&fl_u),
        pooled(&fl_pair),
        pooled(&pg_u),
        pooled(&pg_pair),
    );
    let fl_in_rt = 2.0 * in_rt(pct(&flu, 0.5), pct(&flp, 0.5));
    let pg_in_rt = 2.0 * in_rt(pct(&pgu, 0.5), pct(&pgp, 0.5));
    r.info(
        B,
        "uncontended lock+unlock p50 / p99: fencelock",
        format!(
            "{} / {} ({} rounds: {})",
            fmt_d(pct(&flu, 0.5)),
            fmt_d(pct(&flu, 0.99)),
            fl_u.len(),
            p50s(&fl_u)
        ),
    );
    r.info(
        B,
        "uncontended lock+unlock p50 / p99: PostgreSQL",
        format!(
            "{} / {} ({} rounds: {})",
            fmt_d(pct(&pgu, 0.5)),
            fmt_d(pct(&pgu, 0.99)),
            pg_u.len(),
            p50s(&pg_u)
        ),
    );
    r.info(
        B,
        "round trip p50 within the lock+unlock loops: EVALSHA; SELECT 1",
        format!(
            "{}; {}",
            fmt_d(pct(&flp, 0.5) / 2),
            fmt_d(pct(&pgp, 0.5) / 2)
        ),
    );
    r.check(
        B,
        "fencelock lock+unlock p50, in paired EVALSHA RTs",
        format!(
            "{fl_in_rt:.2} RT ({:.2}× the run's RT)",
            in_rt(pct(&flu, 0.5), rt_redis)
        ),
        "≤ 2.2",
        fl_in_rt <= 2.2,
    );
    r.info(
        B,
        "PostgreSQL lock+unlock p50, in paired SELECT 1 RTs",
        format!(
            "{pg_in_rt:.2} RT ({:.2}× the run's SELECT 1)",
            in_rt(pct(&pgu, 0.5), rt_pg)
        ),
    );

    // Contention.
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let rates = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (fl_mean, pg_mean) = (mean(&fl_rate), mean(&pg_rate));
    let label = format!(
        "T={} S={} W={}: acquisitions/s, fencelock",
        p.threads,
        fmt_d(p.critical),
        fmt_d(p.think)
    );
    r.info(B, &label, format!("{fl_mean:.0}/s ({})", rates(&fl_rate)));
    r.info(
        B,
        "the same: PostgreSQL",
        format!("{pg_mean:.0}/s ({})", rates(&pg_rate)),
    );
    let lowest_fl = fl_rate.iter().copied().fold(f64::INFINITY, f64::min);
    let highest_pg = pg_rate.iter().copied().fold(0.0, f64::max);
    r.check(
        B,
        "contended throughput: fencelock / PostgreSQL",
        format!(
            "{:.2} (every round above: {})",
            fl_mean / pg_mean.max(1e-9),
            lowest_fl > highest_pg
        ),
        "> 1",
        fl_mean > pg_mean,
    );

    // The plot.
    let title = format!(
        "Handoff to a waiter in another process: release call to grant ({} each)",
        flh.len()
    );
    let svg = cdf_svg(
        &title,
        &[
            ("fencelock", "#1f77b4", &flh),
            ("PostgreSQL advisory lock", "#d62728", &pgh),
        ],
    );
    match std::fs::write(PLOT, svg) {
        Ok(()) => println!("  handoff CDF written to {PLOT}"),
        Err(e) => println!("  could not write {PLOT}: {e}"),
    }
    noise.report(r, B);
}
