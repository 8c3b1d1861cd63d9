use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::{validate_namespace, DEFAULT_IDLE_EXPIRY};
use crate::net::tls::TlsSettings;
use crate::options::validate_lease;
use crate::scripts::ReplicaAcks;
use crate::topology::Topology;

/// Largest pool accepted by [`Builder::pool_size`].
pub const MAX_POOL_SIZE: u32 = 1024;
/// Longest connection or response timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Shortest idle expiry accepted by [`Builder::idle_expiry`].
pub const MIN_IDLE_EXPIRY: Duration = Duration::from_secs(1);
/// Longest idle expiry accepted by [`Builder::idle_expiry`]: ten years (of 365 days).
pub const MAX_IDLE_EXPIRY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// Configures and builds a [`LockClient`](crate::LockClient); made by
/// [`LockClient::builder`](crate::LockClient::builder).
///
/// Setters only record values; [`build`](Builder::build) validates all of them and reports the
/// first bad one as [`Error::InvalidArgument`]. Nothing here touches the network.
///
/// ```
/// use std::time::Duration;
/// use fencelock::LockClient;
///
/// let err = LockClient::builder("redis://127.0.0.1:6379/")
///     .lease(Duration::from_millis(1))
///     .build()
///     .unwrap_err();
/// assert!(err.is_invalid_argument());
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct Builder {
    topology: Topology,
    config: Config,
    tls: TlsSettings,
}

/// The validated settings of one client.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) namespace: String,
    pub(crate) lease: Duration,
    pub(crate) pool_size: u32,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) replica_acks: Option<ReplicaAcks>,
    pub(crate) idle_expiry: Duration,
}

impl Builder {
    pub(crate) fn new(topology: Topology) -> Builder {
        Builder {
            topology,
            config: Config {
                namespace: "fencelock".to_owned(),
                lease: Duration::from_secs(30),
                pool_size: 16,
                connection_timeout: Duration::from_secs(5),
                response_timeout: Duration::from_secs(5),
                replica_acks: None,
                idle_expiry: DEFAULT_IDLE_EXPIRY,
            },
            tls: TlsSettings::default(),
        }
    }

    /// Prefix of every Redis key and channel this client uses, like a registry path: clients
    /// with different namespaces never contend, even for equal keys.
    ///
    /// ASCII letters, digits, `_`, `-`, `.` and `:`, at most
    /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes. Defaults to `"fencelock"`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Builder {
        self.config.namespace = namespace.into();
        self
    }

    /// How long a grant lives in Redis without renewal. The renewal thread extends it about every
    /// lease/3 while the guard lives, so the lease is the time another client waits after a holder
    /// crashes, not a bound on how long you may hold a lock.
    ///
    /// Whole milliseconds from [`MIN_LEASE`](crate::MIN_LEASE) (10 ms) to [`MAX_LEASE`](crate::MAX_LEASE) (24 h); a fraction of a
    /// millisecond is rejected. Defaults to 30 s.
    pub fn lease(mut self, lease: Duration) -> Builder {
        self.config.lease = lease;
        self
    }

    /// Maximum number of pooled connections for acquire and release (renewal and wake-ups use
    /// connections of their own). From 1 to [`MAX_POOL_SIZE`]. Defaults to 16.
    pub fn pool_size(mut self, size: u32) -> Builder {
        self.config.pool_size = size;
        self
    }

