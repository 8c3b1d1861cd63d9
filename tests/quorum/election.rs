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
