//! Fenced storage on Redis: writes that a stale fencing token cannot apply.
//!
//! Each write is one Lua script that compares its token with the resource's accepted-token
//! record, applies the write and raises the record in one atomic step; `docs/design.md` holds
//! the key layout and the scripts' state table.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{FromRedisValue, Script, Value};

use crate::config::{settings_setter, Settings};
use crate::error::{Error, Result};
use crate::key::{validate_namespace, LockKeys};
use crate::net::connector::Connector;
use crate::net::router::Router;
use crate::scripts::{self, ReplicaAcks};
use crate::token::FencingToken;
use crate::topology::Topology;

/// Prepended to every write script: the token comparison they share.
const PRELUDE: &str = include_str!("scripts/fenced_prelude.lua");

static SET: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/fenced_set.lua")));
static DELETE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/fenced_delete.lua")));
static INCR_BY: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/fenced_incrby.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/fenced_claim.lua")));

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// A key-value store on Redis that refuses writes carrying a stale [`FencingToken`].
///
/// Every write names a *resource* and carries the token of the lock its writer holds. Redis keeps,
/// per resource, the highest token it has accepted; a write with a lower token is refused with
/// [`Error::StaleToken`] and changes nothing, and a write with an equal or higher token is applied
/// and recorded, in one atomic script. Equal tokens are accepted, so one holder can write several
/// times under one grant. A holder that stalled past its lease — paused, swapped out, stuck on a
/// slow network — and writes after the next holder did is refused, whatever it believes about its
/// lock.
///
/// Write each resource under **one lock key** (usually the same name): tokens of different keys
/// are unrelated numbers, so mixing them would refuse good writes and accept stale ones.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`. Connections come from a pool (16 by
/// default, see [`FencedRedis::builder`]), made when needed and replaced when they break, as for
/// `LockClient`; a call waits up to the connection timeout for one when all are busy, then fails
/// with [`Error::PoolExhausted`]. `FencedRedis::from(&client)` makes a store that shares a
/// [`LockClient`](crate::LockClient)'s pool and namespace instead: one set of connections for the
/// locks and the writes they guard (size the client's pool for both).
///
/// ```no_run
/// use fencelock::{FencedRedis, LockClient};
///
/// # fn main() -> Result<(), fencelock::Error> {
/// let locks = LockClient::new("redis://127.0.0.1:6379/")?;
/// let store = FencedRedis::open("redis://127.0.0.1:6379/")?;
///
/// let guard = locks.lock("report")?;
/// match store.set("report", guard.token(), "totals for May") {
///     Ok(()) => println!("written"),
///     // A newer holder has written since we got our token: our work is out of date.
///     Err(e) if e.is_stale_token() => println!("refused: {e}"),
///     Err(e) => return Err(e),
/// }
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FencedRedis {
    namespace: Arc<str>,
    router: Arc<Router>,
    /// `WAIT replicas timeout` behind every write, on its connection.
    replica_acks: Option<ReplicaAcks>,
}

impl FencedRedis {
    /// A store on the Redis server at `url` (`redis://[user:pass@]host:port/db`, or
    /// `redis+unix:///path`), with its keys under the namespace `"fencelock"` and every other
    /// setting at its default; the same as `FencedRedis::builder(url).build()`.
    ///
    /// Nothing is sent yet: the first call connects, so Redis need not be up. Connecting and each
    /// reply time out after 5 s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the URL does not parse.
    pub fn open(url: impl Into<Topology>) -> Result<FencedRedis> {
        FencedRedis::builder(url).build()
    }

    /// Starts configuring a store for the Redis server at `url`: its namespace, pool size and
    /// timeouts. To share a [`LockClient`](crate::LockClient)'s connections instead, use
    /// `FencedRedis::from(&client)`.
    ///
    /// ```
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let store = fencelock::FencedRedis::builder("redis://127.0.0.1:6379/")
    ///     .namespace("orders")
    ///     .pool_size(4)
    ///     .response_timeout(Duration::from_secs(1))
    ///     .build()?;
    /// assert_eq!(store.namespace(), "orders");
    /// # Ok(()) }
    /// ```
    pub fn builder(topology: impl Into<Topology>) -> FencedBuilder {
        FencedBuilder {
            topology: topology.into(),
            settings: Settings::default(),
        }
    }

    /// A store on `router`'s connections, under `namespace`, waiting for `replica_acks` after each
    /// write (all already validated against the pool's response timeout).
    pub(crate) fn on_pool(
        namespace: &str,
        router: Arc<Router>,
        replica_acks: Option<ReplicaAcks>,
    ) -> FencedRedis {
        FencedRedis {
            namespace: Arc::from(namespace),
            router,
            replica_acks,
        }
    }

