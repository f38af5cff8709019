#!/usr/bin/python3
"""Spawn latency: brig against bubblewrap and crun, side by side in one run.

    bench/spawn.py                      # everything, 300 runs per command
    bench/spawn.py --runs 60 --rounds 2 # quick look
    bench/spawn.py --group musl         # one group

Each group starts the same program in every tool and in no sandbox at all
("bare", the floor):

    true    /bin/true (glibc: ~0.5 ms of CPUID traps per start on this VM)
            brig --template host | bwrap --ro-bind / / | crun with /usr and
            /etc bound into an otherwise empty rootfs (brig's host layout)
    musl    a static musl `int main(){return 0;}`, no glibc start-up at all,
            from a tiny rootfs directory holding only that binary, the same
            directory for every tool (plus a static busybox as bin/sh, which
            brig requires of a template): brig --template dir:R | bwrap
            --ro-bind R / | crun with rootfs R. (brig's host template shows no
            host directory we could put a binary in, hence the separate root.)
    python  /usr/bin/python3 -c pass, layouts as in `true`

brig runs with --network none: like the peers' sandboxes here, it gets a
network namespace with loopback only (bench/net.py measures brig's network).

Timing is hyperfine -N (no shell). To keep slow drifts of this noisy machine
from landing on one tool, the runs are split into rounds; every round runs
every group, each hyperfine call covers all of a group's commands, and the
command order rotates from round to round. The table pools all rounds.

crun 1.8.1 refuses to start on this hybrid cgroup v1+v2 host while
/sys/fs/cgroup/unified is mounted, so its runs (and its one-off sanity run)
happen inside `unshare -m` with that mount removed: a private mount namespace,
so the host's mount table is never touched. That wrapper is outside the timed
region; hyperfine itself runs inside it.

Raw hyperfine JSON and a summary.json land in --out (default
target/bench/spawn-<time>/). See bench/README.md for how to read the numbers.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3"  # Debian's, never a pyenv shim on PATH
CGROUP2_HYBRID = "/sys/fs/cgroup/unified"
GROUPS = ("true", "musl", "python")
TOOLS = ("bare", "brig", "bwrap", "crun")


@dataclass
class Case:
    group: str
    tool: str
    argv: list
    # Commands that must run in the private mount namespace (crun).
    private_mounts: bool = False
    times: list = field(default_factory=list)
    skipped: str = ""

    @property
    def name(self):
        return f"{self.group}/{self.tool}"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(argv, **kw):
    return subprocess.run(argv, check=True, **kw)


def in_private_mounts(argv):
    """argv run in a private mount namespace without the cgroup2 hybrid mount.

    unshare(1) makes the new namespace's mounts private by default, so the
    umount does not propagate back to the host.
    """
    script = (
        f"if mountpoint -q {CGROUP2_HYBRID}; then umount {CGROUP2_HYBRID} || exit; fi; "
        'exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def build_brig(path_override):
    if path_override:
        return Path(path_override).resolve()
    log("building brig (cargo build --release -p brig)")
    p = subprocess.run(
        ["cargo", "build", "--release", "-p", "brig", "--message-format=json-render-diagnostics"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    if p.returncode != 0:
        # The peers are still worth measuring; the brig rows say why they are empty.
        log("spawn.py: brig did not build; measuring the peers only")
        return None
    for line in p.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "brig":
            return Path(msg["executable"])
    sys.exit("spawn.py: cargo built no brig executable")


def make_fixtures(work):
    """The musl binary, the tiny rootfs, and the crun bundles, under work/."""
    fx = {}

    # Static musl `return 0`: exec cost without glibc's CPUID-heavy start-up.
    src = work / "true.c"
    src.write_text("int main(void) { return 0; }\n")
    tiny = work / "tiny-rootfs"
    for d in ("proc", "dev", "sys", "etc", "tmp"):
        (tiny / d).mkdir(parents=True)
    # brig reads the template's passwd to resolve the user; crun and bwrap
    # ignore it. Same directory for all three, so it costs them all the same.
    (tiny / "etc/passwd").write_text("root:x:0:0:root:/root:/true-musl\n")
    (tiny / "etc/group").write_text("root:x:0:\n")
    # brig accepts a dir: template only if it looks like a root filesystem,
    # which it judges by bin/sh: a static busybox, never run here.
    (tiny / "bin").mkdir()
    shutil.copy2("/bin/busybox", tiny / "bin/sh")
    run(["musl-gcc", "-static", "-O2", "-o", str(tiny / "true-musl"), str(src)])
    fx["tiny"] = tiny
    fx["musl"] = "/true-musl"

    # crun bundles. `crun spec` gives the stock config: pid, net, ipc, uts and
    # mount namespaces, /proc /dev /sys mounts, read-only root, cgroupfs.
    spec_dir = work / "spec"
    spec_dir.mkdir()
    run(["crun", "spec"], cwd=spec_dir)
    base = json.loads((spec_dir / "config.json").read_text())

    # Host layout, like brig's host template: /usr and /etc bound read-only,
    # /bin /sbin /lib* as the host has them (symlinks on merged-/usr Debian).
    host_root = work / "host-rootfs"
    host_root.mkdir()
    binds = []
    for p in ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        hp = Path("/") / p
        if hp.is_symlink():
            (host_root / p).symlink_to(os.readlink(hp))
        elif hp.is_dir():
            (host_root / p).mkdir()
            binds.append(str(hp))
    for d in ("proc", "dev", "sys", "tmp"):
        (host_root / d).mkdir()

    def bundle(name, rootfs, args, extra_mounts=()):
        b = work / f"bundle-{name}"
        b.mkdir()
        cfg = json.loads(json.dumps(base))
        cfg["process"]["terminal"] = False
        cfg["process"]["args"] = args
        cfg["root"] = {"path": str(rootfs), "readonly": True}
        cfg["mounts"] += [
            {"destination": m, "type": "bind", "source": m, "options": ["rbind", "ro", "nosuid", "nodev"]}
            for m in extra_mounts
        ]
        (b / "config.json").write_text(json.dumps(cfg, indent=1))
        return b

    fx["bundle-true"] = bundle("true", host_root, ["/bin/true"], binds)
    fx["bundle-python"] = bundle("python", host_root, [PYTHON, "-c", "pass"], binds)
    fx["bundle-musl"] = bundle("musl", tiny, [fx["musl"]])
    return fx


def make_cases(brig, fx, work, groups):
    crun_root = str(work / "crun-state")  # never collides with real containers
    bwrap = ["bwrap", "--unshare-all", "--die-with-parent"]

    def crun(group):
        return ["crun", "--root", crun_root, "run", "--bundle", str(fx[f"bundle-{group}"]), f"brig-bench-{group}"]

    cases = []
    if "true" in groups:
        cases += [
            Case("true", "bare", ["/bin/true"]),
            Case("true", "brig", [str(brig), "run", "--network", "none", "--template", "host", "--", "/bin/true"]),
            Case("true", "bwrap", bwrap + ["--ro-bind", "/", "/", "/bin/true"]),
            Case("true", "crun", crun("true"), private_mounts=True),
        ]
    if "musl" in groups:
        tiny = str(fx["tiny"])
        cases += [
            Case("musl", "bare", [tiny + fx["musl"]]),
            Case("musl", "brig", [str(brig), "run", "--network", "none", "--template", f"dir:{tiny}", "--", fx["musl"]]),
            Case("musl", "bwrap", bwrap + ["--ro-bind", tiny, "/", fx["musl"]]),
            Case("musl", "crun", crun("musl"), private_mounts=True),
        ]
    if "python" in groups:
        py = [PYTHON, "-c", "pass"]
        cases += [
            Case("python", "bare", py),
            Case("python", "brig", [str(brig), "run", "--network", "none", "--template", "host", "--"] + py),
            Case("python", "bwrap", bwrap + ["--ro-bind", "/", "/"] + py),
            Case("python", "crun", crun("python"), private_mounts=True),
        ]
    for c in cases:
        if c.tool == "brig" and brig is None:
            c.skipped = "brig did not build (cargo build --release -p brig)"
    return cases


def sanity_check(case):
    """Run the command once; a tool that cannot run is skipped, not fatal."""
    argv = in_private_mounts(case.argv) if case.private_mounts else case.argv
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        case.skipped = str(e)
        return
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        case.skipped = f"exit {p.returncode}: " + " | ".join(tail)


def hyperfine(cases, runs, warmup, json_out, private_mounts):
    argv = ["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
            "--export-json", str(json_out)]
    for c in cases:
        # hyperfine -N splits on whitespace with shell-like quoting; none of
        # our arguments contain spaces or quotes.
        argv += ["--command-name", c.name, " ".join(c.argv)]
    if private_mounts:
        argv = in_private_mounts(argv)
    # hyperfine warns about outliers on nearly every call on this machine;
    # that is what the rounds and percentiles are for, so keep its stderr for
    # failures only.
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"spawn.py: hyperfine failed for {[c.name for c in cases]}:\n{p.stderr}")
    results = json.loads(json_out.read_text())["results"]
    for c, r in zip(cases, results):
        assert r["command"] == c.name, (r["command"], c.name)
        c.times += [t * 1000 for t in r["times"]]


def pct(sorted_ms, q):
    """Linear-interpolated percentile, q in [0, 1]."""
    i = q * (len(sorted_ms) - 1)
    lo = int(i)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (i - lo)


def summarize(cases):
    out = {}
    for c in cases:
        if c.skipped or not c.times:
            out[c.name] = {"skipped": c.skipped or "no samples"}
            continue
        s = sorted(c.times)
        out[c.name] = {
            "n": len(s),
            "median_ms": statistics.median(s),
            "p10_ms": pct(s, 0.10),
            "p90_ms": pct(s, 0.90),
            "min_ms": s[0],
            "argv": c.argv,
        }
    return out


def ratio(summary, group, a, b, key):
    x, y = summary.get(f"{group}/{a}", {}), summary.get(f"{group}/{b}", {})
    if key in x and key in y and y[key] > 0:
        return x[key] / y[key]
    return None


def render(summary, groups, meta):
    lines = [
        f"spawn latency, ms ({meta['runs']} runs per command in {meta['rounds']} rounds, "
        f"warm-up {meta['warmup']} per call; load before {meta['load_before']}, after {meta['load_after']})",
        "",
        f"{'group':<8} {'tool':<6} {'n':>5} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8}",
    ]
    for g in groups:
        for t in TOOLS:
            s = summary.get(f"{g}/{t}")
            if s is None:
                continue
            if "skipped" in s:
                lines.append(f"{g:<8} {t:<6} skipped: {s['skipped']}")
                continue
            lines.append(f"{g:<8} {t:<6} {s['n']:>5} {s['median_ms']:>8.3f} {s['p10_ms']:>8.3f} "
                         f"{s['p90_ms']:>8.3f} {s['min_ms']:>8.3f}")
        parts = []
        for peer in ("bwrap", "crun"):
            m, p10 = ratio(summary, g, "brig", peer, "median_ms"), ratio(summary, g, "brig", peer, "p10_ms")
            if m is not None:
                parts.append(f"brig/{peer} {m:.2f} (p10 {p10:.2f})")
        if parts:
            lines.append(f"{'':<8} ratio  " + "   ".join(parts))
        lines.append("")
    return "\n".join(lines)


def loadavg():
    return Path("/proc/loadavg").read_text().split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300, help="runs per command, over all rounds")
    ap.add_argument("--rounds", type=int, default=5, help="split the runs into this many interleaved rounds")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up runs per command per hyperfine call")
    ap.add_argument("--group", action="append", choices=GROUPS, help="only these groups (repeatable)")
    ap.add_argument("--brig", help="use this brig binary instead of building target/release/brig")
    ap.add_argument("--out", type=Path, help="where to keep raw JSON (default target/bench/spawn-<time>)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("spawn.py: run as root (crun and the private mount namespace need it)")
    for tool in ("hyperfine", "bwrap", "crun", "musl-gcc", "unshare", "busybox"):
        if not shutil.which(tool):
            sys.exit(f"spawn.py: {tool} not found; run tests/support/install-deps.sh")

    groups = args.group or list(GROUPS)
    out = args.out or REPO / "target/bench" / time.strftime("spawn-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    brig = build_brig(args.brig)
    work = Path(tempfile.mkdtemp(prefix="brig-bench-"))
    try:
        fx = make_fixtures(work)
        cases = make_cases(brig, fx, work, groups)
        for c in cases:
            if not c.skipped:
                sanity_check(c)
            if c.skipped:
                log(f"skipping {c.name}: {c.skipped}")
        live = [c for c in cases if not c.skipped]

        per_round = max(1, args.runs // args.rounds)
        load_before = loadavg()
        log(f"{len(live)} commands, {args.rounds} rounds of {per_round} runs; raw results in {out}")
        for r in range(args.rounds):
            for g in groups:
                for private in (False, True):
                    batch = [c for c in live if c.group == g and c.private_mounts == private]
                    if not batch:
                        continue
                    k = r % len(batch)
                    batch = batch[k:] + batch[:k]
                    log(f"round {r + 1}/{args.rounds}: {', '.join(c.name for c in batch)}")
                    tag = "crun" if private else "host"
                    hyperfine(batch, per_round, args.warmup, out / f"r{r}-{g}-{tag}.json", private)

        meta = {"runs": per_round * args.rounds, "rounds": args.rounds, "warmup": args.warmup,
                "load_before": load_before, "load_after": loadavg(),
                "kernel": os.uname().release, "brig": str(brig) if brig else None}
        summary = summarize(cases)
        (out / "summary.json").write_text(json.dumps({"meta": meta, "results": summary}, indent=1))
        table = render(summary, groups, meta)
        (out / "summary.txt").write_text(table + "\n")
        print(table)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
