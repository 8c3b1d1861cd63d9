//! `election`: how long an election is without a leader, and how soon an observer hears of a
//! change. Every party has a client of its own, as separate processes would.
//!
//! - failover after a resignation: candidate B waits in `campaign`; the time runs from just
//!   before A's `resign()` to B's `campaign` returning (B leads: granted and proclaimed). Beside
//!   it, a lock handoff to a waiter of another client in the same run: a resignation is that
//!   handoff with a script before it (the record withdrawn) and one after (B's proclamation);
//! - failover after a crash: A campaigns with a short lease (`E_LEASE_MS`) and renewal off
//!   (`LockOptions::renew(false)`), which is what Redis sees of a process that crashed right
//!   after it was elected: no renewal, no release. B waits; the time runs from the moment A's
//!   lease ran out to B leading, reported as the lease + an extra. The grant's moment is only
//!   known to lie within A's `campaign` call, so the extra is taken from the call's start (an
//!   upper bound) and the call's length is printed beside it (the bracket);
//! - the observer (on a third client): from just before `proclaim(v)` to its `changes()`
//!   delivering `v` to a thread blocked on it, beside a script that PUBLISHes to a plain
//!   SUBSCRIBE connection (the physical limit); from just before A's `resign()` to the observer
//!   delivering nobody, then the next leader; after a crash, from the lease running out to the
//!   observer delivering the next leader, and nobody when no candidate waits.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fencelock::{Election, Leader, LockOptions, Observer};

use crate::handoff::{handoff_fencelock, wait_for_attempt};
use crate::measure::Noise;
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, RedisServer, NOOP};
use crate::stats::{jitter, pct, sorted};

const B: &str = "election";

/// How long any one step may take before the bench gives up: a bug, not a slow machine.
const PATIENCE: Duration = Duration::from_secs(10);

/// Idle time before the timed call, as `handoff` uses: the waiter has blocked, the machine idles.
fn pause(i: usize) {
    thread::sleep(jitter(
        i as u64,
        Duration::from_millis(3),
        Duration::from_millis(6),
    ));
}

/// An observer's deliveries, each stamped by a thread blocked on `changes()` as it arrives.
struct Watcher {
    observer: Observer,
    heard: Receiver<(Instant, Option<Leader>)>,
    thread: JoinHandle<()>,
}

impl Watcher {
    fn start(election: &Election) -> Watcher {
        let observer = election.observe().expect("observe");
        let changes = observer.changes().clone();
        let (tx, heard) = crossbeam_channel::unbounded();
        let thread = thread::spawn(move || {
            for change in changes.iter() {
                if tx.send((Instant::now(), change)).is_err() {
                    return;
                }
            }
        });
        Watcher {
            observer,
            heard,
            thread,
        }
    }

    /// When the observer delivered the first change that `is` accepts (given the change and
    /// when it was delivered), skipping others.
    fn until(&self, what: &str, mut is: impl FnMut(Instant, &Option<Leader>) -> bool) -> Instant {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, change) = self
                .heard
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the observer never delivered {what}"));
            if is(at, &change) {
                return at;
            }
        }
    }

    /// When `value` was delivered as the leader's.
    fn leader(&self, value: &str) -> Instant {
        self.until(value, |_, c| c.as_ref().is_some_and(|l| l.value() == value))
    }

    /// `(when nobody was delivered, if it was; when value was)`.
    fn nobody_then(&self, value: &str) -> (Option<Instant>, Instant) {
        let mut nobody = None;
        let at = self.until(value, |at, c| match c {
            None => {
                nobody = nobody.or(Some(at));
                false
            }
            Some(l) => l.value() == value,
        });
        (nobody, at)
    }

    fn stop(self) {
        drop(self.observer);
        self.thread.join().expect("watcher thread");
    }
}

/// Candidate B on a client of its own: for each value sent, campaigns with it, stamps the moment
/// `campaign` returns, resigns, and sends the stamp.
struct Candidate {
    go: Sender<String>,
    led: Receiver<Instant>,
    thread: JoinHandle<()>,
}

