#!/usr/bin/env bash
# Install the npm packages the tests use, in an isolated node_modules, and
# nothing else: the official E2B JS clients, `e2b` and
# `@e2b/code-interpreter`, which crates/e2b/tests/e2b_js.rs drives
# against `brig serve --e2b` (tests/e2b/js_sdk.mjs,
# tests/e2b/js_code_interpreter.mjs), and the official MCP Inspector,
# `@modelcontextprotocol/inspector`, whose CLI mode crates/cli/tests/mcp.rs
# runs against `brig mcp` and `brig serve --mcp`.
#
#   tests/support/install-node-deps.sh
#
# The directory is ${BRIG_TEST_CACHE:-~/.cache/brig-test}/e2b-node. Fast when
# the pinned versions are there: two file reads and no network.
set -euo pipefail

# Pinned: the versions the wire-protocol reference was verified against.
# @e2b/code-interpreter 2.8.0 depends on e2b ^2.48.0, so it shares the one
# e2b 2.51.0 below (no nested copy).
E2B_JS_VERSION=2.51.0
E2B_CI_JS_VERSION=2.8.0
# Pinned: the MCP Inspector whose CLI lists and calls brig's tools. It asks
# for Node 22.19 in its package.json; its CLI mode runs on Debian's Node 20
# (checked with this version), so the engine check is not enforced.
MCP_INSPECTOR_VERSION=2.12.0

cache=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}
dir=$cache/e2b-node

if ! command -v npm >/dev/null 2>&1; then
    echo "install-node-deps: npm is missing; install Node.js 20 (Debian: apt-get install nodejs npm)" >&2
    exit 1
fi

version() {
    node -p "require('$dir/node_modules/$1/package.json').version" 2>/dev/null || true
}

# The MCP Inspector, in a directory of its own.
inspector=$cache/mcp-inspector-node
if [ "$(node -p "require('$inspector/node_modules/@modelcontextprotocol/inspector/package.json').version" 2>/dev/null || true)" = "$MCP_INSPECTOR_VERSION" ]; then
    echo "install-node-deps: @modelcontextprotocol/inspector $MCP_INSPECTOR_VERSION present in $inspector"
else
    mkdir -p "$inspector"
    cat >"$inspector/package.json" <<JSON
{
  "name": "brig-mcp-inspector",
  "private": true,
  "dependencies": {
    "@modelcontextprotocol/inspector": "$MCP_INSPECTOR_VERSION"
  }
}
JSON
    rm -f "$inspector/package-lock.json"
    echo "install-node-deps: installing @modelcontextprotocol/inspector $MCP_INSPECTOR_VERSION into $inspector"
    (cd "$inspector" && npm install --silent --no-audit --no-fund)
fi

if [ "$(version e2b)" = "$E2B_JS_VERSION" ] &&
    [ "$(version @e2b/code-interpreter)" = "$E2B_CI_JS_VERSION" ] &&
    [ ! -e "$dir/node_modules/@e2b/code-interpreter/node_modules/e2b" ]; then
    echo "install-node-deps: e2b $E2B_JS_VERSION and @e2b/code-interpreter $E2B_CI_JS_VERSION present in $dir"
    exit 0
fi

mkdir -p "$dir"
# Our own package.json with exact versions, so that npm installs here (not in
# a parent directory's project) and the result does not depend on what was
# there before.
cat >"$dir/package.json" <<JSON
{
  "name": "brig-e2b-node",
  "private": true,
  "dependencies": {
    "e2b": "$E2B_JS_VERSION",
    "@e2b/code-interpreter": "$E2B_CI_JS_VERSION"
  }
}
JSON
rm -f "$dir/package-lock.json"
echo "install-node-deps: installing e2b $E2B_JS_VERSION and @e2b/code-interpreter $E2B_CI_JS_VERSION into $dir"
(cd "$dir" && npm install --silent --no-audit --no-fund)
