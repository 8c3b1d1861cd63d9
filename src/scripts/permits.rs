//! A counting semaphore's scripts (`permit_acquire.lua`, `permit_release.lua`,
//! `permit_status.lua`) and their typed replies. A permit is renewed with `extend.lua`, as a
//! lock is: its grant's lock key is the permit's own key.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script, Value};

use super::{evalsha, run, run_granting, JoinQueue, Leaving, ReplicaAcks};
use crate::key::{millis, PermitKeys};
use crate::net::wire::Arg;
use crate::token::FencingToken;

pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("permits.lua"),
        include_str!("permit_acquire.lua")
    ))
});
pub(crate) static PERMIT_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("permits.lua"),
        include_str!("permit_release.lua")
    ))
});
pub(crate) static PERMIT_STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("permit_status.lua")));

/// What one acquire attempt on a semaphore found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitAcquire {
    Granted(FencingToken),
    /// No permit for the caller; ask again after about this long (`None`: no holder's lease
    /// has an expiry).
    Full(Option<Duration>),
    /// The semaphore is in use with this count of permits, not the caller's.
    OtherCount(u64),
}

/// The six KEYS of the acquire and release scripts: the semaphore's five and `permit`.
fn keys_of<'a>(keys: &'a PermitKeys, permit: &'a str) -> [&'a str; 6] {
    let [holders, fence, queue, waiters, limit] = keys.all();
    [holders, fence, queue, waiters, limit, permit]
}

/// Runs the acquire script for the owner of `permit` (a permit's names, `PermitKeys::permit`).
/// With `acks`, a WAIT follows in the same pipeline, as for a lock's acquire: what the script
/// found and, with `acks`, how many replicas acknowledged.
pub(crate) fn acquire(
    con: &mut redis::Connection,
    keys: &PermitKeys,
    permit: &crate::key::LockKeys,
    lease: Duration,
    queue: JoinQueue,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(PermitAcquire, Option<u32>)> {
    let mode = match queue {
        JoinQueue::Never => "0",
        JoinQueue::Join => "1",
        JoinQueue::Rejoin => "2",
    };
    let count = keys.count().to_string();
    let args = [
        Arg::Str(permit.owner()),
        Arg::Int(millis(lease)),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
        Arg::Str(&count),
    ];
    let mut buf = Vec::with_capacity(384);
    evalsha(
        &mut buf,
        &PERMIT_ACQUIRE,
        &keys_of(keys, permit.lock()),
        &args,
    );
    let (reply, acked) = run_granting(con, &PERMIT_ACQUIRE, buf, acks)?;
    let (code, value): (i64, i64) = redis::from_redis_value(reply)?;
    let found = match code {
        1 => PermitAcquire::Granted(token(value)?),
        0 => PermitAcquire::Full(u64::try_from(value).ok().map(Duration::from_millis)),
        _ => PermitAcquire::OtherCount(value.unsigned_abs()),
    };
    Ok((found, acked))
}

/// What a permit's release found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermitReleased {
    /// The permit was gone or not ours: nothing was released.
    NotOurs,
    /// Released; nobody waited.
    Freed,
    /// Released and handed to the waiter `owner`, with this token and lease.
    HandedOver {
        token: FencingToken,
        owner: String,
        lease: Duration,
    },
}

/// Runs the release script for the owner of `permit`: a holder's release (`Leaving::Lock`) or
/// a waiter leaving the queue (`Leaving::QueueAndLock`).
pub(crate) fn release(
    con: &mut redis::Connection,
    keys: &PermitKeys,
    permit: &crate::key::LockKeys,
    leaving: Leaving,
) -> RedisResult<PermitReleased> {
    let mode = match leaving {
        Leaving::QueueAndLock => "1",
        Leaving::Lock | Leaving::Forced => "0",
    };
    let args = [
        Arg::Str(permit.owner()),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
    ];
    let mut buf = Vec::with_capacity(384);
    evalsha(
        &mut buf,
        &PERMIT_RELEASE,
        &keys_of(keys, permit.lock()),
        &args,
    );
    let reply: Vec<Value> = redis::from_redis_value(run(con, &PERMIT_RELEASE, &buf)?)?;
    let mut reply = reply.into_iter();
    let code: i64 = match reply.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => -1,
    };
    Ok(match (code, reply.next(), reply.next(), reply.next()) {
        (0, ..) => PermitReleased::NotOurs,
        (1, ..) => PermitReleased::Freed,
        (2, Some(token_value), Some(owner), Some(lease)) => PermitReleased::HandedOver {
            token: token(redis::from_redis_value(token_value)?)?,
            owner: redis::from_redis_value(owner)?,
            lease: Duration::from_millis(redis::from_redis_value(lease)?),
        },
        _ => return Err(unexpected("the permit release script")),
    })
}

/// How a semaphore stands, as the status script read it in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PermitStatus {
    /// Live holders.
    pub(crate) held: u64,
    /// Live queue entries: waiting clients.
    pub(crate) waiters: u64,
    /// The count in force, if any.
    pub(crate) limit: Option<u64>,
}

/// Runs the status script: reads only, so it is safe to repeat.
pub(crate) fn status(con: &mut redis::Connection, keys: &PermitKeys) -> RedisResult<PermitStatus> {
    let mut buf = Vec::with_capacity(192);
    evalsha(
        &mut buf,
        &PERMIT_STATUS,
        &[keys.holders(), keys.waiters(), keys.limit()],
        &[],
    );
    let (held, waiters, limit): (u64, u64, String) =
        redis::from_redis_value(run(con, &PERMIT_STATUS, &buf)?)?;
    let limit = match limit.as_str() {
        "" => None,
        digits => Some(
            digits
                .parse()
                .map_err(|_| unexpected("the semaphore's count of permits"))?,
        ),
    };
    Ok(PermitStatus {
        held,
        waiters,
        limit,
    })
}

fn token(value: i64) -> RedisResult<FencingToken> {
    u64::try_from(value)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken::new)
        .ok_or_else(|| unexpected("the semaphore's fence counter"))
}

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}
