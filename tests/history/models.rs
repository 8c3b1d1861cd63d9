//! The checker's semaphore and read-write models, on crafted histories: clean ones with unknown
//! outcomes either way pass; more holders than permits, a writer beside a reader or another
//! writer, and a token that goes back each fail, and only the check they break.

use super::{at, Crafted, Verdict};
use crate::recorder::{Event, Type};

/// What a crafted acquire takes.
#[derive(Clone, Copy)]
enum Take {
    /// A permit of a semaphore of this many.
    Permit(u32),
    Read,
    Write,
}

impl Take {
    fn tag(self, event: Event) -> Event {
        match self {
            Take::Permit(n) => event.permits(n),
            Take::Read => event.mode("read"),
            Take::Write => event.mode("write"),
        }
    }
}

/// A hold of `key` by `process`: acquire invoked at `inv`, granted `token` at `ok`, seen held
/// last at `held`, released at `held + 1` (times in ms, as [`Crafted::hold`] takes them).
#[allow(clippy::too_many_arguments)]
fn hold(
    h: &Crafted,
    take: Take,
    process: &str,
    key: &str,
    token: u64,
    inv: u64,
    ok: u64,
    held: u64,
) {
    let r = &h.recorder;
    r.record(&take.tag(Event::new(process, Type::Invoke, "acquire", Some(key)).at(at(inv))));
    r.record(
        &take.tag(
            Event::new(process, Type::Ok, "acquire", Some(key))
                .at(at(ok))
                .token(token),
        ),
    );
    r.record(
        &Event::new(process, Type::Invoke, "release", Some(key))
            .at(at(held))
            .last_held(at(held)),
    );
    r.record(&Event::new(process, Type::Ok, "release", Some(key)).at(at(held + 1)));
}

/// An acquire of `key` invoked at `inv` whose outcome is unknown at `end`.
fn unknown(h: &Crafted, take: Take, process: &str, key: &str, inv: u64, end: u64) {
    let r = &h.recorder;
    r.record(&take.tag(Event::new(process, Type::Invoke, "acquire", Some(key)).at(at(inv))));
    r.record(
        &take.tag(
            Event::new(process, Type::Unknown, "acquire", Some(key))
                .at(at(end))
                .error("timed out"),
        ),
    );
}

/// The three counts of the new checks and token regressions.
fn counts(v: &Verdict) -> (u64, u64, u64, u64) {
    (
        v.count("semaphore_violations"),
        v.count("rw_violations"),
        v.count("token_regressions"),
        v.count("mutex_violations"),
    )
}

#[test]
fn the_checker_passes_a_semaphore_history_with_n_holders_and_unknowns_either_way() {
    let h = Crafted::new();
    let p = Take::Permit(2);
    // Two holders at once, a third after the first left (touching its end is no overlap).
    hold(&h, p, "a", "s", 1, 0, 2, 30);
    hold(&h, p, "b", "s", 2, 1, 3, 50);
    hold(&h, p, "c", "s", 4, 10, 30, 60);
    // An acquire whose reply never came: it may have been granted meanwhile (a third permit
    // nobody acted on), or not.
    unknown(&h, p, "d", "s", 20, 40);
    // Granted concurrently with c's call: its token may be below c's.
    hold(&h, p, "e", "s", 3, 12, 51, 70);
    // A process that died holding: a grant of no length.
    h.recorder
        .record(&p.tag(Event::new("f", Type::Invoke, "acquire", Some("s")).at(at(71))));
    h.recorder.record(
        &p.tag(
            Event::new("f", Type::Ok, "acquire", Some("s"))
                .at(at(72))
                .token(5),
        ),
    );
    // Another semaphore of one permit beside them.
    hold(&h, Take::Permit(1), "a", "other", 1, 31, 32, 80);
    let v = h.check();
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(v.count("grants"), 6, "{}", v.output);
    assert_eq!(counts(&v), (0, 0, 0, 0), "{}", v.output);
}

