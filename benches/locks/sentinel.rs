//! `sentinel`: what a failover costs a client that keeps locking. A master, two replicas and
//! three sentinels (`down-after-milliseconds 1000`) with the recommended `min-replicas-to-write
//! 1`; one thread locks and unlocks one key in a loop while the master is moved by `SENTINEL
//! FAILOVER`, then frozen with SIGSTOP. Reported: from the trigger to the first grant on the new
//! master, and the longest time without a grant. Seconds, not round trips: Sentinel's own
//! timers (its failure detection, its one-second cron) set these figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::Topology;

use crate::params::Params;
use crate::report::{section, Report};
use crate::server::builder;
use crate::server::sentinel::{SentinelSet, MASTER_NAME};

const B: &str = "8 sentinel";
/// Coordinated failovers measured.
const FAILOVERS: usize = 3;

pub fn run(_p: &Params, r: &mut Report) {
    section("8. Sentinel: a failover, as a client that keeps locking sees it");
    let set = SentinelSet::start_with(
        2,
        &[
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "1",
        ],
    );
    let client = builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .lease(Duration::from_secs(5))
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let grants = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (grants, stop) = (Arc::clone(&grants), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match client.try_lock("failover", Duration::from_millis(500)) {
                    Ok(Some(guard)) => {
                        grants.lock().unwrap().push(Instant::now());
                        drop(guard);
                    }
                    _ => thread::sleep(Duration::from_millis(1)),
                }
            }
        })
    };
    let mut firsts = Vec::new();
    let mut gaps = Vec::new();
    let measure = |trigger: Instant, switched: Instant| {
        // Until the client has granted for a while after the switch.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let last = grants.lock().unwrap().last().copied();
            if last.is_some_and(|l| l > switched + Duration::from_millis(500))
                || Instant::now() > deadline
            {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let times: Vec<Instant> = grants.lock().unwrap().clone();
        let first = times.iter().find(|t| **t > switched).copied();
        let gap = times
            .windows(2)
            .filter(|w| w[1] > trigger)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        let first = first.map(|f| f - trigger);
        (first, gap)
    };
    for _ in 0..FAILOVERS {
        let trigger = Instant::now();
        set.failover();
        let switched = Instant::now();
        let (first, gap) = measure(trigger, switched);
        firsts.push(first);
        gaps.push(gap);
        set.wait_settled(Duration::from_secs(30));
    }
    let secs =
        |d: Option<Duration>| d.map_or("none".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    r.info(
        B,
        "SENTINEL FAILOVER to the first grant on the new master (each run)",
        firsts
            .iter()
            .map(|f| secs(*f))
            .collect::<Vec<_>>()
            .join(", "),
    );
    r.info(
        B,
        "SENTINEL FAILOVER: longest time without a grant (each run)",
        gaps.iter()
            .map(|g| secs(Some(*g)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let old = set.master_port();
    let trigger = Instant::now();
    set.servers()[set.master_index()].pause();
    set.wait_for_switch(old, Duration::from_secs(30));
    let switched = Instant::now();
    let (first, gap) = measure(trigger, switched);
    set.servers()[set.server_by_port(old)].resume();
    r.info(
        B,
        "master frozen (SIGSTOP): to the first grant on the new master",
        secs(first),
    );
    r.info(
        B,
        "master frozen (SIGSTOP): longest time without a grant",
        secs(Some(gap)),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
}
