//! The three Lua scripts every lock operation runs, and their typed replies.
//!
//! `grant.lua` holds what acquire and release share (minting a token, the queue of waiters) and
//! is prepended to both.
//!
//! Each script is its own file with a header naming KEYS, ARGV and the reply; `docs/design.md`
//! holds the state table (lock key absent / ours / another's × acquire / extend / release).
//! Scripts run by EVALSHA; `redis::Script` falls back to loading the script on NOSCRIPT.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, RedisResult, Script};

use crate::key::LockKeys;
use crate::token::FencingToken;

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("acquire.lua")
    ))
});
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("extend.lua")));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("release.lua")
    ))
});

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    Granted(FencingToken),
    /// Held by another owner for about this long; `None` when the key has no expiry.
    Held(Option<Duration>),
}

/// `WAIT replicas timeout` sent right behind a grant, on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// Runs the acquire script; `queue` makes a refused attempt join the key's queue, so that a
/// release hands the lock over. With `acks`, a WAIT follows in the same pipeline, so it counts
/// the replicas that received this very grant. Returns what the script found and, with `acks`,
/// how many replicas acknowledged.
pub(crate) fn acquire(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    queue: bool,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Acquire, Option<u32>)> {
    let queue = if queue { "1" } else { "0" };
    let ((granted, value), acked): ((i64, i64), Option<u32>) = match acks {
        None => (
            ACQUIRE
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.queue)
                .key(&keys.entries)
                .arg(owner)
                .arg(millis(lease))
                .arg(queue)
                .invoke(con)?,
            None,
        ),
        Some(acks) => {
            let mut pipe = redis::pipe();
            pipe.cmd("EVALSHA")
                .arg(ACQUIRE.get_hash())
                .arg(4)
                .arg(&keys.lock)
                .arg(&keys.fence)
                .arg(&keys.queue)
                .arg(&keys.entries)
                .arg(owner)
                .arg(millis(lease))
                .arg(queue)
                .cmd("WAIT")
                .arg(acks.replicas)
                .arg(millis(acks.timeout));
            let (reply, acked) = match pipe.query(con) {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    ACQUIRE.prepare_invoke().load(con)?;
                    pipe.query(con)?
                }
                other => other?,
            };
            (reply, Some(acked))
        }
    };
    let acquire = match granted {
        1 => Acquire::Granted(token(value, keys)?),
        _ if value < 0 => Acquire::Held(None),
        _ => Acquire::Held(Some(Duration::from_millis(value.unsigned_abs()))),
    };
    Ok((acquire, acked))
}

fn token(value: i64, keys: &LockKeys) -> RedisResult<FencingToken> {
    u64::try_from(value)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken::new)
        .ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "fence counter is not a positive integer",
                format!("{value} at {}", keys.fence),
            ))
        })
}

/// What a release found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Released {
    /// The key was gone or another owner's; nothing was touched.
    NotOurs,
    /// Deleted; nobody waited.
    Freed,
    /// Granted straight to the next waiter, `owner`, with this token and lease. A waiter of
    /// another client hears of it by pub/sub; one of ours is the caller's to tell.
    HandedOver {
        token: FencingToken,
        owner: String,
        lease: Duration,
    },
}

/// A release's caller and its own next waiter.
pub(crate) struct Releaser<'a> {
    /// The namespace's release channel.
    pub(crate) channel: &'a str,
    /// Every owner id of the calling client starts with this.
    pub(crate) prefix: &'a str,
    /// The caller's own next waiter for the key, its lease, and whether it goes before the
    /// queue in Redis. Otherwise it is granted the lock when that queue is empty, and queued
    /// behind its waiter if not.
    pub(crate) next: Option<(&'a str, Duration, bool)>,
}

/// Compare-and-delete, or compare-and-hand-over to the next waiter. With `withdraw`, `owner` is
/// a waiter leaving the queue, releasing the lock too if a handoff reached it meanwhile.
pub(crate) fn release(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    withdraw: bool,
    by: &Releaser<'_>,
) -> RedisResult<Released> {
    let (next, next_lease, first) = match by.next {
        Some((next, lease, first)) => (next, millis(lease), first),
        None => ("", 0, false),
    };
    let reply: Vec<redis::Value> = RELEASE
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.entries)
        .arg(owner)
        .arg(if withdraw { "1" } else { "0" })
        .arg(by.channel)
        .arg(&keys.tag)
        .arg(by.prefix)
        .arg(next)
        .arg(next_lease)
        .arg(if first { "1" } else { "0" })
        .invoke(con)?;
    let mut reply = reply.into_iter();
    let code: i64 = match reply.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => -1,
    };
    Ok(match (code, reply.next(), reply.next(), reply.next()) {
        (0, ..) => Released::NotOurs,
        (1, ..) => Released::Freed,
        (2, Some(token_value), Some(owner), Some(lease)) => Released::HandedOver {
            token: token(redis::from_redis_value(token_value)?, keys)?,
            owner: redis::from_redis_value(owner)?,
            lease: Duration::from_millis(redis::from_redis_value(lease)?),
        },
        _ => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply from the release script",
            )))
        }
    })
}

/// Compare-and-pexpire; `true` when the lock was ours and its lease is re-armed.
pub(crate) fn extend(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
) -> RedisResult<bool> {
    EXTEND
        .key(&keys.lock)
        .arg(owner)
        .arg(millis(lease))
        .invoke(con)
}

/// Compare-and-pexpire followed by `WAIT`, in one pipeline on one connection: the extend is a
/// write of this connection, so the WAIT counts the replicas that have everything before it,
/// whoever wrote it (a handoff written by another client's release included).
pub(crate) fn extend_acked(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    acks: ReplicaAcks,
) -> RedisResult<(bool, u32)> {
    let mut pipe = redis::pipe();
    pipe_extend(&mut pipe, keys, owner, lease);
    pipe.cmd("WAIT")
        .arg(acks.replicas)
        .arg(millis(acks.timeout));
    match pipe.query(con) {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            EXTEND.prepare_invoke().load(con)?;
            pipe.query(con)
        }
        other => other,
    }
}

/// Adds one extend call to a pipeline, by EVALSHA; the caller loads the script on NOSCRIPT.
pub(crate) fn pipe_extend(
    pipe: &mut redis::Pipeline,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
) {
    pipe.cmd("EVALSHA")
        .arg(EXTEND.get_hash())
        .arg(1)
        .arg(&keys.lock)
        .arg(owner)
        .arg(millis(lease));
}

/// Leases are validated to whole milliseconds well inside `u64`, so this never saturates in use.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
