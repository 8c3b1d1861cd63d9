//! How a lock stands, read without taking it: [`LockStatus`], from
//! [`LockClient::status`](crate::LockClient::status).

use std::time::Duration;

use crate::error::Result;
use crate::key::LockKeys;
use crate::locks::Locks;
use crate::scripts;
use crate::token::FencingToken;

/// How a lock stood in Redis when [`LockClient::status`](crate::LockClient::status) read it:
/// held or free, the holder's token and remaining lease, and how many clients wait.
///
/// All of it is read in one atomic step, so it describes one moment; by the time you look at
/// it, the lock may have changed hands. It is for operators and monitoring, not for deciding
/// whether to lock: [`try_lock`](crate::LockClient::try_lock) with `Duration::ZERO` asks and
/// takes in one step.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let status = client.status("invoice:7")?;
/// if status.held {
///     match (status.token, status.remaining_lease) {
///         (Some(token), Some(left)) => println!("held with token {token}, {left:?} left"),
///         (token, left) => println!("held (token {token:?}, lease {left:?})"),
///     }
/// } else {
///     println!("free");
/// }
/// println!("{} client(s) waiting", status.waiters);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// Whether some owner holds the lock: its key exists in Redis.
    pub held: bool,
    /// The holder's fencing token, exactly: `None` when the lock is free.
    ///
    /// Every grant sets the lock key and the key's fence counter (to the grant's token) in one
    /// script, and nothing else writes the counter, so while the lock is held the counter holds
    /// the holder's token. It is read in the same atomic step as the lock key. Also `None` when
    /// the lock is held but the counter is gone: it expired during a hold longer than
    /// [`Builder::idle_expiry`](crate::Builder::idle_expiry), or was deleted by hand.
    pub token: Option<FencingToken>,
    /// How long the holder's lease has left in Redis (renewal keeps re-arming it). `None` when
    /// the lock is free, or when its key has no expiry (set by hand).
    pub remaining_lease: Option<Duration>,
    /// How many clients wait in the key's queue in Redis: one per waiting [`LockClient`]
    /// (its other threads wait behind that one, in its own process), counting only entries
    /// that have not expired. A waiter whose process died is counted until its entry expires,
    /// at most its lease after the holder's lease as it last saw it; a
    /// [`try_lock`](crate::LockClient::try_lock) with `Duration::ZERO` never queues.
    ///
    /// [`LockClient`]: crate::LockClient
    pub waiters: u64,
}

impl Locks {
    /// Reads how the lock on `key` stands, by the read-only status script: one round trip,
    /// repeated on a fresh connection if the pooled one turns out broken.
    pub(crate) fn status(&self, key: &str) -> Result<LockStatus> {
        let keys = LockKeys::new(&self.config.namespace, key)?;
        if let Some(quorum) = &self.quorum {
            return quorum.status(&keys);
        }
        let status = self
            .router
            .run(keys.lock(), |con, _| scripts::status(con, &keys))?;
        Ok(LockStatus {
            held: status.held,
            token: status.token,
            remaining_lease: status.pttl,
            waiters: status.waiters,
        })
    }
}
