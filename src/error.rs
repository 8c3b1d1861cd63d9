use std::time::Duration;

/// The result type of every fallible fencelock call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The message of [`Error::Rejected`]: what to check depends on what failed. Told by the text,
/// which a copy of the error for several callers keeps.
fn rejected(cause: &BoxError) -> String {
    let cause = cause.to_string();
    if cause.starts_with(HANDSHAKE_FAILED) {
        format!("redis connection rejected: {cause}; retrying will not help")
    } else if MISCONFIGURED.iter().any(|says| cause.contains(says)) {
        // The cause says what is wrong and what to do; credentials have nothing to do with it.
        format!("redis connection rejected: {cause} (retrying will not help)")
    } else {
        format!(
            "redis rejected the connection: {cause} (retrying will not help: check the URL's \
             credentials and database)"
        )
    }
}

/// Starts the message of every failed TLS handshake, so that [`Error::Rejected`]'s message can
/// tell a TLS failure from a refused set-up even in a copy that kept only the text.
pub(crate) const HANDSHAKE_FAILED: &str = "the TLS handshake failed";
/// The servers given as sentinels are not sentinels.
pub(crate) const NOT_SENTINELS: &str = "the servers given as sentinels are not sentinels (they \
     do not know the SENTINEL command): a Sentinel topology names the sentinels (redis-server \
     --sentinel, port 26379 by default), not the data servers; for one server use a redis:// URL";
/// The sentinels answered, and none knows the master name.
pub(crate) const UNKNOWN_MASTER: &str = "no sentinel knows a master by that name: check it \
     against the `sentinel monitor <name> ...` line of the sentinels' configuration";
/// A server given as a cluster node is not in cluster mode.
pub(crate) const NOT_A_CLUSTER: &str = "is not in cluster mode (cluster support disabled): a \
     Cluster topology (redis+cluster://, Topology::cluster) names nodes of a Redis Cluster \
     (cluster-enabled yes); for one server use a redis:// URL";
/// The question put to a server that does not speak Redis' protocol.
const NOT_REDIS: &str = "is it a Redis server? check the URL's host and port";
/// Causes of [`Error::Rejected`] that say what to do themselves.
const MISCONFIGURED: [&str; 4] = [NOT_SENTINELS, UNKNOWN_MASTER, NOT_A_CLUSTER, NOT_REDIS];

/// Whether `cause` is a reply that did not parse as Redis' protocol.
fn not_parsed(cause: &BoxError) -> bool {
    cause
        .downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.kind() == redis::ErrorKind::Parse)
}

