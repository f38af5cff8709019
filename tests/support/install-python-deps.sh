#!/usr/bin/env bash
# Install the Python tools the tests use, in isolated venvs, and nothing
# else: schemathesis, which fuzzes a live `brig serve` against
# api/openapi.yaml (tests/api/schemathesis.sh, crates/cli/tests/schemathesis.rs),
# and the official E2B clients (e2b-venv: e2b + e2b-code-interpreter, current;
# e2b-venv-2.48: e2b 2.48, the v1 create path; e2b-venv-2.45: e2b 2.45, a
# release that refuses any API key but `e2b_` and hex digits) for the E2B
# tests, and the official MCP Python SDK (mcp-venv: mcp) for the MCP tests.
#
#   tests/support/install-python-deps.sh
#
# The venvs are under ${BRIG_TEST_CACHE:-~/.cache/brig-test}. Fast when the
# pinned versions are already there: `st --version`, `pip freeze`, no network.
#
# Python: the newest 3.12+ found (python3.13, python3.12, or a pyenv
# install), else python3 (Debian 12: 3.11, with the venv module from
# python3-venv, in install-deps.sh). 3.12+ is preferred because CPython 3.11
# can fail `ast.parse` deep in a stack ("AST constructor recursion depth
# mismatch"), which hypothesis, under schemathesis, hits now and then: the
# run then reports a Runtime Error that has nothing to do with brig.
set -euo pipefail

# Pinned: a new schemathesis adds checks and changes flags.
SCHEMATHESIS_VERSION=4.32.5
# Pinned: the E2B compatibility tests check brig against these clients.
E2B_VERSION=2.63.0
E2B_CODE_INTERPRETER_VERSION=2.11.5
E2B_OLD_VERSION=2.48.0
# Releases 2.25-2.45 check the key's shape before sending anything.
E2B_KEY_CHECKING_VERSION=2.45.0
# Pinned: the MCP tests (tests/mcp/, crates/cli/tests/mcp.rs) drive brig
# with the official MCP Python SDK client of this version.
MCP_VERSION=2.3.0

cache=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}
venv=$cache/venv

pick_python() {
    local candidates=(python3.13 python3.12)
    if command -v pyenv >/dev/null 2>&1; then
        local root
        root=$(pyenv root)
        candidates+=("$root"/versions/3.13*/bin/python3 "$root"/versions/3.12*/bin/python3)
    fi
    local p
    for p in "${candidates[@]}"; do
        # A pyenv shim exists even when its version is not selected: run it.
        if "$p" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
            echo "$p"
            return
        fi
    done
    echo python3
}

python=$(pick_python)
want=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

install_schemathesis() {
    if [ -x "$venv/bin/st" ] &&
        [ "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$want" ] &&
        "$venv/bin/st" --version 2>/dev/null | grep -qx "st, version $SCHEMATHESIS_VERSION"; then
        echo "install-python-deps: schemathesis $SCHEMATHESIS_VERSION present in $venv (python $want)"
        return
    fi
    mkdir -p "$cache"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
    echo "install-python-deps: installed schemathesis $SCHEMATHESIS_VERSION in $venv (python $want)"
}

# The official E2B clients, for the E2B compatibility tests
# (crates/e2b/tests/e2b_control.rs, tests/e2b/): one venv per client
# generation, each exactly the pinned packages.
#   install_venv DIR PACKAGE==VERSION...
install_venv() {
    local dir=$cache/$1
    shift
    local frozen
    frozen=$("$dir/bin/python" -m pip freeze 2>/dev/null || true)
    local pkg missing=0
    for pkg in "$@"; do
        grep -qix "$pkg" <<<"$frozen" || missing=1
    done
    if [ "$missing" = 0 ]; then
        echo "install-python-deps: $* present in $dir"
        return
    fi
    mkdir -p "$cache"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet "$@"
    echo "install-python-deps: installed $* in $dir"
}

install_schemathesis
# The current generation: POST /v2/sandboxes, and run_code.
install_venv e2b-venv "e2b==$E2B_VERSION" "e2b-code-interpreter==$E2B_CODE_INTERPRETER_VERSION"
# An older generation (Python 2.10-2.50): POST /sandboxes.
install_venv e2b-venv-2.48 "e2b==$E2B_OLD_VERSION"
# A generation that validates the key's shape (E2B_VALIDATE_API_KEY
# defaults to true there): brig's keys must pass in their E2B spelling.
install_venv e2b-venv-2.45 "e2b==$E2B_KEY_CHECKING_VERSION"
# The MCP client (stdio and streamable HTTP), with matplotlib nowhere: the
# plots are drawn inside the sandbox.
install_venv mcp-venv "mcp==$MCP_VERSION"