    /// The same store with its keys under `namespace`, sharing this one's connections (and its
    /// [replica acknowledgement](FencedBuilder::min_replica_acks)).
    ///
    /// ASCII letters, digits, `_`, `-`, `.` and `:`, at most
    /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes, as for `LockClient`. The data and
    /// accepted-token keys of a namespace do not collide with the lock keys of a `LockClient` in
    /// the same namespace, so one namespace can serve both.
    ///
    /// ```
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let orders = store.with_namespace("orders")?;
    /// assert_eq!(orders.namespace(), "orders");
    /// assert_eq!(store.namespace(), "fencelock");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a namespace that is empty, too long or has other characters.
    pub fn with_namespace(&self, namespace: &str) -> Result<FencedRedis> {
        validate_namespace(namespace)?;
        Ok(FencedRedis {
            namespace: Arc::from(namespace),
            router: Arc::clone(&self.router),
            replica_acks: self.replica_acks,
        })
    }

    /// The namespace this store's keys live under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Stores `value` for `resource`, unless a token higher than `token` was accepted for it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let locks = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let guard = locks.lock("config")?;
    /// store.set("config", guard.token(), b"{\"replicas\": 3}")?;
    /// store.set("config", guard.token(), b"{\"replicas\": 4}")?; // same token: accepted
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::StaleToken`] with both tokens if a higher token was accepted: nothing was
    /// written. [`Error::InvalidArgument`] for an empty resource name or one longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN), before any network call. A connection error or
    /// timeout leaves open whether the write was applied; repeating it with the same token is
    /// safe. With [replica acknowledgement](FencedBuilder::min_replica_acks),
    /// [`Error::NotReplicated`] if too few replicas had the write in time: the master applied it,
    /// and a failover may or may not undo it, so its outcome is unknown too.
    pub fn set(&self, resource: &str, token: FencingToken, value: impl AsRef<[u8]>) -> Result<()> {
        self.write(&SET, resource, token, &[value.as_ref()])
    }

    /// The value of `resource`, or `None` if it was never set or was deleted. Reads need no
    /// token: what is stored was written by the newest holder that wrote. For a counter kept
    /// with [`incr_by`](FencedRedis::incr_by), [`get_i64`](FencedRedis::get_i64) returns the
    /// number.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// if let Some(bytes) = store.get("config")? {
    ///     println!("{}", String::from_utf8_lossy(&bytes));
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad resource name, as for [`set`](FencedRedis::set);
    /// connection errors, timeouts, and [`Error::Redis`] if the value is not a string.
    pub fn get(&self, resource: &str) -> Result<Option<Vec<u8>>> {
        let keys = ResourceKeys::new(&self.namespace, resource)?;
        self.router.run(&keys.data, |con, _retry| {
            redis::cmd("GET").arg(&keys.data).query(con)
        })
    }

    /// The value of `resource` as an integer, as [`incr_by`](FencedRedis::incr_by) keeps it;
    /// `None` if it was never set or was deleted (which `incr_by` counts as 0). Reads need no
    /// token.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let in_stock = store.get_i64("stock:sku-7")?.unwrap_or(0);
    /// # let _ = in_stock;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] if the value is not the decimal text of a 64-bit signed integer (a
    /// [`set`](FencedRedis::set) can store anything); otherwise as for
    /// [`get`](FencedRedis::get).
    pub fn get_i64(&self, resource: &str) -> Result<Option<i64>> {
        let keys = ResourceKeys::new(&self.namespace, resource)?;
        self.router.run(&keys.data, |con, _retry| {
            redis::cmd("GET").arg(&keys.data).query(con)
        })
    }

    /// Deletes the value of `resource`, unless a token higher than `token` was accepted for it.
    /// Returns whether there was a value.
    ///
    /// The accepted token is kept (and raised to `token`): if deleting forgot it, a stale writer
    /// could write again into the empty resource.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let locks = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let guard = locks.lock("session:9")?;
    /// let existed = store.delete("session:9", guard.token())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`set`](FencedRedis::set).
    pub fn delete(&self, resource: &str, token: FencingToken) -> Result<bool> {
        self.write(&DELETE, resource, token, &[])
    }

    /// Adds `delta` (which may be negative) to the integer value of `resource`, unless a token
    /// higher than `token` was accepted for it, and returns the new value. A resource without a
    /// value counts as 0.
    ///
    /// The read, the addition and the write happen inside Redis in one step, so no other writer
    /// can slip in between, and a stale writer cannot apply an increment computed from old state.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let locks = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let guard = locks.lock("stock:sku-7")?;
    /// let left = store.incr_by("stock:sku-7", guard.token(), -1)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`set`](FencedRedis::set), and [`Error::Redis`] if the value is not a 64-bit
    /// integer or the sum overflows: then nothing is changed, the accepted token included. Unlike
    /// `set`, repeating an increment whose outcome is unknown (a connection error or timeout) may
    /// apply it twice.
    pub fn incr_by(&self, resource: &str, token: FencingToken, delta: i64) -> Result<i64> {
        self.write(&INCR_BY, resource, token, &[delta.to_string().as_bytes()])
    }

    /// Records `token` as accepted for `resource` without changing its value, unless a higher
    /// token was accepted.
    ///
    /// Claim first when what you write depends on what you read: between taking the lock and
    /// your first write, an older holder that stalled can still write (its token is the highest
    /// accepted so far), and a read before that write would miss it. Once the claim is in, every
    /// older holder is refused, so what you read stays what is there until you write.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let locks = fencelock::LockClient::new("redis://127.0.0.1:6379/")?;
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// let guard = locks.lock("profile:5")?;
    /// store.claim("profile:5", guard.token())?;
    /// let old = store.get("profile:5")?.unwrap_or_default();
    /// let new = [old.as_slice(), b" (reviewed)"].concat();
    /// store.set("profile:5", guard.token(), new)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`set`](FencedRedis::set).
    pub fn claim(&self, resource: &str, token: FencingToken) -> Result<()> {
        self.write(&CLAIM, resource, token, &[])
    }

    /// The highest token accepted for `resource`, or `None` if no write was ever accepted.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), fencelock::Error> {
    /// # let store = fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?;
    /// if let Some(token) = store.highest_token("config")? {
    ///     println!("last written under token {token}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`get`](FencedRedis::get).
    pub fn highest_token(&self, resource: &str) -> Result<Option<FencingToken>> {
        let keys = ResourceKeys::new(&self.namespace, resource)?;
        let highest: Option<u64> = self.router.run(&keys.accepted, |con, _retry| {
            redis::cmd("GET").arg(&keys.accepted).query(con)
        })?;
        Ok(highest.map(FencingToken::from))
    }

    /// The replica acknowledgement every write waits for, if any: `(replicas, timeout)`.
    ///
    /// ```
    /// # fn main() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    ///
    /// let store = fencelock::FencedRedis::builder("redis://127.0.0.1:6379/")
    ///     .min_replica_acks(1, Duration::from_millis(500))
    ///     .build()?;
    /// assert_eq!(store.min_replica_acks(), Some((1, Duration::from_millis(500))));
    /// assert_eq!(fencelock::FencedRedis::open("redis://127.0.0.1:6379/")?.min_replica_acks(), None);
    /// # Ok(()) }
    /// ```
    pub fn min_replica_acks(&self) -> Option<(u32, Duration)> {
        self.replica_acks.map(|acks| (acks.replicas, acks.timeout))
    }

