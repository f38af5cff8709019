#!/usr/bin/env bash
# Install the Debian packages the tests and benches need, and nothing else.
#
#   tests/support/install-deps.sh [EXTRA_PACKAGE...]
#
# Fast when everything is already there: one `dpkg-query` and no network.
# `apt-get update` runs only when something is missing, because on a fresh
# machine the package lists may be absent or stale.
set -euo pipefail

packages=(
    mmdebstrap      # builds the Debian minbase rootfs (tests/support/build-rootfs.sh)
    bubblewrap      # peer in bench/spawn.sh
    crun            # peer in bench/spawn.sh
    buildah         # peer in bench/e2b_template.py (cached Dockerfile rebuilds)
    hyperfine       # timing in bench/
    musl-tools      # musl-gcc: static test binaries with no glibc start-up cost
    busybox-static  # a shell and coreutils for minimal rootfs fixtures
    uidmap          # newuidmap/newgidmap for the unprivileged user-namespace tests
    iproute2        # `ip`: brig-net makes sandbox links with it; tests build their network worlds
    skopeo          # writes docker-archives and oci-archives for brig-image's import tests
    ca-certificates # mmdebstrap over https mirrors
    python3-venv    # the venv schemathesis runs in (tests/support/install-python-deps.sh)
    docker-registry # a real OCI registry on loopback for the image pull tests (crates/cli/tests/images.rs)
    apache2-utils   # htpasswd: the registry's basic-auth users in those tests
    runsc           # gVisor: the gvisor tier (crates/gvisor) and its peer in bench/gvisor.py
    sqlite3         # crates/cli/tests/gvisor.rs and vm.rs edit a crashed daemon's store
    qemu-system-x86 # QEMU: the vm tier (crates/vm) and its peer in bench/vm.py
    e2fsprogs       # mkfs.ext4: the vm tier's disks and volumes; debugfs reads one back in crates/vm's tests
    cpio            # reads back the initramfs brig writes (crates/vm's tests)
    libnss-myhostname # resolves *.localhost to loopback: E2B's domain path over HTTPS (serve_e2b.rs)
    # The code interpreter (crates/e2b/resources/code-interpreter), tested on
    # the host by crates/e2b/tests/code_interpreter.rs: its kernels and what
    # they need (bash_kernel itself comes from PyPI, into the test cache).
    python3-ipykernel python3-jupyter-client python3-numpy python3-pandas
    python3-matplotlib python3-pexpect python3-filetype
    "$@"
)

missing=()
for p in "${packages[@]}"; do
    # `dpkg-query -W` prints the status of an installed package; anything else
    # (unknown, removed, config-files only) counts as missing.
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
        missing+=("$p")
    fi
done

# The vm tier's copy-on-write forks map a snapshot's RAM read-only and
# private (`memory-backend-file,readonly=on,rom=off`), which needs QEMU 8.2
# or later: Debian 12 has 7.2, its backports 10.x. Where the release's own
# QEMU is older, take the backports' (with its firmware).
qemu_backports=
qemu_version=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
if [ "$(dpkg-query -W -f='${db:Status-Status}' qemu-system-x86 2>/dev/null)" != installed ] \
    || dpkg --compare-versions "${qemu_version:-0}" lt 1:8.2; then
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" = bookworm ]; then
        qemu_backports=bookworm-backports
    fi
fi

if [ -n "$qemu_backports" ]; then
    # Installed from there below, not twice.
    missing=("${missing[@]/qemu-system-x86/}")
    read -r -a missing <<< "${missing[*]}"
fi

if [ ${#missing[@]} -eq 0 ] && [ -z "$qemu_backports" ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${missing[*]} ${qemu_backports:+qemu-system-x86 (8.2 or later, from $qemu_backports)}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if [ -n "$qemu_backports" ]; then
    list=/etc/apt/sources.list.d/$qemu_backports.sources
    if ! grep -rqs "$qemu_backports" /etc/apt/sources.list /etc/apt/sources.list.d; then
        echo "install-deps: adding Debian's $qemu_backports ($list) for QEMU 8.2 or later"
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
            "Suites: $qemu_backports" 'Components: main' \
            'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$list"
    fi
fi
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ -n "$qemu_backports" ]; then
    echo "install-deps: installing qemu-system-x86 from $qemu_backports"
    apt-get install -y -qq --no-install-recommends -t "$qemu_backports" qemu-system-x86
    qemu_version=$(dpkg-query -W -f='${Version}' qemu-system-x86)
    if dpkg --compare-versions "$qemu_version" lt 1:8.2; then
        echo "install-deps: qemu-system-x86 is $qemu_version; the vm tier's tests need 8.2 or later" >&2
        exit 1
    fi
fi
