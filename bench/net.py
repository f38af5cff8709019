#!/usr/bin/python3
"""brig's sandbox network against a plain veth pair, side by side in one run.

    bench/net.py                 # everything, about a minute after the build
    bench/net.py --quick         # fewer runs
    bench/net.py --part conn     # one part (spawn, conn, bulk, create, inject; repeatable)

Everything happens in network namespaces the bench makes and removes (no
packet leaves them):

    brigb-host  (brig and its gateway run here: "the host")  198.51.100.1
       |  veth, forwarding on in brigb-host only
    brigb-world 203.0.113.10: a TCP server (one byte answered per connection;
                and a sink that answers with the byte count at EOF)
    brigb-plain 10.99.0.2: the peer, a namespace linked to brigb-host by a
                plain veth pair, routed, no policy, no proxy

Parts:

  spawn   `brig run -- /bin/true` with its default network (a gateway of its
          own, the sandbox linked to it, policy public) against
          `brig run --network none`, and against the peer: a script making a
          namespace with a veth pair with iproute2 (`ip netns add`, `ip link
          add … veth`, addresses, routes), running /bin/true in it with
          `ip netns exec` and deleting it. hyperfine -N.
  conn    connection set-up: N sequential connections from inside a sandbox
          (brig run, policy public) and from brigb-plain, each connect, send 1
          byte, read the answer, close; the same Python client on both sides.
          Target: at most 1 ms added per connection.
  bulk    one connection sending --bulk-mib MiB to the sink, both ways.
          Target: brig at least 80% of the plain veth's throughput.
  create  `brig serve` in brigb-host: POST /v1/sandboxes from its pool with
          network none and with public (both are linked to the gateway; the
          policy is set at claim), each after an idle gap so the pool has
          refilled; and, with --pool host=0, from scratch (the link is made per
          create).

  inject  HTTPS to a TLS server in the world, one connection per request:
          through the injecting proxy (`brig create --inject`: the sandbox's TLS
          ended with its CA, a header set from a secret, a new TLS connection to
          the server) against a plain TLS connection from brigb-plain; and a
          32 MiB download both ways.

Summary in --out (default target/bench/net-<time>/summary.txt and .json).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (build_brig, log)

REPO = Path(__file__).resolve().parent.parent
HOST_NS, WORLD_NS, PLAIN_NS = "brigb-host", "brigb-world", "brigb-plain"
SERVER = "203.0.113.10"
RTT_PORT, SINK_PORT = 7000, 7001

SERVER_CODE = textwrap.dedent(f"""
    import socket, threading
    def rtt():
        s = socket.create_server(("{SERVER}", {RTT_PORT}), backlog=512)
        while True:
            c, _ = s.accept()
            c.recv(1); c.sendall(b"y"); c.close()
    def sink_one(c):
        n = 0
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            n += len(b)
        c.sendall(str(n).encode()); c.close()
    def sink():
        s = socket.create_server(("{SERVER}", {SINK_PORT}), backlog=16)
        while True:
            c, _ = s.accept()
            threading.Thread(target=sink_one, args=(c,), daemon=True).start()
    threading.Thread(target=rtt, daemon=True).start()
    sink()
""")

CLIENT_CODE = textwrap.dedent(f"""
    import json, socket, sys, time
    mode, n = sys.argv[1], int(sys.argv[2])
    if mode == "conn":
        out = []
        for _ in range(n):
            t = time.perf_counter()
            s = socket.create_connection(("{SERVER}", {RTT_PORT}))
            s.sendall(b"x")
            assert s.recv(1) == b"y"
            s.close()
            out.append((time.perf_counter() - t) * 1000)
        print(json.dumps(out))
    else:
        buf = b"\\0" * (1 << 20)
        t = time.perf_counter()
        s = socket.create_connection(("{SERVER}", {SINK_PORT}))
        for _ in range(n):
            s.sendall(buf)
        s.shutdown(socket.SHUT_WR)
        got = int(s.recv(64))
        secs = time.perf_counter() - t
        assert got == n << 20, got
        print(json.dumps([n / secs]))
