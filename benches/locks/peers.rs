//! `peers`: fencelock's quorum mode against npm `redlock` 5 (on ioredis, one Node.js process), on
//! the same 5 redis-servers started for the run and on 3 of them. `benches/peers/run.sh` installs
//! the npm packages into `target/peers` (or `PEERS_DIR`) when they are missing and runs this;
//! without them this benchmark says so and measures nothing.
//!
//! - **Parallel round** ("PR"), each client's own: a no-op `EVALSHA` sent to every master at once,
//!   timed to the majority's reply; fencelock's from one thread with `poll` (as the `quorum`
//!   benchmark), redlock's with ioredis' promises in the same Node.js process as its locks.
//! - **Uncontended**: lock + unlock of a fresh key, U times, each just after a parallel round, in
//!   four blocks taken in turns (fencelock, redlock, fencelock, ...). redlock's is `acquire` +
//!   `release` (two rounds, both waited for on a majority; no token); fencelock's is `lock` +
//!   `unlock` (two: acquire proposing the token, release; a third, the write-back of the token,
//!   when a majority of the masters did not take the proposal).
//! - **Contention**: 8 workers on one key for D_MS, in two turns each: fencelock 8 threads of one
//!   client (`lock()` waits without polling), redlock 8 async workers of one process (retrying
//!   every 10 ms ± 10 ms, without end). Each worker releases as soon as it is granted, then
//!   thinks 1 ms.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fencelock::Topology;

use crate::contention::{run_contention, spread, Contention};
use crate::params::Params;
use crate::quorum::PollRound;
use crate::report::{fmt_d, section, Report};
use crate::server::{builder, RedisServer};
use crate::stats::{pct, sorted};

const B: &str = "11 peers";
/// Blocks of the uncontended runs, taken in turns.
const BLOCKS: usize = 4;
const WORKERS: usize = 8;
const THINK: Duration = Duration::from_millis(1);

/// Where `node_modules` with redlock and ioredis is.
fn modules() -> PathBuf {
    std::env::var_os("PEERS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/peers"),
        PathBuf::from,
    )
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers/redlock.mjs")
}

/// Runs the Node.js side; its output's lines, each a name and numbers.
fn node(ports: &str, args: &[String]) -> Vec<(String, Vec<f64>)> {
    let out = Command::new("node")
        .arg(script())
        .arg(modules())
        .arg(ports)
        .args(args)
        .output()
        .expect("node");
    assert!(
        out.status.success(),
        "node redlock.mjs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?.to_owned();
            Some((name, words.filter_map(|w| w.parse().ok()).collect()))
        })
        .collect()
}

fn micros(v: &[f64]) -> Vec<Duration> {
    sorted(
        v.iter()
            .map(|us| Duration::from_secs_f64(us / 1e6))
            .collect(),
    )
}

fn field<'a>(lines: &'a [(String, Vec<f64>)], name: &str) -> &'a [f64] {
    lines
        .iter()
        .find(|(n, _)| n == name)
        .map_or(&[][..], |(_, v)| v.as_slice())
}

pub fn run(p: &Params, r: &mut Report) {
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok || !modules().join("node_modules/redlock").exists() {
        println!(
            "\n== 11. peers: not measured (node or npm redlock missing: benches/peers/run.sh \
             installs it into target/peers)"
        );
        return;
    }
    section(&format!(
        "11. fencelock's quorum against npm redlock 5 (ioredis) on 5 and 3 masters: U={}, \
         {WORKERS} workers on one key for 2 x {} each, think {}",
        p.uncontended,
        fmt_d(p.duration / 2),
        fmt_d(THINK)
    ));
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let all: Vec<&RedisServer> = servers.iter().collect();
    let mut table = Vec::new();
    for n in [5, 3] {
        let masters = &all[..n];
        let ports: Vec<String> = masters.iter().map(|s| s.port().to_string()).collect();
        let ports = ports.join(",");
        let (fl, rl) = uncontended(masters, &ports, p, r);
        let (fc, rc) = contention(masters, &ports, p, r);
        table.push((n, fl, rl, fc, rc));
    }
    println!("\n  | masters | client | lock+unlock p50 / p99 | its PR p50 | in PRs | 8 workers: acq/s | wait p99 | max/min |");
    println!("  |---|---|---|---|---|---|---|---|");
    for (n, fl, rl, fc, rc) in table {
        for (who, u, c) in [("fencelock", fl, fc), ("npm redlock", rl, rc)] {
            println!(
                "  | {n} | {who} | {} / {} | {} | {:.2} | {:.0} | {} | {:.2} |",
                fmt_d(u.p50),
                fmt_d(u.p99),
                fmt_d(u.pr),
                u.p50.as_secs_f64() / u.pr.as_secs_f64(),
                c.rate,
                fmt_d(c.p99),
                c.fairness
            );
        }
    }
}

struct Uncontended {
    p50: Duration,
    p99: Duration,
    pr: Duration,
}