    /// Runs one write script: KEYS data and accepted, ARGV the token then `args`. The scripts
    /// reply `{1, result}` when the write was applied and `{0, highest}` when it was refused.
    /// With replica acks, `WAIT replicas timeout` follows in one pipeline on the same
    /// connection, so that it counts the replicas that have this very write (and everything
    /// before it: every applied script writes the accepted record).
    fn write<T: FromRedisValue>(
        &self,
        script: &Script,
        resource: &str,
        token: FencingToken,
        args: &[&[u8]],
    ) -> Result<T> {
        let keys = ResourceKeys::new(&self.namespace, resource)?;
        let mut call = script.prepare_invoke();
        call.key(&keys.data).key(&keys.accepted).arg(token.as_u64());
        for arg in args {
            call.arg(*arg);
        }
        // Not repeated on a broken connection: the first run may have been applied, and an
        // increment must not be applied twice.
        let (reply, acked) = match self.replica_acks {
            None => (
                self.router
                    .run_once(&keys.data, |con| call.invoke::<Value>(con))?,
                None,
            ),
            Some(acks) => {
                let packed = pack_acked(script, &keys, token, args, acks);
                self.router
                    .run_once(&keys.data, |con| acked_write(con, script, &packed))
                    .map(|(reply, acked)| (reply, Some(acked)))?
            }
        };
        let (applied, reply): (i64, Value) =
            redis::from_redis_value(reply).map_err(|e| Error::from_redis(e.into()))?;
        let parsed = if applied == 1 {
            match (self.replica_acks, acked) {
                (Some(acks), Some(acked)) if acked < acks.replicas => {
                    return Err(Error::NotReplicated {
                        acked,
                        required: acks.replicas,
                    })
                }
                _ => T::from_redis_value(reply).map(Ok),
            }
        } else {
            u64::from_redis_value(reply).map(|highest| {
                Err(Error::StaleToken {
                    resource: resource.to_owned(),
                    token,
                    highest: FencingToken::from(highest),
                })
            })
        };
        parsed.map_err(|e| Error::from_redis(e.into()))?
    }
}

