//! Elections on a quorum of five masters: the record stands on a majority, leaders follow one
//! another with rising epochs, and observers (one subscription per master, a majority read at
//! each message) report each leader, also with two masters frozen.

use std::time::Duration;

use crate::support::ms;
use crate::support::quorum::Quorum;

const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn an_election_on_a_quorum_with_and_without_a_frozen_minority() {
    let quorum = Quorum::start(5);
    let election = quorum.client(ms(2000)).election("scheduler").unwrap();
    let observer = quorum
        .client(ms(2000))
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    assert_eq!(observer.changes().recv_timeout(PATIENCE).unwrap(), None);

    let mut last = None;
    for round in 0..2 {
        if round == 1 {
            quorum.freeze(0);
            quorum.freeze(3);
        }
        let leadership = election.campaign(&format!("a{round}")).unwrap();
        assert!(last.is_none_or(|e| leadership.epoch() > e));
        last = Some(leadership.epoch());
        let seen = observer.changes().recv_timeout(PATIENCE).unwrap().unwrap();
        assert_eq!(
            (seen.value(), seen.epoch()),
            (format!("a{round}").as_str(), leadership.epoch())
        );
        leadership.proclaim("v2").unwrap();
        let leader = election.leader().unwrap().unwrap();
        assert_eq!((leader.value(), leader.epoch()), ("v2", leadership.epoch()));
        // The observer reports v2 (a majority read at each master's message).
        let seen = (0..3)
            .find_map(|_| {
                observer
                    .changes()
                    .recv_timeout(PATIENCE)
                    .unwrap()
                    .filter(|l| l.value() == "v2")
            })
            .expect("v2 reported");
        assert_eq!(seen.epoch(), leadership.epoch());
        leadership.resign().unwrap();
        assert_eq!(election.leader().unwrap(), None);
        assert_eq!(observer.changes().recv_timeout(PATIENCE).unwrap(), None);
    }
    quorum.thaw_all();
}

#[test]
fn a_second_candidate_leads_after_the_first_resigns() {
    let quorum = Quorum::start(3);
    let a = quorum.client(ms(2000)).election("e").unwrap();
    let b = quorum.client(ms(2000)).election("e").unwrap();
    let first = a.campaign("a").unwrap();
    assert!(b.try_campaign("b", ms(300)).unwrap().is_none());
    let epoch = first.epoch();
    let waiting = std::thread::spawn(move || b.campaign("b").map(|l| l.epoch()));
    first.resign().unwrap();
    let next = waiting.join().unwrap().unwrap();
    assert!(next > epoch);
}

#[test]
fn an_observer_never_reports_a_value_going_back_after_a_minority_proclamation() {
    let quorum = Quorum::start(3);
    let election = quorum.client(ms(2_000)).election("scheduler").unwrap();
    let observer = quorum
        .client(ms(2_000))
        .election("scheduler")
        .unwrap()
        .observe()
        .unwrap();
    assert_eq!(observer.changes().recv_timeout(PATIENCE).unwrap(), None);
    let leadership = election.campaign("v1").unwrap();
    assert_eq!(
        observer
            .changes()
            .recv_timeout(PATIENCE)
            .unwrap()
            .unwrap()
            .value(),
        "v1"
    );
    // A proclamation that reached master 0 alone, as a partition would leave it: the proclaim
    // script run there by hand.
    let lock = "test:lock:{%election:scheduler}";
    let record = "test:leader:{%election:scheduler}";
    let mut con = quorum.connection(0);
    let owner: String = redis::cmd("GET").arg(lock).query(&mut con).unwrap();
    let stood: i64 = redis::cmd("EVAL")
        .arg(include_str!("../../src/scripts/election_proclaim.lua"))
        .arg(2)
        .arg(lock)
        .arg(record)
        .arg(&owner)
        .arg(leadership.epoch().as_u64().to_string())
        .arg(2)
        .arg("v2")
        .arg(record)
        .query(&mut con)
        .unwrap();
    assert_eq!(stood, 1);
    // Heard from master 0, read with it: v2.
    assert_eq!(
        observer
            .changes()
            .recv_timeout(PATIENCE)
            .unwrap()
            .unwrap()
            .value(),
        "v2"
    );
    // Master 0 frozen: reads see v1 again; the observer, reading at least once per lease,
    // must not report it.
    quorum.freeze(0);
    let back = observer.changes().recv_timeout(ms(3 * 2_000));
    quorum.thaw_all();
    assert!(back.is_err(), "reported after v2: {back:?}");
    assert!(leadership.is_leader());
}
