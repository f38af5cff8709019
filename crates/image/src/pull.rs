//! Pulling an image from a registry over the OCI distribution API (the
//! `oci-client` crate): `python:3.12` means `docker.io/library/python:3.12`,
//! a tag or a digest, a multi-arch index resolved to this host's platform
//! (or `--platform`), anonymous bearer tokens or basic auth (from flags or
//! `~/.docker/config.json`), plain HTTP for `--insecure` registries and
//! loopback ones.
//!
//! Every blob is verified twice over: by oci-client as it streams, and by
//! [`ImageStore::write_blob`] as it lands (a blob is written to a temporary
//! file and renamed only when its digest matches), so a corrupted or
//! truncated download never enters the store. Layers download in parallel
//! (at most [`PARALLEL`] at once), each unpacked as soon as it is whole.
//! Blobs and layers already in the store are not fetched again, which is
//! also what makes an interrupted pull resumable: the next pull of the
//! same image fetches only what is missing. A failed attempt at one blob
//! is retried ([`ATTEMPTS`] in all) before the pull fails. The image is
//! registered last: a failed pull leaves no image behind.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::{parse_config, ImageError, ImageRecord, ImageStore};

/// Layers fetched at once.
pub const PARALLEL: usize = 4;
/// Tries per blob.
pub const ATTEMPTS: u32 = 3;

/// How to pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Plain HTTP (and unverified TLS) for this registry. Loopback
    /// registries (`localhost`, `127.0.0.0/8`, `[::1]`) get it anyway, as
    /// docker does.
    pub insecure: bool,
    /// `os/arch[/variant]`; default: this host's (`linux/amd64` here).
    pub platform: Option<String>,
    /// Basic auth for the registry; default: `~/.docker/config.json`'s
    /// entry for it, else anonymous (with a bearer token if the registry
    /// asks for one).
    pub credentials: Option<(String, String)>,
}

/// What a pull reports as it goes.
#[derive(Debug, Clone)]
pub enum PullEvent {
    /// The manifest is known: the image's digest and its layers (digest,
    /// compressed size), bottom first.
    Resolved {
        digest: String,
        layers: Vec<(String, u64)>,
    },
    /// A layer is already in the store.
    Cached { digest: String },
    /// `bytes` more of layer `digest` arrived.
    Progress { digest: String, bytes: u64 },
    /// Layer `digest` is whole and unpacked.
    Done { digest: String },
    /// A try failed and will be retried.
    Retrying { digest: String, reason: String },
}

/// Where [`PullEvent`]s go.
pub type OnEvent = Arc<dyn Fn(PullEvent) + Send + Sync>;

/// Pull `reference` into `store` and register it as `name` (default: the
/// reference as given). Blocking: runs its own small async runtime.
pub fn pull(
    store: &Arc<ImageStore>,
    reference: &str,
    name: Option<&str>,
    opts: &PullOptions,
    on_event: OnEvent,
) -> Result<ImageRecord, ImageError> {
    let image: Reference = reference.parse().map_err(|e| ImageError::BadReference {
        reference: reference.to_string(),
        reason: format!("{e}"),
    })?;
    // reqwest's rustls has no crypto provider of its own here: ring, as
    // brig-net's TLS uses (a second install is refused, harmlessly).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ImageError::Io {
            op: "start the puller's runtime",
            path: store.root().to_path_buf(),
            source,
        })?;
    runtime.block_on(pull_async(
        store,
        reference,
        &image,
        name.unwrap_or(reference),
        opts,
        on_event,
    ))
}

/// The registries pulls may use, from `BRIG_REGISTRIES` (hosts, commas
/// between, a port optional: `ghcr.io,127.0.0.1`); unset or empty: any.
pub const REGISTRIES_ENV: &str = "BRIG_REGISTRIES";

/// Whether `registry` (as the reference resolves it) is one
/// [`REGISTRIES_ENV`] allows; `Err` names the allowed ones.
fn registry_allowed(registry: &str) -> Result<(), String> {
    let Ok(list) = std::env::var(REGISTRIES_ENV) else {
        return Ok(());
    };
    let host = |r: &str| {
        let r = r
            .trim()
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let h = r.split('/').next().unwrap_or(r);
        let h = h.rsplit_once(':').map_or(h, |(h, _port)| h);
        match h {
            "docker.io" | "registry-1.docker.io" => "index.docker.io".to_string(),
            other => other.to_ascii_lowercase(),
        }
    };
    let allowed: Vec<String> = list
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(host)
        .collect();
    if allowed.is_empty() || allowed.contains(&host(registry)) {
        return Ok(());
    }
    Err(format!(
        "the registry {registry} is not among those {REGISTRIES_ENV} allows ({}): pull from one of \
         them, or add it",
        allowed.join(", ")
    ))
}