/// One write script call by EVALSHA followed by `WAIT replicas timeout`, encoded, and where the
/// first ends.
fn pack_acked(
    script: &Script,
    keys: &ResourceKeys,
    token: FencingToken,
    args: &[&[u8]],
    acks: ReplicaAcks,
) -> (Vec<u8>, usize) {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha
        .arg(script.get_hash())
        .arg(2)
        .arg(&keys.data)
        .arg(&keys.accepted)
        .arg(token.as_u64());
    for arg in args {
        evalsha.arg(*arg);
    }
    let mut packed = evalsha.get_packed_command();
    let first = packed.len();
    scripts::pack_wait(&mut packed, acks);
    (packed, first)
}

/// Sends a write packed by [`pack_acked`]: the script's reply, and how many replicas
/// acknowledged.
fn acked_write(
    con: &mut redis::Connection,
    script: &Script,
    (packed, first): &(Vec<u8>, usize),
) -> redis::RedisResult<(Value, u32)> {
    scripts::run_acked(con, script, packed, *first)
}

/// Configures and builds a [`FencedRedis`]; made by [`FencedRedis::builder`].
///
/// Setters only record values; [`build`](FencedBuilder::build) validates all of them, with the
/// same ranges as [`Builder`](crate::Builder), and reports the first bad one as
/// [`Error::InvalidArgument`]. Nothing here touches the network.
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct FencedBuilder {
    topology: Topology,
    /// What a client's builder records too.
    settings: Settings,
}

impl FencedBuilder {
    settings_setter! {
        /// Prefix of the store's Redis keys; see [`FencedRedis::with_namespace`].
        fn FencedBuilder::namespace;
    }

    settings_setter! {
        /// Maximum number of pooled connections.
        fn FencedBuilder::pool_size;
    }

    settings_setter! {
        /// How long a call may wait to connect, or for a pooled connection to come free.
        fn FencedBuilder::connection_timeout;
    }

    settings_setter! {
        /// How long to wait for a reply before reporting [`Error::Timeout`] (the write may still
        /// have been applied).
        fn FencedBuilder::response_timeout;
    }

    settings_setter! {
        /// Makes every write wait until at least `replicas` replicas have it, for at most
        /// `timeout`: on Sentinel or Cluster, a failover then cannot undo a write reported
        /// accepted, nor let an older token in after it.
        ///
        /// Each write script goes out with a `WAIT replicas timeout` behind it, in one pipeline on
        /// one connection, so the count is for this very write. A write acknowledged by fewer
        /// replicas in time is reported as [`Error::NotReplicated`], not as accepted. It is not
        /// undone: the master applied it, and whether it survives a failover depends on whether the
        /// promoted replica received it. Treat it as a write whose outcome is unknown, like a
        /// timeout: repeat it with the same token (safe for `set`, `delete` and `claim`; an
        /// `incr_by` may count twice), or give the work up. A refused write
        /// ([`Error::StaleToken`]) stays refused, though it may wait up to `timeout` for the WAIT
        /// when replicas lag.
        ///
        /// Without it, a write is reported accepted once the master has it: if the master then
        /// fails before a replica received the write, the promoted replica has the older value and
        /// the older accepted token, and the write of a holder that stalled with a lower token is
        /// accepted there, undoing the newer holder's work.
        ///
        /// A store made with `FencedRedis::from(&client)` takes the client's
        /// [`Builder::min_replica_acks`](crate::Builder::min_replica_acks) instead: the writes a
        /// lock guards wait for the replicas as its grants do.
        fn FencedBuilder::min_replica_acks;
        /// ```no_run
        /// use std::time::Duration;
        /// use fencelock::{FencedRedis, LockClient};
        ///
        /// # fn main() -> Result<(), fencelock::Error> {
        /// let url = "redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/mymaster";
        /// let locks = LockClient::builder(url)
        ///     .min_replica_acks(1, Duration::from_millis(500))
        ///     .build()?;
        /// let store = FencedRedis::builder(url)
        ///     .min_replica_acks(1, Duration::from_millis(500))
        ///     .build()?;
        ///
        /// let guard = locks.lock("report")?;
        /// match store.set("report", guard.token(), "totals for May") {
        ///     Ok(()) => println!("written, and on a replica"),
        ///     Err(e) if e.is_stale_token() => println!("taken over: {e}"),
        ///     // On the master only: a failover may lose it. Unknown, like a timeout.
        ///     Err(e) if e.is_not_replicated() => println!("unknown, write again: {e}"),
        ///     Err(e) => return Err(e),
        /// }
        /// guard.unlock()?;
        /// # Ok(()) }
        /// ```
    }

