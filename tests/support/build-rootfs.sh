#!/usr/bin/env bash
# Build (once) the Debian bookworm minbase rootfs the end-to-end and hostile
# suites run inside, and print its path on stdout.
#
#   tests/support/build-rootfs.sh            # build if missing or stale, print path
#   BRIG_TEST_CACHE=/somewhere tests/support/build-rootfs.sh
#
# The rootfs lives in ${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}/rootfs-bookworm-minbase.
# Next to it, rootfs-bookworm-minbase.recipe records what it was built from
# (variant, suite, package list). The rootfs counts as valid only when that
# file exists and matches the recipe below, so changing the recipe rebuilds it,
# and a build that died half-way is never used: mmdebstrap writes into a temp
# dir in the same cache dir, which is renamed into place only on success and
# only then gets its recipe file.
#
# Needs root (mmdebstrap's root mode: it mounts /proc and /dev in the target
# while dpkg runs) and the mirror this machine's apt already uses.
set -euo pipefail

# ---- the recipe: change any of these and the next run rebuilds ------------
suite=bookworm
variant=minbase
# Extra packages on top of minbase, comma-separated (mmdebstrap --include).
# Keep it empty unless a test needs something: every package is download and
# unpack time on each fresh CI machine.
include=""
# Bump when the way the rootfs is made changes in a way the fields above
# don't capture.
recipe_version=1
# ---------------------------------------------------------------------------

cache=${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}
name=rootfs-$suite-$variant
dest=$cache/$name
stamp=$cache/$name.recipe

recipe="recipe_version=$recipe_version
suite=$suite
variant=$variant
include=$include"

log() { printf 'build-rootfs: %s\n' "$*" >&2; }

# The mirror: whatever apt on this machine uses for the main Debian archive
# (the first deb822 URIs: or one-line `deb` entry that is not the security
# archive), so a machine behind a proxy or local mirror keeps working.
# BRIG_TEST_MIRROR overrides.
find_mirror() {
    local f uri
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        case $f in
        *.sources)
            # deb822: take URIs: from a stanza whose Suites: names $suite.
            uri=$(awk -v suite="$suite" '
                /^[[:space:]]*$/ { if (u != "" && s) { print u; exit } u = ""; s = 0; next }
                tolower($1) == "uris:" { u = $2 }
                tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) s = 1 }
                END { if (u != "" && s) print u }' "$f" | head -n1) ;;
        *)
            uri=$(awk -v suite="$suite" '
                $1 == "deb" {
                    i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == suite) { print $i; exit }
                }' "$f") ;;
        esac
        if [ -n "$uri" ]; then
            printf '%s\n' "$uri"
            return
        fi
    done
    printf '%s\n' http://deb.debian.org/debian
}

if [ -f "$stamp" ] && [ -d "$dest" ] && [ "$(cat "$stamp")" = "$recipe" ]; then
    log "up to date: $dest"
    printf '%s\n' "$dest"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    log "building the rootfs needs root (mmdebstrap --mode=root); run as root or build it once with sudo"
    exit 1
fi
command -v mmdebstrap >/dev/null || { log "mmdebstrap is not installed (apt-get install mmdebstrap)"; exit 1; }

mkdir -p "$cache"
# Two runs sharing a cache (e.g. two checkouts) build it only once.
exec 9>"$cache/.$name.lock"
flock 9
if [ -f "$stamp" ] && [ -d "$dest" ] && [ "$(cat "$stamp")" = "$recipe" ]; then
    log "built by another run meanwhile: $dest"
    printf '%s\n' "$dest"
    exit 0
fi

# Leftovers of builds that were killed.
rm -rf "$cache/.$name.tmp."* "$cache/.$name.old."*

mirror=${BRIG_TEST_MIRROR:-$(find_mirror)}
tmp=$(mktemp -d "$cache/.$name.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# mmdebstrap wants an empty or absent target; mktemp made it empty.
log "building $variant $suite from $mirror${include:+ with $include} (a few minutes)"
start=$(date +%s)
mmdebstrap --mode=root --variant="$variant" ${include:+--include="$include"} \
    --quiet "$suite" "$tmp" "$mirror" >&2

# Invalidate first, then swap: a crash anywhere below leaves no recipe file,
# so the next run rebuilds instead of trusting a half-swapped tree.
rm -f "$stamp"
if [ -e "$dest" ]; then
    old=$cache/.$name.old.$$
    mv "$dest" "$old"
fi
mv "$tmp" "$dest"
trap - EXIT
chmod 755 "$dest"
printf '%s\n' "$recipe" >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
[ -n "${old:-}" ] && rm -rf "$old"
log "built $dest in $(($(date +%s) - start)) s ($(du -sh "$dest" | cut -f1))"
printf '%s\n' "$dest"