async fn pull_async(
    store: &Arc<ImageStore>,
    given: &str,
    image: &Reference,
    name: &str,
    opts: &PullOptions,
    on_event: OnEvent,
) -> Result<ImageRecord, ImageError> {
    let registry = image.resolve_registry().to_string();
    registry_allowed(&registry).map_err(|reason| ImageError::Registry {
        reference: given.to_string(),
        reason,
    })?;
    let client = Client::new(client_config(&registry, opts)?);
    let auth = match &opts.credentials {
        Some((user, pass)) => RegistryAuth::Basic(user.clone(), pass.clone()),
        None => docker_config_auth(&registry).unwrap_or(RegistryAuth::Anonymous),
    };
    let registry_error = |e: oci_client::errors::OciDistributionError| ImageError::Registry {
        reference: given.to_string(),
        reason: explain(&e, &registry),
    };
    // Registers nothing a prune could take from under us meanwhile.
    let _lease = store.write_lease()?;
    // The manifest for this platform (an index is resolved by the
    // client's platform resolver), then its bytes as the registry has
    // them, kept under its digest.
    let (manifest, digest) = client
        .pull_image_manifest(image, &auth)
        .await
        .map_err(registry_error)?;
    let (raw, _) = client
        .pull_manifest_raw(
            &image.clone_with_digest(digest.clone()),
            &auth,
            &[
                oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
                oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
            ],
        )
        .await
        .map_err(registry_error)?;
    {
        let (store, digest) = (Arc::clone(store), digest.clone());
        blocking(move || store.write_blob(&digest, raw.as_ref())).await?;
    }
    if !store.has_blob(&manifest.config.digest) {
        fetch(store, &client, image, &auth, &manifest.config, &on_event).await?;
    }
    let config_bytes =
        std::fs::read(store.blob_path(&manifest.config.digest)).map_err(|source| {
            ImageError::Io {
                op: "read the image config",
                path: store.blob_path(&manifest.config.digest),
                source,
            }
        })?;
    let parsed = parse_config(&config_bytes)?;
    let diff_ids = parsed.diff_ids.clone();
    if diff_ids.len() != manifest.layers.len() {
        return Err(ImageError::BadImage {
            reason: format!(
                "{given}: its manifest lists {} layers and its config {} diff ids",
                manifest.layers.len(),
                diff_ids.len()
            ),
        });
    }
    on_event(PullEvent::Resolved {
        digest: digest.clone(),
        layers: manifest
            .layers
            .iter()
            .map(|l| (l.digest.clone(), l.size.max(0) as u64))
            .collect(),
    });

    // Each layer: fetched unless present, then unpacked; PARALLEL at once.
    let jobs = manifest
        .layers
        .iter()
        .zip(&diff_ids)
        .map(|(layer, diff_id)| {
            let (client, auth, on_event) = (&client, &auth, Arc::clone(&on_event));
            async move {
                if store.layer_dir(diff_id).is_dir() {
                    on_event(PullEvent::Cached {
                        digest: layer.digest.clone(),
                    });
                    return Ok(());
                }
                if !store.has_blob(&layer.digest) {
                    fetch(store, client, image, auth, layer, &on_event).await?;
                }
                let (blob, media, diff) = (
                    layer.digest.clone(),
                    layer.media_type.clone(),
                    diff_id.clone(),
                );
                let store = Arc::clone(store);
                blocking(move || store.unpack_layer(&blob, &media, &diff)).await?;
                on_event(PullEvent::Done {
                    digest: layer.digest.clone(),
                });
                Ok::<(), ImageError>(())
            }
        });
    let results: Vec<_> = futures_util::stream::iter(jobs)
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;

    let record = ImageRecord {
        base: None,
        name: name.to_string(),
        source: image.whole(),
        digest,
        config: parsed.config,
        layers: diff_ids,
        size: manifest.layers.iter().map(|l| l.size.max(0) as u64).sum(),
        created_at: crate::now_millis(),
    };
    store.register(&record)?;
    Ok(record)
}

