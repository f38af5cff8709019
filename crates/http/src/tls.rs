//! HTTPS on a domain of the host's own: what E2B's clients need to reach
//! brig the way they reach E2B's cloud, with only `E2B_DOMAIN` set
//! (`https://api.{domain}`, `https://{port}-{id}.{domain}`).
//!
//! - [`LocalCa`]: a certificate authority made once per home and domain
//!   and kept there (`tls/<domain>/ca.pem`, its key beside it, readable by
//!   root only), which the user trusts once. Its certificate carries a name
//!   constraint: it can vouch for the domain and the names under it and
//!   for nothing else, so its key, were it ever stolen, could not
//!   impersonate any other site to a machine that trusts it.
//! - [`LocalCa::server_config`]: a certificate for `{domain}` and
//!   `*.{domain}` signed by it, made afresh at each start (valid for 397
//!   days), offering HTTP/2 and HTTP/1.1.
//! - [`serve`]: the accept loop: TLS, then hyper's server for either
//!   protocol (with upgrades, for WebSockets and raw TCP through the port
//!   proxy), each connection a task; a graceful stop.
//!
//! The names must resolve to this host: `*.localhost` does with
//! systemd-resolved or `libnss-myhostname` (docs/e2b.md).

use std::future::Future;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::Request;
use axum::http::header::HOST;
use axum::http::HeaderValue;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Why the local CA or a certificate could not be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{domain:?} cannot be served over HTTPS: {why}")]
    Domain { domain: String, why: &'static str },
    #[error("cannot make a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Check a domain names a zone of DNS names brig can serve (lower-case
/// labels of letters, digits and `-`; at least two, since TLS clients do
/// not accept a wildcard directly under a single label: `brig.localhost`,
/// not `localhost`).
pub fn check_domain(domain: &str) -> Result<(), TlsError> {
    let bad = |why| {
        Err(TlsError::Domain {
            domain: domain.to_string(),
            why,
        })
    };
    if domain.is_empty() || domain.len() > 200 {
        return bad("a domain is 1 to 200 characters");
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if labels.len() < 2 {
        return bad(
            "give at least two labels (e.g. brig.localhost): TLS clients refuse a certificate \
             for every name directly under a single label",
        );
    }
    for label in labels {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return bad(
                "each label is 1 to 63 lower-case letters, digits and '-' (no scheme, port or \
                 trailing dot: the port is the listener's)",
            );
        }
    }
    Ok(())
}

/// The host's certificate authority for one domain.
pub struct LocalCa {
    domain: String,
    cert_path: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa")
            .field("domain", &self.domain)
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca-key.pem";

fn ca_params(domain: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, format!("brig local CA for {domain}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "brig");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(domain.to_string())],
        excluded_subtrees: Vec::new(),
    });
    params
}

impl LocalCa {
    /// The CA of `domain` kept under `dir` (`dir/<domain>/`), made there
    /// the first time. The key file is written with mode 0600 before it
    /// holds anything.
    pub fn open(dir: &Path, domain: &str) -> Result<LocalCa, TlsError> {
        check_domain(domain)?;
        let dir = dir.join(domain);
        let io_err = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| TlsError::Io { op, path, source }
        };
        let cert_path = dir.join(CA_CERT);
        let key_path = dir.join(CA_KEY);
        if let Ok(key_pem) = std::fs::read_to_string(&key_path) {
            let key = KeyPair::from_pem(&key_pem)?;
            // The certificate the user trusts is the one on disk; it is
            // read to be sure it is there (a lost one is made again below).
            if cert_path.exists() {
                return Ok(LocalCa {
                    domain: domain.to_string(),
                    issuer: Issuer::new(ca_params(domain), key),
                    cert_path,
                });
            }
        }
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err("set the mode of", &dir))?;
        let key = KeyPair::generate()?;
        let params = ca_params(domain);
        let cert = params.self_signed(&key)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)
            .map_err(io_err("write", &key_path))?;
        write_file(&cert_path, cert.pem().as_bytes(), 0o644)
            .map_err(io_err("write", &cert_path))?;
        Ok(LocalCa {
            domain: domain.to_string(),
            issuer: Issuer::new(params, key),
            cert_path,
        })
    }

    /// Where the CA's certificate is: what a user adds to their trust
    /// store.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// A server configuration for the domain and every name directly
    /// under it, with a new key and certificate; HTTP/2 and HTTP/1.1.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec![self.domain.clone(), format!("*.{}", self.domain)])?;
        params
            .distinguished_name
            .push(DnType::CommonName, self.domain.as_str());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut params, SystemTime::now());
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key_der)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A day before `now` (clocks disagree a little) until 397 days after it
/// (the longest validity TLS clients accept of a server certificate).
fn set_validity(params: &mut CertificateParams, now: SystemTime) {
    let now = time::OffsetDateTime::from(now);
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(397);
}

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop waits for open connections before dropping them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve `app` over TLS on `listener` until `shutdown` completes, then
/// let open connections finish (for at most a few seconds). Requests over
/// HTTP/2 carry their host in the URI, not in a `Host` header: it is put
/// there, so that routing by host works the same on both protocols.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // A full fd table or an aborted connection: not the end of
                // the listener.
                Err(e) => {
                    tracing::warn!("https: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small request and response frames go out at once.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!("https: handshake with {peer}: {e}");
                    return;
                }
                Err(_) => return,
            };
            let service =
                hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    host_from_authority(&mut req);
                    app.clone().oneshot(req.map(axum::body::Body::new))
                });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!("https: connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("https: connections still open after {DRAIN_TIMEOUT:?}; dropped");
    }
    Ok(())
}

