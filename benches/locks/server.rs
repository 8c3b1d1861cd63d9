//! The throwaway redis-server of a run, the clients made on it, and what is read from it.
//!
//! The server is the one the integration tests use (`tests/support`): `RedisServer::start` runs
//! `redis-server` (or `REDIS_SERVER_BIN`) on a free loopback port, never the one on 6379, with its
//! own temp dir and nothing saved to disk; dropping it kills the server and removes the dir.

use fencelock::{Builder, LockClient};

#[path = "../../tests/support/mod.rs"]
mod support;

pub use support::cluster;
pub use support::quorum::{pace, Pace};
pub use support::sentinel;
#[cfg(feature = "tls")]
pub use support::tls;
pub use support::{command_calls, Child, RedisServer};

/// The no-op script whose EVALSHA round trip is the unit of every ratio.
pub const NOOP: &str = "return 1";

/// A client builder with the benches' namespace.
pub fn builder(url: impl Into<fencelock::Topology>) -> Builder {
    LockClient::builder(url).namespace("bench")
}

/// A client with the defaults but for the namespace.
pub fn client(url: &str) -> LockClient {
    builder(url).build().expect("LockClient")
}

/// The value of `field` in `INFO section`, trimmed.
pub fn info_value(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().to_owned())
}
