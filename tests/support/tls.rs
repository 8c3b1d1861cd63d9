//! Certificates made at test time, and `redis-server`s that serve TLS with them.
//!
//! A [`Ca`] is a private certificate authority; it signs server and client certificates
//! ([`Leaf`]). [`TlsServer`] writes a CA and a server certificate where `redis-server` reads them
//! and starts it with a TLS port beside its plain one.

use std::fs;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::{unique_temp_dir, RedisServer};

/// A private certificate authority.
pub struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate signed by a [`Ca`], with its private key, both PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    /// A new CA named `name`, with a fresh key.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate, PEM: what a client trusts.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for `names` (IP addresses or DNS names).
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, |_| {})
    }

    /// A server certificate for `names` that expired in 2001.
    pub fn expired_server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, |params| {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        })
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, |_| {})
    }

    fn leaf(
        &self,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, &names[0]);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        adjust(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// Whether the server asks clients for a certificate (`tls-auth-clients`).
#[derive(Clone, Copy, Debug)]
pub enum ClientCerts {
    /// `yes`, Redis' default: a client without a certificate `ca` signed is refused.
    Required,
    /// `no`.
    NotAsked,
}

/// A CA's certificate and a server's certificate and key, written where `redis-server` reads
/// them; removed on drop.
pub struct CertFiles {
    dir: PathBuf,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
}

impl CertFiles {
    pub fn write(ca: &Ca, cert: &Leaf) -> CertFiles {
        let dir = unique_temp_dir("fencelock-tls");
        let write = |name: &str, pem: &str| -> String {
            let path = dir.join(name);
            fs::write(&path, pem)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            path_str(&path)
        };
        let ca_file = write("ca.crt", ca.pem());
        let cert_file = write("server.crt", &cert.cert_pem);
        let key_file = write("server.key", &cert.key_pem);
        CertFiles {
            dir,
            ca_file,
            cert_file,
            key_file,
        }
    }

    /// `--tls-cert-file`, `--tls-key-file` and `--tls-ca-cert-file`, for a `redis-server`
    /// command line.
    pub fn server_args(&self) -> Vec<String> {
        [
            "--tls-cert-file",
            &self.cert_file,
            "--tls-key-file",
            &self.key_file,
            "--tls-ca-cert-file",
            &self.ca_file,
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

impl Drop for CertFiles {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` with a TLS port, serving `cert`; it trusts client certificates signed by
/// `ca`. Derefs to the [`RedisServer`] (whose plain port stays open).
pub struct TlsServer {
    // Declared (so dropped) before the files it reads.
    server: RedisServer,
    /// The certificate files, removed on drop.
    _files: CertFiles,
}

impl TlsServer {
    pub fn start(ca: &Ca, cert: &Leaf, client_certs: ClientCerts) -> TlsServer {
        let files = CertFiles::write(ca, cert);
        let auth = match client_certs {
            ClientCerts::Required => "yes",
            ClientCerts::NotAsked => "no",
        };
        let mut args = files.server_args();
        args.extend(["--tls-auth-clients".to_owned(), auth.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisServer::start_tls(&args);
        TlsServer {
            server,
            _files: files,
        }
    }
}

impl Deref for TlsServer {
    type Target = RedisServer;
    fn deref(&self) -> &RedisServer {
        &self.server
    }
}

fn path_str(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("temp path {} is not UTF-8", path.display()))
        .to_owned()
}
