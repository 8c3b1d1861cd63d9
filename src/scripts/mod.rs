//! Every Lua script the crate runs, and their typed replies.
//!
//! | script | run by |
//! |---|---|
//! | `acquire.lua`, `extend.lua`, `release.lua`, `status.lua` | the one-master engine |
//! | `acquire.lua`, `confirm.lua`, `extend.lua`, `quorum_release.lua`, `quorum_force.lua`, `quorum_status.lua` | the quorum engine, on each master |
//! | `election_proclaim.lua`, `election_resign.lua`, `election_leader.lua` | elections, over either engine (on each master of a quorum) |
//! | `fenced_*.lua` | [`FencedRedis`](crate::FencedRedis), after `fenced_prelude.lua` |
//! | `permit_acquire.lua`, `permit_release.lua`; `rw_acquire.lua`, `rw_release.lua` (after `rw.lua`); `shared_lock_status.lua`, `extend.lua` | a shared lock's grants (a semaphore's permits; a read-write lock's reads and writes), on the one-master engine (`shared_lock.rs`) |
//!
//! `grant.lua` holds what acquire, confirm and release share (minting a token, the queue of
//! waiters) and is prepended to each; `shared_lock.lua` holds what a shared lock's acquire and
//! release share (counting live holders, the waiters before a caller), and follows it in each.
//!
//! Each script is its own file with a header naming KEYS, ARGV and the reply; `docs/design.md`
//! holds the state table (lock key absent / ours / another's × acquire / extend / release).
//! Scripts run by EVALSHA; after NOSCRIPT the script is loaded and the call sent again, in one
//! place ([`loading`]).

pub(crate) mod shared_lock;

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script, Value};

use crate::key::{millis, LockKeys};
use crate::net::wire::{self, no_script, Arg, Interrupted};
use crate::token::FencingToken;

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = concat!(include_str!("grant.lua"), include_str!("acquire.lua"));
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("extend.lua")));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("grant.lua"),
        include_str!("release.lua")
    ))
});

/// The write-back of a quorum grant (`quorum/acquire.rs`).
pub(crate) static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(CONFIRM_LUA));
const CONFIRM_LUA: &str = concat!(include_str!("grant.lua"), include_str!("confirm.lua"));
/// A quorum master's release: compare-and-delete, then a message to waiting clients.
pub(crate) static QUORUM_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(QUORUM_RELEASE_LUA));
const QUORUM_RELEASE_LUA: &str = include_str!("quorum_release.lua");

/// The scripts a quorum lock call sends on its own connections to the masters (`quorum/lanes.rs`),
/// which load them when they open: a release sent behind a failed attempt waits for no reply, so
/// a `NOSCRIPT` would lose it, and the key would stay for its lease.
pub(crate) const LANE_SCRIPTS: [&str; 3] = [ACQUIRE_LUA, CONFIRM_LUA, QUORUM_RELEASE_LUA];
pub(crate) static QUORUM_FORCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("quorum_force.lua")));
pub(crate) static QUORUM_STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("quorum_status.lua")));

/// A leader's proclamation: compare the lock's owner, record, publish.
pub(crate) static PROCLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("election_proclaim.lua")));
/// A leader's withdrawal of its record, before its release.
pub(crate) static RESIGN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("election_resign.lua")));
/// Who leads, read atomically.
pub(crate) static LEADER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("election_leader.lua")));

pub(crate) static STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("status.lua")));

/// The longest lease a release grants to a waiter of the key's queue in Redis (`HANDOFF_LEASE`
/// in grant.lua): the waiter's first renewal or extend confirms its own lease, and a waiter that
/// died while queued holds the lock no longer than this.
pub(crate) const HANDOFF_LEASE: Duration = Duration::from_millis(5000);

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
    con: &mut redis::Connection,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    queue: JoinQueue,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Acquire, Option<u32>)> {
    let queue = match queue {
        JoinQueue::Never => "0",
        JoinQueue::Join => "1",
        JoinQueue::Rejoin => "2",
    };
    let args = [
        Arg::Str(owner),
        Arg::Int(millis(lease)),
        Arg::Str(queue),
        Arg::Int(keys.idle_ms()),
    ];
    let mut buf = Vec::with_capacity(256);
    evalsha(&mut buf, &ACQUIRE, &keys.all(), &args);
    let (reply, acked) = run_granting(con, &ACQUIRE, buf, acks)?;
    Ok((acquired(reply, keys)?, acked))
}

