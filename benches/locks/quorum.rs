//! `quorum`: quorum mode (one lock on N independent masters, with fencing tokens) on 5
//! redis-servers started for the run, and on 3 of them, against what a round to all of them in
//! parallel costs, fencelock's single-server mode, and a redsync-style Redlock.
//!
//! - **Parallel round** ("PR", the unit here): a no-op `EVALSHA` written to every master's socket
//!   from one thread, the replies taken as they come (`poll`): the time until the majority's
//!   reply (3rd of 5) and until the last (the quorum engine's lock calls make their rounds this
//!   way). Beside it the same round through a thread and a connection per master (each master's
//!   thread makes the call, the caller waits on a channel), as the engine's worker threads serve
//!   what its own connections cannot carry.
//! - **Uncontended**: lock + unlock from one thread, a fresh key each time, U times, each paired
//!   with a parallel round just before, and taken in turns (the order rotating) with: the same
//!   protocol on plain connections from one thread with fencelock's own scripts (acquire on all,
//!   confirm on a majority, release on all, each round ending at a majority: the floor under the
//!   engine), Redlock, and (5 masters) `try_lock` with a zero timeout on a client that never
//!   waits, so has no subscriptions. A quorum lock is an acquire round (and a confirm round, the
//!   write-back of the token, when a majority did not take the proposed one), an unlock a
//!   release round waited for on a majority: about two parallel rounds. Then each alone, for its rate and its CPU (client, all the masters).
//! - **Contention**: T threads over C clients on one key, critical section S, think time W, as
//!   `contention` runs it, for the quorum, fencelock on one of the servers, and Redlock, each
//!   twice for D/2 in turns (Q S R Q S R). Calls are counted on every master.
//! - **Handoff**: H times, a holder releases while a waiter of another client is blocked in
//!   `lock()`; release-to-grant, quorum and single server in turns of H/4.
//!
//! The Redlock is written here rather than taken from the `redlock` crate: that crate (2.0)
//! pulls a second `redis` (0.23, beside fencelock's 1.x; about 30 s more of `cargo clippy
//! --all-targets` on a 2-vCPU VM), and it opens a new connection for every `SET` and every
//! release and asks the masters one after another, so it would measure connection setup. This
//! one is redsync's (Go) algorithm with its defaults, on open connections: `SET key value NX PX
//! ttl` to every master at once (written to every socket, then every reply read: redsync waits
//! for all of them), granted with a majority while the validity `ttl − elapsed − (ttl × 0.01 +
//! 2 ms)` is positive, else released everywhere and retried after a random 50-250 ms; released by
//! a compare-and-delete script on every master, again waiting for all. It gives no fencing token.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fencelock::{LockClient, Topology};

use crate::contention::{run_contention, spread, Contention, Locker};
use crate::handoff::handoff_fencelock;
use crate::measure::{processes_cpu, self_cpu, Noise, ThreadCpu};
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{builder, command_calls, pace, Pace, RedisServer, NOOP};
use crate::stats::{jitter, mix, pct, sorted};

const B: &str = "10 quorum";

pub fn run(p: &Params, r: &mut Report) {
    section(&format!(
        "10. quorum mode on 5 and 3 masters (redis-servers on this machine): U={}, \
         T={} threads over C={} clients, S={}, W={}, {} per contention run, H={}",
        p.uncontended,
        p.threads,
        p.clients,
        fmt_d(p.critical),
        fmt_d(p.think),
        fmt_d(p.duration),
        p.handoffs
    ));
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let pids: Vec<u32> = servers.iter().map(RedisServer::pid).collect();
    let noise = Noise::start_all(&pids);
    let all: Vec<&RedisServer> = servers.iter().collect();

    let unit5 = uncontended(&all, p, r, true);
    uncontended(&all[..3], p, r, false);
    contention(&all, p, r, unit5);
    handoffs(&all, p, r, unit5);
    noise.report(r, B);
}

fn quorum_client(masters: &[&RedisServer]) -> LockClient {
    builder(Topology::quorum(masters.iter().map(|s| s.url())))
        .build()
        .expect("quorum LockClient")
}

// ---------------------------------------------------------------------------------------------
// parallel rounds
// ---------------------------------------------------------------------------------------------

/// A connection to every master, driven from one thread: requests written to several sockets,
/// the replies read as they come (`poll`). Replies nobody waits for any more (a straggler's, once
/// a majority answered) are read and dropped before the next one on their connection.
struct Fanout {
    streams: Vec<TcpStream>,
    fds: Vec<libc::pollfd>,
    bufs: Vec<Vec<u8>>,
    /// Replies still to come on each connection for requests given up on.
    stale: Vec<usize>,
}

impl Fanout {
    /// Connections to `masters`, each with `scripts` loaded; returns their SHA1s too.
    fn new(masters: &[&RedisServer], scripts: &[&str]) -> (Fanout, Vec<String>) {
        let mut shas = Vec::new();
        let streams: Vec<TcpStream> = masters
            .iter()
            .map(|s| {
                let mut con = s.connection();
                shas = scripts
                    .iter()
                    .map(|script| {
                        redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(*script)
                            .query(&mut con)
                            .expect("SCRIPT LOAD")
                    })
                    .collect();
                let stream = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                stream
            })
            .collect();
        let fds = streams
            .iter()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let n = streams.len();
        let fanout = Fanout {
            streams,
            fds,
            bufs: vec![Vec::with_capacity(256); n],
            stale: vec![0; n],
        };
        (fanout, shas)
    }

