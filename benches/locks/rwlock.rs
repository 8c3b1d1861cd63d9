//! `rwlock`: read-write locks, each figure beside a plain lock measured in the same run.
//!
//! - mixes: 16 threads (each on a client of its own) take one read-write lock again and again,
//!   hold it for the critical section S and release, with no think time: a read-mostly mix (one
//!   grant in 20 a write) and a write-heavy one (one in 2); beside them the same threads on one
//!   plain lock, which every grant holds alone. Grants per second, and the ratio to the lock's;
//! - handoff: a writer holds while 4 readers, each on a client of its own, are blocked in
//!   `read_lock()`; the time from the start of the writer's `unlock()` to the first and to the
//!   last reader's `read_lock` returning (one release admits them all), against a lock's handoff
//!   to one waiter in the same run.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::LockClient;

use crate::handoff::handoff_fencelock;
use crate::measure::Noise;
use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{client, command_calls, RedisServer};
use crate::stats::{jitter, pct, sorted};

const B: &str = "rwlock";
const THREADS: usize = 16;
/// Readers admitted by one writer's release in the handoff.
const READERS: usize = 4;

pub fn run(server: &RedisServer, p: &Params, r: &mut Report) {
    section("rwlock: 95% and 50% reads against one lock, 16 threads; writer release to 4 readers");
    let noise = Noise::start(server.pid());
    mixes(server, p, r);
    handoff(server, p, r);
    noise.report(r, B);
}

/// What each grant of a round takes.
#[derive(Clone, Copy)]
enum Mix {
    /// A write every `n`th grant of a thread (threads offset), reads otherwise.
    WriteOneIn(usize),
    /// The plain lock.
    Lock,
}

/// Grants of all threads over `clients` on `name` for `d`, each held for `critical`.
fn round(clients: &[LockClient], name: &str, mix: Mix, critical: Duration, d: Duration) -> u64 {
    let end = Instant::now() + d;
    thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = &clients[t % clients.len()];
                s.spawn(move || {
                    let mut grants = 0u64;
                    let mut i = t;
                    while Instant::now() < end {
                        match mix {
                            Mix::WriteOneIn(n) if i % n == 0 => {
                                let g = client.write_lock(name).expect("write_lock");
                                thread::sleep(critical);
                                g.unlock().expect("unlock");
                            }
                            Mix::WriteOneIn(_) => {
                                let g = client.read_lock(name).expect("read_lock");
                                thread::sleep(critical);
                                g.unlock().expect("unlock");
                            }
                            Mix::Lock => {
                                let g = client.lock(name).expect("lock");
                                thread::sleep(critical);
                                g.unlock().expect("unlock");
                            }
                        }
                        grants += 1;
                        i += 1;
                    }
                    grants
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("contending thread"))
            .sum()
    })
}

fn mixes(server: &RedisServer, p: &Params, r: &mut Report) {
    let d = p.duration.min(Duration::from_secs(4));
    let critical = p.critical;
    let clients: Vec<LockClient> = (0..THREADS).map(|_| client(&server.url())).collect();
    let mut rates = Vec::new();
    for (label, mix) in [
        ("read-mostly (1 write in 20)", Mix::WriteOneIn(20)),
        ("write-heavy (1 write in 2)", Mix::WriteOneIn(2)),
        ("one plain lock", Mix::Lock),
    ] {
        let name = format!("rwm:{label}");
        let start = Instant::now();
        let grants = round(&clients, &name, mix, critical, d);
        let rate = grants as f64 / start.elapsed().as_secs_f64();
        let per = Duration::from_secs_f64(1.0 / rate.max(1e-9));
        r.info(
            B,
            &format!("16 threads, {label}: grants/s"),
            format!(
                "{rate:.0}/s (one per {}; S = {})",
                r.lat(per),
                fmt_d(critical)
            ),
        );
        rates.push(rate);
    }
    r.info(
        B,
        "read-mostly / plain lock, grants/s",
        format!("{:.2}×", rates[0] / rates[2]),
    );
    // Half of the grants are writes, each alone as a lock's grant is; the reads between them
    // come in pairs at most, so the mix should not fall below the lock.
    r.check(
        B,
        "write-heavy / plain lock, grants/s",
        format!("{:.2}×", rates[1] / rates[2]),
        "≥ 0.8",
        rates[1] >= 0.8 * rates[2],
    );
}

fn handoff(server: &RedisServer, p: &Params, r: &mut Report) {
    let n = p.handoffs;
    let name = "rwh";
    let writer = client(&server.url());
    let mut stats = server.connection();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Instant>();
    let gos: Vec<crossbeam_channel::Sender<()>> = (0..READERS)
        .map(|_| {
            let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(1);
            let reader = client(&server.url());
            let done_tx = done_tx.clone();
            thread::spawn(move || {
                while go_rx.recv().is_ok() {
                    let g = reader.read_lock(name).expect("reader read_lock");
                    let granted = Instant::now();
                    g.unlock().expect("reader unlock");
                    done_tx.send(granted).expect("report");
                }
            });
            go_tx
        })
        .collect();
    let (mut first, mut last) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 5 {
        let w = writer.write_lock(name).expect("writer write_lock");
        let before = command_calls(&mut stats, "evalsha");
        for go in &gos {
            go.send(()).expect("go");
        }
        // Each reader's refused attempt, then time for them to block and the machine to idle.
        let deadline = Instant::now() + Duration::from_secs(10);
        while command_calls(&mut stats, "evalsha") < before + READERS as u64 {
            assert!(Instant::now() < deadline, "the readers never attempted");
            thread::sleep(Duration::from_micros(200));
        }
        thread::sleep(jitter(
            i as u64,
            Duration::from_millis(3),
            Duration::from_millis(6),
        ));
        let released = Instant::now();
        w.unlock().expect("writer unlock");
        let grants: Vec<Instant> = (0..READERS)
            .map(|_| done_rx.recv().expect("granted"))
            .collect();
        if i >= 5 {
            let min = grants.iter().min().expect("readers");
            let max = grants.iter().max().expect("readers");
            first.push(min.saturating_duration_since(released));
            last.push(max.saturating_duration_since(released));
        }
    }
    drop(gos);
    let (locks, _) = handoff_fencelock(
        server,
        client(&server.url()),
        client(&server.url()),
        "rwh-lock",
        n,
    );
    let (first, last, locks) = (sorted(first), sorted(last), sorted(locks));
    let (f, l, k) = (pct(&first, 0.5), pct(&last, 0.5), pct(&locks, 0.5));
    r.info(
        B,
        "writer release to the first of 4 readers: p50 (p99)",
        format!("{} ({})", r.lat(f), fmt_d(pct(&first, 0.99))),
    );
    r.info(
        B,
        "writer release to the last of 4 readers: p50 (p99)",
        format!("{} ({})", r.lat(l), fmt_d(pct(&last, 0.99))),
    );
    r.info(
        B,
        "lock handoff to one waiter, same run: p50 (p99)",
        format!("{} ({})", r.lat(k), fmt_d(pct(&locks, 0.99))),
    );
    r.info(
        B,
        "first reader / lock handoff, p50",
        format!("{:.2}×", f.as_secs_f64() / k.as_secs_f64()),
    );
    r.info(
        B,
        "last of 4 readers / lock handoff, p50",
        format!("{:.2}×", l.as_secs_f64() / k.as_secs_f64()),
    );
}