    settings_setter! {
        fn FencedBuilder::tls_root_certificates;
        /// ```no_run
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let store = fencelock::FencedRedis::builder("rediss://redis.internal:6380/")
        ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
        ///     .build()?;
        /// # drop(store);
        /// # Ok(()) }
        /// ```
    }

    settings_setter! {
        fn FencedBuilder::tls_client_certificate;
    }

    /// Validates every setting and makes the store. Connections are made lazily.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first setting that is out of range, or the URL if
    /// it does not parse, or TLS settings that do not parse or were given for a URL that is not
    /// `rediss://`, or a [quorum](Topology::quorum) topology (a store is the one deployment that
    /// holds the data).
    pub fn build(self) -> Result<FencedRedis> {
        let settings = self.settings;
        let connector = Arc::new(Connector::open(
            self.topology.resolve()?,
            &settings.tls,
            settings.connection_timeout,
        )?);
        if connector.masters() > 0 {
            return Err(Error::invalid(
                "topology",
                "a fenced store is the deployment that holds the data (one server, Sentinel or \
                 Cluster), not a quorum of lock masters: open it there",
            ));
        }
        settings.validate()?;
        let router = Router::new(
            connector,
            settings.pool_size,
            settings.connection_timeout,
            settings.response_timeout,
        );
        Ok(FencedRedis::on_pool(
            &settings.namespace,
            Arc::new(router),
            settings.replica_acks,
        ))
    }
}

impl fmt::Debug for FencedBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password. The TLS settings show no keys.
        f.debug_struct("FencedBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for FencedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("FencedRedis")
            .field("namespace", &self.namespace)
            .field("replica_acks", &self.replica_acks)
            .finish_non_exhaustive()
    }
}

/// The Redis keys of one resource.
#[derive(Debug)]
struct ResourceKeys {
    /// `<namespace>:data:{<tag>}`: the value.
    data: String,
    /// `<namespace>:accepted:{<tag>}`: the highest token accepted; never deleted.
    accepted: String,
}

impl ResourceKeys {
    fn new(namespace: &str, resource: &str) -> Result<ResourceKeys> {
        // The same limits and escaping as lock keys: both keys of a resource share one Cluster
        // hash slot, and a resource named like its lock key shares the lock's slot too.
        let tag = LockKeys::new(namespace, resource).map_err(|e| match e {
            Error::InvalidArgument { reason, .. } => Error::invalid("resource", reason),
            other => other,
        })?;
        let tag = tag.tag();
        Ok(ResourceKeys {
            data: format!("{namespace}:data:{{{tag}}}"),
            accepted: format!("{namespace}:accepted:{{{tag}}}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resources_keys_carry_the_hash_tag_of_its_lock() {
        // key.rs proves `{tag}` is a complete Cluster hash tag for any key; the resource's keys
        // must use exactly it.
        for resource in [
            "a",
            "{",
            "}",
            "a}b{c",
            "{x}",
            "%7D",
            "nul\0cr\r\nlf",
            "ключ",
        ] {
            let keys = ResourceKeys::new("ns", resource).unwrap();
            let tag = LockKeys::new("ns", resource).unwrap().tag().to_owned();
            assert_eq!(keys.data, format!("ns:data:{{{tag}}}"), "{resource:?}");
            assert_eq!(
                keys.accepted,
                format!("ns:accepted:{{{tag}}}"),
                "{resource:?}"
            );
        }
        let keys = ResourceKeys::new("ns", "a}b").unwrap();
        assert_eq!(keys.data, "ns:data:{a%7Db}");
        assert_eq!(keys.accepted, "ns:accepted:{a%7Db}");
    }

    #[test]
    fn bad_resource_names_are_named_as_resources() {
        for bad in [String::new(), "r".repeat(crate::MAX_KEY_LEN + 1)] {
            match ResourceKeys::new("ns", &bad) {
                Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "resource"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn debug_shows_no_url() {
        let store = FencedRedis::open("redis://user:hunter2@127.0.0.1:6379/").unwrap();
        let shown = format!("{store:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("fencelock"), "{shown}");
    }

    #[test]
    fn is_send_sync_and_static() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<FencedRedis>();
    }
}
