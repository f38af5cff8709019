#!/usr/bin/env bash
# Fuzz a live `brig serve` against its contract, api/openapi.yaml, with
# schemathesis: generated valid and invalid requests on every operation, and
# each response's status code, content type, headers and body checked
# against the document. Any 5xx fails the run.
#
#   tests/api/schemathesis.sh URL KEY [EXTRA st run ARGS...]
#
# BRIG_SANDBOX_ID, if set, is a running sandbox that operations on one use
# (see schemathesis.toml beside this script); without it they mostly get 404.
#
# crates/cli/tests/schemathesis.rs starts the daemon and runs this; the
# venv comes from tests/support/install-python-deps.sh.
set -euo pipefail

url=$1 key=$2
shift 2
repo=$(cd "$(dirname "$0")/../.." && pwd)
st=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}/venv/bin/st

# schemathesis keeps a cache in the working directory: not in the repo.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# Every check but these, each with the reason it does not apply:
#  - positive_data_acceptance: it expects every schema-valid request to be
#    accepted, but the document cannot spell every rule the server checks
#    (sizes such as 512M with minimums, durations, environment variable
#    names, label filters, files that exist in the sandbox); such requests
#    are rightly 400/404/409. negative_data_rejection, the other direction,
#    stays on.
#  - use_after_free / ensure_resource_availability: they assume DELETE
#    removes a resource; a deleted sandbox stays listed, `stopped`, by design.
# `--checks all` limits a response to 10 s; 30 s here: `files/list` of
# `/` at depth 64 in a `host` sandbox walks the host's whole read-only
# root, which takes ~11 s in a debug build.
# And two operations:
#  - /v1/sandboxes/{id}/ports/{port}/... is a proxy to whatever listens in
#    the sandbox: its 502 when nothing does is the right answer, not a
#    server error, and its bodies are the sandbox server's.
#    crates/api/tests/ports.rs covers it.
#  - GET /v1/sandboxes/{id}/pty is a WebSocket handshake, which schemathesis
#    cannot speak (it answers 426 to plain HTTP, as it must);
#    crates/api/tests/pty.rs covers it.
#  - GET /v1/sandboxes/{id}/files/watch is a stream that ends only when the
#    client leaves; schemathesis reads a whole body and would time out.
#  - GET /v1/sandboxes/{id}/logs with follow=true is such a stream too;
#    crates/cli/tests/serve.rs (logs_*) covers the endpoint.
# An id no sandbox has, so the settings file reads without one.
export BRIG_SANDBOX_ID=${BRIG_SANDBOX_ID:-0123456789ab}
exec "$st" --config-file "$repo/tests/api/schemathesis.toml" run "$repo/api/openapi.yaml" \
    --url "$url" \
    --header "Authorization: Bearer $key" \
    --checks all \
    --exclude-checks positive_data_acceptance,use_after_free,ensure_resource_availability \
    --max-examples "${BRIG_SCHEMATHESIS_EXAMPLES:-10}" \
    --workers 2 \
    --request-timeout 60 \
    --max-response-time 30 \
    --seed "${BRIG_SCHEMATHESIS_SEED:-1}" \
    --exclude-path-regex '/(pty|files/watch|logs)$|/ports/' \
    --no-color \
    "$@"