/// One blob into the store, retried.
async fn fetch(
    store: &Arc<ImageStore>,
    client: &Client,
    image: &Reference,
    auth: &RegistryAuth,
    layer: &OciDescriptor,
    on_event: &OnEvent,
) -> Result<(), ImageError> {
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            on_event(PullEvent::Retrying {
                digest: layer.digest.clone(),
                reason: last.clone(),
            });
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
        client
            .store_auth_if_needed(image.resolve_registry(), auth)
            .await;
        let stream = match client.pull_blob_stream(image, layer).await {
            Ok(s) => s,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        // The bytes cross to a blocking writer that hashes as it writes.
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<bytes::Bytes>>(16);
        let digest = layer.digest.clone();
        let writer = {
            let (digest, store) = (digest.clone(), Arc::clone(store));
            let size = u64::try_from(layer.size).ok();
            tokio::task::spawn_blocking(move || {
                store.write_blob_sized(&digest, size, ChannelReader::new(rx))
            })
        };
        let mut body = stream.stream;
        let mut sent_all = true;
        let mut broke: Option<String> = None;
        while let Some(chunk) = body.next().await {
            let n = chunk.as_ref().map_or(0, |b| b.len() as u64);
            if let Err(e) = &chunk {
                broke = Some(e.to_string());
            }
            let failed = chunk.is_err();
            if tx.send(chunk).is_err() {
                sent_all = false;
                break;
            }
            if failed {
                sent_all = false;
                break;
            }
            on_event(PullEvent::Progress {
                digest: digest.clone(),
                bytes: n,
            });
        }
        drop(tx);
        let written = writer.await;
        // oci-client checks the digest as the bytes stream and ends the
        // stream with an error on a mismatch: the registry serves other
        // content than it names, which no retry mends.
        if let Some(got) = broke
            .as_deref()
            .and_then(|b| b.split_once("Invalid digest"))
            .and_then(|(_, rest)| rest.rsplit_once(", got "))
        {
            return Err(ImageError::DigestMismatch {
                expected: digest.clone(),
                got: got.1.trim().to_string(),
            });
        }
        last = match written {
            Ok(Ok(_)) if sent_all => return Ok(()),
            // A digest or size mismatch is not retried: the registry
            // serves something else than it said.
            Ok(Err(e @ (ImageError::DigestMismatch { .. } | ImageError::SizeMismatch { .. }))) => {
                return Err(e)
            }
            // Nor is this host's own failure to store it (a full disk, a
            // read-only store): the next try would fail the same way.
            Ok(Err(e @ ImageError::Io { .. })) => return Err(e),
            // The stream's own error says more than the reader's.
            _ if broke.is_some() => broke.unwrap_or_default(),
            Ok(Ok(_)) => "the download broke off".into(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
    }
    Err(ImageError::Registry {
        reference: image.whole(),
        reason: format!("layer {}: {last} ({ATTEMPTS} tries)", layer.digest),
    })
}

/// A `Read` over chunks sent from the async side.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    current: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: std::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>) -> Self {
        ChannelReader {
            rx,
            current: bytes::Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.recv() {
                Ok(Ok(b)) => self.current = b,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

fn client_config(registry: &str, opts: &PullOptions) -> Result<ClientConfig, ImageError> {
    let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
    let loopback = host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback());
    let protocol = if opts.insecure || loopback {
        ClientProtocol::HttpsExcept(vec![registry.to_string()])
    } else {
        ClientProtocol::Https
    };
    let (os, arch, variant) = match &opts.platform {
        Some(p) => parse_platform(p)?,
        None => {
            let (os, arch) = crate::host_platform();
            (os.to_string(), arch.to_string(), None)
        }
    };
    let resolver = move |entries: &[oci_client::manifest::ImageIndexEntry]| {
        entries.iter().find_map(|e| {
            let p = e.platform.as_ref()?;
            let matches = p.os.to_string() == os
                && p.architecture.to_string() == arch
                && variant
                    .as_ref()
                    .is_none_or(|v| p.variant.as_deref() == Some(v.as_str()));
            matches.then(|| e.digest.clone())
        })
    };
    Ok(ClientConfig {
        protocol,
        accept_invalid_certificates: opts.insecure,
        platform_resolver: Some(Box::new(resolver)),
        max_concurrent_download: PARALLEL,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(120)),
        ..ClientConfig::default()
    })
}

/// `os/arch[/variant]`.
fn parse_platform(p: &str) -> Result<(String, String, Option<String>), ImageError> {
    let parts: Vec<&str> = p.split('/').collect();
    match parts.as_slice() {
        [os, arch] if !os.is_empty() && !arch.is_empty() => {
            Ok((os.to_string(), arch.to_string(), None))
        }
        [os, arch, v] if !os.is_empty() && !arch.is_empty() && !v.is_empty() => {
            Ok((os.to_string(), arch.to_string(), Some(v.to_string())))
        }
        _ => Err(ImageError::BadReference {
            reference: p.to_string(),
            reason: "a platform is OS/ARCH[/VARIANT], e.g. linux/amd64".into(),
        }),
    }
}

/// Basic credentials for `registry` from `~/.docker/config.json` (the
/// `auths` entry's `auth`, base64 of `user:password`); Docker Hub's entry is
/// keyed `https://index.docker.io/v1/`.
fn docker_config_auth(registry: &str) -> Option<RegistryAuth> {
    use base64::Engine;
    let home = std::env::var_os("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".docker")))?;
    let text = std::fs::read_to_string(home.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let auths = config["auths"].as_object()?;
    let keys: Vec<String> = if registry == "index.docker.io" || registry == "docker.io" {
        vec![
            "https://index.docker.io/v1/".into(),
            "index.docker.io".into(),
            "docker.io".into(),
        ]
    } else {
        vec![registry.to_string(), format!("https://{registry}")]
    };
    let entry = keys.iter().find_map(|k| auths.get(k))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry["auth"].as_str()?)
        .ok()?;
    let (user, pass) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(RegistryAuth::Basic(user.to_string(), pass.to_string()))
}

/// Run a blocking store call off the runtime's thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ImageError::BadImage {
            reason: format!("a store task failed: {e}"),
        })
    })
}

