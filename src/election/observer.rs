//! [`Observer`]: who leads an election, delivered at each change without polling.
//!
//! One thread per observer reads who leads whenever its watch subscribes (first, or again after
//! an outage: what was published meanwhile is lost, so only a read can say what is current),
//! and follows the messages in between. On one master each message is the truth when it was
//! published (the script that records a proclamation publishes it), so every proclamation is
//! delivered in order; on a quorum a message is one master's word, so it prompts a majority read.
//!
//! A leader that dies says nothing: the observer reads again when the leader's lease would have
//! run out, as a lock's waiter looks again at its holder's expiry. So it learns of a crashed
//! leader within about a lease, and of everything else within a round trip. While nobody leads
//! it reads once per lease of its client, as a net under the messages: one lost (a publish the
//! leader's ACL refused, a subscription the observer's ACL refused) then costs a lease of delay,
//! not a report never made.
//!
//! | event | what the observer does |
//! |---|---|
//! | subscribed, first or again | reads; reports what it read if it differs from what was reported last (the first read is always reported) |
//! | `leader <epoch> <seq> <pttl> <value>` | reports it if it is later than anything heard (epoch, then seq); looks again after `pttl` |
//! | `resigned <epoch> <seq>` | reports `None` if the leader reported last had that epoch |
//! | the last leader's lease would have run out | reads |
//! | a read failed | reads again after a pause (100 ms, doubling to 1 s), or at the next subscription |

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

use super::{Election, Leader};
use crate::error::{Error, Result};
use crate::net::watch::Heard;
use crate::scripts::{Leading, Who};
use crate::token::FencingToken;

/// What an observer adds to a leader's lease before it reads again: the lease as read left out
/// the time the reply took, and a renewal may land at the last moment.
const LEASE_MARGIN: Duration = Duration::from_millis(20);

/// Watches an election: made by [`Election::observe`]. Its [`changes`](Observer::changes)
/// channel delivers who leads when the observer starts, then every change of leader or of the
/// leader's value, in order, without polling. Dropping the observer stops it (its thread ends
/// once a read in progress ends: at most a connection and a response timeout).
///
/// `None` means nobody leads: the leader resigned, its lease ran out, or a new leader was
/// granted the election and has not proclaimed yet. A leader that crashes is reported gone
/// within about its lease. After an outage the observer reads who leads as soon as it can
/// subscribe again, so it never reports a stale leader as current; changes that came and went
/// during the outage are not replayed.
///
/// Each observer has a thread and a pub/sub connection of its own (one per master on a quorum),
/// and reads who leads once per leader's lease besides: share one observer among the threads
/// of a process (the receiver can be cloned) rather than start one per thread.
///
/// ```no_run
/// # fn main() -> Result<(), fencelock::Error> {
/// let client = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
/// let observer = client.election("scheduler")?.observe()?;
/// for leader in observer.changes().iter().take(3) {
///     match leader {
///         Some(leader) => println!("{} leads, epoch {}", leader.value(), leader.epoch()),
///         None => println!("nobody leads"),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Observer {
    changes: Receiver<Option<Leader>>,
    /// The watch threads hold a `Weak` of it; the observer's thread ends when `stop`'s sender
    /// is dropped with it.
    _alive: Arc<()>,
    _stop: Sender<()>,
    name: String,
}

impl Observer {
    pub(super) fn start(election: Election) -> Result<Observer> {
        let alive = Arc::new(());
        let (inbox_tx, inbox) = crossbeam_channel::unbounded();
        let (changes_tx, changes) = crossbeam_channel::unbounded();
        let (stop_tx, stop) = crossbeam_channel::bounded(0);
        let trusts_messages = election.inner.shared.engine.watch(
            &election.inner.record,
            inbox_tx,
            Arc::downgrade(&alive),
        )?;
        let name = election.name().to_owned();
        let mut observing = Observing {
            fallback: election.inner.shared.config.lease,
            election,
            trusts_messages,
            changes: changes_tx,
            reported: None,
            heard: None,
            next_read: None,
            pause: FIRST_PAUSE,
            warned: false,
        };
        thread::Builder::new()
            .name("fencelock-observe".to_owned())
            .spawn(move || {
                observing.read();
                observing.run(&inbox, &stop);
            })
            .map_err(|e| Error::Connection(Box::new(e)))?;
        Ok(Observer {
            changes,
            _alive: alive,
            _stop: stop_tx,
            name,
        })
    }

    /// Who leads now (first), then each change, in order. Unbounded: an observer nobody reads
    /// keeps what it heard.
    pub fn changes(&self) -> &Receiver<Option<Leader>> {
        &self.changes
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.name)
            .finish_non_exhaustive()
    }
}

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The observer thread's state.
struct Observing {
    election: Election,
    trusts_messages: bool,
    changes: Sender<Option<Leader>>,
    /// What was reported last; `None` until the first report.
    reported: Option<Option<Leader>>,
    /// The latest proclamation heard or read, (epoch, seq): a message at or below it is old
    /// news.
    heard: Option<(FencingToken, u64)>,
    /// When to read again without being told.
    next_read: Option<Instant>,
    /// The pause after a failed read.
    pause: Duration,
    /// How long to go without a read while nobody leads (or the leader's lease is unknown):
    /// the client's lease.
    fallback: Duration,
    /// Whether a failed read has been warned of since the last good one.
    warned: bool,
}

