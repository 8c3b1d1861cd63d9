//! The output: a line per result as it comes, with a PASS/MISS mark where there is a target, and
//! a markdown table of every result at the end (docs/benchmarks.md keeps the latest).
//!
//! Latencies are printed with their ratio to the run's round trip: the p50 of a no-op EVALSHA on
//! a plain connection, measured first (`rtt`). Targets are informational: the exit code is 0
//! whatever they say.

use std::fmt::Write as _;
use std::time::Duration;

pub fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

pub fn section(title: &str) {
    println!("\n== {title}");
}

#[derive(Clone, Copy)]
enum Verdict {
    Pass,
    Miss,
    Info,
}

struct Row {
    bench: String,
    metric: String,
    value: String,
    target: String,
    verdict: Verdict,
}

pub struct Report {
    /// p50 of a no-op EVALSHA round trip: the unit of every ratio.
    evalsha: Duration,
    rows: Vec<Row>,
}

impl Report {
    pub fn new(evalsha: Duration) -> Report {
        Report {
            evalsha,
            rows: Vec::new(),
        }
    }

    pub fn ratio(&self, d: Duration) -> f64 {
        d.as_secs_f64() / self.evalsha.as_secs_f64()
    }

    /// A latency with its ratio to the EVALSHA round trip.
    pub fn lat(&self, d: Duration) -> String {
        format!("{} ({:.2}× RT)", fmt_d(d), self.ratio(d))
    }

    fn row(&mut self, bench: &str, metric: &str, value: String, target: &str, verdict: Verdict) {
        let mark = match verdict {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Info => "",
        };
        println!("  {metric:<44} {value:<40} {target} {mark}");
        self.rows.push(Row {
            bench: bench.to_owned(),
            metric: metric.to_owned(),
            value,
            target: target.to_owned(),
            verdict,
        });
    }

    pub fn info(&mut self, bench: &str, metric: &str, value: String) {
        self.row(bench, metric, value, "", Verdict::Info);
    }

    pub fn check(&mut self, bench: &str, metric: &str, value: String, target: &str, ok: bool) {
        let verdict = if ok { Verdict::Pass } else { Verdict::Miss };
        self.row(bench, metric, value, target, verdict);
    }

    /// Prints the count of targets met and missed, then the markdown table of every result.
    pub fn close(&self, elapsed: Duration) {
        let misses = self
            .rows
            .iter()
            .filter(|row| matches!(row.verdict, Verdict::Miss))
            .count();
        let checked = self
            .rows
            .iter()
            .filter(|row| !matches!(row.verdict, Verdict::Info))
            .count();
        println!(
            "\n== summary ({} passed, {misses} missed; {} in all)\n",
            checked - misses,
            fmt_d(elapsed)
        );
        println!("{}", self.table());
    }

    fn table(&self) -> String {
        let mut out =
            String::from("| benchmark | metric | result | target | |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            let mark = match r.verdict {
                Verdict::Pass => "PASS",
                Verdict::Miss => "**MISS**",
                Verdict::Info => "",
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {mark} |",
                r.bench, r.metric, r.value, r.target
            );
        }
        out
    }
}