""")

PEER_SPAWN = textwrap.dedent("""
    set -e
    ns=brigb-p$$
    ip netns add $ns
    ip link add vp$$ type veth peer name eth0 netns $ns
    ip -n $ns addr add 10.98.0.2/32 dev eth0
    ip -n $ns link set lo up
    ip -n $ns link set eth0 up
    ip -n $ns route add default dev eth0
    nsenter --net=/run/netns/$ns /bin/true
    ip netns del $ns
""")


def in_ns(ns, argv):
    """argv in network namespace `ns` and nothing else (`ip netns exec` would
    also remount /sys, hiding the cgroup mounts brig needs)."""
    return ["nsenter", f"--net=/run/netns/{ns}", *argv]


def ns_run(ns, argv, **kw):
    return subprocess.run(in_ns(ns, argv), check=True, **kw)


def ip(ns, script):
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input=script, text=True, check=True)


def build_world():
    teardown_world()
    for ns in (HOST_NS, WORLD_NS, PLAIN_NS):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    ip(HOST_NS, textwrap.dedent(f"""\
        link set lo up
        link add up0 type veth peer name down0 netns {WORLD_NS}
        addr add 198.51.100.1/24 dev up0
        link set up0 up
        route add 203.0.113.0/24 via 198.51.100.2
        link add pl0 type veth peer name eth0 netns {PLAIN_NS}
        addr add 10.99.0.1/24 dev pl0
        link set pl0 up
        """))
    ip(WORLD_NS, textwrap.dedent(f"""\
        link set lo up
        addr add 198.51.100.2/24 dev down0
        link set down0 up
        addr add {SERVER}/32 dev lo
        route add default via 198.51.100.1
        """))
    ip(PLAIN_NS, textwrap.dedent("""\
        link set lo up
        addr add 10.99.0.2/24 dev eth0
        link set eth0 up
        route add default via 10.99.0.1
        """))
    ns_run(HOST_NS, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    server = subprocess.Popen(in_ns(WORLD_NS, [sys.executable, "-c", SERVER_CODE]))
    # Listening before anyone connects.
    for _ in range(100):
        r = subprocess.run(in_ns(PLAIN_NS, [sys.executable, "-c",
                                            f"import socket; socket.create_connection(('{SERVER}', {RTT_PORT}), 1)"]),
                           capture_output=True)
        if r.returncode == 0:
            return server
        time.sleep(0.05)
    raise SystemExit("net.py: the world's server did not start")


def teardown_world():
    for ns in (HOST_NS, WORLD_NS, PLAIN_NS):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def stats(ms):
    ms = sorted(ms)
    return {"n": len(ms), "median": statistics.median(ms), "p10": spawn.pct(ms, 0.1),
            "p90": spawn.pct(ms, 0.9)}


def client_in_brig(brig, mode, n):
    p = ns_run(HOST_NS, [str(brig), "run", "--template", "host", "--dns-upstream", "203.0.113.53",
                         "--", "/usr/bin/python3", "-c", CLIENT_CODE, mode, str(n)],
               capture_output=True, text=True)
    return json.loads(p.stdout)


def client_in_plain(mode, n):
    p = ns_run(PLAIN_NS, ["/usr/bin/python3", "-c", CLIENT_CODE, mode, str(n)],
               capture_output=True, text=True)
    return json.loads(p.stdout)


def part_spawn(brig, args, out, summary):
    runs = args.runs
    # hyperfine -N splits on whitespace: the peer is a script file.
    script = out / "peer-spawn.sh"
    script.write_text(PEER_SPAWN)
    cmds = [
        ("brig public", " ".join(in_ns(HOST_NS, [str(brig), "run", "--template", "host", "--", "/bin/true"]))),
        ("brig none", " ".join(in_ns(HOST_NS, [str(brig), "run", "--network", "none", "--template", "host", "--",
                                               "/bin/true"]))),
        ("peer netns+veth", " ".join(in_ns(HOST_NS, ["sh", str(script)]))),
    ]
    argv = ["hyperfine", "-N", "--style", "none", "--warmup", "5", "--runs", str(runs),
            "--export-json", str(out / "spawn.json")]
    for name, cmd in cmds:
        argv += ["--command-name", name, cmd]
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = json.loads((out / "spawn.json").read_text())["results"]
    rows = {r["command"]: stats([t * 1000 for t in r["times"]]) for r in results}
    summary["spawn"] = rows
    pub, none, peer = rows["brig public"], rows["brig none"], rows["peer netns+veth"]
    lines = ["spawn (ms)             n   median     p10     p90"]
    for name, r in rows.items():
        lines.append(f"  {name:18} {r['n']:4} {r['median']:8.2f} {r['p10']:7.2f} {r['p90']:7.2f}")
    lines.append(f"  network added by brig: {pub['median'] - none['median']:.2f} ms; "
                 f"brig public / peer netns+veth: {pub['median'] / peer['median']:.2f}")
    return lines


def part_conn(brig, args, out, summary):
    n = args.conns
    brig_ms, plain_ms = [], []
    for r in range(args.rounds):
        order = [("brig", brig_ms), ("plain", plain_ms)]
        if r % 2:
            order.reverse()
        for who, acc in order:
            acc += client_in_brig(brig, "conn", n) if who == "brig" else client_in_plain("conn", n)
    b, p = stats(brig_ms), stats(plain_ms)
    summary["conn"] = {"brig": b, "plain": p}
    added = b["median"] - p["median"]
    return [
        "connection set-up (ms)  n   median     p10     p90",
        f"  brig (proxy)       {b['n']:5} {b['median']:8.3f} {b['p10']:7.3f} {b['p90']:7.3f}",
        f"  plain veth         {p['n']:5} {p['median']:8.3f} {p['p10']:7.3f} {p['p90']:7.3f}",
        f"  added by brig: {added:.3f} ms per connection (target <= 1 ms: "
        f"{'met' if added <= 1.0 else 'MISSED'})",
    ]


def part_bulk(brig, args, out, summary):
    brig_r, plain_r = [], []
    for r in range(args.rounds * 2):
        order = [("brig", brig_r), ("plain", plain_r)]
        if r % 2:
            order.reverse()
        for who, acc in order:
            acc += (client_in_brig(brig, "bulk", args.bulk_mib) if who == "brig"
                    else client_in_plain("bulk", args.bulk_mib))
    b, p = statistics.median(brig_r), statistics.median(plain_r)
    summary["bulk"] = {"brig_mib_s": brig_r, "plain_mib_s": plain_r}
    ratio = b / p
    return [
        f"bulk throughput ({args.bulk_mib} MiB per run, MiB/s, median of {len(brig_r)})",
        f"  brig (proxy)  {b:8.0f}",
        f"  plain veth    {p:8.0f}",
        f"  brig / plain: {ratio:.2f} (target >= 0.80: {'met' if ratio >= 0.8 else 'MISSED'})",
    ]


class Daemon:
    """`brig serve` in brigb-host on a free port with a temp home; a
    context manager that stops it and removes the home."""

    def __init__(self, brig, serve_args, extra_env=None):
        self.home = Path(tempfile.mkdtemp(prefix="brigb-home-"))
        env = dict(os.environ, BRIG_HOME=str(self.home), BRIG_AGENT=str(brig.parent / "brig-agent"),
                   **(extra_env or {}))
        self.proc = subprocess.Popen(in_ns(HOST_NS, [str(brig), "serve", "--listen", "127.0.0.1:0", *serve_args]),
                                     env=env, stderr=subprocess.PIPE, text=True)
        self.url = None
        for line in self.proc.stderr:
            if line.startswith("brig: listening on "):
                self.url = line.split()[-1]
                break
        if self.url is None:
            self.close()
            raise SystemExit("net.py: brig serve did not start")
        self.key = (self.home / "local.key").read_text().strip()
        # The CLI against it.
        self.cli_env = dict(os.environ, BRIG_HOME=str(self.home), BRIG_URL=self.url)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", str(self.home)])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def part_create(brig, args, out, summary):
    lines = ["daemon create (ms)           n   median     p10     p90"]
    summary["create"] = {}
    for pool, label in (("host=2", "from the pool"), ("host=0", "from scratch")):
        with Daemon(brig, ["--pool", pool, "--dns-upstream", "203.0.113.53"]) as daemon:
            url, key = daemon.url, daemon.key
            # The daemon listens in brigb-host: the requests go from there too.
            caller = textwrap.dedent(f"""
                import json, sys, time, urllib.request
                url, key, mode, n, gap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
                def call(method, path, body=None):
                    req = urllib.request.Request(url + path, method=method,
                        data=json.dumps(body).encode() if body is not None else None,
                        headers={{"Authorization": "Bearer " + key, "Content-Type": "application/json"}})
                    with urllib.request.urlopen(req) as r:
                        return json.loads(r.read() or b"null")
                out = []
                for _ in range(n):
                    time.sleep(gap)
                    t = time.perf_counter()
                    sb = call("POST", "/v1/sandboxes", {{"template": "host", "network": {{"mode": mode}}}})
                    out.append((time.perf_counter() - t) * 1000)
                    call("DELETE", "/v1/sandboxes/" + sb["id"])
                print(json.dumps(out))
            """)
            for mode in ("none", "public"):
                p = ns_run(HOST_NS, [sys.executable, "-c", caller, url, key, mode, str(args.creates),
                                     str(args.gap_ms / 1000)], capture_output=True, text=True)
                r = stats(json.loads(p.stdout))
                summary["create"][f"{label} {mode}"] = r
                lines.append(f"  {label:13} {mode:7} {r['n']:4} {r['median']:8.2f} {r['p10']:7.2f} {r['p90']:7.2f}")
    # The peer: a namespace and a veth pair made with iproute2 (what a
    # network set-up costs with the standard tools), timed the same way.
    script = out / "peer-create.sh"
    script.write_text(PEER_SPAWN)
    peer = []
    for _ in range(args.creates):
        t = time.perf_counter()
        ns_run(HOST_NS, ["sh", str(script)])
        peer.append((time.perf_counter() - t) * 1000)
    r = stats(peer)
    summary["create"]["peer netns+veth"] = r
    lines.append(f"  peer netns+veth (iproute2) {r['n']:4} {r['median']:8.2f} {r['p10']:7.2f} {r['p90']:7.2f}")
    return lines


TLS_PORT = 8443
TLS_SERVER = textwrap.dedent(f"""
    import http.server, ssl, sys
    big = b"x" * (32 << 20)
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_GET(self):
            body = big if self.path == "/big" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("{SERVER}", {TLS_PORT}), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()
