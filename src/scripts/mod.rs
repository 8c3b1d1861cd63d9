//! The three Lua scripts every lock operation runs, and their typed replies.
//!
//! Each script is its own file with a header naming KEYS, ARGV and the reply; `docs/design.md`
//! holds the state table (lock key absent / ours / another's × acquire / extend / release).
//! Scripts run by EVALSHA; `redis::Script` falls back to loading the script on NOSCRIPT.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, RedisResult, Script};

use crate::key::LockKeys;
use crate::token::FencingToken;

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("acquire.lua")));
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("extend.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));

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

/// Runs the acquire script; with `acks`, a WAIT follows it in the same pipeline, so it counts
/// the replicas that received this very grant. Returns what the script found and, with `acks`,
/// how many replicas acknowledged.
pub(crate) fn acquire(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Acquire, Option<u32>)> {
    let ((granted, value), acked): ((i64, i64), Option<u32>) = match acks {
        None => (
            ACQUIRE
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.waiting)
                .arg(owner)
                .arg(millis(lease))
                .invoke(con)?,
            None,
        ),
        Some(acks) => {
            let mut pipe = redis::pipe();
            pipe.cmd("EVALSHA")
                .arg(ACQUIRE.get_hash())
                .arg(3)
                .arg(&keys.lock)
                .arg(&keys.fence)
                .arg(&keys.waiting)
                .arg(owner)
                .arg(millis(lease))
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
        1 => {
            let token = u64::try_from(value)
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| {
                    redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "fence counter is not a positive integer",
                        format!("{value} at {}", keys.fence),
                    ))
                })?;
            Acquire::Granted(FencingToken::new(token))
        }
        _ if value < 0 => Acquire::Held(None),
        _ => Acquire::Held(Some(Duration::from_millis(value.unsigned_abs()))),
    };
    Ok((acquire, acked))
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Released, and published: another attempt had found the lock held.
    Published,
    /// Released; nobody had marked waiting, so nothing was published.
    Quietly,
    /// The key was gone or another owner's; nothing was touched.
    NotOurs,
}

/// Compare-and-delete, publishing only if someone waits.
pub(crate) fn release(
    con: &mut dyn ConnectionLike,
    keys: &LockKeys,
    owner: &str,
) -> RedisResult<Released> {
    let reply: i64 = RELEASE
        .key(&keys.lock)
        .key(&keys.waiting)
        .arg(owner)
        .arg(&keys.channel)
        .arg(&keys.tag)
        .invoke(con)?;
    Ok(match reply {
        2 => Released::Published,
        1 => Released::Quietly,
        _ => Released::NotOurs,
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