impl Candidate {
    fn start(election: Election) -> Candidate {
        let (go, values) = crossbeam_channel::bounded::<String>(0);
        let (led_tx, led) = crossbeam_channel::bounded(0);
        let thread = thread::spawn(move || {
            for value in values.iter() {
                let leadership = election.campaign(&value).expect("B campaigns");
                let at = Instant::now();
                leadership.resign().expect("B resigns");
                led_tx.send(at).expect("report");
            }
        });
        Candidate { go, led, thread }
    }

    /// Sends B campaigning and returns once its first attempt reached Redis (it then waits).
    fn campaign(&self, stats: &mut redis::Connection, value: String) {
        let before = command_calls(stats, "evalsha");
        self.go.send(value).expect("go");
        wait_for_attempt(stats, "evalsha", before);
    }

    fn led(&self) -> Instant {
        self.led.recv_timeout(PATIENCE).expect("B never led")
    }

    fn stop(self) {
        drop(self.go);
        self.thread.join().expect("candidate thread");
    }
}

#[derive(Default)]
struct Failovers {
    /// From just before A's `resign()` to B's `campaign` returning.
    failover: Vec<Duration>,
    /// A's `resign()` alone.
    resign: Vec<Duration>,
    /// From just before A's `resign()` to the observer delivering nobody.
    nobody: Vec<Duration>,
    /// From just before A's `resign()` to the observer delivering B.
    next: Vec<Duration>,
}

/// `n` failovers after a resignation (5 more first, not counted).
fn failovers(
    server: &RedisServer,
    a: &Election,
    b: &Candidate,
    watcher: Option<&Watcher>,
    n: usize,
) -> Failovers {
    let mut stats = server.connection();
    let mut out = Failovers::default();
    for i in 0..n + 5 {
        let (va, vb) = (format!("a{i}"), format!("b{i}"));
        let leadership = a.campaign(&va).expect("A campaigns");
        if let Some(w) = watcher {
            w.leader(&va);
        }
        b.campaign(&mut stats, vb.clone());
        pause(i);
        let resigned = Instant::now();
        leadership.resign().expect("A resigns");
        let resign = resigned.elapsed();
        let led = b.led();
        let heard = watcher.map(|w| w.nobody_then(&vb));
        if i < 5 {
            continue;
        }
        out.failover.push(led.saturating_duration_since(resigned));
        out.resign.push(resign);
        if let Some((nobody, next)) = heard {
            if let Some(nobody) = nobody {
                out.nobody.push(nobody.saturating_duration_since(resigned));
            }
            out.next.push(next.saturating_duration_since(resigned));
        }
    }
    out
}

#[derive(Default)]
struct Crashes {
    /// B leading (or, without B, the observer delivering nobody), from the start of A's
    /// `campaign` call + the lease: at most one call's length later than the lease's true end.
    after_expiry: Vec<Duration>,
    /// A's `campaign` call: its grant lies within it.
    campaign: Vec<Duration>,
    /// The observer delivering B, from the same moment.
    observed: Vec<Duration>,
}

/// `n` crashed leaderships (one more first, not counted): A campaigns with `lease` and no
/// renewal, and is left to run out. With `b`, B waits to take over; without, the observer alone
/// notices.
fn crashes(
    server: &RedisServer,
    a: &Election,
    b: Option<&Candidate>,
    watcher: &Watcher,
    lease: Duration,
    n: usize,
) -> Crashes {
    let mut stats = server.connection();
    let crashed = LockOptions::new().lease(lease).renew(false);
    let mut out = Crashes::default();
    for i in 0..n + 1 {
        let (va, vb) = (format!("crashed{i}"), format!("next{i}"));
        let called = Instant::now();
        let leadership = a.campaign_with(&va, &crashed).expect("A campaigns");
        let campaign = called.elapsed();
        watcher.leader(&va);
        let expiry = called + lease;
        let (taken, observed) = match b {
            Some(b) => {
                b.campaign(&mut stats, vb.clone());
                let led = b.led();
                (led, Some(watcher.leader(&vb)))
            }
            None => (watcher.until("nobody", |_, c| c.is_none()), None),
        };
        // A "crashed": its leadership is dropped only once it was taken over or seen gone.
        drop(leadership);
        if i < 1 {
            continue;
        }
        out.after_expiry
            .push(taken.saturating_duration_since(expiry));
        out.campaign.push(campaign);
        if let Some(observed) = observed {
            out.observed
                .push(observed.saturating_duration_since(expiry));
        }
    }
    out
}