/// The registry's error in words, with what to do.
///
/// Classified by the error's structure (variant, HTTP status, OCI error
/// codes) first; words are matched only in the message with its URLs left
/// out, so a port such as 40179 never reads as a 401.
fn explain(e: &oci_client::errors::OciDistributionError, registry: &str) -> String {
    use oci_client::errors::OciDistributionError as E;
    use oci_client::errors::OciErrorCode as C;
    let text = e.to_string();
    let codes: Vec<&C> = match e {
        E::RegistryError { envelope, .. } => envelope.errors.iter().map(|x| &x.code).collect(),
        _ => Vec::new(),
    };
    let status = match e {
        E::ServerError { code, .. } => Some(*code),
        _ => None,
    };
    let words: String = text
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase();
    let has = |ws: &[&str]| ws.iter().any(|w| words.contains(w));
    let hint = if matches!(e, E::AuthenticationFailure(_) | E::UnauthorizedError { .. })
        || status == Some(401)
        || codes
            .iter()
            .any(|c| matches!(c, C::Unauthorized | C::Denied))
        || has(&["unauthorized"])
    {
        format!(
            "the registry {registry} refused the credentials (give them with --username and \
             --password-stdin, or `docker login {registry}`)"
        )
    } else if matches!(e, E::ImageManifestNotFoundError(_))
        || status == Some(404)
        || codes
            .iter()
            .any(|c| matches!(c, C::ManifestUnknown | C::NameUnknown | C::NotFound))
        || has(&["manifest unknown", "name unknown"])
    {
        format!("no such image or tag on {registry} (check the name and the tag)")
    } else if has(&["tls", "ssl", "certificate", "wrong version number"]) {
        "a registry that speaks plain HTTP needs --insecure".into()
    } else if has(&["error sending request", "connect"]) {
        format!("is {registry} reachable from this host?")
    } else {
        return text;
    };
    format!("{text}: {hint}")
}

#[cfg(test)]
mod tests {
    use super::explain;
    use oci_client::errors::{OciDistributionError as E, OciEnvelope, OciError, OciErrorCode};

    fn registry_error(code: OciErrorCode, url: &str) -> E {
        E::RegistryError {
            envelope: OciEnvelope {
                errors: vec![OciError {
                    code,
                    message: "from the registry".into(),
                    detail: serde_json::Value::Null,
                }],
            },
            url: url.into(),
        }
    }

    /// A registry on a port with "401" in it once made an unknown tag read
    /// as refused credentials.
    #[test]
    fn the_url_never_decides_what_an_error_means() {
        let r = "127.0.0.1:40179";
        let e = registry_error(
            OciErrorCode::ManifestUnknown,
            "http://127.0.0.1:40179/v2/test/busy/manifests/nope",
        );
        let said = explain(&e, r);
        assert!(said.contains("no such image or tag"), "{said}");
        assert!(!said.contains("credentials"), "{said}");

        let e = registry_error(OciErrorCode::Unauthorized, "http://127.0.0.1:5000/v2/x");
        assert!(explain(&e, r).contains("refused the credentials"));
        let e = E::ServerError {
            code: 401,
            url: "http://127.0.0.1:404/v2/x".into(),
            message: "no".into(),
        };
        assert!(explain(&e, r).contains("refused the credentials"));
        let e = E::ServerError {
            code: 500,
            url: "http://127.0.0.1:40100/v2/x".into(),
            message: "boom".into(),
        };
        assert_eq!(explain(&e, r), e.to_string());
    }
}
