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
//! predicts where that clock is now, and proposes the largest prediction, plus twice the
//! reading's round trip (capped) for the time the request takes to get there. It never proposes
//! twice the same number, nor below a token it has seen, unless that token is further ahead of
//! the predicted clocks than the cap.
//!
//! | reading of master i | prediction at `now` |
//! |---|---|
//! | clock `c`, asked at `sent`, answered at `heard` | `c + (now − heard) + min(2 × (heard − sent), MAX_MARGIN)` |
//!
//! `c` was read before `heard`, so `c + (now − heard)` is at or before master i's clock at `now`
//! (the clocks run at the same rate, to a few parts per million), and a proposal is at most
//! `MAX_MARGIN` ahead of the fastest master's clock, however long a request took to reach a
//! master (a busy one, one stopped for a moment, a request sent again through the worker). With
//! the round trip steady, the margin covers the reply's way back and the next request's way
//! there. Anchored at `sent` instead, a prediction would run ahead by the time the request took
//! to get there, unbounded, and a master restarted empty would have to wait that out.
//! Nothing here is needed for safety: a proposal is taken only where it is high enough.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most a proposal adds to a master's predicted clock for the way there. Masters farther
/// than this take a token of their own for a key they have no counter for (a new key, or one
/// idle for longer than the idle expiry), and the attempt takes the write-back round; a key they
/// have a counter for is proposed one above the last token seen. It also bounds how far ahead
/// of the fastest master's clock a proposal runs, which a master restarted empty must wait out
/// (docs/design.md, "Quorum mode"): a token seen further ahead (a key whose counter a clock
/// stepped forward for a while, or that was set by hand) is not followed, so that it does not
/// carry every other key's tokens ahead with it.
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

    /// The proposal of an attempt sent at `now`: at least the largest predicted clock, and
    /// above every proposal before it and every token seen, as far as that stays within
    /// `MAX_MARGIN` of the fastest predicted clock.
    pub(super) fn next(&self, now: Instant) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // The fastest master's clock at `now`, at the latest, and the prediction with margins.
        let (mut clock, mut predicted) = (0u64, 0u64);
        for r in state.readings.iter().flatten() {
            let at = r
                .clock
                .saturating_add(micros(now.saturating_duration_since(r.heard)));
            let round_trip = r.heard.saturating_duration_since(r.sent);
            let margin = round_trip.saturating_mul(2).min(MAX_MARGIN);
            clock = clock.max(at);
            predicted = predicted.max(at.saturating_add(micros(margin)));
        }
        let above = state
            .high
            .saturating_add(1)
            .min(clock.saturating_add(micros(MAX_MARGIN)));
        let proposal = predicted.max(above);
        state.high = state.high.max(proposal);
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
        // Master 1's clock, 800 µs after its reply, plus twice its 200 µs round trip.
        assert_eq!(p.next(now), 1_000_500 + 800 + 400);
        // A slow reply (a 20 ms round trip) adds no more than the cap.
        let heard = sent + Duration::from_millis(20);
        p.heard(1, 1_019_500, sent, heard);
        assert_eq!(
            p.next(heard),
            1_019_500 + u64::try_from(MAX_MARGIN.as_micros()).unwrap()
        );
    }

    #[test]
    fn a_request_slow_to_get_there_does_not_carry_proposals_ahead() {
        let p = Proposer::new(1);
        let sent = Instant::now();
        // The master read its clock 5 s after the request was sent, and answered at once.
        let heard = sent + Duration::from_secs(5);
        p.heard(0, 7_000_000, sent, heard);
        let now = heard + Duration::from_millis(1);
        // Its clock now is 7_001_000: the proposal is at most the cap ahead of it, not 5 s.
        let cap = u64::try_from(MAX_MARGIN.as_micros()).unwrap();
        assert_eq!(p.next(now), 7_001_000 + cap);
    }

    #[test]
    fn a_token_seen_far_ahead_of_the_clocks_is_not_followed() {
        let p = Proposer::new(1);
        let sent = Instant::now();
        let heard = sent + Duration::from_micros(100);
        p.heard(0, 5_000_000, sent, heard);
        let cap = u64::try_from(MAX_MARGIN.as_micros()).unwrap();
        // A token just ahead is followed: one above it.
        p.saw(5_000_300);
        assert_eq!(p.next(heard), 5_000_301);
        // One far ahead (a counter a stepped clock or a hand left there) is not: the proposal
        // stays within the cap of the clock, and that key takes the write-back round.
        p.saw(9_000_000_000);
        assert_eq!(p.next(heard), 5_000_000 + cap);
        assert_eq!(p.next(heard), 5_000_000 + cap);
    }
}
