//! The baseline the benchmarks compare with: the common hand-written lock (see `main.rs`).

use std::thread;
use std::time::Duration;

use crate::server::RedisServer;

const BASELINE_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const BASELINE_SLEEP: Duration = Duration::from_millis(100);

/// SET NX PX, sleep 100 ms, retry; release by compare-and-delete.
pub struct Baseline {
    con: redis::Connection,
    release: redis::Script,
    owner: String,
    n: u64,
}

impl Baseline {
    pub fn new(server: &RedisServer, owner: String) -> Baseline {
        Baseline {
            con: server.connection(),
            release: redis::Script::new(BASELINE_RELEASE),
            owner,
            n: 0,
        }
    }

    pub fn lock(&mut self, key: &str) -> String {
        self.n += 1;
        let owner = format!("{}-{}", self.owner, self.n);
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query(&mut self.con)
                .expect("SET NX");
            if set.is_some() {
                return owner;
            }
            thread::sleep(BASELINE_SLEEP);
        }
    }

    pub fn unlock(&mut self, key: &str, owner: &str) {
        let _: i64 = self
            .release
            .key(key)
            .arg(owner)
            .invoke(&mut self.con)
            .expect("baseline release");
    }
}