/// The cause of an [`Error::Connection`] from a connection attempt, naming the server it was
/// made to: with several servers (Sentinel, Cluster) or a wrong port, "connection refused"
/// alone does not say which.
#[derive(Debug)]
pub(crate) struct At {
    server: String,
    cause: BoxError,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.server, self.cause)?;
        // What a server of another protocol does with Redis' first command (PostgreSQL's
        // port, say): close the connection, or answer in its own protocol.
        if self.cause.to_string().contains("end of file") {
            write!(
                f,
                " (the server closed the connection before it answered: {NOT_REDIS})"
            )?;
        } else if not_parsed(&self.cause) {
            write!(
                f,
                " (the server's reply is not in Redis' protocol: {NOT_REDIS})"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for At {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// The message of [`Error::NotWritable`]: what the refusal means and what to do, without the
/// script's hash and line that Redis puts in a refusal of a script's write (the cause keeps
/// them).
fn not_writable(cause: &BoxError) -> String {
    let code = cause
        .downcast_ref::<redis::RedisError>()
        .and_then(redis::RedisError::code)
        .map(str::to_owned)
        .or_else(|| {
            let text = cause.to_string();
            NOT_WRITABLE
                .iter()
                .find(|code| text.contains(*code))
                .map(|code| (*code).to_owned())
        });
    match code.as_deref() {
        Some("NOREPLICAS") => "the master refused the write (NOREPLICAS): fewer replicas are in \
             sync with it than its `min-replicas-to-write` requires. Right after a failover \
             this lasts until a replica has synced with the new master, which takes seconds \
             when its only replica is the old master being reconfigured: run two replicas, so \
             that the new master has one at once. Otherwise check the replicas' links to the \
             master (`min-replicas-max-lag`)"
            .to_owned(),
        Some("MASTERDOWN") => "the server refused the write (MASTERDOWN): it is a replica whose \
             link to its master is down; point the client at the master (with Sentinel, the \
             client finds it itself once the failover completes)"
            .to_owned(),
        Some("READONLY") => "the server refused the write (READONLY): it is a read-only \
             replica; point the client at the master (with Sentinel or Cluster, the client \
             finds it itself once the failover completes)"
            .to_owned(),
        _ => format!("the server refused the write: {cause}"),
    }
}

/// The codes of [`Error::NotWritable`].
const NOT_WRITABLE: [&str; 3] = ["NOREPLICAS", "MASTERDOWN", "READONLY"];

/// Everything that can go wrong, as one enum to match or branch on with its predicates.
///
/// Branch on the predicates ([`is_lock_lost`](Error::is_lock_lost),
/// [`is_timeout`](Error::is_timeout), [`is_connection`](Error::is_connection), ...) rather than on
/// variants: the enum is `#[non_exhaustive]` and gains variants as fencelock gains features.
/// The underlying cause, where there is one, is reachable through
/// [`std::error::Error::source`].
///
/// Types of the `redis` crate stay out of this API, so that a new major version of it is not a
/// breaking change of fencelock: what a caller branches on has a predicate, the code of a Redis
/// error reply is [`redis_code`](Error::redis_code), and a cause is a boxed error (a
/// `redis::RedisError` today, for those who downcast it at their own risk; for a failed TLS
/// handshake, an error whose source is one).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument or setting was rejected, before any network call; or a semaphore's count
    /// of permits is not the one in force in Redis (`what` is `"permits"`; see
    /// [`Semaphore`](crate::Semaphore)).
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// What was rejected: `"key"`, `"lease"`, `"pool size"`, `"url"`, ...
        what: &'static str,
        /// Why, in words.
        reason: String,
    },

    /// The lock is no longer ours: its lease ran out or another owner holds the key now.
    ///
    /// Work done under the lock since its last confirmed renewal may overlap another holder's;
    /// fencing tokens let storage reject such writes.
    #[error("lock on {key:?} was lost: its lease expired or another owner holds it")]
    LockLost {
        /// The user key of the lost lock.
        key: String,
    },

    /// Every pooled connection stayed in use for the whole connection timeout, or until the
    /// caller's own deadline (a `try_lock` timeout, at least 10 ms) when that came first: a
    /// `try_lock` on a client whose pool is busy fails with this, not `Ok(None)`, so that a
    /// pool too small for its threads shows.
    #[error("all {size} pooled redis connections stayed busy for {waited:?}")]
    PoolExhausted {
        /// The pool size.
        size: u32,
        /// How long the call waited for a connection.
        waited: Duration,
    },

    /// Redis could not be reached, or the connection broke before a reply came.
    ///
    /// Calls fail with it at once rather than retrying until a timeout: a lock call makes one
    /// connection attempt, bounded by the connection timeout.
    #[error("redis connection failed: {0}")]
    Connection(#[source] BoxError),

    /// Redis refused the connection's set-up: a wrong user or password, a password for a server
    /// that has none, a database number out of range, or a command the client needs that an
    /// ACL forbids. Or, for a `rediss://` URL, the TLS handshake failed: the server's
    /// certificate is not signed by a CA the client trusts, has expired or does not name the
    /// URL's host, or the server wants a client certificate it trusts. Retrying cannot fix it;
    /// the URL, the client's settings or the server's configuration must change.
    #[error("{}", rejected(.0))]
    Rejected(#[source] BoxError),

    /// A command got no reply within the response timeout.
    ///
    /// The command may still have run. fencelock cleans up after an acquire that timed out
    /// (it deletes the lock if the lost reply had granted it); for a release, the lease bounds
    /// how long the lock can stay held.
    #[error("redis did not reply in time ({0}); the command may still have run")]
    Timeout(#[source] BoxError),

    /// A fenced write carried a token lower than one the resource already accepted: the writer's
    /// lock was taken over since. Nothing was written.
    #[error("stale fencing token {token} for {resource:?}: {highest} was already accepted")]
    StaleToken {
        /// The resource written to.
        resource: String,
        /// The token the write carried.
        token: crate::FencingToken,
        /// The highest token the resource had accepted.
        highest: crate::FencingToken,
    },

    /// A plain lock call asked for a key this thread holds through a
    /// [`ReentrantGuard`](crate::ReentrantGuard) of the same client: waiting would never end.
    /// (Nest with [`reentrant_lock`](crate::LockClient::reentrant_lock). A key held through a
    /// plain guard, which may have moved to another thread, is waited for instead.)
    #[error("this thread already holds {key:?}; waiting for it would never end")]
    WouldDeadlock {
        /// The user key.
        key: String,
    },

    /// The wait was cancelled through its cancel channel before the lock was granted.
    #[error("waiting for the lock was cancelled")]
    Cancelled,

    /// A write reached fewer replicas than
    /// [`Builder::min_replica_acks`](crate::Builder::min_replica_acks) requires within its
    /// timeout, so a failover now could undo it. From `lock` and `try_lock`: the grant was
    /// released again (compare-and-delete) and never reported as held. From
    /// [`LockGuard::extend`](crate::LockGuard::extend): the longer lease does not count, and the
    /// guard stays held until the deadline it had before. From a
    /// [`FencedRedis`](crate::FencedRedis) write (with
    /// [`FencedBuilder::min_replica_acks`](crate::FencedBuilder::min_replica_acks)): the master
    /// applied the write and keeps it, but a failover may or may not undo it, so its outcome is
    /// unknown, as after a timeout.
    #[error("the write reached {acked} of the {required} replicas required in time")]
    NotReplicated {
        /// Replicas that acknowledged the write in time.
        acked: u32,
        /// Replicas required.
        required: u32,
    },

    /// The server refused to write because it is not, for now, a master that may take writes:
    /// `NOREPLICAS` (fewer replicas in sync than its `min-replicas-to-write`, as for several
    /// seconds after a failover when the new master's only replica is the old master being
    /// reconfigured), `MASTERDOWN` (a replica cut off from its master) or `READONLY` (a
    /// replica). Nothing was written; the message says what to do, and
    /// [`redis_code`](Error::redis_code) gives the code.
    ///
    /// On Sentinel and Cluster such a refusal is a passing state of a failover: a lock call with
    /// time left asks the deployment for the master again and attempts again until its
    /// deadline (`lock`: for up to 60 s), as for a master that does not answer. On one server
    /// it is the server's configuration, and is reported at once.
    #[error("{}", not_writable(.0))]
    NotWritable(#[source] BoxError),

    /// Redis replied with an error: OOM (maxmemory), NOPERM, BUSY, LOADING, a wrong type at a
    /// lock key, ...
    #[error("redis replied with an error: {0}")]
    Redis(#[source] BoxError),
}

impl Error {
    /// The lock was lost, or was not ours any more when we tried to release or extend it.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }

    /// A command got no reply in time: its effect is unknown.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout(_))
    }

    /// Redis was unreachable or the connection broke, or a reply timed out.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_) | Error::Timeout(_))
    }

    /// Redis refused the connection's set-up (credentials, database, ACL), or the TLS handshake
    /// failed: see [`Error::Rejected`]. Unlike [`is_connection`](Error::is_connection), not
    /// worth retrying.
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }

    /// The pool had no free connection within the connection timeout.
    pub fn is_pool_exhausted(&self) -> bool {
        matches!(self, Error::PoolExhausted { .. })
    }

    /// A fenced write was refused because a newer token was already accepted.
    pub fn is_stale_token(&self) -> bool {
        matches!(self, Error::StaleToken { .. })
    }

    /// A plain lock call asked for a key this thread holds through a reentrant guard.
    pub fn is_would_deadlock(&self) -> bool {
        matches!(self, Error::WouldDeadlock { .. })
    }

    /// The wait was cancelled before the lock was granted.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled)
    }

    /// An argument or setting was rejected before any network call.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument { .. })
    }

    /// A write was not acknowledged by enough replicas in time: a grant, released again; an
    /// extend, not counted; a fenced store's write, of unknown outcome.
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, Error::NotReplicated { .. })
    }

    /// The code of the error Redis replied with, such as `"READONLY"` (a replica), `"OOM"`
    /// (maxmemory reached), `"BUSY"` (a script running too long), `"LOADING"` (a restart still
    /// loading its data), `"NOREPLICAS"` (`min-replicas-to-write` unmet) or `"NOPERM"` (ACL).
    pub fn redis_code(&self) -> Option<&str> {
        match self {
            Error::Redis(e) | Error::Rejected(e) | Error::NotWritable(e) => {
                e.downcast_ref::<redis::RedisError>()?.code()
            }
            _ => None,
        }
    }

    /// The server would not write for now: too few replicas (`NOREPLICAS`), or it is no
    /// writable master (`MASTERDOWN`, `READONLY`). See [`Error::NotWritable`].
    pub fn is_not_writable(&self) -> bool {
        matches!(self, Error::NotWritable(_))
    }

    /// Redis replied to a command with an error (see [`redis_code`](Error::redis_code)).
    pub fn is_redis(&self) -> bool {
        matches!(self, Error::Redis(_))
    }

    /// The variant as a metrics label: `connection`, `timeout`, `lock_lost`, ... (docs/metrics.md
    /// lists them).
    // Only the metrics read it.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::LockLost { .. } => "lock_lost",
            Error::PoolExhausted { .. } => "pool_exhausted",
            Error::Connection(_) => "connection",
            Error::Rejected(_) => "rejected",
            Error::Timeout(_) => "timeout",
            Error::StaleToken { .. } => "stale_token",
            Error::WouldDeadlock { .. } => "would_deadlock",
            Error::Cancelled => "cancelled",
            Error::NotReplicated { .. } => "not_replicated",
            Error::NotWritable(_) => "not_writable",
            Error::Redis(_) => "redis",
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// A failed connection attempt to `server` (`host:port`, or a description of the node):
    /// a connection error names it, and so does a reply that is not Redis' protocol; any other
    /// rejected set-up concerns the URL's credentials or database.
    pub(crate) fn at(self, server: String) -> Error {
        match self {
            Error::Connection(cause) if !cause.is::<At>() => {
                Error::Connection(Box::new(At { server, cause }))
            }
            // A reply in another protocol: the address is what is wrong.
            Error::Rejected(cause) if not_parsed(&cause) => {
                Error::Rejected(Box::new(At { server, cause }))
            }
            other => other,
        }
    }

    pub(crate) fn from_redis(e: redis::RedisError) -> Error {
        match RedisKind::of(&e) {
            RedisKind::Timeout => Error::Timeout(Box::new(e)),
            RedisKind::Connection => Error::Connection(Box::new(e)),
            RedisKind::Rejected => Error::Rejected(Box::new(e)),
            RedisKind::NotWritable => Error::NotWritable(Box::new(e)),
            RedisKind::Reply => Error::Redis(Box::new(e)),
        }
    }
}

