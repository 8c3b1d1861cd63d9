//! How bytes reach Redis: which server a call goes to, the connections to it, and the RESP on
//! them.
//!
//! Everything here serves the layers above (the lock engines, the listener, the fenced store)
//! and knows nothing of them: no lock state, no scripts, no waiting. It imports only the leaves
//! (keys, tokens, errors), so it can be read, and changed, from the bottom up.
//!
//! | file | what it holds |
//! |---|---|
//! | `url.rs` | every URL form: parsed, checked, and shown without its password |
//! | `target.rs` | what to connect to, resolved and checked: one server, Sentinel, Cluster or a quorum |
//! | `connector.rs` | where connections come from: one server, or `sentinel.rs` and `cluster.rs` under `connector/` |
//! | `router.rs` | which pool a key's call goes to, and following a cluster's redirects |
//! | `pool.rs` | the connection pool of one node; `pool/combine.rs` batches unlocks |
//! | `subscriber.rs` | one pub/sub subscription held by a thread: heartbeat, reconnection, linger |
//! | `watch.rs` | a thread that watches one channel for an owner (an election's observer) |
//! | `wire.rs` | RESP encoding of our commands and reading their replies |
//! | `tls.rs` | TLS settings for `rediss://` URLs, and telling a failed handshake from an outage |

pub(crate) mod connector;
pub(crate) mod pool;
pub(crate) mod router;
pub(crate) mod subscriber;
pub(crate) mod target;
pub(crate) mod tls;
pub(crate) mod url;
pub(crate) mod watch;
pub(crate) mod wire;
