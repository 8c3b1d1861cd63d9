//! `multi`: `lock_all` of 1, 2, 4 and 8 keys + `unlock`, uncontended, from one thread, against
//! the same keys taken by that many `lock` calls one after another and unlocked one by one. A
//! set is that many plain lock calls in a canonical order, so both should cost about 2 round
//! trips per key; what `lock_all` adds (checking and sorting the keys, the set's guard) shows
//! as the ratio between them.
//!
//! Then contended: 4 threads over 2 clients all take the same n keys, with nothing between
//! taking a set and releasing it, by `lock_all` in one run and by n `lock` calls (in the order
//! `lock_all` takes them, so that neither deadlocks, released last taken first as `MultiGuard`
//! releases them) in another, in turns: all, one by one, one
//! by one, all, and again, 16 rounds of a sixteenth of at most 4 s (of `D_MS`) each.
//! The rate is the median round's: on a shared VM a burst of other work can halve a round's.
//! Both wait for each key in its queue, so they should pass sets on at the same rate.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::measure::Noise;
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, RedisServer};
use crate::stats::{pct, sorted};

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "multi";
    section("multi: lock_all of N keys + unlock against N lock calls + N unlocks, uncontended");
    let noise = Noise::start(server.pid());
    let client = client(&server.url());
    for i in 0..200 {
        client
            .lock_all(&[format!("warm:{i}:a"), format!("warm:{i}:b")])
            .expect("lock_all")
            .unlock()
            .expect("unlock");
    }
    let rounds = p.uncontended.min(1000);
    for n in [1_usize, 2, 4, 8] {
        let mut all = Vec::with_capacity(rounds);
        let mut one_by_one = Vec::with_capacity(rounds);
        for i in 0..rounds {
            // Fresh keys each time, as `uncontended` uses; the two ways take turns going first.
            let keys = |way: &str| -> Vec<String> {
                (0..n).map(|k| format!("m{n}:{way}:{i}:{k}")).collect()
            };
            let (set_keys, single_keys) = (keys("all"), keys("one"));
            for way in [i % 2, 1 - i % 2] {
                let start = Instant::now();
                if way == 0 {
                    client
                        .lock_all(&set_keys)
                        .expect("lock_all")
                        .unlock()
                        .expect("unlock");
                    all.push(start.elapsed());
                } else {
                    let guards: Vec<_> = single_keys
                        .iter()
                        .map(|key| client.lock(key).expect("lock"))
                        .collect();
                    for guard in guards {
                        guard.unlock().expect("unlock");
                    }
                    one_by_one.push(start.elapsed());
                }
            }
        }
        let (all, one_by_one) = (sorted(all), sorted(one_by_one));
        let (a, o) = (pct(&all, 0.5), pct(&one_by_one, 0.5));
        // In units of the 2·n round trips both ways make.
        let line = |d: Duration| {
            let per = r.ratio(d) / (2 * n) as f64;
            format!("{} = {per:.2}× 2·{n} RT", r.lat(d))
        };
        let (line_a, line_o) = (line(a), line(o));
        r.info(B, &format!("lock_all({n}) + unlock: p50"), line_a);
        r.info(B, &format!("{n} × lock, {n} × unlock: p50"), line_o);
        r.check(
            B,
            &format!("lock_all({n}) / {n} lock calls, p50"),
            format!(
                "{:.2}× (p99 {} / {})",
                a.as_secs_f64() / o.as_secs_f64(),
                fmt_d(pct(&all, 0.99)),
                fmt_d(pct(&one_by_one, 0.99))
            ),
            "≤ 1.1",
            a.as_secs_f64() <= 1.1 * o.as_secs_f64(),
        );
    }
    contended(&client, server, p, r);
    noise.report(r, B);
}

const THREADS: usize = 4;

/// `(sets taken, time to take each)` by `THREADS` threads over `clients`, each taking `keys`
/// (sorted) and releasing them at once, again and again for `d`.
fn contended_round(
    clients: &[LockClient],
    keys: &[String],
    by_set: bool,
    d: Duration,
) -> Vec<Duration> {
    let end = Instant::now() + d;
    thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = &clients[t % clients.len()];
                s.spawn(move || {
                    let mut took = Vec::new();
                    while Instant::now() < end {
                        let start = Instant::now();
                        if by_set {
                            let set = client.lock_all(keys).expect("lock_all");
                            took.push(start.elapsed());
                            set.unlock().expect("unlock");
                        } else {
                            let guards: Vec<_> = keys
                                .iter()
                                .map(|key| client.lock(key).expect("lock"))
                                .collect();
                            took.push(start.elapsed());
                            // Last taken first, as the set's unlock releases them.
                            for guard in guards.into_iter().rev() {
                                guard.unlock().expect("unlock");
                            }
                        }
                    }
                    took
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("contending thread"))
            .collect()
    })
}

fn contended(first: &LockClient, server: &RedisServer, p: &Params, r: &mut Report) {
    const B: &str = "multi contended";
    const ROUNDS: usize = 16;
    section(&format!(
        "multi, contended: {THREADS} threads over 2 clients on the same keys, lock_all against lock calls"
    ));
    let clients = [first.clone(), client(&server.url())];
    let round = p.duration.min(Duration::from_secs(4)) / ROUNDS as u32;
    for n in [1_usize, 2, 4, 8] {
        let mut keys: Vec<String> = (0..n).map(|k| format!("mc{n}:{k}")).collect();
        keys.sort();
        let (mut all, mut one_by_one) = (Vec::new(), Vec::new());
        // Sets per second of each round.
        let (mut all_rates, mut one_rates) = (Vec::new(), Vec::new());
        for i in 0..ROUNDS {
            // all, one, one, all, all, one, one, all, ...
            let by_set = (i % 2 == 0) == (i % 4 < 2);
            let start = Instant::now();
            let took = contended_round(&clients, &keys, by_set, round);
            let rate = took.len() as f64 / start.elapsed().as_secs_f64();
            if by_set {
                all.extend(took);
                all_rates.push(rate);
            } else {
                one_by_one.extend(took);
                one_rates.push(rate);
            }
        }
        let median = |rates: &mut Vec<f64>| {
            rates.sort_by(f64::total_cmp);
            rates[rates.len() / 2]
        };
        let (rate_a, rate_o) = (median(&mut all_rates), median(&mut one_rates));
        let (all, one_by_one) = (sorted(all), sorted(one_by_one));
        // A set passed on every 1/rate: in round trips.
        let line = |rate: f64, rates: &[f64], took: &[Duration]| {
            let per = Duration::from_secs_f64(1.0 / rate.max(1e-9));
            format!(
                "{rate:.0}/s (rounds {:.0}-{:.0}; one per {}); wait p50 {}, p99 {}",
                rates[0],
                rates[rates.len() - 1],
                r.lat(per),
                fmt_d(pct(took, 0.5)),
                fmt_d(pct(took, 0.99)),
            )
        };
        let line_a = line(rate_a, &all_rates, &all);
        let line_o = line(rate_o, &one_rates, &one_by_one);
        r.info(B, &format!("lock_all({n}): sets, median round"), line_a);
        r.info(B, &format!("{n} × lock: sets, median round"), line_o);
        r.check(
            B,
            &format!("contended lock_all({n}) / {n} lock calls, sets/s"),
            format!("{:.2}×", rate_a / rate_o),
            "≥ 0.9",
            rate_a >= 0.9 * rate_o,
        );
    }
}
