//! TLS with rustls (ring provider, no OpenSSL): the server configuration nsqd's
//! buildTLSConfig makes from `--tls-cert`, `--tls-key`, `--tls-client-auth-policy`,
//! `--tls-root-ca-file` and `--tls-min-version` (nsqd: nsqd.go buildTLSConfig).
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

/// Go's error text for a file that cannot be opened (`open PATH: why`).
fn open_error(path: &str, e: &std::io::Error) -> String {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    };
    format!("open {path}: {why}")
}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| open_error(path, &e))?;
    rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path}: {e}"))
}

/// Builds the server configuration; `None` without a certificate and key (nsqd: TLS off).
/// Errors read as nsqd's `failed to build TLS config - ...`.
pub fn server_config(o: &TlsOptions) -> Result<Option<Arc<ServerConfig>>, String> {
    if o.cert.is_empty() && o.key.is_empty() {
        return Ok(None);
    }
    build(o)
        .map(|c| Some(Arc::new(c)))
        .map_err(|e| format!("failed to build TLS config - {e}"))
}

fn build(o: &TlsOptions) -> Result<ServerConfig, String> {
    // Go's tls.LoadX509KeyPair with an empty name: `open : no such file or directory`.
    let certs = read_certs(o.cert)?;
    if certs.is_empty() {
        return Err("tls: failed to find any PEM data in certificate input".into());
    }
    let key_pem = std::fs::read(o.key).map_err(|e| open_error(o.key, &e))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| format!("{}: {e}", o.key))?
        .ok_or_else(|| "tls: failed to find any PEM data in key input".to_string())?;
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
        .map_err(|e| e.to_string())?;
    let mut roots = RootCertStore::empty();
    if !o.root_ca_file.is_empty() {
        for c in read_certs(o.root_ca_file)? {
            roots
                .add(c)
                .map_err(|_| "failed to append certificate to pool".to_string())?;
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
                return Err(
                    "--tls-client-auth-policy=require-verify needs the client CA in \
                            --tls-root-ca-file (this broker does not verify client \
                            certificates against the system roots)"
                        .into(),
                );
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(v)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls: {e}"))?;
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