/// Sends a granting script's call, packed in `buf`, and with `acks` a `WAIT` behind it in the
/// same pipeline, so that it counts the replicas that received this very grant: the script's
/// reply and, with `acks`, how many replicas acknowledged. An interrupted reply is left
/// unanswered, never asked for again alone (see [`run_pipeline`]).
pub(crate) fn run_granting(
    con: &mut redis::Connection,
    script: &Script,
    mut buf: Vec<u8>,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Value, Option<u32>)> {
    let Some(acks) = acks else {
        return Ok((run(con, script, &buf)?, None));
    };
    let first = buf.len();
    pack_wait(&mut buf, acks);
    let ends = [first, buf.len()];
    let (reply, acked) = both(run_pipeline(
        con,
        script,
        &buf,
        &ends,
        Interrupted::LeaveUnanswered,
    )?)?;
    Ok((reply, Some(redis::from_redis_value(acked)?)))
}

/// The reply of one acquire call.
pub(crate) fn acquired(reply: Value, keys: &LockKeys) -> RedisResult<Acquire> {
    let (granted, value): (i64, i64) = redis::from_redis_value(reply)?;
    acquire_of(granted, value, keys)
}

fn acquire_of(granted: i64, value: i64, keys: &LockKeys) -> RedisResult<Acquire> {
    Ok(match granted {
        1 => Acquire::Granted(token(value, keys)?),
        _ if value < 0 => Acquire::Held(None),
        _ => Acquire::Held(Some(Duration::from_millis(value.unsigned_abs()))),
    })
}

/// The reply of a quorum attempt's acquire on one master (the `'h'` form of `acquire.lua`).
pub(crate) struct QuorumAcquire {
    pub(crate) acquire: Acquire,
    /// The holder's owner id, when refused.
    pub(crate) holder: Option<String>,
    /// The token granted is the client's proposal.
    pub(crate) taken: bool,
    /// The master's clock (`TIME`) in microseconds.
    pub(crate) clock: u64,
}

/// Reads `{1, token, taken, clock}` or `{0, pttl, holder, clock}`.
pub(crate) fn acquired_quorum(reply: Value, keys: &LockKeys) -> RedisResult<QuorumAcquire> {
    let reply: Vec<Value> = redis::from_redis_value(reply)?;
    let [granted, value, third, clock]: [Value; 4] = reply.try_into().map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply from the acquire script",
        ))
    })?;
    let acquire = acquire_of(
        redis::from_redis_value(granted)?,
        redis::from_redis_value(value)?,
        keys,
    )?;
    let (holder, taken) = match acquire {
        Acquire::Granted(_) => (None, redis::from_redis_value::<i64>(third)? == 1),
        Acquire::Held(_) => (Some(redis::from_redis_value(third)?), false),
    };
    Ok(QuorumAcquire {
        acquire,
        holder,
        taken,
        clock: redis::from_redis_value(clock)?,
    })
}

/// Whether a refused acquire joins the key's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinQueue {
    /// A single try: never queued.
    Never,
    /// A waiter's first attempt: it cannot stand in the queue yet, so a grant has no entry to
    /// take out.
    Join,
    /// A waiter's later attempt: it may stand in the queue.
    Rejoin,
}

/// Appends `EVALSHA <sha> <keys> <args>` to `buf`.
pub(crate) fn evalsha(buf: &mut Vec<u8>, script: &Script, keys: &[&str], args: &[Arg<'_>]) {
    wire::array(buf, 3 + keys.len() + args.len());
    wire::arg(buf, Arg::Str("EVALSHA"));
    wire::arg(buf, Arg::Str(script.get_hash()));
    wire::arg(buf, Arg::Int(keys.len() as u64));
    for key in keys {
        wire::arg(buf, Arg::Str(key));
    }
    for a in args {
        wire::arg(buf, *a);
    }
}

/// Sends one EVALSHA of `script` (see [`loading`]).
fn run(con: &mut redis::Connection, script: &Script, packed: &[u8]) -> RedisResult<Value> {
    loading(
        con,
        script,
        |con| wire::call(con, packed),
        |reply| matches!(reply, Err(e) if no_script(e)),
    )
}

/// Sends a pipeline of calls (see [`wire::exchange`]) of which those of `script` are by EVALSHA
/// (see [`loading`]). A pipeline with a `WAIT` must leave interrupted replies unanswered, never
/// send a command again by itself: a `WAIT` must follow what it counts.
pub(crate) fn run_pipeline(
    con: &mut redis::Connection,
    script: &Script,
    packed: &[u8],
    ends: &[usize],
    on_interrupt: Interrupted,
) -> RedisResult<Vec<Option<RedisResult<Value>>>> {
    loading(
        con,
        script,
        |con| wire::exchange(con, packed, ends, on_interrupt),
        |replies| {
            replies.as_ref().is_ok_and(|replies| {
                replies
                    .iter()
                    .any(|r| matches!(r, Some(Err(e)) if no_script(e)))
            })
        },
    )
}

/// Sends by `send` and, if `refused` says Redis answered NOSCRIPT (a restarted or flushed
/// server has no scripts), loads `script` and sends once more. Every script call goes through
/// here; a refused call did not run, so sending it again is safe.
fn loading<T>(
    con: &mut redis::Connection,
    script: &Script,
    mut send: impl FnMut(&mut redis::Connection) -> RedisResult<T>,
    refused: impl Fn(&RedisResult<T>) -> bool,
) -> RedisResult<T> {
    let reply = send(con);
    if !refused(&reply) {
        return reply;
    }
    script.load(con)?;
    send(con)
}

/// The two replies of a two-command pipeline; one lost to a signal fails it, and the pool runs
/// the whole pipeline again.
fn both(replies: Vec<Option<RedisResult<Value>>>) -> RedisResult<(Value, Value)> {
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Some(first)), Some(Some(second))) => Ok((first?, second?)),
        _ => Err(wire::interrupted_error()),
    }
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
                format!("{value} at {}", keys.fence()),
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