    /// How long a call may wait for a connection: for one attempt to connect to Redis (and its
    /// set-up: password, database), or for a pooled connection to come free when all are in use.
    /// A call whose attempt fails reports it at once: [`Error::Connection`] (refused, timed out),
    /// [`Error::Rejected`] (wrong credentials or database), or [`Error::PoolExhausted`]. Nothing
    /// is retried until the timeout runs out. Greater than zero, at most [`MAX_TIMEOUT`].
    /// Defaults to 5 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Builder {
        self.config.connection_timeout = timeout;
        self
    }

    /// How long to wait for a reply to a command before reporting [`Error::Timeout`].
    /// Greater than zero, at most [`MAX_TIMEOUT`]. Defaults to 5 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Builder {
        self.config.response_timeout = timeout;
        self
    }

    /// Makes every grant wait until at least `replicas` replicas have it, for at most `timeout`:
    /// the acquire script and a `WAIT replicas timeout` go out in one pipeline on one connection,
    /// so the count is for this very grant. A grant acknowledged by fewer replicas in time is
    /// released and reported as [`Error::NotReplicated`], never as held: after a failover to a
    /// replica, an acknowledged grant (its lock and its token) is still there.
    ///
    /// Renewals wait the same way: the renewal thread ends each pipeline with the `WAIT`, and a
    /// renewal acknowledged by too few replicas does not move the guard's deadline, so a guard
    /// never says held past the lease its replicas know. While replicas stay out of reach, held
    /// locks are therefore reported lost when their lease runs out, though the master still has
    /// them.
    ///
    /// `replicas` from 1; `timeout` greater than zero and shorter than the response timeout, as
    /// the WAIT shares the connection's reply budget. Off by default. A
    /// [`FencedRedis`](crate::FencedRedis) made with `FencedRedis::from(&client)` takes the
    /// same setting for its writes.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::{LockClient, Topology};
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// // Sentinel with two replicas: a grant counts once one of them has it.
    /// let client = LockClient::builder(Topology::sentinel(
    ///         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///         "mymaster"))
    ///     .min_replica_acks(1, Duration::from_millis(500))
    ///     .build()?;
    /// match client.try_lock("report", Duration::from_secs(5)) {
    ///     Ok(Some(guard)) => guard.unlock()?,
    ///     Ok(None) => println!("held by another"),
    ///     // No replica had the grant in time: it was given back; try again later.
    ///     Err(e) if e.is_not_replicated() => println!("{e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn min_replica_acks(mut self, replicas: u32, timeout: Duration) -> Builder {
        self.config.replica_acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    /// How long Redis keeps a key's bookkeeping once nobody locks the key: its fence counter
    /// expires this long after the Redis server's clock, read in microseconds, passes the last
    /// token granted, which is this long after the last grant unless the counter ran ahead of
    /// the clock. Every grant re-arms it. (The lock key lives for its lease, and a key's queue
    /// of waiters as long as its longest-lived entry.)
    ///
    /// Tokens keep increasing across the expiry: the first grant after it takes its token from
    /// the server clock (the clock floor), which is then past every earlier token, provided the
    /// Redis server's wall clock never steps back by more than `idle` (see "How long the fence
    /// counter lives" in `docs/design.md`). A longer expiry tolerates a larger step back of the
    /// clock, and keeps more keys: about 170 bytes of Redis memory for each key locked within
    /// that time, with short key names (`docs/benchmarks.md`, run J).
    ///
    /// Whole milliseconds from [`MIN_IDLE_EXPIRY`] (1 s) to [`MAX_IDLE_EXPIRY`] (ten years); a
    /// fraction of a millisecond is rejected. Defaults to 24 h.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::LockClient;
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// // Request ids as lock keys: forget each one a week after its last use.
    /// let client = LockClient::builder("redis://127.0.0.1:6379/")
    ///     .idle_expiry(Duration::from_secs(7 * 24 * 60 * 60))
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn idle_expiry(mut self, idle: Duration) -> Builder {
        self.config.idle_expiry = idle;
        self
    }

    /// Trusts the certificate authorities in `pem` for a `rediss://` URL, instead of the default
    /// roots: for a Redis whose certificate a private CA signed. Requires the `tls` feature.
    ///
    /// `pem` holds one or more PEM `CERTIFICATE` blocks (other blocks are skipped): the bytes
    /// of a file such as the one given to the server as `tls-ca-cert-file`. Only these CAs are
    /// trusted; the default roots (the platform's certificate store, or the bundled Mozilla roots
    /// with the `tls-webpki-roots` feature) are not consulted. A second call replaces the first.
    ///
    /// Every connection checks that the server's certificate chains up to one of them, is
    /// within its validity period, and names the URL's host (a DNS name or IP address among its
    /// subject alternative names); a server that fails this is reported as [`Error::Rejected`]
    /// by the call that tried to connect, at once. [`build`](Builder::build) reports PEM without a
    /// certificate, or with one that does not parse, and a URL that is not `rediss://`, as
    /// [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fencelock::LockClient;
    ///
    /// let client = LockClient::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Builder {
        self.tls.set_roots(pem.into());
        self
    }

    /// Presents `certificate_chain` to a server that asks for a client certificate (mutual TLS,
    /// as Redis does by default with `tls-auth-clients yes`), proving it with `private_key`.
    /// Requires the `tls` feature.
    ///
    /// `certificate_chain` is PEM, the client's own certificate first, then any intermediates;
    /// `private_key` is one unencrypted PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC). A
    /// second call replaces the first. [`build`](Builder::build) reports a chain without a
    /// certificate, a missing or encrypted key, a key that does not belong to the certificate,
    /// and a URL that is not `rediss://`, as [`Error::InvalidArgument`]. A server that does not
    /// accept the certificate is reported as [`Error::Rejected`]. The key is never shown in
    /// `Debug` output.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fencelock::LockClient;
    ///
    /// let client = LockClient::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .tls_client_certificate(
    ///         std::fs::read("/etc/orders/tls/client.crt")?,
    ///         std::fs::read("/etc/orders/tls/client.key")?,
    ///     )
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        certificate_chain: impl Into<Vec<u8>>,
        private_key: impl Into<Vec<u8>>,
    ) -> Builder {
        self.tls
            .set_identity(certificate_chain.into(), private_key.into());
        self
    }

    /// The deployment and the settings, for [`build`](Builder::build).
    pub(crate) fn into_parts(self) -> (Topology, Config, TlsSettings) {
        (self.topology, self.config, self.tls)
    }
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The topology shows itself without passwords.
        f.debug_struct("Builder")
            .field("topology", &self.topology)
            .field("config", &self.config)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Checks every setting; the first one out of range is the error.
    pub(crate) fn validate(&self) -> Result<()> {
        validate_namespace(&self.namespace)?;
        validate_lease(self.lease)?;
        validate_idle_expiry(self.idle_expiry)?;
        validate_connections(
            self.pool_size,
            self.connection_timeout,
            self.response_timeout,
        )?;
        validate_replica_acks(self.replica_acks, self.response_timeout)
    }
}

