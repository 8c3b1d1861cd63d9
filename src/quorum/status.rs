//! How a lock stands on a quorum: held when a majority holds one owner's key.

use std::time::{Duration, Instant};

use super::Quorum;
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::scripts;
use crate::status::LockStatus;
use crate::token::FencingToken;

/// How the lock stands on a majority: held when a majority holds one owner's key; its
/// token is then the fence value a majority of the holder's masters share (the masters that
/// took the attempt's proposal hold it, as the write-back sets every confirmed master's
/// counter to it when fewer than a majority took it; nothing changes it while the lock is
/// held).
pub(super) fn status(q: &Quorum, keys: &LockKeys) -> Result<LockStatus> {
    let until = Instant::now() + q.response_timeout;
    let mut packed = Vec::with_capacity(128);
    scripts::evalsha(
        &mut packed,
        &scripts::QUORUM_STATUS,
        &[keys.lock(), keys.fence()],
        &[],
    );
    let rx = q.ask(q.all(), &scripts::QUORUM_STATUS, packed, until, false);
    let n = q.masters.len();
    type Seen = (Option<String>, i64, Option<u64>);
    let mut seen: Vec<Seen> = Vec::new();
    let mut failed = None;
    while seen.len() + usize::from(failed.is_some()) < n {
        let Ok(reply) = rx.recv_deadline(until) else {
            break;
        };
        match reply.result.and_then(|v| {
            Ok(redis::from_redis_value::<(
                Option<String>,
                i64,
                Option<String>,
            )>(v)?)
        }) {
            Ok((owner, pttl, fence)) => {
                seen.push((owner, pttl, fence.and_then(|f| f.parse().ok())));
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if seen.len() < q.majority {
        return Err(match failed {
            Some(e) => Error::from_redis(e),
            None => Error::Timeout("no majority of the masters answered in time".into()),
        });
    }
    let quorum = q.majority;
    let holder = seen
        .iter()
        .filter_map(|(o, ..)| o.as_ref())
        .find(|o| seen.iter().filter(|(x, ..)| x.as_ref() == Some(*o)).count() >= quorum);
    let Some(holder) = holder else {
        return Ok(LockStatus {
            held: false,
            token: None,
            remaining_lease: None,
            waiters: 0,
        });
    };
    let holders: Vec<&Seen> = seen
        .iter()
        .filter(|(o, ..)| o.as_ref() == Some(holder))
        .collect();
    let token = holders
        .iter()
        .filter_map(|(.., f)| *f)
        .find(|f| holders.iter().filter(|(.., g)| *g == Some(*f)).count() >= quorum);
    // The lock is held until fewer than a majority of the holder's keys are left.
    let mut pttls: Vec<i64> = holders.iter().map(|(_, p, _)| *p).collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    Ok(LockStatus {
        held: true,
        token: token.map(FencingToken::new),
        remaining_lease: pttls
            .get(quorum - 1)
            .filter(|p| **p >= 0)
            .map(|p| Duration::from_millis(p.unsigned_abs())),
        waiters: 0,
    })
}