    fn len(&self) -> usize {
        self.streams.len()
    }

    fn send(&mut self, to: &[usize], packed: &[u8]) {
        for &i in to {
            self.streams[i].write_all(packed).expect("write");
        }
    }

    /// Reads the replies to the request last sent to `to`, passing each to `take` (the master,
    /// the reply's RESP) as it comes, until `take` says it has enough or all of them answered.
    fn collect(&mut self, to: &[usize], mut take: impl FnMut(usize, &[u8]) -> bool) {
        let mut awaited = vec![false; self.len()];
        for &i in to {
            awaited[i] = true;
        }
        let mut left = to.len();
        let mut buf = [0u8; 512];
        loop {
            // Whole replies already read.
            for i in 0..self.len() {
                while let Some(end) = crate::resp::resp_value(&self.bufs[i], 0) {
                    let reply: Vec<u8> = self.bufs[i].drain(..end).collect();
                    if self.stale[i] > 0 {
                        self.stale[i] -= 1;
                        continue;
                    }
                    assert!(awaited[i], "a reply nobody asked for");
                    awaited[i] = false;
                    left -= 1;
                    if take(i, &reply) || left == 0 {
                        for (j, a) in awaited.iter().enumerate() {
                            if *a {
                                self.stale[j] += 1;
                            }
                        }
                        return;
                    }
                }
            }
            for (i, fd) in self.fds.iter_mut().enumerate() {
                fd.fd = if awaited[i] || self.stale[i] > 0 {
                    self.streams[i].as_raw_fd()
                } else {
                    -1
                };
                fd.revents = 0;
            }
            // SAFETY: `fds` is a live, writable array of `fds.len()` pollfd structs.
            let ready = unsafe {
                libc::poll(
                    self.fds.as_mut_ptr(),
                    self.fds.len() as libc::nfds_t,
                    10_000,
                )
            };
            assert!(ready > 0, "poll: no reply within 10 s");
            for i in 0..self.len() {
                if self.fds[i].fd >= 0 && self.fds[i].revents != 0 {
                    let k = self.streams[i].read(&mut buf).expect("read");
                    assert!(k > 0, "a master closed the connection");
                    self.bufs[i].extend_from_slice(&buf[..k]);
                }
            }
        }
    }
}

/// The parallel round: a no-op EVALSHA to every master; when each reply came, earliest first.
pub struct PollRound {
    fanout: Fanout,
    packed: Vec<u8>,
    all: Vec<usize>,
}

impl PollRound {
    pub fn new(masters: &[&RedisServer]) -> PollRound {
        let (fanout, shas) = Fanout::new(masters, &[NOOP]);
        PollRound {
            all: (0..fanout.len()).collect(),
            fanout,
            packed: redis::cmd("EVALSHA")
                .arg(&shas[0])
                .arg(0)
                .get_packed_command(),
        }
    }

    pub fn round(&mut self) -> Vec<Duration> {
        let mut times = Vec::with_capacity(self.all.len());
        let t0 = Instant::now();
        self.fanout.send(&self.all, &self.packed);
        self.fanout.collect(&self.all, |_, reply| {
            times.push(t0.elapsed());
            assert_eq!(reply, b":1\r\n", "the no-op's reply");
            false
        });
        times
    }
}

/// fencelock's quorum scripts, as the engine sends them.
const ACQUIRE: &str = concat!(
    include_str!("../../src/scripts/grant.lua"),
    include_str!("../../src/scripts/acquire.lua")
);
const CONFIRM: &str = concat!(
    include_str!("../../src/scripts/grant.lua"),
    include_str!("../../src/scripts/confirm.lua")
);
const RELEASE: &str = include_str!("../../src/scripts/quorum_release.lua");
const RAW_LEASE_MS: u64 = 30_000;
const RAW_IDLE_MS: u64 = 86_400_000;

/// The quorum protocol on plain connections from one thread, with fencelock's scripts: acquire
/// on all proposing a token (the largest master clock last read, plus the time since and a
/// margin), held on
/// a majority of grants that took it; otherwise confirm the largest token on those that
/// granted, held on a majority of confirms; release on all, done on a majority. No renewal, no
/// waiting, no subscriptions: what the protocol's round trips cost, with nothing of the engine.
struct RawQuorum {
    fanout: Fanout,
    shas: Vec<String>,
    all: Vec<usize>,
    n: u64,
    /// The largest master clock read (µs), when its request was sent and answered; the last
    /// proposal.
    clock: Option<(u64, Instant, Instant)>,
    proposed: u64,
}

impl RawQuorum {
    fn new(masters: &[&RedisServer]) -> RawQuorum {
        let (fanout, shas) = Fanout::new(masters, &[ACQUIRE, CONFIRM, RELEASE]);
        RawQuorum {
            all: (0..fanout.len()).collect(),
            fanout,
            shas,
            n: 0,
            clock: None,
            proposed: 0,
        }
    }

