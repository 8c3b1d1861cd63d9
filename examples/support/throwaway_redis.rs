//! A throwaway `redis-server` for the examples that run without `REDIS_URL`.

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// `REDIS_URL` when set; otherwise a throwaway server, kept alive as long as the returned guard.
pub fn redis_url() -> Result<(String, Option<ThrowawayRedis>), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => Ok((url, None)),
        Err(_) => {
            let server = ThrowawayRedis::start()?;
            Ok((server.url(), Some(server)))
        }
    }
}

/// A redis-server on a free loopback port that keeps nothing on disk; killed on drop.
pub struct ThrowawayRedis {
    child: Child,
    port: u16,
}

impl ThrowawayRedis {
    pub fn start() -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
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
                format!(
                    "cannot start {bin} ({e}); \
                     install it (apt-get install -y redis-server) or set REDIS_URL"
                )
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