/// `(proclaim to delivered, proclaim() alone)`: A leads, the observer delivers each new value.
fn proclamations(a: &Election, watcher: &Watcher, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let leadership = a.campaign("p0").expect("A campaigns");
    watcher.leader("p0");
    let mut delivered = Vec::with_capacity(n);
    let mut calls = Vec::with_capacity(n);
    for i in 1..=n + 5 {
        let value = format!("p{i}");
        pause(i);
        let start = Instant::now();
        leadership.proclaim(&value).expect("proclaim");
        let call = start.elapsed();
        let at = watcher.leader(&value);
        if i > 5 {
            delivered.push(at.saturating_duration_since(start));
            calls.push(call);
        }
    }
    leadership.resign().expect("A resigns");
    (delivered, calls)
}

const RAW_PROCLAIM: &str =
    "redis.call('HSET', KEYS[1], 'value', ARGV[1]) redis.call('PUBLISH', ARGV[2], ARGV[1]) return 1";

/// The physical limit of an observer's delivery: a script that records a value and PUBLISHes
/// it, heard by a thread blocked reading its own SUBSCRIBE connection. Returns `(script to
/// heard, a no-op EVALSHA after the same idle time)`: every timed call here follows a pause,
/// and on a small VM a round trip that wakes an idle machine takes several times the run's.
fn proclamations_raw(server: &RedisServer, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    const CHANNEL: &str = "raw:leader";
    let mut sub = server.connection();
    let (ready_tx, ready) = crossbeam_channel::bounded::<()>(0);
    let (heard_tx, heard) = crossbeam_channel::unbounded::<(Instant, String)>();
    let t = thread::spawn(move || {
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe(CHANNEL).expect("subscribe");
        ready_tx.send(()).expect("ready");
        loop {
            let msg = pubsub.get_message().expect("message");
            let at = Instant::now();
            let payload: String = msg.get_payload().expect("payload");
            if payload == "stop" || heard_tx.send((at, payload)).is_err() {
                return;
            }
        }
    });
    ready.recv().expect("subscribed");
    let mut con = server.connection();
    let script = redis::Script::new(RAW_PROCLAIM);
    let noop = redis::Script::new(NOOP);
    let mut out = Vec::with_capacity(n);
    let mut cold = Vec::with_capacity(n);
    for i in 1..=n + 5 {
        let value = format!("p{i}");
        pause(i);
        let start = Instant::now();
        let _: i64 = noop.invoke(&mut con).expect("noop");
        let cold_rt = start.elapsed();
        pause(i + n);
        let start = Instant::now();
        let _: i64 = script
            .key("raw:record")
            .arg(&value)
            .arg(CHANNEL)
            .invoke(&mut con)
            .expect("raw proclaim");
        let (at, payload) = heard.recv_timeout(PATIENCE).expect("the subscriber heard");
        assert_eq!(payload, value);
        if i > 5 {
            out.push(at.saturating_duration_since(start));
            cold.push(cold_rt);
        }
    }
    let _: i64 = script
        .key("raw:record")
        .arg("stop")
        .arg(CHANNEL)
        .invoke(&mut con)
        .expect("raw stop");
    t.join().expect("subscriber thread");
    (out, cold)
}

/// p50 and p99, each with its ratio to the round trip.
fn spread(r: &Report, s: &[Duration]) -> String {
    format!("{} / {}", r.lat(pct(s, 0.5)), r.lat(pct(s, 0.99)))
}

