//! `multi`: `lock_all` of 1, 2, 4 and 8 keys + `unlock`, uncontended, from one thread, against
//! the same keys taken by that many `lock` calls one after another and unlocked one by one. A
//! set is that many plain lock calls in a canonical order, so both should cost about 2 round
//! trips per key; what `lock_all` adds (checking and sorting the keys, the set's guard) shows
//! as the ratio between them.

use std::time::{Duration, Instant};

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
    noise.report(r, B);
}
