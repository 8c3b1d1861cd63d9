//! `tls` (with `--features tls`): what TLS costs. A new connection (connect, handshake, PING)
//! and an uncontended `lock` + `unlock` on established connections, each beside the same on the
//! plain port of the same redis-server, interleaved so that both see the same conditions. The
//! server's certificate is signed by a private CA made for the run and trusted with
//! `tls_root_certificates`.

use std::time::{Duration, Instant};

use crate::params::Params;
use crate::report::{fmt_d, section, Report};
use crate::server::builder;
use crate::server::tls::{Ca, ClientCerts, TlsServer};
use crate::stats::{pct, sorted};

const B: &str = "7 tls";
/// New connections of each kind.
const CONNECTS: usize = 200;

pub fn run(p: &Params, r: &mut Report) {
    section(
        "7. TLS: a new connection, and lock + unlock, against the plain port of the same server",
    );
    let ca = Ca::new("fencelock bench CA");
    let server = TlsServer::start(&ca, &ca.server(&["127.0.0.1"]), ClientCerts::NotAsked);
    let tls_url = server.tls_url("127.0.0.1");
    let plain_url = server.url();

    // Connections as fencelock's connector makes them: redis-rs with the CA as its roots.
    let tls_client = redis::Client::build_with_tls(
        tls_url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.pem().as_bytes().to_vec()),
        },
    )
    .expect("TLS client");
    let plain_client = redis::Client::open(plain_url.as_str()).expect("client");
    let connect = |client: &redis::Client| -> Duration {
        let t = Instant::now();
        let mut con = client.get_connection().expect("connect");
        let _: redis::Value = redis::cmd("PING").query(&mut con).expect("PING");
        t.elapsed()
    };
    let (mut plain, mut tls) = (Vec::new(), Vec::new());
    for _ in 0..CONNECTS {
        plain.push(connect(&plain_client));
        tls.push(connect(&tls_client));
    }
    let (plain, tls) = (sorted(plain), sorted(tls));
    r.info(
        B,
        "new connection + PING p50: plain, TLS",
        format!("{}, {}", fmt_d(pct(&plain, 0.5)), fmt_d(pct(&tls, 0.5))),
    );
    r.info(
        B,
        "new connection + PING p90: plain, TLS",
        format!("{}, {}", fmt_d(pct(&plain, 0.9)), fmt_d(pct(&tls, 0.9))),
    );

    let plain_locks = builder(plain_url.as_str()).build().expect("LockClient");
    let tls_locks = builder(tls_url.as_str())
        .tls_root_certificates(ca.pem())
        .build()
        .expect("LockClient over TLS");
    let lock_unlock = |client: &fencelock::LockClient, key: &str| -> Duration {
        let t = Instant::now();
        client.lock(key).expect("lock").unlock().expect("unlock");
        t.elapsed()
    };
    for i in 0..200 {
        lock_unlock(&plain_locks, &format!("tls-warm:p{i}"));
        lock_unlock(&tls_locks, &format!("tls-warm:t{i}"));
    }
    let (mut plain, mut tls) = (Vec::new(), Vec::new());
    for i in 0..p.uncontended {
        plain.push(lock_unlock(&plain_locks, &format!("tls:p{i}")));
        tls.push(lock_unlock(&tls_locks, &format!("tls:t{i}")));
    }
    let (plain, tls) = (sorted(plain), sorted(tls));
    let (p50_plain, p50_tls) = (pct(&plain, 0.5), pct(&tls, 0.5));
    r.info(
        B,
        "lock+unlock p50: plain, TLS",
        format!(
            "{}, {} ({:.2}×)",
            fmt_d(p50_plain),
            fmt_d(p50_tls),
            p50_tls.as_secs_f64() / p50_plain.as_secs_f64()
        ),
    );
    r.info(
        B,
        "lock+unlock p99: plain, TLS",
        format!("{}, {}", fmt_d(pct(&plain, 0.99)), fmt_d(pct(&tls, 0.99))),
    );
}
