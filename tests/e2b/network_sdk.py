"""E2B's network options through the official Python client, against
`brig serve --e2b` in the test world of crates/cli/tests/network.rs (no
packet leaves it): allow_internet_access, network allow_out / deny_out
with E2B's semantics (an allow entry beats a deny entry; domains need
ALL_TRAFFIC denied), update_network replacing the whole configuration,
get_info showing it, allow_public_traffic's token and mask_request_host on
the data plane, and what brig refuses rather than ignores.

argv: the world's ALLOWED, OTHER, PRIVATE, METADATA and SOCKS addresses.
"""

import sys
import urllib.error
import urllib.request

from e2b import Sandbox, Secret
from e2b.sandbox.network import ALL_TRAFFIC
from e2b.exceptions import SandboxException
from sdk_checks import check, raises, summary

ALLOWED, OTHER, PRIVATE, METADATA, SOCKS = sys.argv[1:6]
TEMPLATE = "host"
DATA_URL = __import__("os").environ["E2B_SANDBOX_URL"]

FETCH = """
import sys, urllib.request
for u in sys.argv[1:]:
    try:
        print(u, urllib.request.urlopen(u, timeout=5).read().decode().replace('\\r', '').replace('\\n', '|'))
    except Exception as e:
        print(u, 'ERR', type(e).__name__)
"""


def fetch(sbx, *urls):
    """URL -> body, or None if the sandbox could not fetch it."""
    out = sbx.commands.run(
        "python3 -c " + shlex_quote(FETCH) + " " + " ".join(urls), timeout=60
    ).stdout
    got = {}
    for line in out.splitlines():
        url, _, rest = line.partition(" ")
        got[url] = None if rest.startswith("ERR") else rest
    return got


def shlex_quote(s):
    import shlex

    return shlex.quote(s)


def reaches(sbx, url):
    return fetch(sbx, url).get(url) is not None


# The default: the internet, never private ranges or metadata.
sbx = Sandbox.create(TEMPLATE)
got = fetch(
    sbx,
    "http://allowed.test/",
    f"http://{OTHER}/",
    f"http://{PRIVATE}/",
    f"http://{METADATA}/",
)
check(
    "default: a name is reached",
    got["http://allowed.test/"] == f"hello from {ALLOWED}:80",
    got,
)
check("default: an address is reached", got[f"http://{OTHER}/"] is not None, got)
check("default: a private range is not", got[f"http://{PRIVATE}/"] is None, got)
check("default: metadata is not", got[f"http://{METADATA}/"] is None, got)
info = sbx.get_info()
check("default: get_info allow_internet_access unset", info.allow_internet_access is None, info)
sbx.kill()

# allow_internet_access=False: nothing; get_info says so.
sbx = Sandbox.create(TEMPLATE, allow_internet_access=False)
check("internet off: nothing reached", not reaches(sbx, "http://allowed.test/"))
check(
    "internet off: get_info",
    sbx.get_info().allow_internet_access is False,
    sbx.get_info(),
)

# update_network({}) restores default-allow (a full replace).
sbx.update_network({})
check("update {}: open again", reaches(sbx, f"http://{ALLOWED}/"))
# Deny one address: the rest stays open; get_info shows what was sent.
sbx.update_network({"deny_out": [ALLOWED]})
check("update deny: denied address", not reaches(sbx, f"http://{ALLOWED}/"))
check("update deny: others open", reaches(sbx, f"http://{OTHER}/"))
net = sbx.get_info().network or {}
check("update deny: get_info network", net.get("deny_out") == [ALLOWED], net)
check(
    "update: allow_internet_access kept as created (E2B's own behaviour)",
    sbx.get_info().allow_internet_access is False,
)
# Deny everything with one exception, live.
sbx.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": [OTHER]})
got = fetch(sbx, f"http://{OTHER}/", f"http://{ALLOWED}/")
check("update deny-all + allow: the exception", got[f"http://{OTHER}/"] is not None, got)
check("update deny-all + allow: the rest", got[f"http://{ALLOWED}/"] is None, got)
# A bad update is refused and changes nothing.
raises(
    "update: domain without ALL_TRAFFIC refused",
    (SandboxException, Exception),
    lambda: sbx.update_network({"allow_out": ["allowed.test"]}),
)
check("update refused: policy unchanged", reaches(sbx, f"http://{OTHER}/"))
sbx.kill()

# An allow entry beats a deny entry (E2B's order).
sbx = Sandbox.create(
    TEMPLATE,
    network={"deny_out": ["203.0.113.0/24"], "allow_out": [ALLOWED]},
)
got = fetch(sbx, f"http://{ALLOWED}/", f"http://{OTHER}/")
check("allow beats deny: the allowed address", got[f"http://{ALLOWED}/"] is not None, got)
check("allow beats deny: the rest of the range", got[f"http://{OTHER}/"] is None, got)
sbx.kill()

