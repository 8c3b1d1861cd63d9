//! The bookkeeping of unlocks that go out together ([`Pool::run_combined`]), with no I/O.
//!
//! A thread hands in a call and either gets a reply or is told to lead a batch. The first
//! caller to find nobody sending leads: it takes every call queued (its own first), sends them
//! and, once they are on the wire, passes the lead on to the first call queued meanwhile, then
//! answers the rest of its batch by position. So one batch goes out at a time, and a call that
//! waits is sent by the next batch. A [`Batch`] dropped before it answered (its sender
//! panicked) still passes the lead on and tells each of its calls that it was not sent, so that
//! no thread waits forever.
//!
//! [`Combiner`] is generic over the call and its reply so that its tests can model-check it with
//! Shuttle, numbers standing in for calls: every interleaving of two threads, and tens of
//! thousands of two to four threads (PCT), with and without a batch dropped unsent. Each call is
//! answered once, with its own reply; no thread waits forever (a lost lead); a batch's leader's
//! own call is first; one batch is out at a time; and once every call is answered nothing is
//! left queued and `busy` is clear, so the next call leads at once.
//!
//! [`Pool::run_combined`]: super::Pool::run_combined

#[cfg(not(test))]
use crossbeam_channel::{bounded, Sender};
use std::sync::PoisonError;
#[cfg(not(test))]
use std::sync::{Mutex, MutexGuard};

#[cfg(test)]
use crate::model::{bounded, Mutex, MutexGuard, Sender};

/// Calls waiting to go out together.
pub(crate) struct Combiner<T, R> {
    queue: Mutex<Queue<T, R>>,
}

struct Queue<T, R> {
    calls: Vec<Call<T, R>>,
    /// A thread is sending a batch; the calls queued meanwhile go in the next. Never set while
    /// no call is queued and no batch is out, so the next call leads at once.
    busy: bool,
}

struct Call<T, R> {
    item: T,
    answer: Sender<Answer<R>>,
}

enum Answer<R> {
    Reply(R),
    /// Send the next batch: the calls queued now, this one first.
    Lead,
    /// The batch that took this call was dropped before it had a reply: the call was not sent.
    Unsent,
}

/// What a call handed to [`Combiner::join`] is to do.
pub(crate) enum Turn<'a, T, R> {
    /// Another thread's batch carried it: its reply, or `None` if that batch never sent it.
    Answered(Option<R>),
    /// Send this batch, then [`Batch::pass_on`] and [`Batch::answer`].
    Lead(Batch<'a, T, R>),
}

impl<T, R> Default for Combiner<T, R> {
    fn default() -> Self {
        Combiner {
            queue: Mutex::new(Queue {
                calls: Vec::new(),
                busy: false,
            }),
        }
    }
}