/// The same, after `lease +`.
fn after_lease(r: &Report, lease: Duration, s: &[Duration]) -> String {
    format!(
        "{} + {} / + {}",
        fmt_d(lease),
        r.lat(pct(s, 0.5)),
        r.lat(pct(s, 0.99))
    )
}

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    let noise = Noise::start(server.pid());
    section("election: failover after a resignation and after a crash, observer latency");
    let url = server.url();
    let (ca, cb, co) = (client(&url), client(&url), client(&url));
    let name = "bench-election";
    let a = ca.election(name).expect("election");
    let b = Candidate::start(cb.election(name).expect("election"));
    let n = p.elections;

    // 1. Resignation, nobody watching; then a lock handoff between two clients, for comparison.
    let plain = failovers(server, &a, &b, None, n);
    let handoff = sorted(handoff_fencelock(server, client(&url), client(&url), "election:h", n).0);

    // 3. The observer: proclamations, then resignations watched.
    let watcher = Watcher::start(&co.election(name).expect("election"));
    watcher.until("the first reading", |_, _| true);
    let (raw, cold) = proclamations_raw(server, n);
    let (raw, cold) = (sorted(raw), sorted(cold));
    let (delivered, proclaims) = proclamations(&a, &watcher, n);
    let watched = failovers(server, &a, &b, Some(&watcher), n);

    // 2. Crashes: B takes over; then nobody does and the observer alone notices.
    let lease = p.crash_lease;
    let crash = crashes(server, &a, Some(&b), &watcher, lease, p.crashes);
    let gone = crashes(server, &a, None, &watcher, lease, p.crashes.div_ceil(2));
    watcher.stop();
    b.stop();

    let failover = sorted(plain.failover);
    r.info(
        B,
        "a no-op EVALSHA after the same idle time: p50",
        r.lat(pct(&cold, 0.5)),
    );
    r.info(
        B,
        "failover after resign(): p50 / p99",
        spread(r, &failover),
    );
    let resign_p50 = pct(&sorted(plain.resign), 0.5);
    r.info(B, "resign() call alone: p50", r.lat(resign_p50));
    r.info(
        B,
        "lock handoff to another client, same run: p50",
        r.lat(pct(&handoff, 0.5)),
    );
    r.info(
        B,
        "failover p50 − lock handoff p50",
        r.lat(pct(&failover, 0.5).saturating_sub(pct(&handoff, 0.5))),
    );

    let (after, campaign) = (sorted(crash.after_expiry), sorted(crash.campaign));
    r.info(
        B,
        "failover after a crash: lease + p50 / + p99",
        after_lease(r, lease, &after),
    );
    r.info(
        B,
        "  the crashed leader's campaign call: p50",
        format!(
            "{} (the grant lies within it: the extra is at most this much less)",
            r.lat(pct(&campaign, 0.5))
        ),
    );
    r.info(
        B,
        "  observer delivers the next leader: lease + p50 / + p99",
        after_lease(r, lease, &sorted(crash.observed)),
    );
    r.info(
        B,
        "crash, no candidate: observer delivers nobody, lease + p50 / + p99",
        after_lease(r, lease, &sorted(gone.after_expiry)),
    );
    r.info(
        B,
        "  samples (with a candidate, without)",
        format!("{}, {}", after.len(), gone.campaign.len()),
    );

    let delivered = sorted(delivered);
    r.info(
        B,
        "observer: proclaim() to delivery: p50 / p99",
        spread(r, &delivered),
    );
    r.info(
        B,
        "  proclaim() call alone: p50",
        r.lat(pct(&sorted(proclaims), 0.5)),
    );
    r.info(
        B,
        "  plain script + PUBLISH to a SUBSCRIBE reader: p50 / p99",
        spread(r, &raw),
    );
    r.info(
        B,
        "  observer p50 / plain p50",
        format!(
            "{:.2}",
            pct(&delivered, 0.5).as_secs_f64() / pct(&raw, 0.5).as_secs_f64()
        ),
    );
    r.info(
        B,
        "observer: resign() to nobody delivered: p50 / p99",
        format!(
            "{} ({} of {})",
            spread(r, &sorted(watched.nobody.clone())),
            watched.nobody.len(),
            watched.next.len()
        ),
    );
    r.info(
        B,
        "observer: resign() to the next leader delivered: p50 / p99",
        spread(r, &sorted(watched.next)),
    );
    r.info(
        B,
        "  failover while observed: p50 / p99",
        spread(r, &sorted(watched.failover)),
    );
    let cold_p50 = pct(&cold, 0.5).as_secs_f64();
    let in_cold = |d: Duration| format!("{:.2}", d.as_secs_f64() / cold_p50);
    r.info(
        B,
        "p50s in cold round trips: failover, resign(), lock handoff, proclaim to delivery",
        [
            pct(&failover, 0.5),
            resign_p50,
            pct(&handoff, 0.5),
            pct(&delivered, 0.5),
        ]
        .map(in_cold)
        .join(", "),
    );
    noise.report(r, B);
}
