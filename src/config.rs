//! The settings of a client and of a fenced store: what both builders record, the setters they
//! share, the ranges every setting must be in, and the checked configuration a client runs on.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::validate_namespace;
use crate::net::tls::TlsSettings;
use crate::options::validate_lease;
use crate::scripts::ReplicaAcks;

/// Largest pool accepted by [`Builder::pool_size`](crate::Builder::pool_size).
pub const MAX_POOL_SIZE: u32 = 1024;
/// Longest connection or response timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Shortest idle expiry accepted by [`Builder::idle_expiry`](crate::Builder::idle_expiry).
pub const MIN_IDLE_EXPIRY: Duration = Duration::from_secs(1);
/// Longest idle expiry accepted by [`Builder::idle_expiry`](crate::Builder::idle_expiry): ten
/// years (of 365 days).
pub const MAX_IDLE_EXPIRY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The namespace of a client or store whose builder did not set one.
pub(crate) const DEFAULT_NAMESPACE: &str = "fencelock";
/// The lease of a client whose builder did not set one.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The pool size of a client or store whose builder did not set one.
pub(crate) const DEFAULT_POOL_SIZE: u32 = 16;
/// The connection timeout and the response timeout of a client or store whose builder did not
/// set them.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a [`Builder`](crate::Builder) and a [`FencedBuilder`](crate::FencedBuilder) both record:
/// the namespace, the pool and its timeouts, replica acknowledgement and TLS. Unchecked until
/// [`validate`](Settings::validate); the TLS settings are checked against the URL when the
/// connector opens.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) namespace: String,
    pub(crate) pool_size: u32,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) replica_acks: Option<ReplicaAcks>,
    pub(crate) tls: TlsSettings,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connection_timeout: DEFAULT_TIMEOUT,
            response_timeout: DEFAULT_TIMEOUT,
            replica_acks: None,
            tls: TlsSettings::default(),
        }
    }
}

