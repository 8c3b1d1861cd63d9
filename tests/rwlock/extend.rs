//! `ReadGuard`/`WriteGuard::lease` and `extend`, as `LockGuard::extend`: the grant's own key runs
//! at least the new lease in Redis, a shorter extend never cuts it, and an extend of a grant gone
//! reports the loss.

use std::time::Duration;

use crate::support::{lock_client, ms, RedisServer};
use crate::tag;

/// The grant keys of read-write lock `name` and their remaining lease in ms, sorted by key.
fn hold_pttls(con: &mut redis::Connection, name: &str) -> Vec<(String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:rwhold:{{{}}}:*", tag(name)))
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
fn extend_lengthens_only_its_own_grant_for_readers_and_writers() {
    let server = RedisServer::start();
    let client = lock_client(&server, 600);
    let mut con = server.connection();

    let a = client.read_lock("shared").unwrap();
    let b = client.read_lock("shared").unwrap();
    assert_eq!(a.lease(), ms(600));
    a.extend(ms(30_000)).unwrap();
    assert_eq!((a.lease(), b.lease()), (ms(30_000), ms(600)));
    let pttls = hold_pttls(&mut con, "shared");
    assert_eq!(pttls.len(), 2, "{pttls:?}");
    // Exactly one reader's key runs the new lease: the extend touched no other grant.
    let long = pttls.iter().filter(|(_, pttl)| *pttl > 20_000).count();
    assert_eq!(long, 1, "{pttls:?}");
    assert!(a.is_held() && b.is_held());
    drop((a, b));

    let w = client.write_lock("shared").unwrap();
    w.extend(ms(30_000)).unwrap();
    assert_eq!(w.lease(), ms(30_000));
    let pttls = hold_pttls(&mut con, "shared");
    assert!(pttls.len() == 1 && pttls[0].1 > 20_000, "{pttls:?}");
    // Still alone: the extend admitted nobody.
    assert!(client
        .try_read_lock("shared", Duration::ZERO)
        .unwrap()
        .is_none());
    w.unlock().unwrap();
}

#[test]
fn a_shorter_extend_never_cuts_a_writers_lease_in_redis() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let w = client.write_lock("kept").unwrap();
    w.extend(ms(100)).unwrap();
    assert_eq!(w.lease(), ms(100));
    let mut con = server.connection();
    let pttls = hold_pttls(&mut con, "kept");
    // Still the 30 s it had: a late, shorter extend that cut it could let Redis admit a reader
    // while this writer still counts itself held.
    assert!(pttls.len() == 1 && pttls[0].1 > 20_000, "{pttls:?}");
    assert!(w.is_held());
    assert!(rival
        .try_read_lock("kept", Duration::ZERO)
        .unwrap()
        .is_none());
    w.unlock().unwrap();
}

#[test]
fn an_extend_of_a_grant_gone_reports_the_loss_and_a_bad_lease_is_refused() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let mut con = server.connection();
    let r = client.read_lock("vanishing").unwrap();
    assert!(r.extend(ms(1)).unwrap_err().is_invalid_argument());
    assert!(r.is_held());
    let pttls = hold_pttls(&mut con, "vanishing");
    assert_eq!(pttls.len(), 1, "{pttls:?}");
    let _: () = redis::cmd("DEL").arg(&pttls[0].0).query(&mut con).unwrap();
    let err = r.extend(ms(5_000)).unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(!r.is_held());
    assert!(r.lost().try_recv().is_ok());
    drop(r);

    let w = client.write_lock("vanishing").unwrap();
    let pttls = hold_pttls(&mut con, "vanishing");
    assert_eq!(pttls.len(), 1, "{pttls:?}");
    let _: () = redis::cmd("DEL").arg(&pttls[0].0).query(&mut con).unwrap();
    assert!(w.extend(ms(5_000)).unwrap_err().is_lock_lost());
    assert!(!w.is_held());
    assert!(w.unlock().unwrap_err().is_lock_lost());
}
