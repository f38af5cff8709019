#!/usr/bin/env bash
# Install the cargo subcommands the checks use, and nothing else:
# cargo-fuzz, which builds and runs the libFuzzer targets in fuzz/
# (scripts/fuzz, scripts/test's fuzz stage).
#
#   tests/support/install-cargo-tools.sh
#
# Fast when the pinned version is already there: one `--version`, no
# network. Otherwise `cargo install --locked` from crates.io (half a
# minute).
set -euo pipefail

# Pinned: 0.13 passes no -Z flag with `--sanitizer none`, which is what
# lets the targets build on stable Rust.
CARGO_FUZZ_VERSION=0.13.2

if [ "$(cargo fuzz --version 2>/dev/null)" = "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
    echo "install-cargo-tools: cargo-fuzz $CARGO_FUZZ_VERSION present"
    exit 0
fi
echo "install-cargo-tools: installing cargo-fuzz $CARGO_FUZZ_VERSION"
cargo install --locked --quiet --version "$CARGO_FUZZ_VERSION" cargo-fuzz
