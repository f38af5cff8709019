#!/usr/bin/python3
"""brig as an MCP server: a trivial tool call's round trip, next to the native API, in one run.

    bench/mcp.py                  # about a minute after the build
    bench/mcp.py --quick          # fewer iterations
    bench/mcp.py --brig PATH      # a brig already built (brig-agent next to it)

One `brig serve --mcp` (release build, free port, temp home), one sandbox of
the `host` template made beforehand, and the same operation — `sh -c 'echo
hi'` in that sandbox, to its exit — timed from the client, one after the
other, over:

  native      POST /v1/sandboxes/ID/exec, NDJSON read to `exited` (one
              keep-alive connection, Python's http.client)
  native-cwd  the same with "cwd": "/root": what run_command asks of the
              agent (it runs commands in the user's home), so that the
              difference to it is the MCP layer's alone
  mcp-http    tools/call run_command {"command": "echo hi", "sandbox_id": ID}
              to /mcp in an initialized session (streamable HTTP: the
              answer is an SSE stream read to the result; one keep-alive
              connection, http.client): a raw JSON-RPC client, so what is
              timed is brig's side, not an SDK's
  mcp-stdio   the same JSON-RPC line written to `brig mcp`'s stdin and its
              answer read from its stdout (`brig mcp` relays to the daemon)
  sdk-http    the official MCP Python SDK's ClientSession.call_tool over
  sdk-stdio   streamable HTTP and stdio (tests' mcp-venv), for reference:
              what the SDK itself adds

Rounds rotate the order of the transports. Target: MCP adds at most 1 ms to
the native round trip (p50 of mcp-http and mcp-stdio minus native).
Samples and summary.json go to --out (default target/bench/mcp-<time>/).
"""

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("BRIG_TEST_CACHE", Path.home() / ".cache/brig-test"))
MCP_PYTHON = CACHE / "mcp-venv/bin/python"
TARGET_ADDED_MS = 1.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build(override):
    if override:
        return Path(override).resolve()
    log("building brig (release)")
    p = subprocess.run(["cargo", "build", "--release", "-p", "brig", "-p", "brig-agent", "--bins",
                        "--message-format=json-render-diagnostics"],
                       cwd=REPO, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("cargo build failed")
    for line in p.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "brig":
            return Path(msg["executable"])
    sys.exit("no brig binary in cargo's output")


def pct(s, p):
    s = sorted(s)
    return s[round((len(s) - 1) * p)]


class Daemon:
    def __init__(self, brig, home):
        self.log_path = home.parent / "daemon.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(brig), "serve", "--mcp", "--mcp-template", "host", "--home", str(home),
             "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        self.url = None
        while self.url is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"brig serve did not start: {self.log_path.read_text()}")
            for line in self.log_path.read_text().splitlines():
                if line.startswith("brig: mcp on "):
                    self.url = line.split()[-1].rsplit("/mcp", 1)[0]
            time.sleep(0.05)
        self.key = (home / "local.key").read_text().strip()
        host, port = self.url.removeprefix("http://").split(":")
        self.addr = (host, int(port))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.log.close()


def native_exec(conn, key, sid, cwd=None):
    body = json.dumps({"argv": ["sh", "-c", "echo hi"], **({"cwd": cwd} if cwd else {})})
    conn.request("POST", f"/v1/sandboxes/{sid}/exec", body,
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.read().decode()
    if '"exited"' not in out or "aGkK" not in out:
        raise RuntimeError(f"native exec: {out}")


class McpHttp:
    """A raw JSON-RPC client of /mcp: one initialized session."""

    def __init__(self, addr, key):
        self.conn = http.client.HTTPConnection(*addr)
        self.key, self.session, self.next_id = key, None, 1
        r = self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench", "version": "1"}})
        assert r["result"]["serverInfo"]["name"] == "brig", r
        self.notify("notifications/initialized")

    def headers(self):
        h = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
            h["MCP-Protocol-Version"] = "2025-11-25"
        return h

    def notify(self, method):
        self.conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": method}),
                          self.headers())
        self.conn.getresponse().read()

    def call(self, method, params):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        self.conn.request("POST", "/mcp", json.dumps(msg), self.headers())
        r = self.conn.getresponse()
        self.session = r.getheader("mcp-session-id") or self.session
        if r.getheader("content-type", "").startswith("application/json"):
            return json.loads(r.read())
        # SSE: read events until the one answering this id.
        answer = None
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data = line[5:].strip()
                if data:
                    v = json.loads(data)
                    if v.get("id") == msg["id"]:
                        answer = v
        if answer is None:
            raise RuntimeError("no answer in the SSE stream")
        return answer


def check_echo(answer, what):
    sc = answer.get("result", {}).get("structuredContent", {})
    if sc.get("stdout") != "hi\n" or sc.get("exit_code") != 0:
        raise RuntimeError(f"{what}: {answer}")


