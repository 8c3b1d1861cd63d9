//! What reaches the log, as the crate docs' "Logging" section says: targets under `fencelock`,
//! messages starting `fencelock: `, only warn and debug; grants and releases at debug, losses at
//! warn, owner ids never above debug.
//!
//! Its own test binary, with one test: it captures the log, and a logger is process-wide
//! (installed once, and other tests' records would mix in).

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use log::Level;
use support::{lock_client, ms, RedisServer};

#[test]
fn owner_ids_stay_out_of_logs_and_debug_output() {
    support::capture_logs();
    let server = RedisServer::start();
    let client = lock_client(&server, 300);
    let mut con = server.connection();

    let guard = client.lock("audit").unwrap();
    let owner: String = redis::cmd("GET")
        .arg("test:lock:{audit}")
        .query(&mut con)
        .unwrap();
    // "<client id>:<sequence>": a random 128-bit id per client, a counter per lock call.
    let (client_id, sequence) = owner.split_once(':').expect("owner id format");
    assert!(
        client_id.len() == 32 && client_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "owner id {owner}"
    );
    assert!(sequence.parse::<u64>().is_ok(), "owner id {owner}");
    let shown = format!("{guard:?}");
    assert!(
        shown.contains("audit") && shown.contains(&guard.token().to_string()),
        "{shown}"
    );
    assert!(!shown.contains(&owner), "Debug shows the owner id: {shown}");
    guard.unlock().unwrap();

    let lost = client.lock("audit").unwrap();
    let second_owner: String = redis::cmd("GET")
        .arg("test:lock:{audit}")
        .query(&mut con)
        .unwrap();
    assert_ne!(second_owner, owner, "owner ids must be fresh per grant");
    let _: () = redis::cmd("DEL")
        .arg("test:lock:{audit}")
        .query(&mut con)
        .unwrap();
    assert!(lost.lost().recv_timeout(ms(1_000)).is_ok());
    assert!(lost.unlock().unwrap_err().is_lock_lost());
    // The renewal thread logs the loss around the time it signals it.
    let logged = support::poll_until(Duration::from_secs(10), Duration::from_millis(5), || {
        let records = support::log_records();
        if records
            .iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("lost"))
        {
            Ok(())
        } else {
            Err(format!("{records:#?}"))
        }
    });
    if let Err(records) = logged {
        panic!("no warning of the loss was logged: {records}");
    }

    let records = support::log_records();
    let at = |level: Level, needle: &str| {
        records
            .iter()
            .any(|(l, m)| *l == level && m.contains(needle))
    };
    assert!(at(Level::Debug, "granted"), "{records:#?}");
    assert!(at(Level::Debug, "released"), "{records:#?}");
    assert!(at(Level::Warn, "lost"), "{records:#?}");
    let ours: Vec<_> = support::log_records_with_targets()
        .into_iter()
        .filter(|(target, _, message)| {
            target.starts_with("fencelock") || message.starts_with("fencelock")
        })
        .collect();
    assert!(!ours.is_empty());
    for (target, level, message) in &ours {
        assert!(
            target == "fencelock" || target.starts_with("fencelock::"),
            "target {target:?} of {message:?}"
        );
        assert!(message.starts_with("fencelock: "), "{message:?}");
        assert!(
            matches!(level, Level::Warn | Level::Debug),
            "{level} is not a documented level: {message:?}"
        );
    }
    for (level, message) in &records {
        if *level <= Level::Info {
            assert!(
                !message.contains(&owner) && !message.contains(&second_owner),
                "{message}"
            );
        }
    }
}
