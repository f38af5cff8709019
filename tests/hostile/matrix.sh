#!/usr/bin/env bash
# The "one protection off" matrix (issue 10): builds brig with the test-only
# `knockout` feature (crates/jail/src/knockout.rs; a release build with it
# does not compile), then runs the hostile corpus under `brig run` on both
# templates once with every protection and once per protection left out
# (BRIG_KNOCKOUT=<name>), and prints which programs fail each time; then
# once with the seccomp filter's errnos marked (BRIG_SECCOMP_MARK), each
# program counting the refusals it met by the layer that refused: the
# tables in docs/threat-model.md.
#
#   tests/hostile/matrix.sh                 # every protection (~15 min)
#   tests/hostile/matrix.sh seccomp pidns   # only these
#
# Needs root, BRIG_TEST_ROOTFS (scripts/test builds it) for the dir
# template. Writes target/hostile/matrix.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

protections=("$@")
if [ ${#protections[@]} -eq 0 ]; then
    protections=(pidns netns ipcns utsns cgroupns pivot_root proc_ro sys_ro template_ro
        no_new_privs capabilities seccomp dumpable memory pids disk nofile core)
fi

echo "building brig with the knockout feature (target/knockout)" >&2
cargo build -q -p brig --features knockout --target-dir target/knockout
cargo test -q -p brig --test hostile --no-run 2>/dev/null
export BRIG_HOSTILE_BRIG=$PWD/target/knockout/debug/brig

# The failing tests of one run, as "template::program" lines; each one
# that fails is run again alone and counts only if it fails again (the
# suite shares a 2-core machine with whatever else runs).
failures() {
    local t
    { BRIG_KNOCKOUT="$1" cargo test -q -p brig --test hostile -- host_template:: dir_template:: \
        2>/dev/null || true; } | sed -n 's/^\(.*_template::[a-z_]*\) --- FAILED$/\1/p' | sort -u |
        while read -r t; do
            if ! BRIG_KNOCKOUT="$1" cargo test -q -p brig --test hostile -- --exact "$t" \
                >/dev/null 2>&1; then
                echo "$t"
            fi
        done
}

out=target/hostile/matrix.md
mkdir -p target/hostile
baseline=$(failures "")
if [ -n "$baseline" ]; then
    echo "with every protection these already fail; fix them first:" >&2
    echo "$baseline" >&2
    exit 1
fi
{
    echo "| protection left out | programs that fail (host template / dir template) |"
    echo "|---|---|"
} > "$out"
for p in "${protections[@]}"; do
    echo "knockout $p ..." >&2
    got=$(failures "$p")
    host=$(echo "$got" | sed -n 's/^host_template:://p' | paste -sd, - | sed 's/,/, /g')
    dir=$(echo "$got" | sed -n 's/^dir_template:://p' | paste -sd, - | sed 's/,/, /g')
    echo "| \`$p\` | ${host:-none} / ${dir:-none} |" >> "$out"
done
# Attribution: the filter's errnos shifted by 1000 (BRIG_SECCOMP_MARK, a
# knockout build only); each program counts the refusals it met by layer.
echo "attribution pass (seccomp errnos marked) ..." >&2
{
    echo
    echo "| program | refused by the seccomp filter | refused by the kernel (capabilities, permissions, namespaces) |"
    echo "|---|---|---|"
    { BRIG_HOSTILE_SECCOMP_MARK=1000 cargo test -q -p brig --test hostile -- host_template:: \
        --nocapture --test-threads 1 2>&1 || true; } |
        sed -n 's/^{"program":"\([a-z_0-9]*\)".*refused by the seccomp filter: \([0-9]*\), by the kernel: \([0-9]*\).*/| \1 | \2 | \3 |/p' |
        sort -u
} >> "$out"
cat "$out"
