#!/usr/bin/env bash
# In-process spawn latency of brig-jail: the jail library driven directly from
# Rust, without the `brig` CLI's process start-up. It is the number to compare
# with the zygote floor in /work/shared/reference/measured-limits.md §2(a)
# (about 0.3-0.45 ms median for clone + exec of a static binary).
#
# The benchmark itself is the Rust example crates/jail/examples/spawn_bench.rs;
# this script only runs it, passing its arguments through, and says so
# plainly when the example does not exist yet.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f crates/jail/examples/spawn_bench.rs ] && [ ! -d crates/jail/examples/spawn_bench ]; then
    echo "jail: skipped, crates/jail/examples/spawn_bench.rs does not exist yet"
    exit 0
fi
exec cargo run --release -q -p brig-jail --example spawn_bench -- "$@"