impl Settings {
    /// Checks every setting but TLS; the first one out of range is the error.
    pub(crate) fn validate(&self) -> Result<()> {
        validate_namespace(&self.namespace)?;
        if self.pool_size == 0 || self.pool_size > MAX_POOL_SIZE {
            return Err(Error::invalid(
                "pool size",
                format!("is {}, allowed are 1 to {MAX_POOL_SIZE}", self.pool_size),
            ));
        }
        validate_timeout("connection timeout", self.connection_timeout)?;
        validate_timeout("response timeout", self.response_timeout)?;
        // The WAIT shares its connection's reply budget, so it must end within the response
        // timeout.
        if let Some(acks) = self.replica_acks {
            if acks.replicas == 0 {
                return Err(Error::invalid(
                    "replica acks",
                    "at least one replica is required",
                ));
            }
            if acks.timeout.is_zero() || acks.timeout >= self.response_timeout {
                return Err(Error::invalid(
                    "replica ack timeout",
                    format!(
                        "is {:?}; it must be more than zero and shorter than the response timeout ({:?})",
                        acks.timeout, self.response_timeout
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Writes one setter of [`Settings`], with the docs both builders share, for a builder that keeps
/// its `Settings` in a field named `settings`: the client's [`Builder`](crate::Builder) and
/// [`FencedBuilder`](crate::FencedBuilder) take the same settings with the same ranges and
/// defaults, so the code and the words on ranges and defaults are written here once.
///
/// ```text
/// settings_setter! {
///     /// What the setting does for this builder (its own words, first).
///     fn Builder::pool_size;
///     /// What follows the shared words: this builder's examples.
/// }
/// ```
///
/// Intra-doc links in the shared words resolve where the setter lands, so they are written from
/// `crate::` (or `Self::`).
macro_rules! settings_setter {
    ($(#[$about:meta])* fn $builder:ident::namespace; $(#[$after:meta])*) => {
        $(#[$about])*
        ///
        /// ASCII letters, digits, `_`, `-`, `.` and `:`, at most
        /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes. Defaults to `"fencelock"`.
        $(#[$after])*
        pub fn namespace(mut self, namespace: impl Into<String>) -> $builder {
            self.settings.namespace = namespace.into();
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::pool_size; $(#[$after:meta])*) => {
        $(#[$about])*
        /// From 1 to [`MAX_POOL_SIZE`](crate::MAX_POOL_SIZE). Defaults to 16.
        $(#[$after])*
        pub fn pool_size(mut self, size: u32) -> $builder {
            self.settings.pool_size = size;
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::connection_timeout; $(#[$after:meta])*) => {
        $(#[$about])*
        /// Greater than zero, at most [`MAX_TIMEOUT`](crate::MAX_TIMEOUT). Defaults to 5 s.
        $(#[$after])*
        pub fn connection_timeout(mut self, timeout: ::std::time::Duration) -> $builder {
            self.settings.connection_timeout = timeout;
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::response_timeout; $(#[$after:meta])*) => {
        $(#[$about])*
        /// Greater than zero, at most [`MAX_TIMEOUT`](crate::MAX_TIMEOUT). Defaults to 5 s.
        $(#[$after])*
        pub fn response_timeout(mut self, timeout: ::std::time::Duration) -> $builder {
            self.settings.response_timeout = timeout;
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::min_replica_acks; $(#[$after:meta])*) => {
        $(#[$about])*
        ///
        /// `replicas` from 1 (no more than the master has, or every call waits out `timeout` and
        /// fails with [`Error::NotReplicated`](crate::Error::NotReplicated)); `timeout` greater
        /// than zero and shorter than the response timeout, as the WAIT shares the connection's
        /// reply budget. Off by default.
        $(#[$after])*
        pub fn min_replica_acks(
            mut self,
            replicas: u32,
            timeout: ::std::time::Duration,
        ) -> $builder {
            self.settings.replica_acks = Some($crate::scripts::ReplicaAcks { replicas, timeout });
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::tls_root_certificates; $(#[$after:meta])*) => {
        /// Trusts the certificate authorities in `pem` for a `rediss://` URL, instead of the
        /// default roots: for a Redis whose certificate a private CA signed. Requires the `tls`
        /// feature.
        $(#[$about])*
        ///
        /// `pem` holds one or more PEM `CERTIFICATE` blocks (other blocks are skipped): the bytes
        /// of a file such as the one given to the server as `tls-ca-cert-file`. Only these CAs
        /// are trusted; the default roots (the platform's certificate store, or the bundled
        /// Mozilla roots with the `tls-webpki-roots` feature) are not consulted. A second call
        /// replaces the first.
        ///
        /// Every connection checks that the server's certificate chains up to one of them, is
        /// within its validity period, and names the URL's host (a DNS name or IP address among
        /// its subject alternative names); a server that fails this is reported as
        /// [`Error::Rejected`](crate::Error::Rejected) by the call that tried to connect, at
        /// once. [`build`](Self::build) reports PEM without a certificate, or with one that does
        /// not parse, and a URL that is not `rediss://`, as
        /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
        $(#[$after])*
        #[cfg(feature = "tls")]
        #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
        pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> $builder {
            self.settings.tls.set_roots(pem.into());
            self
        }
    };
    ($(#[$about:meta])* fn $builder:ident::tls_client_certificate; $(#[$after:meta])*) => {
        /// Presents `certificate_chain` to a server that asks for a client certificate (mutual
        /// TLS, as Redis does by default with `tls-auth-clients yes`), proving it with
        /// `private_key`. Requires the `tls` feature.
        $(#[$about])*
        ///
        /// `certificate_chain` is PEM, the client's own certificate first, then any
        /// intermediates; `private_key` is one unencrypted PEM private key (PKCS#8, PKCS#1 RSA or
        /// SEC1 EC). A second call replaces the first. [`build`](Self::build) reports a chain
        /// without a certificate, a missing or encrypted key, a key that does not belong to the
        /// certificate, and a URL that is not `rediss://`, as
        /// [`Error::InvalidArgument`](crate::Error::InvalidArgument). A server that does not
        /// accept the certificate is reported as [`Error::Rejected`](crate::Error::Rejected).
        /// The key is never shown in `Debug` output.
        $(#[$after])*
        #[cfg(feature = "tls")]
        #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
        pub fn tls_client_certificate(
            mut self,
            certificate_chain: impl Into<Vec<u8>>,
            private_key: impl Into<Vec<u8>>,
        ) -> $builder {
            self.settings
                .tls
                .set_identity(certificate_chain.into(), private_key.into());
            self
        }
    };
}
pub(crate) use settings_setter;

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

impl Config {
    /// A client's configuration from what its builder recorded: the settings it shares with a
    /// fenced store, its lease and its idle expiry. Checks every one; the first one out of range
    /// is the error. (The TLS settings are checked when the connector opens.)
    pub(crate) fn new(
        settings: Settings,
        lease: Duration,
        idle_expiry: Duration,
    ) -> Result<Config> {
        settings.validate()?;
        validate_lease(lease)?;
        validate_idle_expiry(idle_expiry)?;
        Ok(Config {
            namespace: settings.namespace,
            lease,
            pool_size: settings.pool_size,
            connection_timeout: settings.connection_timeout,
            response_timeout: settings.response_timeout,
            replica_acks: settings.replica_acks,
            idle_expiry,
        })
    }
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