#[test]
fn the_checker_reports_more_holders_than_permits() {
    let h = Crafted::new();
    let p = Take::Permit(2);
    hold(&h, p, "a", "s", 1, 0, 1, 50);
    hold(&h, p, "b", "s", 2, 0, 2, 50);
    // A third granted while both still saw theirs held, tokens rising: only this check fails.
    hold(&h, p, "c", "s", 3, 0, 40, 45);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(counts(&v), (1, 0, 0, 0), "{}", v.output);
    assert!(
        v.output
            .contains("semaphore 's' of 2: c (a permit, token 3, [0.040s .. 0.045s]) is granted while 2 others hold"),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_reports_a_semaphore_token_that_goes_back_in_grant_order() {
    let h = Crafted::new();
    let p = Take::Permit(3);
    hold(&h, p, "a", "s", 5, 0, 1, 100);
    // Invoked after a's grant returned, so granted after it: it needs a token above 5.
    hold(&h, p, "b", "s", 5, 2, 3, 100);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(counts(&v), (0, 0, 1, 0), "{}", v.output);
    assert!(v.output.contains("b is granted token 5"), "{}", v.output);
}

#[test]
fn the_checker_passes_a_read_write_history_with_readers_together() {
    let h = Crafted::new();
    hold(&h, Take::Read, "a", "rw", 1, 0, 1, 40);
    hold(&h, Take::Read, "b", "rw", 2, 0, 2, 30);
    // A writer queued meanwhile, granted once both left.
    hold(&h, Take::Write, "c", "rw", 3, 5, 41, 60);
    // A reader whose outcome is unknown across the writer's hold: left out.
    unknown(&h, Take::Read, "d", "rw", 45, 55);
    // Readers after the writer, one invoked during its hold; then a writer.
    hold(&h, Take::Read, "a", "rw", 4, 50, 61, 80);
    hold(&h, Take::Read, "b", "rw", 5, 62, 63, 70);
    hold(&h, Take::Write, "c", "rw", 6, 64, 81, 90);
    let v = h.check();
    assert_eq!(v.code, 0, "{}", v.output);
    assert_eq!(counts(&v), (0, 0, 0, 0), "{}", v.output);
    assert!(
        v.output
            .contains("read-write: 6 holds (2 writes) on 1 locks; 0 beside a writer"),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_reports_a_writer_beside_a_reader() {
    let h = Crafted::new();
    hold(&h, Take::Read, "a", "rw", 1, 0, 1, 50);
    // Granted while a still saw its read held, with a higher token: only this check fails.
    hold(&h, Take::Write, "b", "rw", 2, 2, 40, 60);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(counts(&v), (0, 1, 0, 0), "{}", v.output);
    assert!(
        v.output.contains(
            "read-write lock 'rw': b (write, token 2, [0.040s .. 0.060s]) is granted while a (read"
        ),
        "{}",
        v.output
    );
}

#[test]
fn the_checker_reports_a_reader_beside_a_writer_and_a_writer_beside_a_writer() {
    let h = Crafted::new();
    hold(&h, Take::Write, "a", "rw", 1, 0, 1, 50);
    hold(&h, Take::Read, "b", "rw", 2, 2, 10, 20);
    hold(&h, Take::Write, "c", "rw", 3, 3, 30, 70);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(counts(&v), (0, 2, 0, 0), "{}", v.output);
}

#[test]
fn the_checker_reports_a_write_token_below_an_earlier_reads() {
    let h = Crafted::new();
    // Two readers together; the writer after them carries a token below the second's. Both
    // readers' calls were invoked before the writer's returned, and the writer's before b's
    // returned: only the read-write order says the writer came after b.
    hold(&h, Take::Read, "a", "rw", 3, 0, 2, 20);
    hold(&h, Take::Read, "b", "rw", 7, 1, 3, 30);
    hold(&h, Take::Write, "c", "rw", 5, 2, 31, 40);
    let v = h.check();
    assert_eq!(v.code, 1, "{}", v.output);
    assert_eq!(counts(&v), (0, 0, 1, 0), "{}", v.output);
    assert!(v.output.contains("c (write, token 5"), "{}", v.output);
}

#[test]
fn the_checker_rejects_a_key_taken_as_two_kinds() {
    let h = Crafted::new();
    hold(&h, Take::Permit(2), "a", "k", 1, 0, 1, 10);
    hold(&h, Take::Read, "b", "k", 2, 11, 12, 20);
    let v = h.check();
    assert_eq!(v.code, 2, "{}", v.output);
    assert!(v.output.contains("acquired as a rw"), "{}", v.output);
}