/// Which [`Error`] a command's `redis::RedisError` becomes.
enum RedisKind {
    Timeout,
    Connection,
    Rejected,
    NotWritable,
    Reply,
}

impl RedisKind {
    fn of(e: &redis::RedisError) -> RedisKind {
        if e.is_timeout() {
            RedisKind::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            RedisKind::Connection
        } else if e.code() == Some("NOAUTH") {
            // A URL without the password the server asks for: the set-up succeeded, every
            // command fails.
            RedisKind::Rejected
        } else if e.code().is_some_and(|code| NOT_WRITABLE.contains(&code)) {
            RedisKind::NotWritable
        } else {
            RedisKind::Reply
        }
    }
}

/// [`Error::kind`] of the error a command's `e` becomes, without making it: for errors that
/// stay inside fencelock (the renewal thread's).
// Only the metrics read it.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn kind_of_redis(e: &redis::RedisError) -> &'static str {
    match RedisKind::of(e) {
        RedisKind::Timeout => "timeout",
        RedisKind::Connection => "connection",
        RedisKind::Rejected => "rejected",
        RedisKind::NotWritable => "not_writable",
        RedisKind::Reply => "redis",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_error_kept_inside_is_labelled_as_the_error_it_would_become() {
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::WouldBlock,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let e = || redis::RedisError::from(std::io::Error::from(kind));
            assert_eq!(
                kind_of_redis(&e()),
                Error::from_redis(e()).kind(),
                "{kind:?}"
            );
        }
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(kind_of_redis(&refused().into()), "connection");
    }
}