/// Checks a replica acknowledgement setting, as for `LockClient` and `FencedRedis`: the WAIT
/// shares its connection's reply budget, so it must end within the response timeout.
pub(crate) fn validate_replica_acks(
    acks: Option<ReplicaAcks>,
    response_timeout: Duration,
) -> Result<()> {
    if let Some(acks) = acks {
        if acks.replicas == 0 {
            return Err(Error::invalid(
                "replica acks",
                "at least one replica is required",
            ));
        }
        if acks.timeout.is_zero() || acks.timeout >= response_timeout {
            return Err(Error::invalid(
                "replica ack timeout",
                format!(
                    "is {:?}; it must be more than zero and shorter than the response timeout ({:?})",
                    acks.timeout, response_timeout
                ),
            ));
        }
    }
    Ok(())
}

/// Checks the settings of a pool of connections, as for `LockClient` and `FencedRedis`.
pub(crate) fn validate_connections(
    pool_size: u32,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> Result<()> {
    if pool_size == 0 || pool_size > MAX_POOL_SIZE {
        return Err(Error::invalid(
            "pool size",
            format!("is {pool_size}, allowed are 1 to {MAX_POOL_SIZE}"),
        ));
    }
    validate_timeout("connection timeout", connection_timeout)?;
    validate_timeout("response timeout", response_timeout)
}

fn validate_idle_expiry(idle: Duration) -> Result<()> {
    if idle < MIN_IDLE_EXPIRY || idle > MAX_IDLE_EXPIRY {
        return Err(Error::invalid(
            "idle expiry",
            format!("is {idle:?}, allowed are {MIN_IDLE_EXPIRY:?} to {MAX_IDLE_EXPIRY:?}"),
        ));
    }
    if !idle.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::invalid(
            "idle expiry",
            format!("is {idle:?}; Redis expiries are whole milliseconds"),
        ));
    }
    Ok(())
}

fn validate_timeout(what: &'static str, timeout: Duration) -> Result<()> {
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(Error::invalid(
            what,
            format!("is {timeout:?}, allowed are more than zero up to {MAX_TIMEOUT:?}"),
        ));
    }
    Ok(())
}