impl Observing {
    fn run(&mut self, inbox: &Receiver<Heard>, stop: &Receiver<()>) {
        loop {
            let timeout = self.next_read.map_or(Duration::from_secs(3600), |at| {
                at.saturating_duration_since(Instant::now())
            });
            select! {
                recv(stop) -> _ => return,
                recv(inbox) -> heard => match heard {
                    Ok(Heard::Subscribed) => self.read(),
                    Ok(Heard::Message(payload)) if self.trusts_messages => self.message(&payload),
                    // One master's word: read a majority, once for every message that came
                    // meanwhile (each master publishes each change).
                    Ok(Heard::Message(_)) => {
                        while inbox.try_recv().is_ok() {}
                        self.read();
                    }
                    Err(_) => return,
                },
                default(timeout) => self.read(),
            }
        }
    }

    /// Reads who leads; what it reads is the truth now, whatever was heard before (but see the
    /// module docs on a lower seq within an epoch).
    fn read(&mut self) {
        let inner = &self.election.inner;
        match inner.shared.engine.leader(&inner.keys, &inner.record) {
            Ok(Who::Leads(l)) => {
                self.pause = FIRST_PAUSE;
                self.warned = false;
                self.next_read = Some(self.look_again(l.pttl));
                let at = (l.epoch, l.seq);
                if self
                    .heard
                    .is_some_and(|(epoch, seq)| epoch == l.epoch && l.seq < seq)
                {
                    return;
                }
                self.heard = Some(at);
                self.report(Some(Leader::from(l)));
            }
            Ok(Who::Nobody { after }) => {
                self.pause = FIRST_PAUSE;
                self.warned = false;
                self.next_read = Some(self.look_again(None));
                if let Some(after) = after {
                    self.heard = Some(self.heard.map_or(after, |heard| heard.max(after)));
                }
                self.report(None);
            }
            Err(e) => {
                if std::mem::replace(&mut self.warned, true) {
                    log::debug!(
                        "fencelock: observer of election {:?} could not read the leader: {e}",
                        self.election.name()
                    );
                } else {
                    log::warn!(
                        "fencelock: observer of election {:?} could not read the leader; \
                         trying again: {e}",
                        self.election.name()
                    );
                }
                self.next_read = Some(Instant::now() + self.pause);
                self.pause = (self.pause * 2).min(MAX_PAUSE);
            }
        }
    }

    /// When to read again for a leader whose lease has `pttl` left (`None`: nobody leads, or
    /// the lease has no expiry): a lease of the client's at most.
    fn look_again(&self, pttl: Option<Duration>) -> Instant {
        Instant::now() + pttl.unwrap_or(self.fallback).min(self.fallback) + LEASE_MARGIN
    }

    /// A message from the one master, true when it was published.
    fn message(&mut self, payload: &[u8]) {
        match parse(payload) {
            Some(Said::Leader(leading)) => {
                let at = (leading.epoch, leading.seq);
                if self.heard.is_some_and(|heard| at <= heard) {
                    return;
                }
                self.heard = Some(at);
                self.next_read = Some(self.look_again(leading.pttl));
                self.report(Some(Leader::from(leading)));
            }
            Some(Said::Resigned(epoch, seq)) => {
                if self.heard.is_none_or(|heard| (epoch, seq) >= heard) {
                    self.heard = Some((epoch, u64::MAX));
                }
                let current = matches!(&self.reported, Some(Some(l)) if l.epoch == epoch);
                if current {
                    self.next_read = Some(self.look_again(None));
                    self.report(None);
                }
            }
            None => {
                log::debug!("fencelock: ignoring a malformed election message; reading instead");
                self.read();
            }
        }
    }

    /// Reports `now` unless it is what was reported last.
    fn report(&mut self, now: Option<Leader>) {
        if self.reported.as_ref() == Some(&now) {
            return;
        }
        self.reported = Some(now.clone());
        // Nobody reads any more: the observer is being dropped, and `stop` ends the thread.
        let _ = self.changes.send(now);
    }
}

enum Said {
    Leader(Leading),
    Resigned(FencingToken, u64),
}

/// `leader <epoch> <seq> <pttl> <value>` or `resigned <epoch> <seq>`.
fn parse(payload: &[u8]) -> Option<Said> {
    let text = std::str::from_utf8(payload).ok()?;
    let epoch = |s: &str| s.parse().ok().filter(|e| *e > 0).map(FencingToken::new);
    if let Some(rest) = text.strip_prefix("leader ") {
        let mut parts = rest.splitn(4, ' ');
        let epoch = epoch(parts.next()?)?;
        let seq = parts.next()?.parse().ok()?;
        let pttl: i64 = parts.next()?.parse().ok()?;
        let value = parts.next()?.to_owned();
        return Some(Said::Leader(Leading {
            owner: String::new(),
            epoch,
            seq,
            value,
            pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        }));
    }
    let rest = text.strip_prefix("resigned ")?;
    let (e, s) = rest.split_once(' ')?;
    Some(Said::Resigned(epoch(e)?, s.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_as_the_scripts_write_them() {
        let Some(Said::Leader(l)) = parse(b"leader 17 2 2999 node a: v2") else {
            panic!("a leader message")
        };
        assert_eq!(
            (l.epoch, l.seq, l.value.as_str()),
            (FencingToken::new(17), 2, "node a: v2")
        );
        assert_eq!(l.pttl, Some(Duration::from_millis(2999)));
        let Some(Said::Leader(l)) = parse(b"leader 17 1 -1 ") else {
            panic!("an empty value, no expiry")
        };
        assert_eq!((l.value.as_str(), l.pttl), ("", None));
        assert!(
            matches!(parse(b"resigned 17 3"), Some(Said::Resigned(e, 3)) if e == FencingToken::new(17))
        );
        for bad in [
            &b"leader x 1 1 v"[..],
            b"leader 0 1 1 v",
            b"resigned 1",
            b"other",
            b"\xff",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
