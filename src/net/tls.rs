//! TLS for `rediss://` URLs (the `tls` feature): the certificates a builder records, checked
//! before any connection is made, and how a failed handshake is told apart from an outage.
//!
//! The handshake itself is redis-rs' (rustls). It verifies the server's certificate chain up to
//! a trusted root, its validity period, and that it names the URL's host; it runs inside the
//! connection's set-up, so the connection timeout bounds it. Without the feature only the empty
//! settings exist: `url.rs` refuses `rediss://` URLs and the builders have no TLS setters.

use std::fmt;

use crate::error::HANDSHAKE_FAILED;

/// Why a `rediss://` URL is refused without the `tls` feature.
pub(crate) const TLS_IS_OFF: &str =
    "TLS (rediss://) is off: build with the `tls` feature (features = [\"tls\"] in Cargo.toml)";

/// The TLS settings of one client or store: which CAs it trusts, and the certificate it shows a
/// server that asks for one. Empty by default: the default roots, no client certificate.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM certificates of the CAs to trust instead of the default roots.
    #[cfg(feature = "tls")]
    roots: Option<Vec<u8>>,
    /// PEM certificate chain and private key for client authentication.
    #[cfg(feature = "tls")]
    identity: Option<Identity>,
}

#[cfg(feature = "tls")]
#[derive(Clone)]
struct Identity {
    chain: Vec<u8>,
    key: Vec<u8>,
}

impl TlsSettings {
    /// Whether anything was set: settings for a URL that is not `rediss://` are an error.
    pub(crate) fn is_set(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.roots.is_some() || self.identity.is_some()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("TlsSettings");
        // Whether each is set, never the bytes: a private key must not reach a log.
        #[cfg(feature = "tls")]
        s.field("root_certificates", &self.roots.is_some())
            .field("client_certificate", &self.identity.is_some());
        s.finish()
    }
}

/// A TLS handshake that failed: the server's certificate is not trusted or does not name the
/// host, the server refused the client's certificate (or wanted one), or the port does not speak
/// TLS. A configuration error: retrying cannot fix it.
#[derive(Debug)]
pub(crate) struct HandshakeFailed {
    cause: redis::RedisError,
}

impl HandshakeFailed {
    /// `e` as a failed handshake, if that is what it is.
    pub(crate) fn from_connect(e: redis::RedisError) -> Result<HandshakeFailed, redis::RedisError> {
        #[cfg(feature = "tls")]
        if imp::rustls_error(&e).is_some() {
            return Ok(HandshakeFailed { cause: e });
        }
        Err(e)
    }
}

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "tls")]
        let hint = imp::hint(&self.cause);
        #[cfg(not(feature = "tls"))]
        let hint = "";
        write!(f, "{HANDSHAKE_FAILED}: {} ({hint})", self.cause)
    }
}

impl std::error::Error for HandshakeFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

#[cfg(feature = "tls")]
pub(crate) use imp::{check_server_name, client};

/// Without the feature `url.rs` refuses `rediss://` before it gets here.
#[cfg(not(feature = "tls"))]
pub(crate) fn client(
    _: redis::ConnectionInfo,
    _: &TlsSettings,
) -> crate::error::Result<redis::Client> {
    Err(crate::error::Error::invalid("url", TLS_IS_OFF))
}

/// Without the feature there is no certificate to check a host name against.
#[cfg(not(feature = "tls"))]
pub(crate) fn check_server_name(_: &str) -> Result<(), String> {
    Ok(())
}

#[cfg(feature = "tls")]
mod imp {
    use std::error::Error as StdError;
    use std::sync::Arc;

    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::{CertificateError, RootCertStore};

    use super::{Identity, TlsSettings};
    use crate::error::{Error, Result};

    impl TlsSettings {
        /// Trusts the CAs in `pem` instead of the default roots.
        pub(crate) fn set_roots(&mut self, pem: Vec<u8>) {
            self.roots = Some(pem);
        }

        /// Shows `chain` (PEM, the client's certificate first) to a server that asks, and signs
        /// with `key` (PEM).
        pub(crate) fn set_identity(&mut self, chain: Vec<u8>, key: Vec<u8>) {
            self.identity = Some(Identity { chain, key });
        }
    }

