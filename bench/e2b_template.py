#!/usr/bin/python3
"""A cached rebuild of a 10-step template: E2B's template builder against
brig, brig's own Dockerfile build, and buildah, side by side in one run.

    bench/e2b_template.py              # 10 rounds (about a minute after set-up)
    bench/e2b_template.py --runs 5
    bench/e2b_template.py --brig target/debug/brig   # skip the release build

The template (10 steps: 3 copies, ENV, 4 RUNs, WORKDIR, USER on brig's
`base`) is built once untimed by each tool, then rebuilt unchanged --runs
times, every step a cache hit:

  e2b client    `Template.build(template, NAME)` from the official Python
                client (the tests' venv) against `brig serve --e2b`: request
                the build, ask for the three upload links (all present, no
                upload), send the steps, poll the status every 0.2 s (the
                client's own interval) until `ready`. Timed inside one
                Python process, so the interpreter's start is not counted.
  brig build    `brig template build NAME -f Dockerfile CTX` with the same
                steps as a Dockerfile (a process of its own each time, as a
                person runs it).
  buildah       `buildah bud --layers --isolation chroot` with the same
                Dockerfile, FROM the same root filesystem imported into its
                own storage (skopeo copy into containers-storage), also a
                process each time.

The daemon runs on free ports with a temp home whose `templates` is a
symlink to the built templates ($BRIG_TEST_TEMPLATE_HOME/templates, built
first if `base` is missing); its image store starts empty, so the first
(untimed) build also turns `base` into an image. Medians in milliseconds
and the ratios to the E2B path; summary in
target/bench/e2b_template-<time>/summary.txt. See bench/README.md.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (build_brig, log, REPO)

REPO = spawn.REPO
log = spawn.log
CACHE = Path(os.environ.get("BRIG_TEST_CACHE", Path.home() / ".cache/brig-test"))
E2B_PYTHON = CACHE / "e2b-venv/bin/python"
TEMPLATES = Path(os.environ.get("BRIG_TEST_TEMPLATE_HOME", CACHE / "home")) / "templates"

DOCKERFILE = """FROM {base}
COPY a.txt /opt/bench/a.txt
COPY dir /opt/bench/dir/
ENV BENCH=1
RUN echo one > /opt/bench/one
WORKDIR /opt/bench
RUN echo two > two
RUN mkdir -p /opt/bench/made
COPY b.txt /opt/bench/b.txt
RUN ln -sf /opt/bench/one /opt/bench/link
USER user
"""

# The same ten steps through E2B's client; times each cached rebuild.
E2B_SCRIPT = r"""
import json, sys, time
from e2b import Template
ctx, name, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
def template():
    return (Template(file_context_path=ctx).from_template("base")
        .copy("a.txt", "/opt/bench/a.txt")
        .copy("dir", "/opt/bench/dir/")
        .set_envs({"BENCH": "1"})
        .run_cmd("echo one > /opt/bench/one")
        .set_workdir("/opt/bench")
        .run_cmd("echo two > two")
        .run_cmd("mkdir -p /opt/bench/made")
        .copy("b.txt", "/opt/bench/b.txt")
        .run_cmd("ln -sf /opt/bench/one /opt/bench/link")
        .set_user("user"))
if runs == 0:
    Template.build(template(), name)
    print("[]")
    sys.exit()
logs, times = [], []
for _ in range(runs):
    logs.clear()
    t = time.perf_counter()
    Template.build(template(), name, on_build_logs=logs.append)
    times.append((time.perf_counter() - t) * 1000)
    cached = sum(1 for e in logs if str(e.message).strip() == "(cached)")
    if cached != 7:
        sys.exit(f"e2b: expected 7 cached layer steps, got {cached}: {[str(e.message) for e in logs]}")
