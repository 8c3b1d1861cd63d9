//! `semaphore`: a counting semaphore's permits, each beside a lock measured in the same run.
//!
//! - uncontended: `acquire` + `release` of a permit from one thread, against `lock` + `unlock`,
//!   in turns (fresh names each time, as `uncontended` uses); both should cost two round trips;
//! - throughput and fairness: 16 threads (`SEM_T`) take permits of one semaphore of 4 with a
//!   critical section S and no think time, each thread on a client of its own and then all over
//!   2 clients; grants per second, and how evenly they went to the threads (the fewest and most
//!   grants of one thread, and Jain's index: 1 when all got as many, 1/n when one got them all).
//!   Beside it, the same threads on one lock;
//! - handoff: a holder releases the only permit while a waiter of another client is blocked in
//!   `acquire()`; the time from the start of the release to the waiter's `acquire` returning,
//!   against a lock's handoff in the same run.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::handoff::{handoff_fencelock, wait_for_attempt};
use crate::measure::Noise;
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, RedisServer};
use crate::stats::{jitter, pct, sorted};

const B: &str = "semaphore";
const PERMITS: u32 = 4;
const THREADS: usize = 16;

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    section(
        "semaphore: acquire + release against lock + unlock; 16 threads over 4 permits; handoff",
    );
    let noise = Noise::start(server.pid());
    uncontended(server, p, r);
    contended(server, p, r);
    handoff(server, p, r);
    noise.report(r, B);
}

fn uncontended(server: &RedisServer, p: &Params, r: &mut Report) {
    let client = client(&server.url());
    for i in 0..200 {
        let semaphore = client.semaphore(&format!("warm:{i}"), PERMITS).unwrap();
        semaphore.acquire().unwrap().release().unwrap();
        client.lock(&format!("warm:{i}")).unwrap().unlock().unwrap();
    }
    let rounds = p.uncontended.min(2000);
    let (mut permits, mut locks) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for i in 0..rounds {
        let semaphore = client
            .semaphore(&format!("su:{i}"), PERMITS)
            .expect("semaphore");
        let key = format!("lu:{i}");
        // The two take turns going first.
        for way in [i % 2, 1 - i % 2] {
            let start = Instant::now();
            if way == 0 {
                semaphore
                    .acquire()
                    .expect("acquire")
                    .release()
                    .expect("release");
                permits.push(start.elapsed());
            } else {
                client.lock(&key).expect("lock").unlock().expect("unlock");
                locks.push(start.elapsed());
            }
        }
    }
    let (permits, locks) = (sorted(permits), sorted(locks));
    let (s, l) = (pct(&permits, 0.5), pct(&locks, 0.5));
    r.info(
        B,
        "acquire + release, uncontended: p50 (p99)",
        format!("{} ({})", r.lat(s), fmt_d(pct(&permits, 0.99))),
    );
    r.info(
        B,
        "lock + unlock, same run: p50 (p99)",
        format!("{} ({})", r.lat(l), fmt_d(pct(&locks, 0.99))),
    );
    r.check(
        B,
        "acquire + release / lock + unlock, p50",
        format!("{:.2}×", s.as_secs_f64() / l.as_secs_f64()),
        "≤ 1.2",
        s.as_secs_f64() <= 1.2 * l.as_secs_f64(),
    );
}

/// Grants of each of `THREADS` threads over `clients`, taking a permit (or, with `None`, the
/// lock on `name`), holding it for `critical`, releasing, again and again for `d`.
fn round(
    clients: &[LockClient],
    name: &str,
    permits: Option<u32>,
    critical: Duration,
    d: Duration,
) -> Vec<u64> {
    let end = Instant::now() + d;
    thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = &clients[t % clients.len()];
                s.spawn(move || {
                    let semaphore = permits.map(|n| client.semaphore(name, n).expect("semaphore"));
                    let mut grants = 0;
                    while Instant::now() < end {
                        match &semaphore {
                            Some(semaphore) => {
                                let permit = semaphore.acquire().expect("acquire");
                                thread::sleep(critical);
                                permit.release().expect("release");
                            }
                            None => {
                                let guard = client.lock(name).expect("lock");
                                thread::sleep(critical);
                                guard.unlock().expect("unlock");
                            }
                        }
                        grants += 1;
                    }
                    grants
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("contending thread"))
            .collect()
    })
}