struct Contended {
    rate: f64,
    p99: Duration,
    fairness: f64,
}

fn uncontended(
    masters: &[&RedisServer],
    ports: &str,
    p: &Params,
    r: &mut Report,
) -> (Uncontended, Uncontended) {
    let n = masters.len();
    let q = n / 2 + 1;
    let client = builder(Topology::quorum(masters.iter().map(|s| s.url())))
        .build()
        .expect("quorum LockClient");
    let mut round = PollRound::new(masters);
    let per_block = (p.uncontended / BLOCKS).max(10);
    for i in 0..200 {
        round.round();
        client
            .lock(&format!("peer-warm:{i}"))
            .expect("lock")
            .unlock()
            .expect("unlock");
    }
    let (mut f_pr, mut f_lu, mut r_pr, mut r_lu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut key = 0u64;
    for _ in 0..BLOCKS {
        for _ in 0..per_block {
            f_pr.push(round.round()[q - 1]);
            key += 1;
            let t0 = std::time::Instant::now();
            let guard = client.lock(&format!("peer-u:{key}")).expect("lock");
            guard.unlock().expect("unlock");
            f_lu.push(t0.elapsed());
        }
        let lines = node(ports, &["uncontended".into(), per_block.to_string()]);
        r_pr.extend(micros(field(&lines, "pr")));
        r_lu.extend(micros(field(&lines, "lu")));
    }
    let summary = |pr: Vec<Duration>, lu: Vec<Duration>| {
        let (pr, lu) = (sorted(pr), sorted(lu));
        Uncontended {
            p50: pct(&lu, 0.5),
            p99: pct(&lu, 0.99),
            pr: pct(&pr, 0.5),
        }
    };
    let f = summary(f_pr, f_lu);
    let rl = summary(r_pr, r_lu);
    for (who, u) in [("fencelock quorum", &f), ("npm redlock", &rl)] {
        r.info(
            B,
            &format!("{n} masters: {who}: lock+unlock p50 / p99; its parallel round p50"),
            format!(
                "{} ({:.2}× its PR) / {}; {}",
                fmt_d(u.p50),
                u.p50.as_secs_f64() / u.pr.as_secs_f64(),
                fmt_d(u.p99),
                fmt_d(u.pr)
            ),
        );
    }
    r.check(
        B,
        &format!("{n} masters: fencelock lock+unlock p50 / npm redlock's"),
        format!("{:.2}", f.p50.as_secs_f64() / rl.p50.as_secs_f64()),
        "< 1",
        f.p50 < rl.p50,
    );
    (f, rl)
}

fn contention(
    masters: &[&RedisServer],
    ports: &str,
    p: &Params,
    r: &mut Report,
) -> (Contended, Contended) {
    let n = masters.len();
    let half = p.duration / 2;
    let mut fencelock: Option<Contention> = None;
    let (mut waits, mut counts) = (Vec::new(), vec![0f64; WORKERS]);
    for turn in 0..2 {
        let client = builder(Topology::quorum(masters.iter().map(|s| s.url())))
            .build()
            .expect("quorum LockClient");
        let run = run_contention(
            masters,
            spread(vec![client], WORKERS),
            &format!("peer-c:{turn}"),
            Duration::ZERO,
            THINK,
            half,
        );
        assert_eq!(run.overlaps, 0, "two fencelock holders at once");
        fencelock = Some(match fencelock {
            Some(before) => before.merge(run),
            None => run,
        });
        let lines = node(
            ports,
            &[
                "contention".into(),
                half.as_millis().to_string(),
                WORKERS.to_string(),
                "0".into(),
                THINK.as_micros().to_string(),
            ],
        );
        waits.extend(micros(field(&lines, "waits")));
        for (c, k) in counts.iter_mut().zip(field(&lines, "counts")) {
            *c += k;
        }
    }
    let fencelock = fencelock.expect("two turns");
    fencelock.describe(r, B, &format!("{n} masters fencelock quorum"));
    let f = Contended {
        rate: fencelock.rate(),
        p99: fencelock.wait(0.99),
        fairness: fencelock.fairness(),
    };
    let waits = sorted(waits);
    let max = counts.iter().copied().fold(0.0, f64::max);
    let min = counts.iter().copied().fold(f64::INFINITY, f64::min);
    let rl = Contended {
        rate: waits.len() as f64 / (2.0 * half.as_secs_f64()),
        p99: pct(&waits, 0.99),
        fairness: if min > 0.0 { max / min } else { f64::INFINITY },
    };
    r.info(
        B,
        &format!("{n} masters npm redlock: acquisitions/s; wait p50 / p99; max/min"),
        format!(
            "{:.0}/s; {} / {}; {:.2}",
            rl.rate,
            fmt_d(pct(&waits, 0.5)),
            fmt_d(rl.p99),
            rl.fairness
        ),
    );
    (f, rl)
}