print(json.dumps(times))
"""


def context(work):
    ctx = work / "ctx"
    (ctx / "dir" / "sub").mkdir(parents=True)
    (ctx / "a.txt").write_text("a\n")
    (ctx / "b.txt").write_text("b\n")
    (ctx / "dir" / "sub" / "c.txt").write_text("c\n")
    return ctx


def timed(argv, **kw):
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    ms = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        raise SystemExit(f"e2b_template.py: {' '.join(map(str, argv))} failed: {p.stderr[-2000:]}")
    return ms, p.stderr


def start_daemon(brig, home):
    p = subprocess.Popen(
        [str(brig), "serve", "--listen", "127.0.0.1:0", "--e2b", "--e2b-api", "127.0.0.1:0",
         "--e2b-sandbox", "127.0.0.1:0", "--prepare", "none", "--pool", "host=0",
         "--pool", "base=0"],
        env=dict(os.environ, BRIG_HOME=str(home)), stderr=subprocess.PIPE, text=True)
    api = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        if "e2b api on " in line:
            api = line.split("e2b api on ")[1].strip()
        if "e2b sandboxes on " in line and api:
            # Its log from now on: read, so the pipe never fills.
            import threading
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, api
    p.kill()
    raise SystemExit("e2b_template.py: brig serve --e2b did not start")


def buildah_base(work, rootfs, root, runroot):
    """The base rootfs as localhost/brig-base:1 in buildah's storage."""
    layout = work / "base-oci"
    (layout / "blobs/sha256").mkdir(parents=True)
    tar_path = work / "base.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as t:
        t.add(rootfs, arcname=".")
    h = hashlib.sha256()
    with open(tar_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    layer = h.hexdigest()
    size = tar_path.stat().st_size
    shutil.move(tar_path, layout / "blobs/sha256" / layer)

    def blob(data, media):
        d = hashlib.sha256(data).hexdigest()
        (layout / "blobs/sha256" / d).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{d}", "size": len(data)}

    cfg = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer}"]},
        # buildah counts layers against history entries.
        "history": [{"created_by": "brig's base template rootfs"}],
    }).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cfg, "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                   "digest": f"sha256:{layer}", "size": size}],
    }).encode(), "application/vnd.oci.image.manifest.v1+json")
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest]}))
    subprocess.run(["skopeo", "copy", f"oci:{layout}",
                    f"containers-storage:[overlay@{root}+{runroot}]localhost/brig-base:1"],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(layout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--brig")
    args = ap.parse_args()
    if not E2B_PYTHON.exists():
        sys.exit(f"e2b_template.py: {E2B_PYTHON} is missing: run tests/support/install-python-deps.sh")
    brig = spawn.build_brig(args.brig)
    if brig is None:
        sys.exit("e2b_template.py: brig did not build")
    if not (TEMPLATES / "base" / "rootfs").exists():
        log("building the base template (minutes, once)")
        subprocess.run([str(brig), "template", "build", "base"], check=True,
                       env=dict(os.environ, BRIG_HOME=str(TEMPLATES.parent)))
    work = Path(tempfile.mkdtemp(prefix="brig-bench-e2b-template-"))
    out_dir = REPO / "target/bench" / time.strftime("e2b_template-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    daemon = None
    results = {"e2b client (brig serve --e2b)": [], "brig template build": [], "buildah bud --layers": []}
    try:
        home = work / "home"
        home.mkdir()
        (home / "templates").symlink_to(TEMPLATES)
        ctx = context(work)
        (ctx / "Dockerfile").write_text(DOCKERFILE.format(base="base"))
        env = dict(os.environ, BRIG_HOME=str(home))
        daemon, api = start_daemon(brig, home)
        key = subprocess.run([str(brig), "keys", "e2b"], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        e2b_env = dict(os.environ, E2B_API_KEY=key, E2B_API_URL=api,
                       E2B_SANDBOX_URL="http://127.0.0.1:1")
        e2b_env.pop("E2B_DEBUG", None)
        e2b_env.pop("E2B_DOMAIN", None)
        script = work / "e2b_build.py"
        script.write_text(E2B_SCRIPT)
        brig_build = [str(brig), "template", "build", "bench-df", "-f", str(ctx / "Dockerfile"), str(ctx)]

        log("first builds (untimed): base as an image, every step once")
        timed(brig_build, env=env)
        subprocess.run([str(E2B_PYTHON), str(script), str(ctx), "bench-e2b", "0"], env=e2b_env,
                       check=True, stdout=subprocess.DEVNULL)

        buildah = shutil.which("buildah") and shutil.which("skopeo")
        broot, brun = work / "buildah-root", work / "buildah-run"
        bud = None
        if buildah:
            rootfs = (TEMPLATES / "base" / "rootfs").resolve()
            log("buildah: importing the base rootfs into its storage")
            buildah_base(work, rootfs, broot, brun)
            bctx = work / "bctx"
            shutil.copytree(ctx, bctx)
            (bctx / "Dockerfile").write_text(DOCKERFILE.format(base="localhost/brig-base:1"))
            bud = ["buildah", "--root", str(broot), "--runroot", str(brun),
                   "--storage-driver", "overlay", "bud", "--layers", "--isolation", "chroot",
                   "--pull-never", "-t", "bench-df", "-f", str(bctx / "Dockerfile"), str(bctx)]
            timed(bud)
        else:
            log("buildah or skopeo missing: its row is skipped (tests/support/install-deps.sh)")

        log(f"{args.runs} cached rebuilds each, tools in rotating order")
        for r in range(args.runs):
            order = ["e2b", "brig", "buildah"]
            order = order[r % 3:] + order[:r % 3]
            for tool in order:
                if tool == "e2b":
                    p = subprocess.run([str(E2B_PYTHON), str(script), str(ctx), "bench-e2b", "1"],
                                       env=e2b_env, capture_output=True, text=True)
                    if p.returncode != 0:
                        raise SystemExit(f"e2b_template.py: e2b build failed: {p.stderr[-2000:]}")
                    results["e2b client (brig serve --e2b)"].extend(json.loads(p.stdout))
                elif tool == "brig":
                    ms, said = timed(brig_build, env=env)
                    if said.count("(cached)") != 7:
                        raise SystemExit(f"e2b_template.py: brig build was not all cached: {said}")
                    results["brig template build"].append(ms)
                elif bud:
                    ms, said = timed(bud)
                    results["buildah bud --layers"].append(ms)
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if (work / "buildah-root").exists():
            subprocess.run(["buildah", "--root", str(work / "buildah-root"), "--runroot",
                            str(work / "buildah-run"), "--storage-driver", "overlay", "rm", "--all"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run(["umount", "-R", str(work / "buildah-root" / "overlay")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    e2b_median = statistics.median(results["e2b client (brig serve --e2b)"])
    lines = [f"cached rebuild of a 10-step template, {args.runs} runs, medians (ms)",
             f"brig: {brig}"]
    for name, samples in results.items():
        if not samples:
            lines.append(f"  {name:32s} skipped")
            continue
        m = statistics.median(samples)
        lines.append(f"  {name:32s} {m:9.1f}   ratio to e2b client {m / e2b_median:5.2f}")
    text = "\n".join(lines)
    print(text)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "samples.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