# Domains: only with ALL_TRAFFIC denied; by name only, never the bare IP.
sbx = Sandbox.create(
    TEMPLATE, network={"deny_out": [ALL_TRAFFIC], "allow_out": ["allowed.test"]}
)
got = fetch(sbx, "http://allowed.test/", "http://other.test/", f"http://{ALLOWED}/")
check("domain: allowed name", got["http://allowed.test/"] == f"hello from {ALLOWED}:80", got)
check("domain: other name", got["http://other.test/"] is None, got)
check("domain: its IP literal", got[f"http://{ALLOWED}/"] is None, got)
net = sbx.get_info().network or {}
check("domain: get_info echoes it", net.get("allow_out") == ["allowed.test"], net)
sbx.kill()

sbx = Sandbox.create(TEMPLATE, network={"deny_out": [ALL_TRAFFIC], "allow_out": ["*"]})
got = fetch(sbx, "http://other.test/", f"http://{OTHER}/")
check("*: any name", got["http://other.test/"] == f"hello from {OTHER}:80", got)
check("*: no bare address", got[f"http://{OTHER}/"] is None, got)
sbx.kill()

raises(
    "create: domain without ALL_TRAFFIC refused",
    (SandboxException, Exception),
    lambda: Sandbox.create(TEMPLATE, network={"allow_out": ["allowed.test"]}),
)
# Header transforms with a secret: the host gets it, the sandbox never
# sees it (the echo server's answer has it masked, and says its hash).
import hashlib

SECRET = "e2b-s3cret-value-42"
Secret.create("e2btok", SECRET)
sbx = Sandbox.create(
    TEMPLATE,
    network={
        "rules": {
            "allowed.test": [
                {"transform": {"headers": {"Authorization": f"Bearer {Secret.fill('e2btok')}"}}}
            ]
        }
    },
)
want = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
got = fetch(sbx, "https://allowed.test:8443/", "http://other.test:8080/")
tls = got.get("https://allowed.test:8443/") or ""
check("transform: the host got the secret", f"auth-sha256: {want}" in tls, got)
check("transform: the sandbox did not", SECRET not in repr(got), got)
check("transform: other hosts get nothing", "auth-sha256: none" in (got.get("http://other.test:8080/") or ""), got)
# Every process's environment but pid 1's (the agent is non-dumpable: its
# environ is refused inside the sandbox, which is what is wanted).
env = sbx.commands.run("env; for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done; true").stdout
check("transform: not in the sandbox's environment", SECRET not in env)
net = sbx.get_info().network or {}
check("transform: get_info shows the placeholder", "${e2b.secrets.e2btok}" in repr(net.get("rules")), net)
sbx.kill()
Secret.destroy("e2btok")

# egress_proxy: through the world's SOCKS5 proxy, never around it.
sbx = Sandbox.create(
    TEMPLATE,
    network={"egress_proxy": {"address": f"{SOCKS}:1080", "username": "u", "password": "p"}},
)
check("egress_proxy: through the proxy", reaches(sbx, f"http://{OTHER}/"))
proxy = (sbx.get_info().network or {}).get("egress_proxy") or {}
check("egress_proxy: get_info without the password", proxy.get("address") == f"{SOCKS}:1080" and "password" not in proxy, proxy)
sbx.update_network({"egress_proxy": {"address": f"{SOCKS}:1080", "username": "u", "password": "wrong"}})
check("egress_proxy: refused credentials, nothing gets out", not reaches(sbx, f"http://{OTHER}/"))
sbx.kill()

# Ingress: allow_public_traffic=False needs the token on every port but
# envd's; mask_request_host is the Host the sandbox's server sees.
SERVER = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('host=' + self.headers.get('Host', '')).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()
"""
sbx = Sandbox.create(
    TEMPLATE,
    network={"allow_public_traffic": False, "mask_request_host": "app.example:${PORT}"},
)
check("private traffic: a token was issued", bool(sbx.traffic_access_token))
sbx.commands.run("python3 -c " + shlex_quote(SERVER), background=True)
sbx.commands.run(
    "python3 -c 'import socket,time\n"
    "for _ in range(100):\n"
    "    try: socket.create_connection((\"127.0.0.1\", 8000), 1).close(); break\n"
    "    except OSError: time.sleep(0.05)'"
)


def port_get(token=None):
    req = urllib.request.Request(DATA_URL + "/")
    req.add_header("E2b-Sandbox-Id", sbx.sandbox_id)
    req.add_header("E2b-Sandbox-Port", "8000")
    if token is not None:
        req.add_header("e2b-traffic-access-token", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


status, _ = port_get()
check("private traffic: no token, 403", status == 403, status)
status, _ = port_get("wrong")
check("private traffic: wrong token, 403", status == 403, status)
status, body = port_get(sbx.traffic_access_token)
check("private traffic: the token, 200", status == 200, (status, body))
check("mask_request_host: the Host it sees", body == "host=app.example:8000", body)
check("private traffic: envd needs no traffic token", sbx.commands.run("true").exit_code == 0)
sbx.kill()

summary()
