//! `Permit::lease` and `Permit::extend`, as `LockGuard::extend`: the permit's own key runs at
//! least the new lease in Redis, a shorter extend never cuts it, renewal re-arms the new lease,
//! and an extend of a permit gone reports the loss.

use std::time::Duration;

use crate::support::{lock_client, ms, RedisServer};

/// The permit keys of semaphore `name` (no braces or percent signs in the tests' names) and
/// their remaining lease in ms, sorted by key.
fn permit_pttls(con: &mut redis::Connection, name: &str) -> Vec<(String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:permit:{{%semaphore:{name}}}:*"))
        .query(con)
        .unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(con).unwrap();
            (key, pttl)
        })
        .collect()
}

#[test]
fn extend_lengthens_only_its_own_permit_and_renewal_keeps_the_new_lease() {
    let server = RedisServer::start();
    let client = lock_client(&server, 600);
    let uploads = client.semaphore("extended", 2).unwrap();
    let long = uploads.acquire().unwrap();
    let short = uploads.acquire().unwrap();
    assert_eq!(long.lease(), ms(600));
    let mut con = server.connection();
    assert_eq!(permit_pttls(&mut con, "extended").len(), 2);

    long.extend(ms(6_000)).unwrap();
    assert_eq!(long.lease(), ms(6_000));
    assert_eq!(short.lease(), ms(600));
    let after = permit_pttls(&mut con, "extended");
    let extended: Vec<_> = after.iter().filter(|(_, pttl)| *pttl > 1_000).collect();
    // Exactly one permit key runs the new lease: the extend touched no other permit.
    assert_eq!(extended.len(), 1, "{after:?}");
    let key = extended[0].0.clone();
    assert!(after.iter().all(|(_, pttl)| *pttl > 0), "{after:?}");
    assert!(long.is_held() && short.is_held());

    // Renewal re-arms what the last extend asked for, never the client's 600 ms again: waited
    // for until a renewal raises the key's lease (every 2 s), failing at once if it drops to
    // the client's lease, which the renewal thread alone, stalled 5 s, could not explain.
    let mut last = extended[0].1;
    crate::support::poll_until(Duration::from_secs(15), ms(20), || {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        let renewed = pttl > last + 300;
        last = pttl;
        match pttl {
            _ if pttl <= 700 => Ok(Err(format!("the extended lease was cut to {pttl} ms"))),
            _ if renewed => Ok(Ok(())),
            _ => Err(format!("not renewed yet: {pttl} ms left")),
        }
    })
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(long.is_held());
    long.release().unwrap();
    short.release().unwrap();
}

#[test]
fn a_shorter_extend_never_cuts_the_lease_in_redis() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let one = client.semaphore("kept", 1).unwrap();
    let permit = one.acquire().unwrap();
    permit.extend(ms(100)).unwrap();
    assert_eq!(permit.lease(), ms(100));
    let mut con = server.connection();
    let pttls = permit_pttls(&mut con, "kept");
    // Still the 30 s it had: a late, shorter extend that cut it could let Redis hand the permit
    // to another while this holder still counts itself held.
    assert!(pttls.len() == 1 && pttls[0].1 > 20_000, "{pttls:?}");
    assert!(permit.is_held());
    let theirs = rival.semaphore("kept", 1).unwrap();
    assert!(theirs.try_acquire(Duration::ZERO).unwrap().is_none());
    permit.release().unwrap();
}

#[test]
fn an_extend_of_a_permit_gone_reports_the_loss_and_a_bad_lease_is_refused() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let permit = client.semaphore("vanishing", 3).unwrap().acquire().unwrap();
    let err = permit.extend(ms(1)).unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    assert!(permit.is_held());

    let mut con = server.connection();
    let pttls = permit_pttls(&mut con, "vanishing");
    assert_eq!(pttls.len(), 1, "{pttls:?}");
    let _: () = redis::cmd("DEL").arg(&pttls[0].0).query(&mut con).unwrap();
    let err = permit.extend(ms(5_000)).unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(!permit.is_held());
    assert!(permit.lost().try_recv().is_ok());
    assert!(permit.release().unwrap_err().is_lock_lost());
}
