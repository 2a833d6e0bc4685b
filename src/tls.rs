//! TLS with rustls (ring provider, no OpenSSL): the server configuration nsqd's
//! buildTLSConfig makes from `--tls-cert`, `--tls-key`, `--tls-client-auth-policy`,
//! `--tls-root-ca-file` and `--tls-min-version` (nsqd: nsqd.go buildTLSConfig), and the
//! mutual TLS between cluster members under `--cluster-tls` ([`cluster_configs`]).
//!
//! The stream side (encrypting and decrypting on a connection) is in
//! [`crate::tcp::SharedStream`].

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};
use std::sync::Arc;

/// The TLS settings, as the command line and config file give them.
pub struct TlsOptions<'a> {
    pub cert: &'a str,
    pub key: &'a str,
    pub client_auth_policy: &'a str,
    pub root_ca_file: &'a str,
    /// Go's `tls.VersionTLS1x` number (0x0301..0x0304).
    pub min_version: u16,
}

/// A file that could not be opened; `Display` is Go's text (`open PATH: why`, with
/// Go's wording for a missing file and a denied one).
#[derive(Debug)]
pub struct OpenError {
    pub path: String,
    pub error: std::io::Error,
}

impl OpenError {
    fn new(path: &str, error: std::io::Error) -> OpenError {
        OpenError {
            path: path.to_string(),
            error,
        }
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = &self.path;
        match self.error.kind() {
            std::io::ErrorKind::NotFound => write!(f, "open {path}: no such file or directory"),
            std::io::ErrorKind::PermissionDenied => write!(f, "open {path}: permission denied"),
            _ => write!(f, "open {path}: {}", self.error),
        }
    }
}

impl std::error::Error for OpenError {}

/// Reads a file as Go's os.ReadFile does, with its error text.
pub fn read_file(path: &str) -> Result<Vec<u8>, OpenError> {
    std::fs::read(path).map_err(|e| OpenError::new(path, e))
}

/// Why the TLS configuration could not be built. `Display` reads as nsqd's `failed to
/// build TLS config - <cause>`.
#[derive(Debug)]
pub struct TlsConfigError(pub TlsCause);

/// The cause inside a [`TlsConfigError`]; `Display` is Go's text where nsqd has one.
#[derive(Debug)]
pub enum TlsCause {
    /// A certificate or key file could not be read.
    Open(OpenError),
    /// A PEM file did not parse (`PATH: <error>`).
    Pem { path: String, error: std::io::Error },
    /// `tls: failed to find any PEM data in certificate input`.
    NoCertificate,
    /// `tls: failed to find any PEM data in key input`.
    NoKey,
    /// `failed to append certificate to pool`: a root CA rustls does not take.
    RootCa,
    /// `--tls-client-auth-policy=require-verify` without `--tls-root-ca-file`.
    RequireVerifyWithoutRoots,
    /// rustls refused the protocol versions or the client verifier (its text).
    Rustls(String),
    /// rustls refused the certificate and key (`tls: <error>`).
    CertKey(rustls::Error),
}

impl std::fmt::Display for TlsCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsCause::Open(e) => e.fmt(f),
            TlsCause::Pem { path, error } => write!(f, "{path}: {error}"),
            TlsCause::NoCertificate => {
                f.write_str("tls: failed to find any PEM data in certificate input")
            }
            TlsCause::NoKey => f.write_str("tls: failed to find any PEM data in key input"),
            TlsCause::RootCa => f.write_str("failed to append certificate to pool"),
            TlsCause::RequireVerifyWithoutRoots => f.write_str(
                "--tls-client-auth-policy=require-verify needs the client CA in \
                 --tls-root-ca-file (this broker does not verify client \
                 certificates against the system roots)",
            ),
            TlsCause::Rustls(e) => f.write_str(e),
            TlsCause::CertKey(e) => write!(f, "tls: {e}"),
        }
    }
}

impl std::fmt::Display for TlsConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failed to build TLS config - {}", self.0)
    }
}

impl std::error::Error for TlsConfigError {}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, TlsCause> {
    let pem = read_file(path).map_err(TlsCause::Open)?;
    rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsCause::Pem {
            path: path.to_string(),
            error,
        })
}

/// Builds the server configuration; `None` without a certificate and key (nsqd: TLS off).
/// Errors read as nsqd's `failed to build TLS config - ...`.
pub fn server_config(o: &TlsOptions) -> Result<Option<Arc<ServerConfig>>, TlsConfigError> {
    if o.cert.is_empty() && o.key.is_empty() {
        return Ok(None);
    }
    build(o).map(|c| Some(Arc::new(c))).map_err(TlsConfigError)
}

/// The certificate chain and private key of `--tls-cert` and `--tls-key`.
fn cert_and_key(
    o: &TlsOptions,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsCause> {
    // Go's tls.LoadX509KeyPair with an empty name: `open : no such file or directory`.
    let certs = read_certs(o.cert)?;
    if certs.is_empty() {
        return Err(TlsCause::NoCertificate);
    }
    let key_pem = read_file(o.key).map_err(TlsCause::Open)?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|error| TlsCause::Pem {
            path: o.key.to_string(),
            error,
        })?
        .ok_or(TlsCause::NoKey)?;
    Ok((certs, key))
}