    fn keys(key: &str) -> [String; 4] {
        ["lock", "fence", "queue", "waiters"].map(|k| format!("bench-raw:{k}:{{{key}}}"))
    }

    /// The owner id and token of a grant; panics if not granted (a fresh key, uncontended).
    fn lock(&mut self, key: &str) -> (String, String) {
        self.n += 1;
        let owner = format!("raw:{}", self.n);
        let keys = RawQuorum::keys(key);
        let q = self.fanout.len() / 2 + 1;
        let sent = Instant::now();
        // The engine's proposal (quorum/propose.rs): the largest master clock it read, plus
        // the time since its reply came, plus twice its round trip (at most 10 ms).
        let proposal = self.clock.map_or(0, |(clock, at, heard)| {
            let margin = (heard.duration_since(at) * 2).min(Duration::from_millis(10));
            let ahead = sent.saturating_duration_since(heard) + margin;
            clock + u64::try_from(ahead.as_micros()).expect("µs")
        });
        let proposal = proposal.max(self.proposed + 1);
        self.proposed = proposal;
        let acquire = redis::cmd("EVALSHA")
            .arg(&self.shas[0])
            .arg(4)
            .arg(&keys)
            .arg(&owner)
            .arg(RAW_LEASE_MS)
            .arg("h")
            .arg(RAW_IDLE_MS)
            .arg(proposal)
            .get_packed_command();
        self.fanout.send(&self.all, &acquire);
        let mut granted: Vec<(usize, String)> = Vec::new();
        let mut taken = 0;
        let mut clock = self.clock;
        self.fanout.collect(&self.all, |i, reply| {
            // `{1, token, taken, clock}`
            let reply: Vec<redis::Value> =
                redis::from_redis_value(redis::parse_redis_value(reply).expect("RESP"))
                    .expect("an array");
            let [ok, token, took, read]: [redis::Value; 4] = reply.try_into().expect("4 fields");
            assert_eq!(
                redis::from_redis_value::<i64>(ok).expect("int"),
                1,
                "refused on a fresh key"
            );
            let read: u64 = redis::from_redis_value(read).expect("clock");
            if clock.is_none_or(|(c, _, _)| read > c) {
                clock = Some((read, sent, Instant::now()));
            }
            taken += usize::from(redis::from_redis_value::<i64>(took).expect("int") == 1);
            granted.push((i, redis::from_redis_value(token).expect("token")));
            granted.len() >= q
        });
        self.clock = clock;
        if taken >= q {
            return (owner, proposal.to_string());
        }
        let token = granted
            .iter()
            .map(|(_, t)| t.clone())
            .max_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)))
            .expect("grants");
        let to: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
        let confirm = redis::cmd("EVALSHA")
            .arg(&self.shas[1])
            .arg(2)
            .arg(&keys[..2])
            .arg(&owner)
            .arg(&token)
            .arg(RAW_LEASE_MS)
            .arg(RAW_IDLE_MS)
            .get_packed_command();
        self.fanout.send(&to, &confirm);
        let mut yes = 0;
        self.fanout.collect(&to, |_, reply| {
            assert_eq!(reply, b":1\r\n", "confirmed");
            yes += 1;
            yes >= q
        });
        (owner, token)
    }

    fn unlock(&mut self, key: &str, owner: &str) {
        let keys = RawQuorum::keys(key);
        let q = self.fanout.len() / 2 + 1;
        let release = redis::cmd("EVALSHA")
            .arg(&self.shas[2])
            .arg(1)
            .arg(&keys[0])
            .arg(owner)
            .arg(format!("bench-raw:freed:{{{key}}}"))
            .get_packed_command();
        self.fanout.send(&self.all, &release);
        let mut yes = 0;
        self.fanout.collect(&self.all, |_, reply| {
            yes += usize::from(reply == b":1\r\n");
            yes >= q
        });
    }
}

/// The same round through a thread and a connection per master, as the quorum engine does it.
struct ThreadRound {
    go: Vec<Sender<()>>,
    done: Receiver<Instant>,
}

impl ThreadRound {
    fn new(masters: &[&RedisServer]) -> ThreadRound {
        let (done_tx, done) = crossbeam_channel::unbounded();
        let go = masters
            .iter()
            .map(|s| {
                let (tx, rx) = crossbeam_channel::unbounded::<()>();
                let mut con = s.connection();
                let done = done_tx.clone();
                thread::Builder::new()
                    .name("bench-round".into())
                    .spawn(move || {
                        let noop = redis::Script::new(NOOP);
                        while rx.recv().is_ok() {
                            let _: i64 = noop.invoke(&mut con).expect("noop");
                            if done.send(Instant::now()).is_err() {
                                return;
                            }
                        }
                    })
                    .expect("spawn");
                tx
            })
            .collect();
        ThreadRound { go, done }
    }

    fn round(&self) -> Vec<Duration> {
        let t0 = Instant::now();
        for tx in &self.go {
            tx.send(()).expect("go");
        }
        let mut times: Vec<Duration> = (0..self.go.len())
            .map(|_| self.done.recv().expect("done") - t0)
            .collect();
        times.sort_unstable();
        times
    }
}

