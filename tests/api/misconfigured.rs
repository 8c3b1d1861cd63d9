//! Configuration mistakes are told as such, with the hint that fits: a cluster or sentinel URL
//! at a plain server, a master name the sentinels do not know, a URL whose scheme lacks its
//! `://`, and a server that is no Redis. A connection error names the server it failed to reach.
//! Real servers only; the server that is no Redis is a listener in the test.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use fencelock::{Error, LockClient, Topology};

use crate::support::cluster::ClusterSet;
use crate::support::sentinel::{SentinelSet, MASTER_NAME};
use crate::support::{free_port, ms, RedisServer};

fn build(topology: impl Into<Topology>) -> LockClient {
    LockClient::builder(topology)
        .connection_timeout(ms(2000))
        .response_timeout(ms(2000))
        .build()
        .unwrap()
}

/// `e` is a rejected set-up whose message says `says`, and no credentials hint.
fn rejected_saying(what: &str, e: &Error, says: &[&str]) {
    assert!(e.is_rejected(), "{what}: {e:?}");
    let message = e.to_string();
    println!("{what}: {message}");
    for s in says {
        assert!(message.contains(s), "{what}: {message}");
    }
    assert!(!message.contains("credentials"), "{what}: {message}");
}

#[test]
fn a_cluster_url_at_a_server_not_in_cluster_mode_is_rejected_saying_so() {
    let server = RedisServer::start();
    let url = format!("redis+cluster://127.0.0.1:{}/", server.port());
    let client = build(url.as_str());
    let e = client.try_lock("k", ms(500)).unwrap_err();
    rejected_saying(
        "cluster URL",
        &e,
        &[
            &format!("127.0.0.1:{}", server.port()),
            "not in cluster mode",
        ],
    );
    let e = client.lock("k").unwrap_err();
    rejected_saying("cluster URL, lock", &e, &["not in cluster mode"]);
}

/// A plain server among the seeds (a stale entry in a configuration) is passed over when
/// another seed is a cluster node: only a topology whose every node is plain is refused.
#[test]
fn a_plain_server_among_cluster_seeds_is_passed_over() {
    let plain = RedisServer::start();
    let cluster = ClusterSet::start(1, 0);
    let mut seeds = vec![format!("redis://127.0.0.1:{}/", plain.port())];
    seeds.extend(cluster.seed_urls());
    let client = build(Topology::cluster(seeds));
    let guard = client
        .try_lock("k", ms(5000))
        .expect("the second seed is a cluster node")
        .expect("a free key");
    guard.unlock().unwrap();
}

#[test]
fn a_sentinel_topology_at_a_plain_server_is_rejected_saying_it_is_no_sentinel() {
    let server = RedisServer::start();
    let client = build(Topology::sentinel([server.url()], "mymaster"));
    let e = client.lock("k").unwrap_err();
    rejected_saying("sentinel at a data server", &e, &["not sentinels", "26379"]);
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", server.port());
    let e = build(url.as_str()).try_lock("k", ms(500)).unwrap_err();
    rejected_saying("sentinel URL at a data server", &e, &["not sentinels"]);
}

#[test]
fn a_master_name_no_sentinel_knows_is_rejected_without_a_credentials_hint() {
    let set = SentinelSet::start(0);
    let e = build(Topology::sentinel(set.sentinel_urls(), "nosuch"))
        .lock("k")
        .unwrap_err();
    rejected_saying("unknown master name", &e, &["nosuch", "sentinel monitor"]);
    // The right name still works.
    let client = build(Topology::sentinel(set.sentinel_urls(), MASTER_NAME));
    assert!(client.lock("k").unwrap().is_held());
}

#[test]
fn a_scheme_without_its_separator_is_told_how_to_write_it() {
    for (url, says) in [
        ("redis//127.0.0.1:27001/", "write redis://127.0.0.1:27001/"),
        ("redis:/127.0.0.1:6379", "write redis://127.0.0.1:6379"),
    ] {
        match LockClient::new(url) {
            Err(e) => {
                assert!(e.is_invalid_argument(), "{url}: {e:?}");
                let message = e.to_string();
                assert!(message.contains(says), "{url}: {message}");
                assert!(!message.contains("redis://redis"), "{url}: {message}");
            }
            Ok(_) => panic!("{url} was accepted"),
        }
    }
}

#[test]
fn a_connection_error_names_the_server() {
    let port = free_port();
    let e = build(format!("redis://127.0.0.1:{port}/").as_str())
        .lock("k")
        .unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    assert!(
        e.to_string().contains(&format!("127.0.0.1:{port}")),
        "refused: {e}"
    );
    // The password stays out of it.
    let e = build(format!("redis://:hunter2@127.0.0.1:{port}/").as_str())
        .try_lock("k", ms(300))
        .unwrap_err();
    let message = e.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

/// A server of another protocol (PostgreSQL's port, say) that reads the first command and
/// closes, or answers it with text that is not Redis': told as no Redis server, by address.
#[test]
fn a_server_that_is_no_redis_is_named_and_told_so() {
    for reply in [&b""[..], &b"HTTP/1.1 400 Bad Request\r\n\r\n"[..]] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let speaker = thread::spawn(move || {
            // Two connection attempts at most (the client's call, and the test's second one),
            // and for 10 s at most: a client that connects less often must not hang the test.
            let until = std::time::Instant::now() + Duration::from_secs(10);
            let mut served = 0;
            while served < 2 && std::time::Instant::now() < until {
                let mut stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => return,
                };
                served += 1;
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(reply);
            }
        });
        let client = build(format!("redis://127.0.0.1:{port}/").as_str());
        let e = client.try_lock("k", ms(1000)).unwrap_err();
        let message = e.to_string();
        println!("{:?}: {e:?}\n  {message}", String::from_utf8_lossy(reply));
        assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
        assert!(message.contains("Redis server"), "{message}");
        assert!(!message.contains("credentials"), "{message}");
        let _ = client.try_lock("k", ms(300));
        speaker.join().unwrap();
    }
}
