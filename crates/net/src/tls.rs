//! The TLS of header injection (`inject.rs`): a certificate authority per
//! sandbox, which the sandbox trusts (the runtime installs [`SandboxCa::pem`]
//! in it) and which signs, on demand, a certificate for each host whose
//! requests get headers; and the client side that checks the real host's
//! certificate against the host's trust store.
//!
//! The CA's key never leaves the daemon. A certificate it signs is good
//! only inside that one sandbox: no other sandbox, and nothing on the host,
//! trusts its CA.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Where a sandbox's CA certificate is put (`/run` is the sandbox's own),
/// and the host's trusted certificates with it: the daemon writes them
/// through the agent, `brig run` as the spec's `run_files`.
pub const CA_FILE: &str = "/run/brig-ca.crt";
pub const CA_BUNDLE: &str = "/run/brig-ca-bundle.crt";

/// The variables that point TLS clients at [`CA_BUNDLE`] (OpenSSL, Python's
/// requests and pip, curl, git) and Node at [`CA_FILE`].
pub const CA_ENV: [(&str, &str); 6] = [
    ("SSL_CERT_FILE", CA_BUNDLE),
    ("REQUESTS_CA_BUNDLE", CA_BUNDLE),
    ("CURL_CA_BUNDLE", CA_BUNDLE),
    ("PIP_CERT", CA_BUNDLE),
    ("GIT_SSL_CAINFO", CA_BUNDLE),
    ("NODE_EXTRA_CA_CERTS", CA_FILE),
];

/// The host's trusted certificates (Debian's and most distributions'
/// bundle), read once.
pub fn host_bundle() -> &'static str {
    static BUNDLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUNDLE.get_or_init(|| {
        [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
    })
}

/// A sandbox's certificate authority.
pub struct SandboxCa {
    /// The CA's certificate, PEM: what the sandbox trusts.
    pem: String,
    /// The CA's key, PEM: kept by the runtime so that a restarted daemon
    /// signs with the CA the sandbox already trusts.
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
    /// A server configuration per host name, made once.
    hosts: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

/// Why a CA or a host certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot make a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

fn ca_params(id: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, format!("brig sandbox {id}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "brig");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl SandboxCa {
    /// A new CA for sandbox `id`.
    pub fn new(id: &str) -> Result<SandboxCa, TlsError> {
        let key = KeyPair::generate()?;
        let params = ca_params(id);
        let cert = params.self_signed(&key)?;
        Ok(SandboxCa {
            pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
            hosts: Mutex::default(),
        })
    }

    /// The CA kept from an earlier daemon: its certificate and key, PEM.
    pub fn restore(id: &str, pem: &str, key_pem: &str) -> Result<SandboxCa, TlsError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(SandboxCa {
            pem: pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer: Issuer::new(ca_params(id), key),
            hosts: Mutex::default(),
        })
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The CA's key, PEM (for the runtime to keep; never for a sandbox).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The server side of a connection to `host`: a certificate for it,
    /// signed by this CA; HTTP/1.1 only.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = hosts.get(host) {
            return Ok(Arc::clone(c));
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        hosts.insert(host.to_string(), Arc::clone(&config));
        Ok(config)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client side towards the real hosts: the host's trust store (its
/// system certificates, or `SSL_CERT_FILE`/`SSL_CERT_DIR` if set), made
/// once; HTTP/1.1 only.
pub fn client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!("the host's trust store: {e}");
        }
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            tracing::warn!(
                "no trusted certificate found on this host: header injection cannot reach any \
                 TLS host (install ca-certificates, or set SSL_CERT_FILE)"
            );
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_signs_host_certificates_and_survives_a_restore() {
        let ca = SandboxCa::new("abc").unwrap();
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem().contains("PRIVATE KEY"));
        let a = ca.server_config("api.example.com").unwrap();
        let b = ca.server_config("api.example.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b), "made once per host");
        let again = SandboxCa::restore("abc", ca.pem(), ca.key_pem()).unwrap();
        assert_eq!(again.pem(), ca.pem());
        again.server_config("x.example.com").unwrap();
    }
}
