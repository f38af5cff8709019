#!/usr/bin/env bash
# Build (once) brig and brig-agent as an earlier commit of this repository
# had them, for the upgrade test (crates/cli/tests/live_restore.rs): a
# daemon of that build starts sandboxes, this tree's daemon must re-adopt
# them. Prints the directory holding the two binaries on stdout.
#
#   tests/support/build-previous.sh
#
# The commit is pinned below: the last one before a change to what the
# daemon and its sandboxes share across an upgrade (the agent protocol,
# the state schema, /run/brig/sb). Move it forward when such a change is
# released, so the test always upgrades across the newest change.
#
# The binaries live in ${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}/previous-<commit>/;
# the build's own target directory is removed once they are copied out.
set -euo pipefail

# ---- the pin ---------------------------------------------------------------
# Session 5's last commit: agent protocol 3, state schema 5 (this tree: 4, 6).
commit=dbcaaac2db2f0772a8ceba439f60e392be4bf253
# ---------------------------------------------------------------------------

cd "$(dirname "$0")/../.."
repo=$PWD
cache=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}
dest=$cache/previous-${commit:0:12}

if [ -x "$dest/brig" ] && [ -x "$dest/brig-agent" ]; then
    echo "$dest"
    exit 0
fi
if ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "build-previous: commit $commit is not in this clone's history (a shallow clone?): fetch it, e.g. git fetch --unshallow" >&2
    exit 1
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/previous-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
git -C "$repo" archive "$commit" | tar -x -C "$work"
echo "build-previous: building brig at ${commit:0:12} (once per machine)" >&2
# Its own lock file and dependency versions, as it was released, but this
# tree's debug profile (how much debug info: it changes no behaviour), so
# that the dependencies both trees share, compiled alike, are not compiled
# again: the build's target directory starts as hard links to this tree's
# compiled units (a unit compiled alike has the same file names in both
# and is used as it is; one compiled differently gets names of its own).
# About a third of the units are then compiled rather than all of them.
if ! grep -q '^\[profile\.dev' "$work/Cargo.toml"; then
    awk '/^\[/{keep = /^\[profile\.dev/} keep' Cargo.toml >>"$work/Cargo.toml"
fi
main_target=${CARGO_TARGET_DIR:-$repo/target}/debug
if [ -d "$main_target/deps" ]; then
    mkdir -p "$work/target/debug"
    for d in deps build .fingerprint; do
        [ -d "$main_target/$d" ] && cp -al "$main_target/$d" "$work/target/debug/"
    done
fi
(cd "$work" && CARGO_TARGET_DIR="$work/target" cargo build --locked -p brig -p brig-agent >&2)
tmp=$dest.tmp
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$work/target/debug/brig" "$work/target/debug/brig-agent" "$tmp/"
rm -rf "$dest"
mv "$tmp" "$dest"
echo "$dest"