/// The two sides of the connections between cluster members under `--cluster-tls`
/// (docs/replication.md, "Running a cluster"): each member presents its `--tls-cert`
/// both as the listening side and as the dialling side, and accepts a peer only if the
/// peer's certificate chains to `--tls-root-ca-file` (mutual TLS, TLS 1.3 only); the
/// dialling side also checks that the certificate names the host of the peer's
/// `--cluster-peer` address.
///
/// # Errors
///
/// A missing or unreadable certificate, key or root CA (the texts of
/// [`server_config`]'s errors); an empty root CA file.
pub fn cluster_configs(
    o: &TlsOptions,
) -> Result<(Arc<ServerConfig>, Arc<rustls::ClientConfig>), TlsConfigError> {
    let cause = |c: TlsCause| TlsConfigError(c);
    let (certs, key) = cert_and_key(o).map_err(cause)?;
    let mut roots = RootCertStore::empty();
    for c in read_certs(o.root_ca_file).map_err(cause)? {
        roots.add(c).map_err(|_| cause(TlsCause::RootCa))?;
    }
    if roots.is_empty() {
        return Err(cause(TlsCause::RootCa));
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let v13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| cause(TlsCause::Rustls(e.to_string())))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(v13)
        .map_err(|e| cause(TlsCause::Rustls(e.to_string())))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| cause(TlsCause::CertKey(e)))?;
    // The dialling side never reads application data: no tickets for it to take.
    server.send_tls13_tickets = 0;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(v13)
        .map_err(|e| cause(TlsCause::Rustls(e.to_string())))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| cause(TlsCause::CertKey(e)))?;
    Ok((Arc::new(server), Arc::new(client)))
}

fn build(o: &TlsOptions) -> Result<ServerConfig, TlsCause> {
    let (certs, key) = cert_and_key(o)?;
    let mut provider = rustls::crypto::ring::default_provider();
    // Go's server order with AES hardware (crypto/tls cipherSuitesPreferenceOrder):
    // AES-128-GCM, then AES-256-GCM, then ChaCha20, chosen by the server whatever the
    // client lists first (rustls' own order puts AES-256 first, about a third slower).
    provider.cipher_suites.sort_by_key(|cs| {
        let name = cs.suite().as_str().unwrap_or_default();
        if name.contains("AES_128") {
            0
        } else if name.contains("AES_256") {
            1
        } else {
            2
        }
    });
    let provider = Arc::new(provider);
    // rustls speaks TLS 1.2 and 1.3 only: a minimum of tls1.0 or tls1.1 allows both.
    let versions: &[&rustls::SupportedProtocolVersion] = if o.min_version >= 0x0304 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsCause::Rustls(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    if !o.root_ca_file.is_empty() {
        for c in read_certs(o.root_ca_file)? {
            roots.add(c).map_err(|_| TlsCause::RootCa)?;
        }
    }
    let builder = match o.client_auth_policy {
        // Go's RequireAnyClientCert: a certificate must be sent, it is not verified.
        "require" => builder.with_client_cert_verifier(Arc::new(AnyClientCert {
            algs: provider.signature_verification_algorithms,
        })),
        // Go's RequireAndVerifyClientCert, against --tls-root-ca-file.
        "require-verify" => {
            if roots.is_empty() {
                return Err(TlsCause::RequireVerifyWithoutRoots);
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsCause::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(v)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(TlsCause::CertKey)?;
    // No session tickets: a resumed session would save little on long-lived NSQ
    // connections, and each ticket is a write the reader task would have to make.
    cfg.send_tls13_tickets = 0;
    cfg.ignore_client_order = true;
    Ok(cfg)
}

/// Go's `tls.RequireAnyClientCert`: asks for a certificate and requires one, but does not
/// verify it (the signature proving the client holds its key still is).
#[derive(Debug)]
struct AnyClientCert {
    algs: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// One DER element at the start of `d`: (tag, contents, rest). None if malformed.
fn der(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *d.first()?;
    let first = *d.get(1)? as usize;
    let (len, hdr) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *d.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    Some((tag, d.get(hdr..end)?, d.get(end..)?))
}

/// The subject common name (OID 2.5.4.3) of a DER certificate, as Go's
/// `Subject.CommonName` (the last one if several). None if absent or malformed.
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let (_, certificate, _) = der(cert)?;
    let (_, tbs, _) = der(certificate)?;
    let mut rest = tbs;
    // [0] version is optional.
    if rest.first() == Some(&0xa0) {
        rest = der(rest)?.2;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        rest = der(rest)?.2;
    }
    let (_, subject, _) = der(rest)?;
    let mut cn = None;
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (_, set, next) = der(rdns)?;
        rdns = next;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, next) = der(atvs)?;
            atvs = next;
            let (tag, oid, value) = der(atv)?;
            if tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                let (_, text, _) = der(value)?;
                cn = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    cn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_from_a_certificate_and_no_panic_on_bad_bytes() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec!["x".to_string()]).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "org");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "worker-7");
        let cert = p.self_signed(&key).expect("cert");
        let der = cert.der().to_vec();
        assert_eq!(subject_common_name(&der).as_deref(), Some("worker-7"));
        for n in 0..der.len() {
            let _ = subject_common_name(&der[..n]);
        }
        let mut flipped = der.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = subject_common_name(&flipped);
            flipped[i] ^= 0xff;
        }
        assert_eq!(subject_common_name(&[]), None);
        assert_eq!(
            subject_common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
    }
}
