//! Helpers shared by the fault-injection tests (`tests/faults/`): a client builder that can
//! point at a proxy, the fence counter in Redis, and bounds on calls that a fault could hang.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Builder, LockClient};

use super::{fence_key, ms, NAMESPACE};

/// A client builder in the test namespace, for a server or a proxy.
pub fn builder(url: String, lease: Duration) -> Builder {
    LockClient::builder(url).namespace(NAMESPACE).lease(lease)
}

/// The key's fence counter (its last token), if any grant ever ran.
pub fn fence_value(con: &mut redis::Connection, key: &str) -> Option<u64> {
    redis::cmd("GET").arg(fence_key(key)).query(con).unwrap()
}

/// Runs `f` on a thread of its own; the answer arrives on the returned channel.
pub fn spawn_answer<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: a call that hangs fails the
/// test instead of stalling the suite.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    match spawn_answer(f).recv_timeout(limit) {
        Ok(answer) => answer,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return within {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Polls `condition` every 2 ms until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        thread::sleep(ms(2));
    }
}
