#!/usr/bin/env bash
# The "one protection off" matrix (issue 10): builds brig with the test-only
# `knockout` feature (crates/jail/src/knockout.rs; a release build with it
# does not compile), then runs the hostile corpus under `brig run` on both
# templates once with every protection and once per protection left out
# (BRIG_KNOCKOUT=<name>), and prints which programs fail each time; then
# the attribution pass: once more with the seccomp filter's errnos marked
# (BRIG_SECCOMP_MARK), each program counting the refusals it met by the
# layer that refused them, and the harness asserting that layer against
# the one declared for the program (`layer()` in
# crates/cli/tests/hostile.rs). The tables are in docs/threat-model.md.
#
#   tests/hostile/matrix.sh                 # every protection, then attribution (~15 min)
#   tests/hostile/matrix.sh seccomp pidns   # only these, then attribution
#   tests/hostile/matrix.sh --attribution   # the attribution pass alone (~2 min)
#
# Needs root, BRIG_TEST_ROOTFS (scripts/test builds it) for the dir
# template. Writes target/hostile/matrix.md (or, with --attribution,
# target/hostile/attribution.md) and the pass's log,
# target/hostile/attribution.log. Fails if the attribution pass finds a
# program refused by another layer than declared, or one that fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

attribution_only=false
if [ "${1:-}" = --attribution ]; then
    attribution_only=true
    shift
fi
protections=("$@")
if [ ${#protections[@]} -eq 0 ]; then
    protections=(pidns netns ipcns utsns cgroupns pivot_root proc_ro sys_ro template_ro
        no_new_privs capabilities seccomp dumpable memory pids disk nofile core)
fi

# One build with the feature: the brig under attack and the harness.
echo "building brig and the hostile harness with the knockout feature (target/knockout)" >&2
hostile=(cargo test -q -p brig --features knockout --target-dir target/knockout --test hostile)
"${hostile[@]}" --no-run
export BRIG_HOSTILE_BRIG=$PWD/target/knockout/debug/brig
mkdir -p target/hostile

# The attribution pass: the filter's errnos shifted by 1000 (a knockout
# build only), both templates, and file_race in a daemon's sandbox. Each
# checked program prints an `attribution:` line (see layer_failures in
# the harness); appends the table to $1 and fails on a mismatch or a
# failing test.
attribution() {
    local log=target/hostile/attribution.log status=0
    echo "attribution pass (seccomp errnos marked) ..." >&2
    BRIG_HOSTILE_SECCOMP_MARK=1000 "${hostile[@]}" -- host_template:: dir_template:: \
        file_api::daemon --nocapture --test-threads 1 > "$log" 2>&1 || status=$?
    {
        echo
        echo "| program | declared layer | host template: filter / kernel | dir template: filter / kernel |"
        echo "|---|---|---|---|"
        sed -n 's/^attribution: \([a-z]*\) \([a-z_0-9]*\): \(.*\); declared \([a-z]*\): .*/\2 \4 \1 \3/p' "$log" |
            sed 's/filter \([0-9]*\), kernel \([0-9]*\)/\1 \/ \2/' |
            awk '{ p = $1; seen[p] = 1; w = $3; l[p, w] = $2; $1 = $2 = $3 = ""; sub(/^ +/, ""); c[p, w] = $0 }
                 END { for (p in seen) {
                     host = c[p, "host"]; dir = c[p, "dir"]; layer = l[p, "host"]
                     if (l[p, "dir"] != layer) layer = "host: " layer ", dir: " l[p, "dir"]
                     if (c[p, "daemon"] != "") { host = "daemon: " c[p, "daemon"]; dir = "—"; layer = l[p, "daemon"] }
                     printf "| %s | %s | %s | %s |\n", p, layer, host, dir } }' |
            sort
    } >> "$1"
    local mismatches failed
    mismatches=$(grep '^attribution: .*: MISMATCH$' "$log" || true)
    failed=$(sed -n 's/^test \([a-z_:]*\) \.\.\. .*FAILED$/\1/p; s/^    \([a-z_]*::[a-z_]*\)$/\1/p' "$log" | sort -u)
    if [ -n "$mismatches" ]; then
        echo "refused by another layer than declared (layer() in crates/cli/tests/hostile.rs):" >&2
        echo "$mismatches" >&2
    fi
    if [ -n "$failed" ]; then
        echo "failed in the attribution pass (see $log):" >&2
        echo "$failed" >&2
    fi
    if [ -z "$mismatches" ] && [ -z "$failed" ] && [ "$status" -ne 0 ]; then
        echo "the attribution pass failed (exit $status); see $log" >&2
    fi
    [ -z "$mismatches" ] && [ -z "$failed" ] && [ "$status" -eq 0 ]
}

if $attribution_only; then
    out=target/hostile/attribution.md
    : > "$out"
    ok=true
    attribution "$out" || ok=false
    cat "$out"
    $ok
    exit
fi

# The failing tests of one run, as "template::program" lines; each one
# that fails is run again alone and counts only if it fails again (the
# suite shares a 2-core machine with whatever else runs).
failures() {
    local t
    { BRIG_KNOCKOUT="$1" "${hostile[@]}" -- host_template:: dir_template:: \
        2>/dev/null || true; } | sed -n 's/^\(.*_template::[a-z_]*\) --- FAILED$/\1/p' | sort -u |
        while read -r t; do
            if ! BRIG_KNOCKOUT="$1" "${hostile[@]}" -- --exact "$t" \
                >/dev/null 2>&1; then
                echo "$t"
            fi
        done
}

out=target/hostile/matrix.md
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
ok=true
attribution "$out" || ok=false
cat "$out"
$ok