/// The caller's own next waiter for a key being released. Unless it goes `ahead` of the queue
/// in Redis, it is granted the lock when that queue is empty, and queued behind its waiter if
/// not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnNext<'a> {
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) ahead: bool,
}

/// What the owner of a release gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// The lock: a holder's release.
    Lock,
    /// The key's queue in Redis first, then the lock if it is ours: a waiter giving up (a
    /// handoff may have reached it meanwhile), or a holder that may still stand in the queue.
    QueueAndLock,
    /// The lock, whoever holds it (`LockClient::force_unlock`). The owner passed is the
    /// caller's owner-id prefix: it names no grant, and tells the script which waiters are the
    /// caller's own (they hear of a handoff from the caller, not by pub/sub). Not safe to
    /// repeat: a second run would take the lock from the waiter the first one handed it to.
    Forced,
}

/// Compare-and-delete, or compare-and-hand-over to the next waiter; see [`Leaving`].
pub(crate) fn release(
    con: &mut redis::Connection,
    keys: &LockKeys,
    owner: &str,
    leaving: Leaving,
    next: Option<OwnNext<'_>>,
) -> RedisResult<Released> {
    let packed = pack_release(keys, owner, leaving, next);
    released(run(con, &RELEASE, &packed)?, keys)
}

/// The release call of [`release`], encoded.
pub(crate) fn pack_release(
    keys: &LockKeys,
    owner: &str,
    leaving: Leaving,
    next: Option<OwnNext<'_>>,
) -> Vec<u8> {
    let withdraw = Arg::Str(match leaving {
        Leaving::Lock => "0",
        Leaving::QueueAndLock => "1",
        Leaving::Forced => "2",
    });
    let idle = Arg::Int(keys.idle_ms());
    let mut buf = Vec::with_capacity(320);
    match next {
        None => evalsha(
            &mut buf,
            &RELEASE,
            &keys.all(),
            &[Arg::Str(owner), withdraw, idle],
        ),
        Some(next) => {
            let args = [
                Arg::Str(owner),
                withdraw,
                idle,
                Arg::Str(next.owner),
                Arg::Int(millis(next.lease)),
                Arg::Str(if next.ahead { "1" } else { "0" }),
            ];
            evalsha(&mut buf, &RELEASE, &keys.all(), &args);
        }
    }
    buf
}

/// The reply of a release call.
pub(crate) fn released(reply: Value, keys: &LockKeys) -> RedisResult<Released> {
    let reply: Vec<Value> = redis::from_redis_value(reply)?;
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

/// How a lock stands in Redis, as the status script read it in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) held: bool,
    /// The fence counter while held: the holder's token. `None` when free, or when the counter
    /// is gone.
    pub(crate) token: Option<FencingToken>,
    /// The lock key's remaining lease; `None` when free or without expiry.
    pub(crate) pttl: Option<Duration>,
    /// Live entries of the key's queue: waiting clients.
    pub(crate) waiters: u64,
}

/// Runs the status script: reads only, so it is safe to repeat.
pub(crate) fn status(con: &mut redis::Connection, keys: &LockKeys) -> RedisResult<Status> {
    let [lock, fence, _queue, entries] = keys.all();
    let mut buf = Vec::with_capacity(192);
    evalsha(&mut buf, &STATUS, &[lock, fence, entries], &[]);
    let (held, token_value, pttl, waiters): (i64, String, i64, u64) =
        redis::from_redis_value(run(con, &STATUS, &buf)?)?;
    let token = match token_value.as_str() {
        "" => None,
        digits => Some(token(parse_token(digits, keys)?, keys)?),
    };
    Ok(Status {
        held: held == 1,
        token,
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        waiters,
    })
}

