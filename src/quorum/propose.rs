//! The token an attempt proposes to the masters.
//!
//! A master takes a proposal P as the grant's token when P is above every token it ever stored
//! (`propose` in `grant.lua`). When a majority took it, P is stored on a majority as a
//! write-back would have stored it, and the lock is held after one round instead of two. A
//! proposal that a master finds too low is harmless: that master mints as before, and the
//! attempt takes the write-back round.
//!
//! So a proposal should be just above what the masters would mint: their clocks (tokens are
//! clock readings in microseconds, lifted by one per grant) and the tokens already stored. Every
//! acquire reply carries the master's clock; from the latest reading of each master the client
//! predicts where that clock is now, and proposes the largest prediction, plus the reading's
//! round trip (capped) for the time the request takes to get there. It never proposes twice the
//! same number, nor below a token it has seen.
//!
//! | reading of master i | prediction at `now` |
//! |---|---|
//! | clock `c`, asked at `sent`, answered at `heard` | `c + (now − sent) + min(heard − sent, MAX_MARGIN)` |
//!
//! `c` was read after `sent`, so `c + (now − sent)` is at or past master i's clock at `now` (the
//! clocks run at the same rate, to a few parts per million); the margin covers the way there.
//! Nothing here is needed for safety: a proposal is taken only where it is high enough.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most a proposal adds to a master's predicted clock for the way there. Masters farther
/// than this take a token of their own for a key they have no counter for (a new key, or one
/// idle for longer than the idle expiry), and the attempt takes the write-back round; a key they
/// have a counter for is proposed one above the last token seen. It also bounds how far ahead
/// of the fastest master's clock a proposal runs, which a master restarted empty must wait out
/// (docs/design.md, "Quorum mode").
const MAX_MARGIN: Duration = Duration::from_millis(10);

/// What a client knows of its masters' clocks and tokens.
pub(super) struct Proposer {
    state: Mutex<State>,
}

struct State {
    /// The largest token seen in a reply or proposed.
    high: u64,
    /// The latest clock reading of each master.
    readings: Vec<Option<Reading>>,
}

#[derive(Clone, Copy)]
struct Reading {
    clock: u64,
    sent: Instant,
    heard: Instant,
}

impl Proposer {
    pub(super) fn new(masters: usize) -> Proposer {
        Proposer {
            state: Mutex::new(State {
                high: 0,
                readings: vec![None; masters],
            }),
        }
    }

    /// The proposal of an attempt sent at `now`: above every proposal before it and every
    /// token seen, and at least the largest predicted clock.
    pub(super) fn next(&self, now: Instant) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let predicted = state
            .readings
            .iter()
            .flatten()
            .map(|r| {
                let since = now.saturating_duration_since(r.sent);
                let margin = r.heard.saturating_duration_since(r.sent).min(MAX_MARGIN);
                r.clock.saturating_add(micros(since + margin))
            })
            .max()
            .unwrap_or(0);
        let proposal = predicted.max(state.high.saturating_add(1));
        state.high = proposal;
        proposal
    }

    /// Master `master` read its clock as `clock` microseconds, asked at `sent`, answered at
    /// `heard`.
    pub(super) fn heard(&self, master: usize, clock: u64, sent: Instant, heard: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = state.readings.get_mut(master) {
            *slot = Some(Reading { clock, sent, heard });
        }
    }

    /// A token seen in a reply (minted, or taken).
    pub(super) fn saw(&self, token: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.high = state.high.max(token);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_above_every_token_seen_and_never_twice() {
        let p = Proposer::new(3);
        let now = Instant::now();
        assert_eq!(p.next(now), 1);
        assert_eq!(p.next(now), 2);
        p.saw(100);
        assert_eq!(p.next(now), 101);
    }

    #[test]
    fn proposes_the_fastest_predicted_clock_plus_the_way_there() {
        let p = Proposer::new(2);
        let sent = Instant::now();
        let heard = sent + Duration::from_micros(200);
        p.heard(0, 1_000_000, sent, heard);
        p.heard(1, 1_000_500, sent, heard);
        let now = sent + Duration::from_millis(1);
        // Master 1's clock, 1 ms on, plus its 200 µs round trip.
        assert_eq!(p.next(now), 1_000_500 + 1_000 + 200);
        // A slow reply adds no more than the cap.
        p.heard(1, 1_000_500, sent, sent + Duration::from_secs(5));
        assert_eq!(
            p.next(now),
            1_000_500 + 1_000 + u64::try_from(MAX_MARGIN.as_micros()).unwrap()
        );
    }
}
