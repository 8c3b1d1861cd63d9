//! What a lock call leaves on the masters once every holder has unlocked: nothing. A key left
//! behind blocks the lock for a whole lease on that master, and while a minority of the masters
//! is down, every attempt needs the others.

use std::thread;
use std::time::Duration;

use crate::support::quorum::Quorum;
use crate::support::{ms, poll_until};

/// Two clients of four threads each, new to fresh masters (their first calls go through the
/// masters' workers, which load the scripts, and later ones on connections of their own),
/// take one key in turn a few times; then every holder has unlocked. The attempts that lost
/// gave up their keys; none may stay.
#[test]
fn nothing_stays_on_the_masters_once_every_holder_unlocked() {
    for run in 0..6 {
        let quorum = Quorum::start(3);
        let lease = Duration::from_secs(30);
        let clients = [quorum.client(lease), quorum.client(lease)];
        thread::scope(|s| {
            for client in &clients {
                for _ in 0..4 {
                    s.spawn(move || {
                        for _ in 0..5 {
                            if let Some(guard) = client.try_lock("turns", ms(2_000)).unwrap() {
                                guard.unlock().unwrap();
                            }
                        }
                    });
                }
            }
        });
        poll_until(Duration::from_secs(3), ms(10), || {
            match quorum.masters_holding("turns") {
                left if left.is_empty() => Ok(()),
                left => Err(format!(
                    "masters {left:?} hold {:?}",
                    left.iter()
                        .map(|&i| (quorum.lock_owner(i, "turns"), quorum.lock_pttl(i, "turns")))
                        .collect::<Vec<_>>()
                )),
            }
        })
        .unwrap_or_else(|e| panic!("run {run}: a key stayed after every holder unlocked: {e}"));
    }
}
