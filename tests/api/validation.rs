//! Bad input is rejected with a typed error before any network call; odd keys work.

use std::time::{Duration, Instant};

use fencelock::{Error, FencingToken, LockClient, LockGuard, MAX_KEY_LEN};

use crate::support::{free_port, lock_client, ms, RedisServer};

/// A URL where nothing listens: a call that reached the network would fail differently.
fn nowhere() -> String {
    format!("redis://127.0.0.1:{}/", free_port())
}

fn rejected(result: Result<LockClient, Error>, what: &str) {
    match result {
        Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected invalid {what}, got {other:?}"),
    }
}

#[test]
fn bad_settings_are_rejected_by_build() {
    let b = || LockClient::builder(nowhere());
    rejected(b().lease(Duration::ZERO).build(), "lease");
    rejected(b().lease(ms(9)).build(), "lease");
    rejected(b().lease(Duration::from_secs(25 * 3600)).build(), "lease");
    rejected(b().lease(Duration::from_micros(10_500)).build(), "lease");
    rejected(b().idle_expiry(ms(999)).build(), "idle expiry");
    rejected(
        b().idle_expiry(fencelock::MAX_IDLE_EXPIRY + ms(1)).build(),
        "idle expiry",
    );
    rejected(
        b().idle_expiry(Duration::from_micros(1_000_500)).build(),
        "idle expiry",
    );
    rejected(b().pool_size(0).build(), "pool size");
    rejected(b().pool_size(100_000).build(), "pool size");
    rejected(
        b().connection_timeout(Duration::ZERO).build(),
        "connection timeout",
    );
    rejected(
        b().response_timeout(Duration::ZERO).build(),
        "response timeout",
    );
    rejected(b().namespace("").build(), "namespace");
    rejected(b().namespace("a{b}").build(), "namespace");
    rejected(b().namespace("x".repeat(65)).build(), "namespace");
    rejected(LockClient::builder("http://127.0.0.1/").build(), "url");
    rejected(LockClient::builder("not a url").build(), "url");
    rejected(LockClient::new(""), "url");
    // TLS needs the `tls` feature: without it a rediss:// URL is refused, not tried in the clear.
    #[cfg(not(feature = "tls"))]
    {
        rejected(LockClient::builder("rediss://127.0.0.1/").build(), "url");
        let tls = fencelock::FencedRedis::open("rediss://127.0.0.1/").unwrap_err();
        assert!(tls.is_invalid_argument(), "{tls:?}");
        assert!(
            tls.to_string().contains("build with the `tls` feature"),
            "{tls}"
        );
    }
    #[cfg(feature = "tls")]
    {
        assert!(LockClient::builder("rediss://127.0.0.1/").build().is_ok());
        assert!(fencelock::FencedRedis::open("rediss://127.0.0.1/").is_ok());
    }
    assert!(b().lease(ms(10)).pool_size(1).build().is_ok());
    assert!(b().idle_expiry(fencelock::MIN_IDLE_EXPIRY).build().is_ok());
    assert!(b().idle_expiry(fencelock::MAX_IDLE_EXPIRY).build().is_ok());
}

#[test]
fn bad_keys_are_rejected_before_any_network_call() {
    let client = LockClient::builder(nowhere())
        .connection_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    for key in [String::new(), "k".repeat(MAX_KEY_LEN + 1)] {
        let err = client.lock(&key).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        let err = client.try_lock(&key, Duration::ZERO).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        let err = client.try_lock(&key, ms(100)).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
    }
    assert!(started.elapsed() < ms(500));
    // The same client does reach for the network with a good key, and says so within its
    // connection timeout.
    let started = Instant::now();
    let err = client.try_lock("fine", Duration::ZERO).unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn keys_with_braces_control_bytes_and_unicode_are_distinct_locks() {
    let server = RedisServer::start();
    let client = lock_client(&server, 30_000);
    let rival = lock_client(&server, 30_000);
    let keys = [
        "{",
        "}",
        "}{",
        "%7D",
        "%7B",
        "%",
        "nul\0byte",
        "cr\r\nlf",
        "ключ",
        "{a}",
        "a",
    ];
    let guards: Vec<LockGuard> = keys.iter().map(|k| client.lock(k).unwrap()).collect();
    for (guard, key) in guards.iter().zip(keys) {
        assert_eq!(guard.key(), key);
        assert!(guard.is_held());
        assert!(
            rival.try_lock(key, Duration::ZERO).unwrap().is_none(),
            "{key:?}"
        );
    }
    assert!(client
        .try_lock(&"k".repeat(MAX_KEY_LEN), Duration::ZERO)
        .unwrap()
        .is_some());
}

#[test]
fn public_types_have_the_promised_traits() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    fn value<T: Copy + Eq + Ord + std::hash::Hash + std::fmt::Display + std::fmt::Debug>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    send_sync::<LockClient>();
    send::<LockGuard>();
    value::<FencingToken>();
    error::<Error>();
    let client = LockClient::new(nowhere()).unwrap();
    let _clone: LockClient = client.clone();
    assert_eq!(
        u64::from(FencingToken::from(7)),
        FencingToken::from(7).as_u64()
    );
}
