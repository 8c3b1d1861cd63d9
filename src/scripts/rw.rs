//! A read-write lock's scripts (`rw_acquire.lua`, `rw_release.lua`, after `grant.lua`,
//! `permits.lua` and `rw.lua`) and their typed replies. A grant is renewed with `extend.lua`, as
//! a lock is: its lock key is the grant's own key.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script, Value};

use super::{evalsha, run, run_granting, JoinQueue, Leaving, ReplicaAcks};
use crate::key::{millis, LockKeys, RwKeys};
use crate::net::wire::Arg;
use crate::token::FencingToken;

pub(crate) static RW_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("permits.lua"),
        include_str!("rw.lua"),
        include_str!("rw_acquire.lua")
    ))
});
pub(crate) static RW_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("permits.lua"),
        include_str!("rw.lua"),
        include_str!("rw_release.lua")
    ))
});

/// Whether a grant of a read-write lock is shared with other readers or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

impl Access {
    fn arg(self) -> &'static str {
        match self {
            Access::Read => "r",
            Access::Write => "w",
        }
    }
}

/// What one acquire attempt on a read-write lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwAcquire {
    Granted(FencingToken),
    /// Not now; ask again after about this long (`None`: no holder in the way has an expiry).
    Refused(Option<Duration>),
}

/// The six KEYS of the acquire and release scripts: the lock's five and `hold`.
fn keys_of<'a>(keys: &'a RwKeys, hold: &'a str) -> [&'a str; 6] {
    let [readers, writers, fence, queue, waiters] = keys.all();
    [readers, writers, fence, queue, waiters, hold]
}

/// Runs the acquire script for the owner of `hold` (a grant's names, `RwKeys::hold`). With
/// `acks`, a WAIT follows in the same pipeline, as for a lock's acquire: what the script found
/// and, with `acks`, how many replicas acknowledged.
pub(crate) fn acquire(
    con: &mut redis::Connection,
    keys: &RwKeys,
    hold: &LockKeys,
    access: Access,
    lease: Duration,
    queue: JoinQueue,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(RwAcquire, Option<u32>)> {
    let mode = match queue {
        JoinQueue::Never => "0",
        JoinQueue::Join => "1",
        JoinQueue::Rejoin => "2",
    };
    let args = [
        Arg::Str(hold.owner()),
        Arg::Int(millis(lease)),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
        Arg::Str(access.arg()),
    ];
    let mut buf = Vec::with_capacity(384);
    evalsha(&mut buf, &RW_ACQUIRE, &keys_of(keys, hold.lock()), &args);
    let (reply, acked) = run_granting(con, &RW_ACQUIRE, buf, acks)?;
    let (code, value): (i64, i64) = redis::from_redis_value(reply)?;
    let found = match code {
        1 => RwAcquire::Granted(token(value)?),
        _ => RwAcquire::Refused(u64::try_from(value).ok().map(Duration::from_millis)),
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
pub(crate) struct RwReleased {
    /// Whether the grant was still ours, and so released.
    pub(crate) ours: bool,
    /// The waiters it let in, each told through its client's channel unless it is ours.
    pub(crate) admitted: Vec<Admitted>,
}

/// Runs the release script for the owner of `hold`: a holder's release (`Leaving::Lock`) or a
/// waiter leaving the queue (`Leaving::QueueAndLock`).
pub(crate) fn release(
    con: &mut redis::Connection,
    keys: &RwKeys,
    hold: &LockKeys,
    leaving: Leaving,
) -> RedisResult<RwReleased> {
    let mode = match leaving {
        Leaving::QueueAndLock => "1",
        Leaving::Lock | Leaving::Forced => "0",
    };
    let args = [
        Arg::Str(hold.owner()),
        Arg::Str(mode),
        Arg::Int(keys.idle_ms()),
    ];
    let mut buf = Vec::with_capacity(384);
    evalsha(&mut buf, &RW_RELEASE, &keys_of(keys, hold.lock()), &args);
    let reply: Vec<Value> = redis::from_redis_value(run(con, &RW_RELEASE, &buf)?)?;
    let mut reply = reply.into_iter();
    let ours = match reply.next() {
        Some(v) => redis::from_redis_value::<i64>(v)? == 1,
        None => return Err(unexpected("the read-write lock's release script")),
    };
    let mut admitted = Vec::new();
    while let Some(token_value) = reply.next() {
        let (Some(owner), Some(lease)) = (reply.next(), reply.next()) else {
            return Err(unexpected("the read-write lock's release script"));
        };
        admitted.push(Admitted {
            token: token(redis::from_redis_value(token_value)?)?,
            owner: redis::from_redis_value(owner)?,
            lease: Duration::from_millis(redis::from_redis_value(lease)?),
        });
    }
    Ok(RwReleased { ours, admitted })
}

fn token(value: i64) -> RedisResult<FencingToken> {
    u64::try_from(value)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken::new)
        .ok_or_else(|| unexpected("the read-write lock's fence counter"))
}

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}
