//! Build `src/statx_compat.c` into the shared object the gvisor tier
//! preloads in its sandboxes (see that file for why), with the C compiler
//! the build already needs for its crypto dependencies (`$CC`, else
//! `cc`). The tier carries it (`include_bytes!` in `src/compat.rs`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("src/statx_compat.c");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("brig-statx.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| {
            panic!("run the C compiler {cc:?} (apt-get install gcc) to build {source:?}: {e}")
        });
    assert!(status.success(), "building {} failed", source.display());
}
