//! A shared lock's scripts and their typed replies: a semaphore's (`permit_acquire.lua`,
//! `permit_release.lua`) and a read-write lock's (`rw_acquire.lua`, `rw_release.lua`, after
//! `rw.lua`), each after `grant.lua` and `shared_lock.lua`, and `shared_lock_status.lua` for
//! both. The two families take the same KEYS and ARGV and answer in the same shape, so one
//! wrapper runs either; the lock's kind picks the family. A grant is renewed with `extend.lua`,
//! as a lock is: its lock key is the grant's own key.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script, Value};

use super::{evalsha, run, run_granting, JoinQueue, Leaving, ReplicaAcks};
use crate::key::{millis, GrantKind, Kind, LockKeys, SharedLockKeys};
use crate::net::wire::Arg;
use crate::token::FencingToken;

pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("shared_lock.lua"),
        include_str!("permit_acquire.lua")
    ))
});
pub(crate) static PERMIT_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("shared_lock.lua"),
        include_str!("permit_release.lua")
    ))
});
pub(crate) static RW_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("shared_lock.lua"),
        include_str!("rw.lua"),
        include_str!("rw_acquire.lua")
    ))
});
pub(crate) static RW_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("shared_lock.lua"),
        include_str!("rw.lua"),
        include_str!("rw_release.lua")
    ))
});
pub(crate) static SHARED_LOCK_STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("shared_lock_status.lua")));

/// What a grant of a shared lock weighs: one permit of a semaphore's count; a read, beside
/// other reads and no write; a write, alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Permit,
    Read,
    Write,
}

impl Access {
    /// The grant this makes.
    pub(crate) fn kind(self) -> GrantKind {
        match self {
            Access::Permit => GrantKind::Permit,
            Access::Read => GrantKind::Read,
            Access::Write => GrantKind::Write,
        }
    }
}

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted(FencingToken),
    /// Not now; ask again after about this long (`None`: no holder in the way has an expiry).
    Refused(Option<Duration>),
    /// The semaphore is in use with this count of permits, not the caller's.
    OtherCount(u64),
}

/// The scripts of `keys`' kind: acquire, release.
fn family(keys: &SharedLockKeys) -> (&'static Script, &'static Script) {
    match keys.kind() {
        Kind::Semaphore(_) => (&PERMIT_ACQUIRE, &PERMIT_RELEASE),
        Kind::ReadWrite => (&RW_ACQUIRE, &RW_RELEASE),
    }
}

/// The six KEYS of the acquire and release scripts: the lock's five and `hold`.
fn keys_of<'a>(keys: &'a SharedLockKeys, hold: &'a str) -> [&'a str; 6] {
    let [holders, fence, queue, waiters, own] = keys.all();
    [holders, fence, queue, waiters, own, hold]
}

/// Runs the acquire script for the owner of `hold` (a grant's names, `SharedLockKeys::hold`).
/// With `acks`, a WAIT follows in the same pipeline, as for a lock's acquire: what the script
/// found and, with `acks`, how many replicas acknowledged.
pub(crate) fn acquire(
    con: &mut redis::Connection,
    keys: &SharedLockKeys,
    hold: &LockKeys,
    access: Access,
    lease: Duration,
    queue: JoinQueue,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Acquired, Option<u32>)> {
    let mode = match queue {
        JoinQueue::Never => "0",
        JoinQueue::Join => "1",
        JoinQueue::Rejoin => "2",
    };
    // ARGV[5]: what the caller asks for, in its family's terms.
    let count;
    let wants = match access {
        Access::Permit => {
            count = keys.count().to_string();
            count.as_str()
        }
        Access::Read => "r",
        Access::Write => "w",
    };
    let args = [
        Arg::Str(hold.owner()),
        Arg::Int(millis(lease)),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
        Arg::Str(wants),
    ];
    let (script, _) = family(keys);
    let mut buf = Vec::with_capacity(384);
    evalsha(&mut buf, script, &keys_of(keys, hold.lock()), &args);
    let (reply, acked) = run_granting(con, script, buf, acks)?;
    let (code, value): (i64, i64) = redis::from_redis_value(reply)?;
    let found = match code {
        1 => Acquired::Granted(token(value)?),
        0 => Acquired::Refused(u64::try_from(value).ok().map(Duration::from_millis)),
        _ => Acquired::OtherCount(value.unsigned_abs()),
    };
    Ok((found, acked))
}

