//! A lock on a quorum of five independent masters: workers of two clients contend for one key,
//! each grant's token is checked to rise, and one master is stopped half-way to show that a
//! minority down changes nothing.
//!
//! Uses `QUORUM_URLS` (comma-separated `redis://` URLs, at least three) when set; otherwise
//! starts five throwaway `redis-server`s on free ports and stops them at the end.
//!
//!     cargo run --example quorum

#[path = "support/throwaway_redis.rs"]
#[allow(dead_code)] // Its single-server helper is for the other examples.
mod throwaway_redis;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencingToken, LockClient, Topology};
use throwaway_redis::ThrowawayRedis;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut servers: Vec<Option<ThrowawayRedis>> = Vec::new();
    let urls: Vec<String> = match std::env::var("QUORUM_URLS") {
        Ok(urls) => urls.split(',').map(str::to_owned).collect(),
        Err(_) => {
            for _ in 0..5 {
                servers.push(Some(ThrowawayRedis::start()?));
            }
            servers.iter().flatten().map(ThrowawayRedis::url).collect()
        }
    };
    println!("using {} masters", urls.len());
    let clients = (0..2)
        .map(|_| {
            LockClient::builder(Topology::quorum(urls.clone()))
                .namespace("quorum-example")
                .lease(Duration::from_millis(500))
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;

    let last = Arc::new(Mutex::new(FencingToken::from(0)));
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let client = clients[worker % 2].clone();
            let last = Arc::clone(&last);
            thread::spawn(move || -> Result<u32, fencelock::Error> {
                let mut grants = 0;
                while started.elapsed() < Duration::from_secs(2) {
                    let guard = client.lock("shared-report")?;
                    let token = guard.token();
                    {
                        let mut last = last.lock().unwrap();
                        assert!(token > *last, "a token went back: {token} after {}", *last);
                        *last = token;
                    }
                    grants += 1;
                    thread::sleep(Duration::from_millis(5));
                    guard.unlock()?;
                }
                Ok(grants)
            })
        })
        .collect();
    // A minority down: the others still make a majority.
    thread::sleep(Duration::from_millis(700));
    if let Some(server) = servers.get_mut(0) {
        println!(
            "{:>5} ms  stopping one master",
            started.elapsed().as_millis()
        );
        drop(server.take());
    }
    let mut total = 0;
    for worker in workers {
        total += worker.join().expect("worker panicked")?;
    }
    println!(
        "{total} grants in 2 s, last token {}; tokens rose throughout",
        last.lock().unwrap()
    );
    Ok(())
}