/// HTTP/2's `:authority` as a `Host` header, where there is none.
fn host_from_authority<B>(req: &mut Request<B>) {
    if req.headers().contains_key(HOST) {
        return;
    }
    if let Some(value) = req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        req.headers_mut().insert(HOST, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_need_two_clean_labels() {
        for ok in ["brig.localhost", "a-1.example.test", "x.y.z"] {
            check_domain(ok).unwrap();
        }
        for bad in [
            "",
            "localhost",
            "Brig.localhost",
            "brig.localhost:443",
            "https://brig.localhost",
            "brig..localhost",
            "brig.localhost.",
            "-a.localhost",
            "*.localhost",
        ] {
            assert!(check_domain(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("{}.localhost", "a".repeat(64));
        assert!(check_domain(&long).is_err());
        let edge = format!("{}.localhost", "a".repeat(63));
        check_domain(&edge).unwrap();
    }

    #[test]
    fn the_ca_is_made_once_and_kept_with_a_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::open(dir.path(), "brig.localhost").unwrap();
        let pem = std::fs::read_to_string(ca.cert_path()).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        let key = dir.path().join("brig.localhost").join(CA_KEY);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        ca.server_config().unwrap();
        // A second start keeps the CA the user trusts.
        let again = LocalCa::open(dir.path(), "brig.localhost").unwrap();
        assert_eq!(std::fs::read_to_string(again.cert_path()).unwrap(), pem);
        // Another domain gets a CA of its own.
        let other = LocalCa::open(dir.path(), "other.localhost").unwrap();
        assert_ne!(std::fs::read_to_string(other.cert_path()).unwrap(), pem);
    }

    /// The CA vouches for names under its domain only: a certificate it
    /// signed for any other name is refused by a client that trusts it.
    #[test]
    fn the_ca_cannot_vouch_for_other_sites() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::open(dir.path(), "brig.localhost").unwrap();
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(ca.cert_path()).unwrap();
        let der = rustls_pemfile_der(&pem);
        roots.add(CertificateDer::from(der)).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let signed_for = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
            set_validity(&mut params, SystemTime::now());
            params.signed_by(&key, &ca.issuer).unwrap().der().clone()
        };
        let verify = |cert: &CertificateDer<'_>, name: &str| {
            verifier.verify_server_cert(
                cert,
                &[],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        let ours = signed_for("8000-abc.brig.localhost");
        verify(&ours, "8000-abc.brig.localhost").expect("a name under the domain");
        for other in ["example.com", "brig.localhost.example.com", "localhost"] {
            let cert = signed_for(other);
            let err = verify(&cert, other).expect_err(other);
            assert!(
                format!("{err:?}").contains("NameConstraint"),
                "{other}: {err:?}"
            );
        }
    }

    /// The DER of a one-certificate PEM.
    fn rustls_pemfile_der(pem: &[u8]) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem)
            .unwrap()
            .to_vec()
    }
}