impl<T, R> Combiner<T, R> {
    /// Queues `item`, and blocks until another thread's batch answers it or the lead comes to
    /// it. Alone, a call leads at once.
    pub(crate) fn join(&self, item: T) -> Turn<'_, T, R> {
        let (answer, answered) = bounded(1);
        let lead = {
            let mut queue = self.queue();
            queue.calls.push(Call { item, answer });
            !std::mem::replace(&mut queue.busy, true)
        };
        if !lead {
            match answered.recv() {
                Ok(Answer::Reply(reply)) => return Turn::Answered(Some(reply)),
                Ok(Answer::Lead) => {}
                // The leader always answers before dropping a call.
                Ok(Answer::Unsent) | Err(_) => return Turn::Answered(None),
            }
        }
        // Leading: the calls queued since the last batch was taken, ours first (we found the
        // queue empty, or the lead was passed to the first call queued).
        Turn::Lead(Batch {
            combiner: self,
            calls: std::mem::take(&mut self.queue().calls),
            passed_on: false,
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue<T, R>> {
        // The queue stays consistent even if a holder of the mutex panicked mid-way.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The calls of a batch being sent, its sender's own first. Dropped before it has answered them
/// (a panic, say in the user's logger), it still passes the sending on and answers each call, so
/// that no thread waits forever.
pub(crate) struct Batch<'a, T, R> {
    combiner: &'a Combiner<T, R>,
    calls: Vec<Call<T, R>>,
    passed_on: bool,
}

impl<T, R> Batch<'_, T, R> {
    /// The calls to send, in order, the sender's own first.
    pub(crate) fn items(&self) -> impl ExactSizeIterator<Item = &T> {
        self.calls.iter().map(|call| &call.item)
    }

    /// Hands the sending of the calls queued meanwhile to the first of them.
    pub(crate) fn pass_on(&mut self) {
        if std::mem::replace(&mut self.passed_on, true) {
            return;
        }
        let mut queue = self.combiner.queue();
        match queue.calls.first() {
            Some(next) => {
                let _ = next.answer.send(Answer::Lead);
            }
            None => queue.busy = false,
        }
    }

    /// Answers every call but the sender's with its reply, by position, and returns the
    /// sender's. A call without a reply is told it was not sent.
    pub(crate) fn answer(mut self, replies: impl IntoIterator<Item = R>) -> Option<R> {
        let mut replies = replies.into_iter();
        let mine = replies.next();
        for call in self.calls.drain(..).skip(1) {
            let answer = replies.next().map_or(Answer::Unsent, Answer::Reply);
            let _ = call.answer.send(answer);
        }
        mine
    }
}

impl<T, R> Drop for Batch<'_, T, R> {
    fn drop(&mut self) {
        self.pass_on();
        for call in self.calls.drain(..).skip(1) {
            let _ = call.answer.send(Answer::Unsent);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The combiner alone, with numbers for calls: call `n`'s reply is `REPLY * n`.

    use std::sync::Arc;

    use super::*;

    const REPLY: u32 = 10;

    /// What the model's connection saw, and how many batches were out at once. Behind std's
    /// mutex, which is no scheduling point for Shuttle (it runs one thread at a time, and this
    /// lock is never held across a Shuttle operation): checking adds no interleavings.
    #[derive(Default)]
    struct Wire {
        /// Each batch as sent, in order.
        batches: Vec<Vec<u32>>,
        /// Batches taken and not yet passed on.
        out: usize,
    }

    /// One call through `combiner`, as `Pool::combined` makes it, sent on `wire`. A leader whose
    /// call is `drop_if_leading` drops its batch instead of sending it, as a panic would.
    fn call(
        combiner: &Combiner<u32, u32>,
        wire: &std::sync::Mutex<Wire>,
        item: u32,
        drop_if_leading: Option<u32>,
    ) -> Option<u32> {
        match combiner.join(item) {
            Turn::Answered(reply) => reply,
            Turn::Lead(mut batch) => {
                let items: Vec<u32> = batch.items().copied().collect();
                assert_eq!(
                    items.first(),
                    Some(&item),
                    "the leader's own call goes first"
                );
                {
                    let mut wire = wire.lock().unwrap();
                    assert_eq!(wire.out, 0, "two batches out at once");
                    wire.out += 1;
                }
                if drop_if_leading == Some(item) {
                    // Dropping passes the lead on: this batch is no longer out.
                    wire.lock().unwrap().out -= 1;
                    drop(batch);
                    return None;
                }
                {
                    let mut wire = wire.lock().unwrap();
                    wire.batches.push(items.clone());
                    // The next batch may go out once this one is passed on.
                    wire.out -= 1;
                }
                batch.pass_on();
                batch.answer(items.iter().map(|n| REPLY * n))
            }
        }
    }

    /// `threads` threads make `calls` calls each (numbered `1 + 100 * thread + call`). Checks
    /// that each call is answered once, with its own reply, and sent exactly once, or else was in
    /// the dropped batch and never sent; and that nothing is left queued or busy. A thread that
    /// waits forever (a lost lead) is a deadlock, which Shuttle reports.
    fn run(threads: u32, calls: u32, drop_if_leading: Option<u32>) {
        let combiner = Arc::new(Combiner::<u32, u32>::default());
        let wire = Arc::new(std::sync::Mutex::new(Wire::default()));
        let calls_of =
            move |t: u32, combiner: &Combiner<u32, u32>, wire: &std::sync::Mutex<Wire>| {
                (0..calls)
                    .map(|c| {
                        let item = 1 + 100 * t + c;
                        (item, call(combiner, wire, item, drop_if_leading))
                    })
                    .collect::<Vec<_>>()
            };
        // The test's own thread is thread 0: one task fewer to schedule.
        let others: Vec<_> = (1..threads)
            .map(|t| {
                let (combiner, wire) = (Arc::clone(&combiner), Arc::clone(&wire));
                shuttle::thread::spawn(move || calls_of(t, &combiner, &wire))
            })
            .collect();
        let mut answers = calls_of(0, &combiner, &wire);
        for other in others {
            answers.extend(other.join().unwrap());
        }
        assert_eq!(answers.len(), (threads * calls) as usize);
        let sent: Vec<u32> = wire
            .lock()
            .unwrap()
            .batches
            .iter()
            .flatten()
            .copied()
            .collect();
        for (item, reply) in answers {
            let times = sent.iter().filter(|&&n| n == item).count();
            match reply {
                Some(reply) => {
                    assert_eq!(reply, REPLY * item, "call {item} got another's reply");
                    assert_eq!(times, 1, "call {item} sent {times} times");
                }
                None => {
                    assert!(drop_if_leading.is_some(), "call {item} unanswered");
                    assert_eq!(times, 0, "call {item} sent but told it was not");
                }
            }
        }
        let queue = combiner.queue();
        assert!(!queue.busy && queue.calls.is_empty(), "left busy or queued");
    }

    /// Iterations of each randomised check: about a second each in a debug build.
    const PCT_RUNS: usize = 10_000;

    /// Checks `run(threads, calls, drop)` with PCT, a randomised scheduler that favours the
    /// orderings few preemptions apart where most concurrency bugs lie (depth 3), `PCT_RUNS`
    /// times: too many interleavings to run them all.
    fn pct(threads: u32, calls: u32, drop_if_leading: Option<u32>) {
        shuttle::check_pct(move || run(threads, calls, drop_if_leading), PCT_RUNS, 3);
    }

    /// Every interleaving of two threads making one call each (263 of them).
    #[test]
    fn two_threads_in_every_interleaving() {
        shuttle::check_dfs(|| run(2, 1, None), None);
    }

    #[test]
    fn two_to_four_threads_in_many_interleavings() {
        pct(2, 2, None);
        pct(3, 1, None);
        pct(3, 2, None);
        pct(4, 2, None);
    }

    /// A leader drops its batch unsent, as a panic unwinding through it would: the calls in it
    /// are told so, and the lead still passes to the calls queued behind it.
    #[test]
    fn a_dropped_batch_still_passes_on_and_answers_in_every_interleaving_of_two() {
        shuttle::check_dfs(|| run(2, 1, Some(1)), None);
        shuttle::check_dfs(|| run(2, 1, Some(101)), None);
    }

    #[test]
    fn a_dropped_batch_still_passes_on_and_answers_with_three_or_four_threads() {
        pct(3, 2, Some(1));
        pct(4, 2, Some(201));
    }

    /// Outside Shuttle, on std's primitives, a lone call leads and finds nothing else queued.
    #[test]
    fn a_lone_call_leads_at_once() {
        let combiner = Combiner::<u32, u32>::default();
        let Turn::Lead(mut batch) = combiner.join(7) else {
            panic!("a lone call waited");
        };
        assert_eq!(batch.items().copied().collect::<Vec<_>>(), [7]);
        batch.pass_on();
        assert_eq!(batch.answer([70]), Some(70));
        let queue = combiner.queue();
        assert!(!queue.busy && queue.calls.is_empty());
    }
}
