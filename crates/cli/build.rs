//! Build brig-agent as a **static** executable and embed it in `brig`.
//!
//! Every daemon sandbox runs brig-agent as its init, inside the sandbox's
//! own root filesystem: a dynamically linked agent needs the host's glibc
//! and loader there, which an image such as alpine (musl), busybox or a
//! distroless one does not have. A static agent runs in any root. Cargo
//! cannot link one binary of a workspace statically and the others not,
//! so this script runs a second cargo for the agent alone with
//! `-C target-feature=+crt-static`, in a target directory of its own
//! (`target/agent-static`, kept between builds, so it is rebuilt only when
//! the agent's sources change), and `brig` carries the result
//! (`include_bytes!` in `src/agent.rs`): one file to install.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..");
    for watched in [
        "crates/agent/src",
        "crates/agent/Cargo.toml",
        "crates/protocol/src",
        "crates/protocol/Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=BRIG_EMBED_AGENT");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("brig-agent");
    // The outer target directory, whatever CARGO_TARGET_DIR says: OUT_DIR
    // is <target>/<profile>/build/<pkg>-<hash>/out.
    let target = PathBuf::from(std::env::var("OUT_DIR").unwrap())
        .ancestors()
        .nth(4)
        .map(|t| t.join("agent-static"))
        .unwrap_or_else(|| root.join("target/agent-static"));
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    // Named explicitly, so RUSTFLAGS reach the agent's own crates and not
    // the build's host tools (proc macros cannot be built static).
    let triple = std::env::var("TARGET").unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--locked",
            "-p",
            "brig-agent",
            "--target",
            &triple,
            "--target-dir",
        ])
        .arg(&target)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        // What the outer build set for its own compilations (clippy as a
        // wrapper, its flags, another target dir) is not for this one.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .expect("run cargo to build the static brig-agent");
    assert!(status.success(), "building the static brig-agent failed");
    let built = target
        .join(&triple)
        .join(if release { "release" } else { "debug" })
        .join("brig-agent");
    std::fs::copy(&built, &out)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), out.display()));
}