// ---------------------------------------------------------------------------------------------
// a redsync-style Redlock (see the module's doc)
// ---------------------------------------------------------------------------------------------

const REDLOCK_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// redsync's defaults: expiry 8 s, drift factor 0.01, retry after 50-250 ms.
const REDLOCK_TTL: Duration = Duration::from_secs(8);
const REDLOCK_DRIFT: f64 = 0.01;
const REDLOCK_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(250));

pub struct Redlock {
    cons: Vec<redis::Connection>,
    release_sha: String,
    owner: String,
    n: u64,
}

impl Redlock {
    fn new(masters: &[&RedisServer], owner: String) -> Redlock {
        let mut release_sha = String::new();
        let cons = masters
            .iter()
            .map(|s| {
                let mut con = s.connection();
                release_sha = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(REDLOCK_RELEASE)
                    .query(&mut con)
                    .expect("SCRIPT LOAD");
                con
            })
            .collect();
        Redlock {
            cons,
            release_sha,
            owner,
            n: 0,
        }
    }

    /// Sends `packed` to every master, then reads every reply; how many satisfied `ok`.
    fn everywhere(&mut self, packed: &[u8], ok: impl Fn(&redis::Value) -> bool) -> usize {
        for con in &mut self.cons {
            con.send_packed_command(packed).expect("send");
        }
        self.cons
            .iter_mut()
            .map(|con| con.recv_response().expect("reply"))
            .filter(|v| ok(v))
            .count()
    }

    /// One attempt: whether a majority granted in time (if not, released everywhere).
    fn attempt(&mut self, key: &str, value: &str) -> bool {
        let ttl = REDLOCK_TTL;
        let start = Instant::now();
        let set = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .get_packed_command();
        let granted = self.everywhere(&set, |v| matches!(v, redis::Value::Okay));
        let drift = ttl.mul_f64(REDLOCK_DRIFT) + Duration::from_millis(2);
        let valid = ttl.saturating_sub(start.elapsed() + drift);
        if granted > self.cons.len() / 2 && !valid.is_zero() {
            return true;
        }
        self.unlock(key, value);
        false
    }

    /// Retries until granted (redsync gives up after 32 tries, about 5 s).
    pub fn lock(&mut self, key: &str) -> String {
        self.n += 1;
        let value = format!("{}-{}", self.owner, self.n);
        let mut tries = 0u64;
        while !self.attempt(key, &value) {
            tries += 1;
            let seed = mix(self.n) ^ tries;
            thread::sleep(jitter(seed, REDLOCK_RETRY.0, REDLOCK_RETRY.1));
        }
        value
    }

    pub fn unlock(&mut self, key: &str, value: &str) {
        let release = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(key)
            .arg(value)
            .get_packed_command();
        self.everywhere(&release, |v| matches!(v, redis::Value::Int(1)));
    }
}

impl Locker for Redlock {
    type Held = String;
    fn acquire(&mut self, key: &str) -> String {
        self.lock(key)
    }
    fn release(&mut self, key: &str, value: String) {
        self.unlock(key, &value);
    }
}

// ---------------------------------------------------------------------------------------------
// uncontended
// ---------------------------------------------------------------------------------------------

fn p50_99(r: &Report, v: &[Duration], unit: Duration) -> String {
    format!(
        "{} ({:.2}× PR, {:.2}× RT) / {}",
        fmt_d(pct(v, 0.5)),
        pct(v, 0.5).as_secs_f64() / unit.as_secs_f64(),
        r.ratio(pct(v, 0.5)),
        fmt_d(pct(v, 0.99))
    )
}

/// Throughput and CPU per call of `op`, run `u` times alone: `(calls/s, client, all masters)`.
fn alone(pids: &[u32], u: usize, mut op: impl FnMut(usize)) -> (f64, Duration, Duration) {
    let (ours, redis) = (self_cpu(), processes_cpu(pids));
    let start = Instant::now();
    for i in 0..u {
        op(i);
    }
    let elapsed = start.elapsed();
    let ops = u.max(1) as u32;
    (
        u as f64 / elapsed.as_secs_f64(),
        self_cpu().saturating_sub(ours) / ops,
        processes_cpu(pids).saturating_sub(redis) / ops,
    )
}