    /// A client for `info` (a `rediss://` URL's), after checking `tls`: a bad certificate or
    /// key is reported now, as a bad argument, rather than by every connection attempt.
    pub(crate) fn client(info: redis::ConnectionInfo, tls: &TlsSettings) -> Result<redis::Client> {
        let provider = crypto_provider();
        if let Some(roots) = &tls.roots {
            let what = "TLS root certificates";
            let mut store = RootCertStore::empty();
            for cert in certificates(roots, what)? {
                store.add(cert).map_err(|e| {
                    Error::invalid(what, format!("a certificate is not a usable CA: {e}"))
                })?;
            }
        }
        if let Some(Identity { chain, key }) = &tls.identity {
            let what = "TLS client certificate";
            let chain = certificates(chain, what)?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                Error::invalid(
                    "TLS client key",
                    format!("no unencrypted PKCS#8, PKCS#1 or SEC1 private key in the PEM ({e:?})"),
                )
            })?;
            // What rustls does with them at each connection: a key that does not belong to the
            // certificate, or of a kind the crypto provider cannot sign with, fails here.
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|b| {
                    b.with_root_certificates(RootCertStore::empty())
                        .with_client_auth_cert(chain, key)
                })
                .map_err(|e| Error::invalid(what, format!("unusable with its private key: {e}")))?;
        }
        let certificates = redis::TlsCertificates {
            client_tls: tls.identity.as_ref().map(|Identity { chain, key }| {
                redis::ClientTlsConfig {
                    client_cert: chain.clone(),
                    client_key: key.clone(),
                }
            }),
            root_cert: tls.roots.clone(),
        };
        redis::Client::build_with_tls(info, certificates)
            .map_err(|e| Error::invalid("TLS settings", e.to_string()))
    }

    /// The certificates in `pem`: at least one, all of which parse.
    fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::invalid(what, format!("the PEM does not parse ({e:?})")))?;
        if certs.is_empty() {
            return Err(Error::invalid(
                what,
                "no CERTIFICATE block in the PEM (the bytes of the file are expected, not its path)",
            ));
        }
        Ok(certs)
    }

    /// The process's rustls crypto provider, installing ring's if there is none yet.
    ///
    /// redis-rs builds its TLS configuration with rustls' process default. When none was
    /// installed, rustls takes the one its crate features name, and panics if they name two (ring
    /// through this crate, aws-lc-rs through another dependency of the program). Installing
    /// ring's first is what rustls itself would do with ring alone; a program that wants another
    /// provider installs it before it builds a client.
    fn crypto_provider() -> Arc<CryptoProvider> {
        if let Some(provider) = CryptoProvider::get_default() {
            return Arc::clone(provider);
        }
        // Err: another thread installed one meanwhile, which is then the default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        CryptoProvider::get_default()
            .map(Arc::clone)
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
    }

    /// Checks that `host` can be a TLS server name (a DNS name or an IP address, without
    /// brackets), as rustls will need it to verify the server's certificate.
    pub(crate) fn check_server_name(host: &str) -> std::result::Result<(), String> {
        ServerName::try_from(host)
            .map(drop)
            .map_err(|e| format!("the host {host:?} cannot be checked against a certificate ({e})"))
    }

    /// The rustls error behind `e`, if the connection failed in the TLS layer. redis-rs keeps
    /// an I/O error of the TLS stream as its source, with rustls' error inside.
    pub(super) fn rustls_error(e: &redis::RedisError) -> Option<&rustls::Error> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(e);
        // A chain is a few links long; the bound only guards against a cycle.
        for _ in 0..8 {
            let current = next?;
            if let Some(tls) = current.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            let inner =
                if let Some(shared) = current.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
                    Some(&**shared as &(dyn StdError + 'static))
                } else if let Some(io) = current.downcast_ref::<std::io::Error>() {
                    // io::Error's own source skips the error it wraps.
                    io.get_ref().map(|inner| inner as &(dyn StdError + 'static))
                } else {
                    None
                };
            next = inner.or_else(|| current.source());
        }
        None
    }

    /// What to look at, for the message of a failed handshake.
    pub(super) fn hint(e: &redis::RedisError) -> &'static str {
        use rustls::AlertDescription as Alert;
        match rustls_error(e) {
            Some(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => "the server's certificate does not name the URL's host",
            Some(rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            )) => "the server's certificate is outside its validity period, or this machine's clock is \
                 wrong",
            Some(rustls::Error::InvalidCertificate(_)) => {
                "the server's certificate is not signed by a CA this client trusts: see \
                 tls_root_certificates"
            }
            Some(rustls::Error::AlertReceived(
                Alert::CertificateRequired
                | Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateUnknown
                | Alert::CertificateExpired
                | Alert::CertificateRevoked
                | Alert::UnsupportedCertificate
                | Alert::AccessDenied,
            )) => {
                "the server wants a client certificate it trusts: see tls_client_certificate"
            }
            Some(rustls::Error::InvalidMessage(_)) => {
                "the server does not speak TLS on this port: is it its tls-port?"
            }
            _ => "check the server's TLS configuration against the client's",
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn finds_rustls_inside_redis_errors() {
        // How redis-rs reports a failure of the TLS stream: an I/O error wrapping rustls'.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let failed = HandshakeFailed::from_connect(redis::RedisError::from(io))
            .expect("recognised as a TLS failure");
        let text = failed.to_string();
        assert!(text.starts_with(HANDSHAKE_FAILED), "{text}");
        assert!(text.contains("tls_root_certificates"), "{text}");
        // The error's message, and that of the copy the pool makes, as text, for the other
        // calls of a batch: both point at TLS, not at credentials.
        let copy = crate::error::Error::Rejected(text.into());
        for shown in [
            crate::error::Error::Rejected(Box::new(failed)).to_string(),
            copy.to_string(),
        ] {
            assert!(shown.contains("tls_root_certificates"), "{shown}");
            assert!(shown.contains("retrying will not help"), "{shown}");
            assert!(!shown.contains("credentials"), "{shown}");
        }
        // And as redis-rs reports a rustls error of its own making.
        let direct = redis::RedisError::from(rustls::Error::NoCertificatesPresented);
        assert!(HandshakeFailed::from_connect(direct).is_ok());
        // Other I/O errors are not TLS failures.
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(HandshakeFailed::from_connect(redis::RedisError::from(refused)).is_err());
    }

    #[test]
    fn the_tcp_settings_survive_the_certificates() {
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(Vec::new())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut tls = TlsSettings::default();
        tls.set_roots(ca.pem().into_bytes());
        let info = redis::Client::open("rediss://localhost:6380/")
            .unwrap()
            .get_connection_info()
            .clone();
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let client = client(info.set_tcp_settings(tcp), &tls).unwrap();
        assert!(client.get_connection_info().tcp_settings().nodelay());
    }

    #[test]
    fn debug_shows_no_key() {
        let mut tls = TlsSettings::default();
        tls.set_identity(b"chain".to_vec(), b"hunter2".to_vec());
        let shown = format!("{tls:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("client_certificate: true"), "{shown}");
    }
}