/// A counter's digits as an `i64` (what Redis counters are); anything else is reported as
/// [`token`] reports a value that is not a positive integer.
fn parse_token(digits: &str, keys: &LockKeys) -> RedisResult<i64> {
    digits.parse().map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "fence counter is not a positive integer",
            format!("{digits:?} at {}", keys.fence()),
        ))
    })
}

/// Compare-and-pexpire; `true` when the lock was ours and its lease is re-armed.
pub(crate) fn extend(
    con: &mut redis::Connection,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
) -> RedisResult<bool> {
    let mut buf = Vec::with_capacity(128);
    pack_extend(&mut buf, keys, owner, lease);
    extended(run(con, &EXTEND, &buf)?)
}

/// Compare-and-pexpire followed by `WAIT`, in one pipeline on one connection: the extend is a
/// write of this connection, so the WAIT counts the replicas that have everything before it,
/// whoever wrote it (a handoff written by another client's release included).
pub(crate) fn extend_acked(
    con: &mut redis::Connection,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    acks: ReplicaAcks,
) -> RedisResult<(bool, u32)> {
    let mut buf = Vec::with_capacity(160);
    pack_extend(&mut buf, keys, owner, lease);
    let first = buf.len();
    pack_wait(&mut buf, acks);
    // The extend stands unconfirmed, not failed, when the WAIT counts no replica.
    let (reply, acked) = run_acked(con, &EXTEND, &buf, first)?;
    Ok((extended(reply)?, acked))
}

/// Appends `WAIT replicas timeout` to `buf`.
pub(crate) fn pack_wait(buf: &mut Vec<u8>, acks: ReplicaAcks) {
    wire::pack(
        buf,
        &[
            Arg::Str("WAIT"),
            Arg::Int(u64::from(acks.replicas)),
            Arg::Int(millis(acks.timeout)),
        ],
    );
}

/// Sends a script call packed in `buf[..first]` followed by the `WAIT` in `buf[first..]`, as one
/// pipeline on `con`: the script's reply (its error, if it failed), and how many replicas
/// acknowledged. A WAIT refused (an ACL without it; UNBLOCKED when the master is demoted under
/// it) or its reply unread counts no replica. An interrupted reply is left unanswered, never
/// asked for again alone: a WAIT must follow the write it counts, and a write whose reply was
/// lost must not run twice.
pub(crate) fn run_acked(
    con: &mut redis::Connection,
    script: &Script,
    buf: &[u8],
    first: usize,
) -> RedisResult<(Value, u32)> {
    let replies = run_pipeline(
        con,
        script,
        buf,
        &[first, buf.len()],
        Interrupted::LeaveUnanswered,
    )?;
    let mut replies = replies.into_iter();
    let reply = match replies.next() {
        Some(Some(reply)) => reply?,
        _ => return Err(wire::interrupted_error()),
    };
    let acked = match replies.next() {
        Some(Some(Ok(acked))) => redis::from_redis_value(acked).unwrap_or(0),
        _ => 0,
    };
    Ok((reply, acked))
}

/// Appends one extend call, by EVALSHA, to `buf`; the caller loads the script on NOSCRIPT.
pub(crate) fn pack_extend(buf: &mut Vec<u8>, keys: &LockKeys, owner: &str, lease: Duration) {
    evalsha(
        buf,
        &EXTEND,
        &[keys.lock()],
        &[Arg::Str(owner), Arg::Int(millis(lease))],
    );
}

/// The reply of one extend call: whether the lease was re-armed.
pub(crate) fn extended(reply: Value) -> RedisResult<bool> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply from the extend script",
            format!("{other:?}"),
        ))),
    }
}

/// One proclamation of a leadership, as the election's scripts take it.
pub(crate) struct Proclamation<'a> {
    pub(crate) owner: &'a str,
    pub(crate) epoch: FencingToken,
    /// 1 for the leadership's first, rising with each after it.
    pub(crate) seq: u64,
    pub(crate) value: &'a str,
}

/// Appends the proclaim script's call for `p` (see `election_proclaim.lua`), whose reply
/// [`proclaimed`] reads.
pub(crate) fn pack_proclaim(
    buf: &mut Vec<u8>,
    keys: &LockKeys,
    record: &str,
    p: &Proclamation<'_>,
) {
    let epoch = p.epoch.as_u64().to_string();
    evalsha(
        buf,
        &PROCLAIM,
        &[keys.lock(), record],
        &[
            Arg::Str(p.owner),
            Arg::Str(&epoch),
            Arg::Int(p.seq),
            Arg::Str(p.value),
            Arg::Str(record),
        ],
    );
}