""")

TLS_CLIENT = textwrap.dedent(f"""
    import json, os, socket, ssl, sys, time
    mode, n, cafile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = ssl.create_default_context(cafile=cafile)
    def get(path):
        s = ctx.wrap_socket(socket.create_connection(("{SERVER}", {TLS_PORT})), server_hostname="api.test")
        s.sendall(f"GET {{path}} HTTP/1.1\\r\\nHost: api.test\\r\\nConnection: close\\r\\n\\r\\n".encode())
        got = 0
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
        s.close()
        return got
    out = []
    for _ in range(n):
        t = time.perf_counter()
        got = get("/big" if mode == "bulk" else "/small")
        secs = time.perf_counter() - t
        assert got > (32 << 20 if mode == "bulk" else 0), f"only {{got}} bytes came back"
        out.append(got / (1 << 20) / secs if mode == "bulk" else secs * 1000)
    print(json.dumps(out))
""")


def part_inject(brig, args, out, summary):
    """HTTPS through the header-injecting proxy (TLS ended with the
    sandbox's CA, a header set from a secret) against a plain TLS
    connection over the plain veth, to a TLS server in the world."""
    # A CA of the bench's, and the server's certificate signed by it.
    ca, ca_key = out / "ca.crt", out / "ca.key"
    cert, key, csr, ext = out / "api.crt", out / "api.key", out / "api.csr", out / "api.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subprocess.run(["openssl", "req", "-x509", *ec, "-subj", "/CN=brig bench CA",
                    "-keyout", str(ca_key), "-out", str(ca), "-days", "1"], check=True, capture_output=True)
    subprocess.run(["openssl", "req", *ec, "-subj", "/CN=api.test", "-keyout", str(key), "-out", str(csr)],
                   check=True, capture_output=True)
    ext.write_text("subjectAltName=DNS:api.test\nbasicConstraints=CA:FALSE\n")
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                    "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext)],
                   check=True, capture_output=True)
    server = subprocess.Popen(in_ns(WORLD_NS, [sys.executable, "-c", TLS_SERVER, str(cert), str(key)]))
    daemon = Daemon(brig, ["--pool", "host=0"], {"SSL_CERT_FILE": str(ca)})
    lines = []
    try:
        cli = daemon.cli_env
        subprocess.run(in_ns(HOST_NS, [str(brig), "secrets", "set", "k"]), input="bench-secret", text=True,
                       env=cli, check=True, capture_output=True)
        sb = subprocess.run(in_ns(HOST_NS, [str(brig), "create", "--inject", "api.test:X-Key=${secrets.k}",
                                            "--add-host", f"api.test:{SERVER}"]),
                            env=cli, check=True, capture_output=True, text=True).stdout.strip()
        n = max(20, args.conns // 5)

        def in_brig(mode, count):
            p = subprocess.run(in_ns(HOST_NS, [str(brig), "exec", sb, "--", "python3", "-c", TLS_CLIENT, mode,
                                               str(count), "/run/brig-ca-bundle.crt"]),
                               env=cli, capture_output=True, text=True, check=True)
            return json.loads(p.stdout)

        def in_plain(mode, count):
            p = ns_run(PLAIN_NS, [sys.executable, "-c", TLS_CLIENT, mode, str(count), str(ca)],
                       capture_output=True, text=True)
            return json.loads(p.stdout)

        for _ in range(50):
            try:
                in_plain("conn", 1)
                break
            except (subprocess.CalledProcessError, json.JSONDecodeError):
                time.sleep(0.1)
        conn_b, conn_p, bulk_b, bulk_p = [], [], [], []
        for r in range(args.rounds):
            for who in (("brig", "plain") if r % 2 == 0 else ("plain", "brig")):
                if who == "brig":
                    conn_b += in_brig("conn", n)
                    bulk_b += in_brig("bulk", 2)
                else:
                    conn_p += in_plain("conn", n)
                    bulk_p += in_plain("bulk", 2)
        cb, cp = stats(conn_b), stats(conn_p)
        bb, bp = statistics.median(bulk_b), statistics.median(bulk_p)
        summary["inject"] = {"conn_brig": cb, "conn_plain": cp, "bulk_brig": bulk_b, "bulk_plain": bulk_p}
        lines = [
            "HTTPS through the injecting proxy (ms per connection + request)   n   median     p10     p90",
            f"  brig (TLS ended, header set)      {cb['n']:5} {cb['median']:8.2f} {cb['p10']:7.2f} {cb['p90']:7.2f}",
            f"  plain TLS over a plain veth       {cp['n']:5} {cp['median']:8.2f} {cp['p10']:7.2f} {cp['p90']:7.2f}",
            f"  added by brig: {cb['median'] - cp['median']:.2f} ms per connection",
            f"  32 MiB download (MiB/s, median of {len(bulk_b)}): brig {bb:.0f}, plain {bp:.0f}, ratio {bb / bp:.2f}",
        ]
    finally:
        daemon.close()
        server.kill()
        server.wait()
    return lines


PARTS = {"spawn": part_spawn, "conn": part_conn, "bulk": part_bulk, "create": part_create,
         "inject": part_inject}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", choices=list(PARTS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=100, help="spawn runs per command")
    ap.add_argument("--conns", type=int, default=300, help="connections per client run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bulk-mib", type=int, default=512)
    ap.add_argument("--creates", type=int, default=50)
    ap.add_argument("--gap-ms", type=int, default=100)
    ap.add_argument("--brig")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.conns, args.rounds, args.bulk_mib, args.creates = 30, 100, 1, 128, 15
    if os.geteuid() != 0:
        raise SystemExit("net.py: run as root (it makes network namespaces)")
    brig = spawn.build_brig(args.brig)
    if brig is None:
        raise SystemExit("net.py: brig did not build")
    out = Path(args.out or REPO / "target/bench" / time.strftime("net-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    server = build_world()
    summary, lines = {}, []
    try:
        for name in args.part or list(PARTS):
            spawn.log(f"net.py: {name}")
            lines += PARTS[name](brig, args, out, summary) + [""]
    finally:
        server.kill()
        server.wait()
        teardown_world()
    text = "\n".join(lines)
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
