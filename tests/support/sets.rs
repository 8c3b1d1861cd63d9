//! Random overlapping sets of keys, each named in a random order, taken with `lock_all` by
//! threads of several clients: the deadlock check of `lock_all`, on any deployment.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{self, RecvTimeoutError};
use fencelock::{LockClient, LockOptions};

use super::Rng;

/// How many sets each thread took.
pub struct Rounds(pub Vec<u64>);

/// Runs `threads` threads, spread over `clients`, for `run` (or `max_rounds` sets each, if
/// sooner): each takes a random 2 to `max_set` of `keys` in a random order with `lock_all`,
/// checks that it holds each of them alone (an in-process flag per key), sleeps up to 1 ms and
/// unlocks. A deadlock stops the threads it catches for good (renewal keeps their leases
/// alive), so once `grace` has passed after `run`, the waits still going are cancelled and
/// the run fails, saying how many threads were stuck.
pub fn run_random_sets(
    clients: &[LockClient],
    threads: usize,
    keys: &[&'static str],
    max_set: usize,
    run: Duration,
    max_rounds: u64,
    grace: Duration,
) -> Result<Rounds, String> {
    assert!(max_set >= 2 && max_set <= keys.len());
    let held: Arc<Vec<AtomicBool>> =
        Arc::new(keys.iter().map(|_| AtomicBool::new(false)).collect());
    let taken = Arc::new(AtomicU64::new(0));
    // Dropped to cancel every wait: a deadlocked thread then returns and can be joined.
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(0);
    let (done_tx, done) = crossbeam_channel::unbounded();
    let until = Instant::now() + run;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let keys = keys.to_vec();
            let (held, taken, done) = (Arc::clone(&held), Arc::clone(&taken), done_tx.clone());
            let options = LockOptions::new().cancel(cancelled.clone());
            thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                let mut mine = 0_u64;
                while Instant::now() < until && mine < max_rounds {
                    // A random order of a random subset: shuffle, keep 2 to max_set.
                    let mut names: Vec<usize> = (0..keys.len()).collect();
                    for i in (1..names.len()).rev() {
                        names.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    names.truncate(2 + rng.below(max_set as u64 - 1) as usize);
                    let set_keys: Vec<&str> = names.iter().map(|&i| keys[i]).collect();
                    let set = match client.lock_all_with(&set_keys, &options) {
                        Ok(set) => set,
                        Err(e) => {
                            let _ = done.send(Err(format!("thread {t}: lock_all: {e}")));
                            return;
                        }
                    };
                    if let Some(&i) = names
                        .iter()
                        .find(|&&i| held[i].swap(true, Ordering::SeqCst))
                    {
                        let _ = done.send(Err(format!("thread {t}: {} held twice", keys[i])));
                        return;
                    }
                    thread::sleep(Duration::from_micros(200 * rng.below(5)));
                    for &i in &names {
                        held[i].store(false, Ordering::SeqCst);
                    }
                    if let Err(e) = set.unlock() {
                        let _ = done.send(Err(format!("thread {t}: unlock: {e}")));
                        return;
                    }
                    mine += 1;
                    taken.fetch_add(1, Ordering::Relaxed);
                }
                let _ = done.send(Ok(mine));
            })
        })
        .collect();
    drop(done_tx);

    let mut finished = Vec::new();
    let mut failed = Vec::new();
    let limit = until + grace;
    while finished.len() + failed.len() < threads {
        match done.recv_timeout(limit.saturating_duration_since(Instant::now())) {
            Ok(Ok(n)) => finished.push(n),
            Ok(Err(e)) => failed.push(e),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    let stuck = threads - finished.len() - failed.len();
    drop(cancel);
    for handle in handles {
        handle
            .join()
            .map_err(|_| "a thread of the run panicked".to_owned())?;
    }
    let taken = taken.load(Ordering::Relaxed);
    if stuck > 0 {
        return Err(format!(
            "{stuck} threads deadlocked ({taken} sets taken before; finished: {finished:?}; {failed:?})"
        ));
    }
    if !failed.is_empty() {
        return Err(format!("{failed:?}"));
    }
    Ok(Rounds(finished))
}