/// Whether a proclamation stands: `false` when the lock was not the leadership's any more.
pub(crate) fn proclaimed(reply: Value) -> RedisResult<bool> {
    Ok(redis::from_redis_value::<i64>(reply)? != 0)
}

/// Runs the proclaim script on one master (see [`pack_proclaim`]); with `acks`, a `WAIT` in
/// the same pipeline, whose count of replicas comes back too.
pub(crate) fn proclaim(
    con: &mut redis::Connection,
    keys: &LockKeys,
    record: &str,
    p: &Proclamation<'_>,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(bool, Option<u32>)> {
    let mut buf = Vec::with_capacity(256 + p.value.len());
    pack_proclaim(&mut buf, keys, record, p);
    match acks {
        None => Ok((proclaimed(run(con, &PROCLAIM, &buf)?)?, None)),
        Some(acks) => {
            let first = buf.len();
            pack_wait(&mut buf, acks);
            let (reply, acked) = run_acked(con, &PROCLAIM, &buf, first)?;
            Ok((proclaimed(reply)?, Some(acked)))
        }
    }
}

/// Appends the resign script's call for `owner`'s record (see `election_resign.lua`).
pub(crate) fn pack_resign(buf: &mut Vec<u8>, record: &str, owner: &str) {
    evalsha(
        buf,
        &RESIGN,
        &[record],
        &[Arg::Str(owner), Arg::Str(record)],
    );
}

/// Runs the resign script on one master: whether the record was `owner`'s.
pub(crate) fn resign(con: &mut redis::Connection, record: &str, owner: &str) -> RedisResult<bool> {
    let mut buf = Vec::with_capacity(192);
    pack_resign(&mut buf, record, owner);
    Ok(redis::from_redis_value::<i64>(run(con, &RESIGN, &buf)?)? != 0)
}

/// Who leads, as one master records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leading {
    /// The owner id of the leadership's grant.
    pub(crate) owner: String,
    pub(crate) epoch: FencingToken,
    pub(crate) seq: u64,
    pub(crate) value: String,
    /// The lock's remaining lease; `None` without expiry.
    pub(crate) pttl: Option<Duration>,
}

/// Who leads an election, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    Leads(Leading),
    /// Nobody leads. `after`: every proclamation at or below this (epoch, seq) is over (the
    /// election's latest grant has ended, or has not proclaimed), when known.
    Nobody {
        after: Option<(FencingToken, u64)>,
    },
}

impl Who {
    pub(crate) fn leading(self) -> Option<Leading> {
        match self {
            Who::Leads(l) => Some(l),
            Who::Nobody { .. } => None,
        }
    }
}

/// Appends the leader script's call (see `election_leader.lua`), whose reply [`leading`] reads.
pub(crate) fn pack_leader(buf: &mut Vec<u8>, keys: &LockKeys, record: &str) {
    evalsha(buf, &LEADER, &[keys.lock(), record, keys.fence()], &[]);
}

/// The leader script's reply.
pub(crate) fn leading(reply: Value, keys: &LockKeys) -> RedisResult<Who> {
    let fields: Vec<Value> = redis::from_redis_value(reply)?;
    if fields.len() == 2 {
        let (held, fence): (i64, String) = redis::from_redis_value(Value::Array(fields))?;
        let after = match fence.as_str() {
            "" => None,
            digits => {
                let epoch = token(parse_token(digits, keys)?, keys)?;
                // Free: every leadership up to the latest grant is over. Held by a candidate
                // that has not proclaimed: every earlier epoch is.
                Some((epoch, if held == 0 { u64::MAX } else { 0 }))
            }
        };
        return Ok(Who::Nobody { after });
    }
    let (owner, epoch, seq, value, pttl): (String, String, u64, String, i64) =
        redis::from_redis_value(Value::Array(fields))?;
    Ok(Who::Leads(Leading {
        owner,
        epoch: token(parse_token(&epoch, keys)?, keys)?,
        seq,
        value,
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    }))
}

/// Runs the leader script on one master.
pub(crate) fn leader(
    con: &mut redis::Connection,
    keys: &LockKeys,
    record: &str,
) -> RedisResult<Who> {
    let mut buf = Vec::with_capacity(192);
    pack_leader(&mut buf, keys, record);
    leading(run(con, &LEADER, &buf)?, keys)
}
