#!/usr/bin/env bash
# Install the npm packages the tests use, in an isolated node_modules, and
# nothing else: the official E2B JS client (`e2b`), which
# crates/server/tests/e2b_control.rs drives against `brig serve --e2b`
# (tests/e2b/js_sdk.mjs).
#
#   tests/support/install-node-deps.sh
#
# The directory is ${BRIG_TEST_CACHE:-~/.cache/brig-test}/e2b-node. Fast when
# the pinned version is there: one file read and no network.
set -euo pipefail

# Pinned: the version the wire-protocol reference was verified against.
E2B_JS_VERSION=2.51.0

cache=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}
dir=$cache/e2b-node

if ! command -v npm >/dev/null 2>&1; then
    echo "install-node-deps: npm is missing; install Node.js 20 (Debian: apt-get install nodejs npm)" >&2
    exit 1
fi

have=$(node -p "require('$dir/node_modules/e2b/package.json').version" 2>/dev/null || true)
if [ "$have" = "$E2B_JS_VERSION" ]; then
    echo "install-node-deps: e2b $E2B_JS_VERSION present in $dir"
    exit 0
fi

mkdir -p "$dir"
echo "install-node-deps: installing e2b $E2B_JS_VERSION into $dir"
(cd "$dir" && npm install --silent --no-audit --no-fund --no-save "e2b@$E2B_JS_VERSION")
