#!/usr/bin/python3
"""Images: brig against skopeo and bubblewrap, side by side in one run.

    bench/images.py              # everything (a few minutes after the build)
    bench/images.py --runs 3     # fewer rounds

Everything is local: Debian's `docker-registry` on a loopback port, holding
one image made here from the test rootfs (BRIG_TEST_ROOTFS, built by
tests/support/build-rootfs.sh) split into one gzip layer per top-level
directory (a multi-layer Debian image of the usual size).

Parts:

  pull     `brig template pull` into an empty home against `skopeo copy
           docker://… oci:DIR` (the same registry, the same image; skopeo
           writes the blobs, brig also verifies and unpacks every layer).
  first    from nothing to a command run in the image: `brig run --template
           REF -- /bin/true` (pull, unpack, mount the layers, run) against
           `skopeo copy` + unpacking the layers with tar + `bwrap` on the
           result (what a tool without a layer store does).
  create   `brig serve --pool host=2 --pool REF=2`: POST /v1/sandboxes from
           the pool, template `host` against the image (a layered template
           must cost no more than a built-in one), each after an idle gap so
           the pool has refilled; and `bwrap` spawning /bin/true in the
           unpacked image as the peer.

Medians in milliseconds; summary in target/bench/images-<time>/summary.txt.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (build_brig, log)

REPO = Path(__file__).resolve().parent.parent
log = spawn.log


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def blob(dir_, data, media):
    digest = hashlib.sha256(data).hexdigest()
    (dir_ / "blobs/sha256" / digest).write_bytes(data)
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}


def make_image(rootfs, out):
    """An OCI layout at `out`: one gzip layer per top-level entry of rootfs."""
    (out / "blobs/sha256").mkdir(parents=True)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layers, diff_ids = [], []
    for top in sorted(os.listdir(rootfs)):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
            t.add(rootfs / top, arcname=top, recursive=True)
        raw = raw.getvalue()
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        layers.append(blob(out, gzip.compress(raw, 6),
                           "application/vnd.oci.image.layer.v1.tar+gzip"))
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }).encode()
    cfg = blob(out, config, "application/vnd.oci.image.config.v1+json")
    manifest = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": cfg, "layers": layers}).encode()
    m = blob(out, manifest, "application/vnd.oci.image.manifest.v1+json")
    m["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [m]}))
    return len(layers), sum(l["size"] for l in layers)


def timed(argv, **kw):
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    ms = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        sys.exit(f"images.py: {' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return ms


def unpack_layers(oci_dir, dest):
    """Unpack an OCI layout's layers in order with tar (no whiteout handling:
    this image has none)."""
    index = json.loads((oci_dir / "index.json").read_text())
    mdigest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((oci_dir / "blobs/sha256" / mdigest).read_text())
    dest.mkdir(parents=True)
    for layer in manifest["layers"]:
        path = oci_dir / "blobs/sha256" / layer["digest"].split(":")[1]
        subprocess.run(["tar", "-xzf", str(path), "-C", str(dest)], check=True)


def table(header, results, width):
    """`header`, then per part each row's median (ms) and the ratio of its
    first two rows (brig / its peer)."""
    lines = [header]
    for part, rows in results.items():
        lines.append(f"{part}:")
        med = {k: statistics.median(v) for k, v in rows.items()}
        for k, v in med.items():
            lines.append(f"  {k:<{width}} {v:9.1f}")
        names = list(med)
        lines.append(f"  {names[0]} / {names[1]}: {med[names[0]] / med[names[1]]:.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--creates", type=int, default=30)
    ap.add_argument("--brig")
    args = ap.parse_args()
    rootfs = Path(os.environ.get("BRIG_TEST_ROOTFS",
                                 Path.home() / ".cache/brig-test/rootfs-bookworm-minbase"))
    if not (rootfs / "bin/sh").exists():
        sys.exit(f"images.py: no rootfs at {rootfs}: run tests/support/build-rootfs.sh")
    for tool in ["docker-registry", "skopeo", "bwrap"]:
        if not shutil.which(tool):
            sys.exit(f"images.py: {tool} is missing (tests/support/install-deps.sh installs it)")
    brig = spawn.build_brig(args.brig)
    work = Path(tempfile.mkdtemp(prefix="brig-bench-images-"))
    out_dir = REPO / "target/bench" / time.strftime("images-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    results = {}
    registry = None
    try:
        log("making the image from the test rootfs")
        nlayers, size = make_image(rootfs, work / "layout")
        port = free_port()
        (work / "registry.yml").write_text(
            f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {work}/registry\nhttp:\n  addr: 127.0.0.1:{port}\n")
        registry = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        ref = f"127.0.0.1:{port}/bench/debian:1"
        subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{work}/layout",
                        f"docker://{ref}"], check=True, stdout=subprocess.DEVNULL)
        log(f"image: {nlayers} layers, {size / 2**20:.1f} MiB compressed")
        env = dict(os.environ, BRIG_REGISTRIES="127.0.0.1")

        def fresh(name):
            d = Path(tempfile.mkdtemp(dir=work, prefix=name))
            return d

        log("pull")
        pulls = {"brig template pull": [], "skopeo copy": []}
        for _ in range(args.runs):
            home = fresh("home")
            pulls["brig template pull"].append(
                timed([str(brig), "template", "pull", ref], env=dict(env, BRIG_HOME=str(home))))
            shutil.rmtree(home)
            dest = fresh("oci")
            pulls["skopeo copy"].append(
                timed(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"oci:{dest}"]))
            shutil.rmtree(dest)
        results["pull"] = pulls

        log("first sandbox")
        first = {"brig run (pull+run)": [], "skopeo + tar + bwrap": []}
        for _ in range(args.runs):
            home = fresh("home")
            first["brig run (pull+run)"].append(timed(
                [str(brig), "run", "--network", "none", "--template", ref, "--", "/bin/true"],
                env=dict(env, BRIG_HOME=str(home))))
            shutil.rmtree(home)
            dest = fresh("peer")

            def peer():
                subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}",
                                f"oci:{dest}/oci"], check=True, stdout=subprocess.DEVNULL)
                unpack_layers(dest / "oci", dest / "rootfs")
                subprocess.run(["bwrap", "--unshare-all", "--bind", str(dest / "rootfs"), "/",
                                "--dev", "/dev", "--proc", "/proc", "/bin/true"], check=True)
            t = time.perf_counter()
            peer()
            first["skopeo + tar + bwrap"].append((time.perf_counter() - t) * 1000)
            shutil.rmtree(dest)
        results["first"] = first

        log("create from the pool")
        home = fresh("daemon")
        subprocess.run([str(brig), "template", "pull", ref], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=dict(env, BRIG_HOME=str(home)))
        dport = free_port()
        daemon = subprocess.Popen([str(brig), "serve", "--home", str(home), "--listen",
                                   f"127.0.0.1:{dport}", "--pool", "host=2", "--pool", f"{ref}=2"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            key = None
            for _ in range(200):
                if (home / "local.key").exists():
                    key = (home / "local.key").read_text().strip()
                try:
                    socket.create_connection(("127.0.0.1", dport)).close()
                    if key:
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            time.sleep(2)

            def create(template):
                req = urllib.request.Request(
                    f"http://127.0.0.1:{dport}/v1/sandboxes", method="POST",
                    data=json.dumps({"template": template, "network": {"mode": "none"}}).encode(),
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
                t = time.perf_counter()
                with urllib.request.urlopen(req) as r:
                    sid = json.load(r)["id"]
                ms = (time.perf_counter() - t) * 1000
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{dport}/v1/sandboxes/{sid}", method="DELETE",
                    headers={"Authorization": f"Bearer {key}"})).read()
                time.sleep(0.15)
                return ms
            creates = {"create host (pool)": [], "create image (pool)": []}
            for _ in range(args.creates):
                creates["create host (pool)"].append(create("host"))
                creates["create image (pool)"].append(create(ref))
        finally:
            daemon.terminate()
            daemon.wait()
        peer_root = fresh("bw")
        subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}",
                        f"oci:{peer_root}/oci"], check=True, stdout=subprocess.DEVNULL)
        unpack_layers(peer_root / "oci", peer_root / "rootfs")
        creates["bwrap /bin/true in the image"] = [
            timed(["bwrap", "--unshare-all", "--ro-bind", str(peer_root / "rootfs"), "/",
                   "--dev", "/dev", "--proc", "/proc", "/bin/true"]) for _ in range(args.creates)]
        results["create"] = creates
    finally:
        if registry:
            registry.terminate()
            registry.wait()
        subprocess.run(["rm", "-rf", str(work)])

    text = table(f"images.py: {nlayers}-layer Debian image, {size / 2**20:.1f} MiB compressed; "
                 f"medians in ms (runs: {args.runs}, creates: {args.creates})", results, 32)
    print(text)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "summary.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
