//! `rtt`: PING and no-op EVALSHA round trips on a plain connection, at the start of the run (the
//! unit of every ratio) and again at its end (a drift check). Always measured.

use std::thread;
use std::time::{Duration, Instant};

use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::{RedisServer, NOOP};
use crate::stats::{mean, pct, sorted};

const B: &str = "0 round trip";

struct Rtt {
    ping: Duration,
    evalsha: Duration,
    /// Lowest and highest EVALSHA p50 of the blocks.
    evalsha_blocks: (Duration, Duration),
}

/// PING and no-op EVALSHA, interleaved so both see the same conditions, in 20 blocks separated by
/// short sleeps; the first samples after each sleep (a cold machine) are dropped. Whether the
/// client thread and redis-server share a core changes a round trip by up to 3× on a small VM
/// and tends to last for seconds: the spread of the blocks' p50 shows it.
fn measure_rtt(server: &RedisServer, samples: usize) -> Rtt {
    const BLOCKS: usize = 20;
    const DROPPED: usize = 20;
    let mut con = server.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(NOOP)
        .query(&mut con)
        .expect("SCRIPT LOAD");
    let ping_cmd = redis::cmd("PING");
    let mut evalsha_cmd = redis::cmd("EVALSHA");
    evalsha_cmd.arg(&sha).arg(0);
    let per_block = (samples / BLOCKS).max(10);
    let mut ping = Vec::with_capacity(samples);
    let mut evalsha = Vec::with_capacity(samples);
    let mut blocks = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        thread::sleep(Duration::from_millis(2));
        let mut block = Vec::with_capacity(per_block);
        for i in 0..per_block + DROPPED {
            let t = Instant::now();
            let _: redis::Value = ping_cmd.query(&mut con).expect("PING");
            let t_ping = t.elapsed();
            let t = Instant::now();
            let _: redis::Value = evalsha_cmd.query(&mut con).expect("EVALSHA");
            let t_evalsha = t.elapsed();
            if i >= DROPPED {
                ping.push(t_ping);
                evalsha.push(t_evalsha);
                block.push(t_evalsha);
            }
        }
        blocks.push(pct(&sorted(block), 0.5));
    }
    let (ping, evalsha) = (sorted(ping), sorted(evalsha));
    for (name, s) in [("PING", &ping), ("EVALSHA `return 1`", &evalsha)] {
        println!(
            "  {name:<20} p50 {}  p99 {}  mean {}  ({} samples)",
            fmt_d(pct(s, 0.5)),
            fmt_d(pct(s, 0.99)),
            fmt_d(mean(s)),
            s.len()
        );
    }
    let lo = blocks.iter().copied().min().unwrap_or_default();
    let hi = blocks.iter().copied().max().unwrap_or_default();
    println!(
        "  EVALSHA p50 of each block: {} to {}",
        fmt_d(lo),
        fmt_d(hi)
    );
    Rtt {
        ping: pct(&ping, 0.5),
        evalsha: pct(&evalsha, 0.5),
        evalsha_blocks: (lo, hi),
    }
}

/// The round trips at the start of the run; returns the report whose unit is their EVALSHA p50.
/// `load` is the machine's load average at the start, reported beside them.
pub fn run_first(server: &RedisServer, p: &Params, load: &str) -> Report {
    section("round trips on a plain connection (the unit of every ratio)");
    let rtt = measure_rtt(server, p.rtt_samples);
    let mut r = Report::new(rtt.evalsha);
    r.info(
        B,
        "machine: load average at start (1, 5, 15 min)",
        load.to_owned(),
    );
    r.info(B, "PING p50", fmt_d(rtt.ping));
    r.info(B, "no-op EVALSHA p50 (= 1 RT)", fmt_d(rtt.evalsha));
    r
}

/// The round trips again, with half the samples, once every benchmark ran.
pub fn run_again(server: &RedisServer, p: &Params, r: &mut Report) {
    section("round trips again, at the end of the run (drift check)");
    let end = measure_rtt(server, p.rtt_samples / 2);
    r.info(
        B,
        "no-op EVALSHA p50 at the end of the run",
        format!(
            "{} (blocks {} to {})",
            fmt_d(end.evalsha),
            fmt_d(end.evalsha_blocks.0),
            fmt_d(end.evalsha_blocks.1)
        ),
    );
}
