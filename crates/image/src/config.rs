//! What brig keeps about an image: [`ImageRecord`] (a row of the index) and
//! [`ImageConfig`] (how to run it), and reading them out of an OCI image
//! config with [`parse_config`].
//!
//! Only the runtime part of the config is kept (`Env`, `WorkingDir`,
//! `User`, `Entrypoint`, `Cmd`): it is what a sandbox started from the
//! image needs. The whole config stays in the blob store under its digest
//! (the manifest names it) for anything that wants more.

use oci_spec::image::ImageConfiguration;
use serde::{Deserialize, Serialize};

use crate::{digest, ImageError};

/// How to run an image: the `config` section of its OCI image config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    /// `KEY=VALUE` strings, in the image's order.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`, as the image says it.
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// An image in the store's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The name brig knows it by (unique): `alpine:3.20`, `myapp`.
    pub name: String,
    /// Where it came from: a registry reference (`docker.io/library/alpine:3.20`)
    /// or, for an import, `oci:PATH`, `oci-archive:PATH`, `docker-archive:PATH`.
    pub source: String,
    /// The digest of its manifest (for a multi-platform image, the
    /// platform's manifest, not the index). The manifest blob is in the
    /// store; a docker-archive's is made by the import.
    pub digest: String,
    pub config: ImageConfig,
    /// The diff ids (digests of the uncompressed layer tars), bottom
    /// first, as the image config lists them.
    pub layers: Vec<String>,
    /// A directory below all its layers, for an image made on this host
    /// over a named template's build (a snapshot of a sandbox of `base`):
    /// that build, kept while the image is (`brig template prune` leaves
    /// builds an image names). `None` for every pulled or imported image.
    pub base: Option<std::path::PathBuf>,
    /// Bytes of its layer blobs as stored (compressed, as a registry
    /// reports them).
    pub size: u64,
    /// When it was registered, in Unix milliseconds ([`now_millis`]).
    pub created_at: i64,
}

/// What an OCI image config says that brig uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedConfig {
    pub config: ImageConfig,
    /// `rootfs.diff_ids`, bottom first, each checked to be a sha256 digest.
    pub diff_ids: Vec<String>,
    /// `os` and `architecture` as the config names them (`linux`, `amd64`).
    pub os: String,
    pub architecture: String,
}

/// Read an OCI (or Docker) image config.
pub fn parse_config(json: &[u8]) -> Result<ParsedConfig, ImageError> {
    let parsed: ImageConfiguration =
        serde_json::from_slice(json).map_err(|source| ImageError::Json {
            what: "the image config".to_string(),
            source,
        })?;
    let config = parsed
        .config()
        .as_ref()
        .map(|c| ImageConfig {
            env: c.env().clone().unwrap_or_default(),
            working_dir: c.working_dir().clone().filter(|d| !d.is_empty()),
            user: c.user().clone().filter(|u| !u.is_empty()),
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
        })
        .unwrap_or_default();
    let diff_ids = parsed.rootfs().diff_ids().clone();
    for d in &diff_ids {
        digest::check(d)?;
    }
    Ok(ParsedConfig {
        config,
        diff_ids,
        os: parsed.os().to_string(),
        architecture: parsed.architecture().to_string(),
    })
}

/// The platform images are chosen for: this host's, in OCI's (Go's) names.
pub fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    };
    ("linux", arch)
}

/// Now, in Unix milliseconds (what [`ImageRecord::created_at`] holds).
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_config_and_diff_ids_are_read() {
        let diff = digest::of_bytes(b"layer");
        let json = format!(
            r#"{{"architecture":"amd64","os":"linux",
                "config":{{"Env":["PATH=/bin","A=1"],"WorkingDir":"/app","User":"1000:1000",
                           "Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"]}},
                "rootfs":{{"type":"layers","diff_ids":["{diff}"]}}}}"#
        );
        let parsed = parse_config(json.as_bytes()).unwrap();
        assert_eq!(
            parsed.config,
            ImageConfig {
                env: vec!["PATH=/bin".into(), "A=1".into()],
                working_dir: Some("/app".into()),
                user: Some("1000:1000".into()),
                entrypoint: vec!["/bin/sh".into(), "-c".into()],
                cmd: vec!["echo hi".into()],
            }
        );
        assert_eq!(parsed.diff_ids, vec![diff]);
        assert_eq!(
            (parsed.os.as_str(), parsed.architecture.as_str()),
            ("linux", "amd64")
        );
    }

    #[test]
    fn a_config_without_a_config_section_runs_with_defaults() {
        let json =
            r#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let parsed = parse_config(json.as_bytes()).unwrap();
        assert_eq!(parsed.config, ImageConfig::default());
        assert_eq!(parsed.architecture, "arm64");
    }

    #[test]
    fn bad_configs_are_errors() {
        assert!(matches!(parse_config(b"{"), Err(ImageError::Json { .. })));
        let bad_diff = r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:../x"]}}"#;
        assert!(matches!(
            parse_config(bad_diff.as_bytes()),
            Err(ImageError::InvalidDigest { .. })
        ));
    }
}
