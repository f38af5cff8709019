#!/usr/bin/env bash
# Install the Python tools the tests use, in an isolated venv, and nothing
# else: schemathesis, which fuzzes a live `brig serve` against
# api/openapi.yaml (tests/api/schemathesis.sh, crates/cli/tests/schemathesis.rs).
#
#   tests/support/install-python-deps.sh
#
# The venv is ${BRIG_TEST_CACHE:-~/.cache/brig-test}/venv. Fast when the
# pinned version is already there: one `st --version` and no network.
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

if [ -x "$venv/bin/st" ] &&
    [ "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$want" ] &&
    "$venv/bin/st" --version 2>/dev/null | grep -qx "st, version $SCHEMATHESIS_VERSION"; then
    echo "install-python-deps: schemathesis $SCHEMATHESIS_VERSION present in $venv (python $want)"
    exit 0
fi

mkdir -p "$cache"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
echo "install-python-deps: installed schemathesis $SCHEMATHESIS_VERSION in $venv (python $want)"