/// Jain's fairness index of `x`: (Σx)² / (n · Σx²).
fn jain(x: &[u64]) -> f64 {
    let sum: f64 = x.iter().map(|&v| v as f64).sum();
    let squares: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

fn contended(server: &RedisServer, p: &Params, r: &mut Report) {
    let d = p.duration.min(Duration::from_secs(4));
    let critical = p.critical;
    let own: Vec<LockClient> = (0..THREADS).map(|_| client(&server.url())).collect();
    let two: Vec<LockClient> = (0..2).map(|_| client(&server.url())).collect();
    let mut rates = Vec::new();
    for (label, clients, permits) in [
        ("16 clients, semaphore of 4", &own, Some(PERMITS)),
        ("2 clients, semaphore of 4", &two, Some(PERMITS)),
        ("16 clients, one lock", &own, None),
    ] {
        let name = format!("sc:{}:{}", clients.len(), permits.unwrap_or(0));
        let start = Instant::now();
        let grants = round(clients, &name, permits, critical, d);
        let rate = grants.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64();
        let (min, max) = (
            grants.iter().min().copied().unwrap_or(0),
            grants.iter().max().copied().unwrap_or(0),
        );
        let per = Duration::from_secs_f64(1.0 / rate.max(1e-9));
        r.info(
            B,
            &format!("{label}: grants/s"),
            format!(
                "{rate:.0}/s (one per {}; S = {})",
                r.lat(per),
                fmt_d(critical)
            ),
        );
        r.info(
            B,
            &format!("{label}: grants per thread"),
            format!("min {min}, max {max}, Jain's index {:.3}", jain(&grants)),
        );
        if permits.is_some() && clients.len() == THREADS {
            r.check(
                B,
                &format!("{label}: Jain's index"),
                format!("{:.3}", jain(&grants)),
                "≥ 0.9",
                jain(&grants) >= 0.9,
            );
        }
        rates.push(rate);
    }
    // With S much longer than a round trip, 4 permits pass about 4× the grants of one lock.
    r.info(
        B,
        "16 clients: semaphore of 4 / one lock, grants/s",
        format!("{:.2}×", rates[0] / rates[2]),
    );
}

fn handoff(server: &RedisServer, p: &Params, r: &mut Report) {
    let n = p.handoffs;
    let holder = client(&server.url());
    let waiter = client(&server.url());
    let mut stats = server.connection();
    let name = "sh";
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<Instant>(0);
    let waiting = waiter.semaphore(name, 1).expect("semaphore");
    let t = thread::spawn(move || {
        while go_rx.recv().is_ok() {
            let permit = waiting.acquire().expect("waiter acquire");
            let granted = Instant::now();
            permit.release().expect("waiter release");
            done_tx.send(granted).expect("report");
        }
    });
    let holding = holder.semaphore(name, 1).expect("semaphore");
    let mut out = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let permit = holding.acquire().expect("holder acquire");
        let before = command_calls(&mut stats, "evalsha");
        go_tx.send(()).expect("go");
        wait_for_attempt(&mut stats, "evalsha", before);
        // Time for the waiter to block after its refused attempt, and for the machine to idle.
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let released = Instant::now();
        permit.release().expect("holder release");
        let granted = done_rx.recv().expect("granted");
        if i >= 5 {
            out.push(granted.saturating_duration_since(released));
        }
    }
    drop(go_tx);
    t.join().expect("waiter thread");
    let (locks, _) = handoff_fencelock(
        server,
        client(&server.url()),
        client(&server.url()),
        "sh-lock",
        n,
    );
    let (out, locks) = (sorted(out), sorted(locks));
    let (s, l) = (pct(&out, 0.5), pct(&locks, 0.5));
    r.info(
        B,
        "handoff, release to a waiter's acquire: p50 (p99)",
        format!("{} ({})", r.lat(s), fmt_d(pct(&out, 0.99))),
    );
    r.info(
        B,
        "lock handoff, same run: p50 (p99)",
        format!("{} ({})", r.lat(l), fmt_d(pct(&locks, 0.99))),
    );
    r.check(
        B,
        "semaphore / lock handoff, p50",
        format!("{:.2}×", s.as_secs_f64() / l.as_secs_f64()),
        "≤ 1.2",
        s.as_secs_f64() <= 1.2 * l.as_secs_f64(),
    );
}