class McpStdio:
    def __init__(self, brig, home):
        self.proc = subprocess.Popen([str(brig), "mcp"], env={**os.environ, "BRIG_HOME": str(home)},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.next_id = 1
        r = self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench", "version": "1"}})
        assert r["result"]["serverInfo"]["name"] == "brig", r
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")

    def call(self, method, params):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        self.proc.stdin.write(json.dumps(msg) + "\n")
        while True:
            v = json.loads(self.proc.stdout.readline())
            if v.get("id") == msg["id"]:
                return v

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


SDK_CLIENT = r'''
import json, sys, time, anyio, os
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
mode, target, key, sid, n, warmup = sys.argv[1:7]
n, warmup = int(n), int(warmup)
async def timed(s):
    await s.initialize()
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = await s.call_tool("run_command", {"command": "echo hi", "sandbox_id": sid})
        dt = (time.perf_counter() - t0) * 1000
        assert r.structured_content["stdout"] == "hi\n", r
        if i >= warmup:
            out.append(dt)
    print(json.dumps(out))
async def main():
    if mode == "http":
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as hc:
            async with streamable_http_client(target + "/mcp", http_client=hc) as (r, w):
                async with ClientSession(r, w) as s:
                    await timed(s)
    else:
        params = StdioServerParameters(command=target, args=["mcp"], env=dict(os.environ))
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await timed(s)
anyio.run(main)
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brig")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    n = 40 if args.quick else 200
    warmup = 10
    brig = build(args.brig)
    out = Path(args.out or REPO / f"target/bench/mcp-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="brig-bench-mcp-"))
    home = tmp / "home"
    home.mkdir()
    d = Daemon(brig, home)
    samples = {k: [] for k in ("native", "native-cwd", "mcp-http", "mcp-stdio", "sdk-http",
                               "sdk-stdio")}
    try:
        conn = http.client.HTTPConnection(*d.addr)
        conn.request("POST", "/v1/sandboxes", json.dumps({"template": "host", "timeout": "1h"}),
                     {"Authorization": f"Bearer {d.key}", "Content-Type": "application/json"})
        sid = json.loads(conn.getresponse().read())["id"]
        mh = McpHttp(d.addr, d.key)
        ms = McpStdio(brig, home)
        call = lambda c: c.call("tools/call", {"name": "run_command",
                                               "arguments": {"command": "echo hi", "sandbox_id": sid}})
        ops = {
            "native": lambda: native_exec(conn, d.key, sid),
            "native-cwd": lambda: native_exec(conn, d.key, sid, "/root"),
            "mcp-http": lambda: check_echo(call(mh), "mcp-http"),
            "mcp-stdio": lambda: check_echo(call(ms), "mcp-stdio"),
        }
        per_round = max(1, n // args.rounds)
        for name, op in ops.items():
            for _ in range(warmup):
                op()
        order = list(ops)
        for rnd in range(args.rounds):
            for name in order[rnd % len(order):] + order[:rnd % len(order)]:
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    ops[name]()
                    samples[name].append((time.perf_counter() - t0) * 1000)
        ms.close()
        if MCP_PYTHON.exists():
            env = {**os.environ, "BRIG_HOME": str(home)}
            for mode, target in (("http", d.url), ("stdio", str(brig))):
                p = subprocess.run([str(MCP_PYTHON), "-c", SDK_CLIENT, mode, target, d.key, sid,
                                    str(n), str(warmup)], env=env, stdout=subprocess.PIPE, text=True)
                if p.returncode == 0:
                    samples[f"sdk-{mode}"] = json.loads(p.stdout.strip().splitlines()[-1])
                else:
                    log(f"sdk-{mode} failed")
        else:
            log(f"{MCP_PYTHON} missing (tests/support/install-python-deps.sh): no sdk-* rows")
    finally:
        d.stop()
    (out / "samples.json").write_text(json.dumps(samples))
    native = pct(samples["native"], 0.5)
    summary = {}
    print(f"{'transport':<10} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'min ms':>8} {'vs native':>10} {'added ms':>9}")
    for name, s in samples.items():
        if not s:
            continue
        p50 = pct(s, 0.5)
        summary[name] = {"n": len(s), "p50_ms": p50, "p90_ms": pct(s, 0.9), "min_ms": min(s),
                         "mean_ms": statistics.fmean(s), "ratio": p50 / native, "added_ms": p50 - native}
        print(f"{name:<10} {len(s):>5} {p50:>8.3f} {pct(s, 0.9):>8.3f} {min(s):>8.3f} "
              f"{p50 / native:>9.2f}x {p50 - native:>9.3f}")
    same = summary["native-cwd"]["p50_ms"]
    for name in ("mcp-http", "mcp-stdio"):
        added = summary[name]["added_ms"]
        verdict = "met" if added <= TARGET_ADDED_MS else "MISSED"
        print(f"target: {name} adds <= {TARGET_ADDED_MS} ms to the native exec: {added:.3f} ms, {verdict}"
              f" ({summary[name]['p50_ms'] - same:.3f} ms over native-cwd, the same request to the agent)")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"samples in {out}")


if __name__ == "__main__":
    main()
