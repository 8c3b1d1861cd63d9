//! Several workers contend for one lock; each writes under it with its fencing token, one holds
//! it across several leases to show renewal, and everything shuts down cleanly.
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server` on a free port and
//! stops it at the end.
//!
//!     cargo run --example quickstart

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencingToken, LockClient};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = ThrowawayRedis::start()?;
            (server.url(), Some(server))
        }
    };
    println!("using {url}");

    let client = LockClient::builder(url.as_str())
        .namespace("quickstart")
        .lease(Duration::from_millis(300))
        .build()?;

    // The "storage": it remembers the highest token it accepted and refuses lower ones.
    let store = Arc::new(Mutex::new((FencingToken::from(0), Vec::new())));
    let started = Instant::now();

    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let client = client.clone();
            let store = Arc::clone(&store);
            thread::spawn(move || -> Result<(), fencelock::Error> {
                for round in 0..3 {
                    let guard = client.lock("shared-report")?;
                    let token = guard.token();
                    println!(
                        "{:>5} ms  worker {worker} got the lock, token {token}",
                        started.elapsed().as_millis()
                    );
                    {
                        let mut store = store.lock().unwrap();
                        assert!(token > store.0, "storage would reject a stale token");
                        store.0 = token;
                        store.1.push(format!("worker {worker} round {round}"));
                    }
                    thread::sleep(Duration::from_millis(20));
                    guard.unlock()?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker panicked")?;
    }

    // Renewal: hold a 300 ms lease for a full second; the renewal thread keeps it alive.
    let guard = client.lock("long-job")?;
    thread::sleep(Duration::from_secs(1));
    println!(
        "held 'long-job' for 1 s on a {:?} lease: still held = {}",
        client.lease(),
        guard.is_held()
    );
    guard.unlock()?;

    let (last, writes) = &*store.lock().unwrap();
    println!(
        "{} writes accepted, last token {last}; clean exit",
        writes.len()
    );
    Ok(())
}

/// A redis-server on a free loopback port that keeps nothing on disk; killed on drop.
struct ThrowawayRedis {
    child: Child,
    port: u16,
}

impl ThrowawayRedis {
    fn start() -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start {bin} ({e}); install it (apt-get install -y redis-server) or set REDIS_URL")
            })?;
        let server = ThrowawayRedis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