/// The parallel rounds, and quorum and Redlock lock + unlock paired with them; returns the
/// parallel round's majority p50 (the unit of the rest). With `detail`, also lock + unlock of a
/// client that never waits (`try_lock` with a zero timeout: no subscriptions), and each one's
/// throughput and CPU alone.
fn uncontended(masters: &[&RedisServer], p: &Params, r: &mut Report, detail: bool) -> Duration {
    let n = masters.len();
    let majority = n / 2;
    println!(" -- {n} masters: uncontended, {} iterations", p.uncontended);
    let client = quorum_client(masters);
    // In a namespace of its own: no subscription hears its releases.
    let once = builder(Topology::quorum(masters.iter().map(|s| s.url())))
        .namespace("bench-once")
        .build()
        .expect("quorum LockClient");
    let mut redlock = Redlock::new(masters, format!("rl{n}"));
    let mut poll = PollRound::new(masters);
    let threads = ThreadRound::new(masters);
    let mut raw = RawQuorum::new(masters);
    let try_once = |key: &str| {
        once.try_lock(key, Duration::ZERO)
            .expect("try_lock")
            .expect("free")
    };
    for i in 0..200 {
        client
            .lock(&format!("q{n}:warm:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
        try_once(&format!("o{n}:warm:{i}"))
            .unlock()
            .expect("unlock");
        let key = format!("rl{n}:warm:{i}");
        let v = redlock.lock(&key);
        redlock.unlock(&key, &v);
        poll.round();
        threads.round();
        let key = format!("warm:{n}:{i}");
        let (owner, _) = raw.lock(&key);
        raw.unlock(&key, &owner);
    }
    let u = p.uncontended;
    let (mut pr_maj, mut pr_last, mut tr_maj, mut tr_last) = (vec![], vec![], vec![], vec![]);
    let (mut locks, mut unlocks, mut both) = (vec![], vec![], vec![]);
    let (mut rl_locks, mut rl_both, mut once_both) = (vec![], vec![], vec![]);
    let (mut raw_locks, mut raw_both) = (vec![], vec![]);
    for i in 0..u {
        let times = poll.round();
        pr_maj.push(times[majority]);
        pr_last.push(times[n - 1]);
        // The order of the variants turns with i.
        for k in 0..4 {
            match (i + k) % 4 {
                0 => {
                    let t0 = Instant::now();
                    let guard = client.lock(&format!("q{n}:u:{i}")).expect("lock");
                    let t1 = Instant::now();
                    guard.unlock().expect("unlock");
                    let t2 = Instant::now();
                    locks.push(t1 - t0);
                    unlocks.push(t2 - t1);
                    both.push(t2 - t0);
                }
                1 => {
                    let key = format!("rl{n}:u:{i}");
                    let t0 = Instant::now();
                    let v = redlock.lock(&key);
                    let t1 = Instant::now();
                    redlock.unlock(&key, &v);
                    rl_locks.push(t1 - t0);
                    rl_both.push(t0.elapsed());
                }
                2 => {
                    let key = format!("u:{n}:{i}");
                    let t0 = Instant::now();
                    let (owner, _) = raw.lock(&key);
                    let t1 = Instant::now();
                    raw.unlock(&key, &owner);
                    raw_locks.push(t1 - t0);
                    raw_both.push(t0.elapsed());
                }
                _ if detail => {
                    let t0 = Instant::now();
                    try_once(&format!("o{n}:u:{i}")).unlock().expect("unlock");
                    once_both.push(t0.elapsed());
                }
                _ => {}
            }
        }
        let times = threads.round();
        tr_maj.push(times[majority]);
        tr_last.push(times[n - 1]);
    }
    let [pr_maj, pr_last, tr_maj, tr_last, locks, unlocks, both, rl_locks, rl_both, once_both, raw_locks, raw_both] =
        [
            pr_maj, pr_last, tr_maj, tr_last, locks, unlocks, both, rl_locks, rl_both, once_both,
            raw_locks, raw_both,
        ]
        .map(sorted);
    let unit = pct(&pr_maj, 0.5);
    let m = format!("{n} masters");
    r.info(
        B,
        &format!("{m}: parallel round (PR), one thread: majority p50 / p99"),
        format!(
            "{} ({:.2}× RT) / {}",
            fmt_d(unit),
            r.ratio(unit),
            fmt_d(pct(&pr_maj, 0.99))
        ),
    );
    r.info(
        B,
        &format!("{m}: parallel round, one thread: last reply p50 / p99"),
        p50_99(r, &pr_last, unit),
    );
    r.info(
        B,
        &format!("{m}: parallel round, a thread per master: majority p50, last p50"),
        format!(
            "{} ({:.2}× PR), {} ({:.2}× PR)",
            fmt_d(pct(&tr_maj, 0.5)),
            pct(&tr_maj, 0.5).as_secs_f64() / unit.as_secs_f64(),
            fmt_d(pct(&tr_last, 0.5)),
            pct(&tr_last, 0.5).as_secs_f64() / unit.as_secs_f64()
        ),
    );
    r.info(
        B,
        &format!("{m}: quorum lock p50 / p99"),
        p50_99(r, &locks, unit),
    );
    r.info(
        B,
        &format!("{m}: quorum unlock p50 / p99"),
        p50_99(r, &unlocks, unit),
    );
    let both50 = pct(&both, 0.5).as_secs_f64() / unit.as_secs_f64();
    r.check(
        B,
        &format!("{m}: quorum lock+unlock p50 / p99"),
        p50_99(r, &both, unit),
        "p50 ≤ 3.5× PR",
        both50 <= 3.5,
    );
    r.info(
        B,
        &format!("{m}: the protocol on plain connections, one thread: lock p50 / p99"),
        p50_99(r, &raw_locks, unit),
    );
    r.info(
        B,
        &format!("{m}: the protocol on plain connections, one thread: lock+unlock p50 / p99"),
        p50_99(r, &raw_both, unit),
    );
    r.info(
        B,
        &format!("{m}: quorum lock+unlock p50 / the protocol's on plain connections"),
        format!(
            "{:.2}",
            pct(&both, 0.5).as_secs_f64() / pct(&raw_both, 0.5).as_secs_f64()
        ),
    );
    if detail {
        r.info(
            B,
            &format!("{m}: quorum try_lock(0)+unlock, a client that never waits: p50 / p99"),
            p50_99(r, &once_both, unit),
        );
    }
    r.info(
        B,
        &format!("{m}: Redlock lock p50 / p99"),
        p50_99(r, &rl_locks, unit),
    );
    r.info(
        B,
        &format!("{m}: Redlock lock+unlock p50 / p99"),
        p50_99(r, &rl_both, unit),
    );
    r.info(
        B,
        &format!("{m}: quorum lock+unlock p50 / Redlock's"),
        format!(
            "{:.2}",
            pct(&both, 0.5).as_secs_f64() / pct(&rl_both, 0.5).as_secs_f64()
        ),
    );
    if detail {
        let pids: Vec<u32> = masters.iter().map(|s| s.pid()).collect();
        let before = ThreadCpu::snapshot();
        let quorum = alone(&pids, u, |i| {
            client
                .lock(&format!("q{n}:v:{i}"))
                .expect("lock")
                .unlock()
                .expect("unlock");
        });
        let by_thread = ThreadCpu::snapshot().per_op_since(&before, u as u64);
        let before = ThreadCpu::snapshot();
        let never_waits = alone(&pids, u, |i| {
            try_once(&format!("o{n}:v:{i}")).unlock().expect("unlock");
        });
        let once_by_thread = ThreadCpu::snapshot().per_op_since(&before, u as u64);
        let red = alone(&pids, u, |i| {
            let key = format!("rl{n}:v:{i}");
            let v = redlock.lock(&key);
            redlock.unlock(&key, &v);
        });
        let plain = alone(&pids, u, |i| {
            let key = format!("v:{n}:{i}");
            let (owner, _) = raw.lock(&key);
            raw.unlock(&key, &owner);
        });
        let rounds = alone(&pids, u, |_| {
            poll.round();
        });
        let thread_rounds = alone(&pids, u, |_| {
            threads.round();
        });
        for (what, (rate, client_cpu, redis_cpu)) in [
            ("quorum lock+unlock", quorum),
            ("quorum try_lock(0)+unlock", never_waits),
            ("the protocol on plain connections: lock+unlock", plain),
            ("Redlock lock+unlock", red),
            ("parallel round, one thread", rounds),
            ("parallel round, a thread per master", thread_rounds),
        ] {
            r.info(
                B,
                &format!("{m}: {what} alone: per second; CPU each: client, all masters"),
                format!("{rate:.0}/s; {}, {}", fmt_d(client_cpu), fmt_d(redis_cpu)),
            );
        }
        r.info(
            B,
            &format!("{m}: client CPU per quorum lock+unlock by thread"),
            by_thread,
        );
        r.info(
            B,
            &format!("{m}: the same, try_lock(0)+unlock"),
            once_by_thread,
        );
    }
    unit
}

// ---------------------------------------------------------------------------------------------
// contention
// ---------------------------------------------------------------------------------------------

/// Two runs of `D/2` merged.
fn merged(a: Contention, b: Contention) -> (Contention, [f64; 2]) {
    let rates = [a.rate(), b.rate()];
    (a.merge(b), rates)
}

fn contention(masters: &[&RedisServer], p: &Params, r: &mut Report, unit: Duration) {
    let (t, c) = (p.threads, p.clients);
    println!(
        " -- contention: T={t} over C={c} clients, one key; quorum, single server, Redlock in turns"
    );
    let half = p.duration / 2;
    let single = masters[0];
    let mut q = Vec::new();
    let mut s = Vec::new();
    let mut rl = Vec::new();
    for round in 0..2 {
        let clients = (0..c).map(|_| quorum_client(masters)).collect();
        q.push(run_contention(
            masters,
            spread(clients, t),
            &format!("qhot:{round}"),
            p.critical,
            p.think,
            half,
        ));
        let clients = (0..c)
            .map(|_| crate::server::client(&single.url()))
            .collect();
        s.push(run_contention(
            &[single],
            spread(clients, t),
            &format!("shot:{round}"),
            p.critical,
            p.think,
            half,
        ));
        let lockers = (0..t)
            .map(|i| Redlock::new(masters, format!("rlc{round}-{i}")))
            .collect();
        rl.push(run_contention(
            masters,
            lockers,
            &format!("rlhot:{round}"),
            p.critical,
            p.think,
            half,
        ));
    }
    let n = masters.len();
    let mut rates = Vec::new();
    for (who, runs) in [
        (format!("{n} masters quorum"), q),
        ("1 server".to_owned(), s),
        (format!("{n} masters Redlock"), rl),
    ] {
        let mut runs = runs.into_iter();
        let (all, each) = merged(runs.next().expect("run"), runs.next().expect("run"));
        all.describe(r, B, &who);
        r.info(
            B,
            &format!("{who}: acquisitions/s of each half, PUBLISH per acquisition"),
            format!(
                "{:.0}/s, {:.0}/s, {:.2}",
                each[0],
                each[1],
                all.publish_per_acquisition()
            ),
        );
        rates.push(all.rate());
        assert_eq!(all.overlaps, 0, "{who}: overlapping holds");
    }
    // The floor under contention: per acquisition an acquire round (and a confirm round when its
    // proposal was not taken), the critical section and a release round.
    let per = 1.0 / rates[0];
    r.info(
        B,
        "quorum: time per acquisition, in PR, and against 1 server, Redlock",
        format!(
            "{} ({:.1}× PR); {:.2}×, {:.1}× the rate",
            fmt_d(Duration::from_secs_f64(per)),
            per / unit.as_secs_f64(),
            rates[0] / rates[1],
            rates[0] / rates[2].max(1e-9)
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// handoff
// ---------------------------------------------------------------------------------------------

fn evalsha_calls(cons: &mut [redis::Connection]) -> u64 {
    cons.iter_mut().map(|c| command_calls(c, "evalsha")).sum()
}

/// Release-to-grant on a quorum: as `handoff::handoff_fencelock`, with the waiter's attempt
/// seen on every master (its acquire everywhere) before the pause and the release.
fn handoff_quorum(
    masters: &[&RedisServer],
    holder: &LockClient,
    waiter: LockClient,
    key: &str,
    n: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut stats: Vec<redis::Connection> = masters.iter().map(|s| s.connection()).collect();
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<Instant>(0);
    let key_w = key.to_owned();
    let t = thread::spawn(move || {
        while go_rx.recv().is_ok() {
            let guard = waiter.lock(&key_w).expect("waiter lock");
            let granted = Instant::now();
            guard.unlock().expect("waiter unlock");
            done_tx.send(granted).expect("report");
        }
    });
    let mut out = Vec::with_capacity(n);
    let mut unlocks = Vec::with_capacity(n);
    for i in 0..n {
        let guard = holder.lock(key).expect("holder lock");
        // The holder's confirms that came after its majority.
        thread::sleep(Duration::from_millis(1));
        let before = evalsha_calls(&mut stats);
        go_tx.send(()).expect("go");
        let deadline = Instant::now() + Duration::from_secs(10);
        while evalsha_calls(&mut stats) < before + masters.len() as u64 {
            assert!(Instant::now() < deadline, "the waiter never attempted");
            thread::sleep(Duration::from_micros(200));
        }
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let released = Instant::now();
        guard.unlock().expect("holder unlock");
        let unlocked = Instant::now();
        let granted = done_rx.recv().expect("granted");
        out.push(granted.saturating_duration_since(released));
        unlocks.push(unlocked - released);
    }
    drop(go_tx);
    t.join().expect("waiter thread");
    (out, unlocks)
}

fn handoffs(masters: &[&RedisServer], p: &Params, r: &mut Report, unit: Duration) {
    let n = masters.len();
    println!(
        " -- handoff to a waiter of another client: {} each, quorum and single server in turns",
        p.handoffs
    );
    let single = masters[0];
    let holder = quorum_client(masters);
    let waiter = quorum_client(masters);
    let s_holder = crate::server::client(&single.url());
    let s_waiter = crate::server::client(&single.url());
    // Warm up: the waiters' subscriptions made.
    handoff_quorum(masters, &holder, waiter.clone(), "qh:warm", 5);
    handoff_fencelock(single, s_holder.clone(), s_waiter.clone(), "sh:warm", 0);
    let turns = 4;
    let per = p.handoffs.div_ceil(turns);
    let (mut q, mut q_unlock, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for turn in 0..turns {
        let (a, b) = handoff_quorum(masters, &holder, waiter.clone(), &format!("qh:{turn}"), per);
        q.extend(a);
        q_unlock.extend(b);
        let (a, _) = handoff_fencelock(
            single,
            s_holder.clone(),
            s_waiter.clone(),
            &format!("sh:{turn}"),
            per,
        );
        s.extend(a);
    }
    let (q, q_unlock, s) = (sorted(q), sorted(q_unlock), sorted(s));
    r.info(
        B,
        &format!("{n} masters: handoff to another client, release to grant p50 / p99"),
        p50_99(r, &q, unit),
    );
    r.info(
        B,
        &format!("{n} masters: the holder's unlock() in it, p50 / p99"),
        p50_99(r, &q_unlock, unit),
    );
    r.info(
        B,
        "1 server: handoff to another client p50 / p99",
        p50_99(r, &s, unit),
    );
}

// ---------------------------------------------------------------------------------------------
// a frozen or killed minority
// ---------------------------------------------------------------------------------------------

const BM: &str = "10b quorum minority";
/// The workload's lease and `try_lock` timeout.
const MINORITY_LEASE: Duration = Duration::from_millis(1_500);
const MINORITY_WAIT: Duration = Duration::from_secs(2);
/// Runs of each configuration, in turns.
const ROUNDS: usize = 3;

/// `quorum_minority`: the same contention workload on a quorum with all masters healthy, with a
/// minority frozen (SIGSTOP: connections open, no replies) or killed (connections refused), and
/// on the deployment without that minority: two clients of four threads taking three keys in
/// turn with `try_lock(key, 2 s)`, holding each grant 0.5 ms, lease 1.5 s, the default
/// timeouts (5 s). Each configuration runs M_MS (default 2 s) three times, in turns; fresh clients
/// and keys for each run. Reported: grants/s and the p99 wait of a `try_lock`, as ratios.
pub fn run_minority(p: &Params, r: &mut Report) {
    let run = p.minority;
    section(&format!(
        "10b. quorum with a frozen or killed minority: 2 clients x 4 threads, 3 keys, \
         try_lock(2 s) / 0.5 ms hold / unlock, lease 1.5 s, {} per run, {ROUNDS} in turns",
        fmt_d(run)
    ));
    let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let pids: Vec<u32> = servers.iter().map(RedisServer::pid).collect();
    let noise = Noise::start_all(&pids);
    // Masters 1 and 2 are the minority of five; the deployment without them is 0, 3, 4, of
    // which 4 is the minority of three (a deployment of the two others is not a quorum: it
    // needs three masters).
    let five: Vec<usize> = (0..5).collect();
    let three = vec![0, 3, 4];
    let configs: [(&str, &[usize], &[usize]); 4] = [
        ("5 masters", &five, &[]),
        ("5 masters, 2 frozen", &five, &[1, 2]),
        ("3 masters", &three, &[]),
        ("3 masters, 1 frozen", &three, &[4]),
    ];
    let mut seen: Vec<Vec<Pace>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (i, (name, masters, frozen)) in configs.iter().enumerate() {
            for &f in *frozen {
                servers[f].pause();
            }
            let on: Vec<&RedisServer> = masters.iter().map(|&m| &servers[m]).collect();
            seen[i].push(minority_run(&on, &format!("m{round}{i}"), run));
            for &f in *frozen {
                servers[f].resume();
            }
            println!("    {name} ({round}): {}", seen[i][round]);
        }
    }
    // Killed last: the servers do not come back.
    servers[1].kill();
    servers[2].kill();
    let all: Vec<&RedisServer> = servers.iter().collect();
    let killed = minority_run(&all, "mk", run);
    println!("    5 masters, 2 killed: {killed}");
    noise.report(r, BM);

    let merged: Vec<Pace> = seen.into_iter().map(Pace::merge).collect();
    let rate = |p: &Pace| p.total() as f64 / (run.as_secs_f64() * p.runs as f64);
    for ((name, ..), pace) in configs.iter().zip(&merged) {
        r.info(
            BM,
            &format!("{name}: grants/s; wait p50 / p99; per client"),
            format!(
                "{:.0}/s; {} / {}; {:?}",
                rate(pace),
                fmt_d(pace.wait(0.5)),
                fmt_d(pace.wait(0.99)),
                pace.grants
            ),
        );
    }
    r.info(
        BM,
        "5 masters, 2 killed: grants/s; wait p50 / p99",
        format!(
            "{:.0}/s; {} / {}",
            rate(&killed),
            fmt_d(killed.wait(0.5)),
            fmt_d(killed.wait(0.99))
        ),
    );
    let [healthy5, frozen5, healthy3, frozen3] = &merged[..] else {
        unreachable!("four configurations")
    };
    let ratios = |of: &Pace, to: &Pace| {
        format!(
            "{:.2}; {:.2}",
            rate(of) / rate(to).max(1e-9),
            to.wait(0.99).as_secs_f64() / of.wait(0.99).as_secs_f64().max(1e-9)
        )
    };
    r.check(
        BM,
        "2 of 5 frozen / healthy: rate; healthy p99 / its p99",
        ratios(frozen5, healthy5),
        ">= 0.5; >= 0.5",
        rate(frozen5) >= rate(healthy5) / 2.0 && frozen5.wait(0.99) <= healthy5.wait(0.99) * 2,
    );
    r.info(
        BM,
        "2 of 5 frozen / 3 masters: rate; p99 ratio",
        ratios(frozen5, healthy3),
    );
    r.info(
        BM,
        "2 of 5 killed / healthy: rate; p99 ratio",
        ratios(&killed, healthy5),
    );
    r.info(
        BM,
        "2 of 5 killed / 3 masters: rate; p99 ratio",
        ratios(&killed, healthy3),
    );
    r.check(
        BM,
        "1 of 3 frozen / healthy: rate; healthy p99 / its p99",
        ratios(frozen3, healthy3),
        ">= 0.5; >= 0.5",
        rate(frozen3) >= rate(healthy3) / 2.0 && frozen3.wait(0.99) <= healthy3.wait(0.99) * 2,
    );
}

/// One run of the workload on `masters`, keys under `tag`, with fresh clients.
fn minority_run(masters: &[&RedisServer], tag: &str, run: Duration) -> Pace {
    let topology = Topology::quorum(masters.iter().map(|s| s.url()));
    let clients: Vec<LockClient> = (0..2)
        .map(|_| {
            builder(topology.clone())
                .lease(MINORITY_LEASE)
                .build()
                .expect("quorum LockClient")
        })
        .collect();
    let keys: Vec<String> = (0..3).map(|k| format!("{tag}:{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    pace(&clients, &keys, 4, MINORITY_WAIT, run)
}