/// One waiter a release admitted: its owner id, token and the lease Redis set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) token: FencingToken,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
}

/// What a release found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released {
    /// Whether the grant was still ours, and so released.
    pub(crate) ours: bool,
    /// The waiters it let in (a semaphore's release: one at most), each told through its
    /// client's channel unless it is the caller's.
    pub(crate) admitted: Vec<Admitted>,
}

/// Runs the release script for the owner of `hold`: a holder's release (`Leaving::Lock`) or a
/// waiter leaving the queue (`Leaving::QueueAndLock`).
pub(crate) fn release(
    con: &mut redis::Connection,
    keys: &SharedLockKeys,
    hold: &LockKeys,
    leaving: Leaving,
) -> RedisResult<Released> {
    let mode = match leaving {
        Leaving::QueueAndLock => "1",
        Leaving::Lock | Leaving::Forced => "0",
    };
    let args = [
        Arg::Str(hold.owner()),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
    ];
    let (_, script) = family(keys);
    let mut buf = Vec::with_capacity(384);
    evalsha(&mut buf, script, &keys_of(keys, hold.lock()), &args);
    let reply: Vec<Value> = redis::from_redis_value(run(con, script, &buf)?)?;
    let mut reply = reply.into_iter();
    let ours = match reply.next() {
        Some(v) => redis::from_redis_value::<i64>(v)? == 1,
        None => return Err(unexpected("the release script of a shared lock")),
    };
    let mut admitted = Vec::new();
    while let Some(token_value) = reply.next() {
        let (Some(owner), Some(lease)) = (reply.next(), reply.next()) else {
            return Err(unexpected("the release script of a shared lock"));
        };
        admitted.push(Admitted {
            token: token(redis::from_redis_value(token_value)?)?,
            owner: redis::from_redis_value(owner)?,
            lease: Duration::from_millis(redis::from_redis_value(lease)?),
        });
    }
    Ok(Released { ours, admitted })
}

/// How a shared lock stands, as the status script read it in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status {
    /// Live holders: of a permit, or of a read.
    pub(crate) held: u64,
    /// Live queue entries: waiting clients.
    pub(crate) waiters: u64,
    /// A semaphore's count in force, if any.
    pub(crate) limit: Option<u64>,
    /// A read-write lock's live writers (one at most).
    pub(crate) writers: u64,
}

/// Runs the status script: reads only, so it is safe to repeat.
pub(crate) fn status(con: &mut redis::Connection, keys: &SharedLockKeys) -> RedisResult<Status> {
    let own = match keys.kind() {
        Kind::Semaphore(_) => "count",
        Kind::ReadWrite => "holders",
    };
    let mut buf = Vec::with_capacity(256);
    evalsha(
        &mut buf,
        &SHARED_LOCK_STATUS,
        &[keys.holders(), keys.waiters(), keys.own()],
        &[Arg::Str(keys.hold_prefix()), Arg::Str(own)],
    );
    let (held, waiters, own): (u64, u64, String) =
        redis::from_redis_value(run(con, &SHARED_LOCK_STATUS, &buf)?)?;
    let number = |digits: &str| {
        digits
            .parse::<u64>()
            .map_err(|_| unexpected("the status script of a shared lock"))
    };
    let (limit, writers) = match (keys.kind(), own.as_str()) {
        (Kind::Semaphore(_), "") => (None, 0),
        (Kind::Semaphore(_), digits) => (Some(number(digits)?), 0),
        (Kind::ReadWrite, digits) => (None, number(digits)?),
    };
    Ok(Status {
        held,
        waiters,
        limit,
        writers,
    })
}

fn token(value: i64) -> RedisResult<FencingToken> {
    u64::try_from(value)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken::new)
        .ok_or_else(|| unexpected("the fence counter of a shared lock"))
}

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}
