"""The official E2B Python SDK with only E2B_DOMAIN set, over HTTPS (driven
by crates/cli/tests/serve_e2b.rs against `brig serve --e2b --e2b-domain`).

    E2B_DOMAIN=brig.localhost:PORT SSL_CERT_FILE=BUNDLE python domain_sdk.py

No E2B_API_URL or E2B_SANDBOX_URL: the client goes to
`https://api.{domain}` and `https://{port}-{id}.{domain}` as it does on
E2B's cloud, and checks brig's certificate against SSL_CERT_FILE (the
host's bundle with brig's local CA). E2B_TEMPLATE names the template.
Covers: create (the sandbox's domain is the daemon's), commands, files,
a background command, a port of the sandbox through `get_host(port)`
over HTTPS, the API over HTTP/2, list, get_info, connect and kill; a
volume's content API (which the clients send to `https://api.{domain}`,
with no E2B_VOLUME_API_URL) and the volume mounted in a sandbox.

Prints one line per check and `N passed, 0 failed` at the end.
"""

import os
import ssl
import time

import httpx
from e2b import Sandbox, Volume

from sdk_checks import check, summary

domain = os.environ["E2B_DOMAIN"]
template = os.environ.get("E2B_TEMPLATE", "base")
check(
    "only E2B_DOMAIN points at brig",
    not any(os.environ.get(v) for v in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL")),
)
tls = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])

sbx = Sandbox.create(template, timeout=120)
print(f"sandbox {sbx.sandbox_id}", flush=True)
try:
    check("the sandbox's domain is the daemon's", sbx.sandbox_domain == domain, sbx.sandbox_domain)
    r = sbx.commands.run("echo hi; echo err >&2")
    check("a command over https", r.stdout == "hi\n" and r.stderr == "err\n", r)
    sbx.files.write("/tmp/tls.txt", "written over tls")
    check("files.read", sbx.files.read("/tmp/tls.txt") == "written over tls")
    check("files.list", "tls.txt" in [e.name for e in sbx.files.list("/tmp")])

    # A server in the sandbox, reached by the name get_host gives.
    sbx.commands.run(
        "mkdir -p /tmp/www && echo hello-from-8000 > /tmp/www/index.html",
    )
    server = sbx.commands.run(
        "cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
        background=True,
    )
    host = sbx.get_host(8000)
    check("get_host names the port under the domain", host == f"8000-{sbx.sandbox_id}.{domain}", host)
    body = None
    for _ in range(100):
        try:
            resp = httpx.get(f"https://{host}/index.html", verify=tls, timeout=10)
            if resp.status_code == 200:
                body = resp.text
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    check("the sandbox's port over https", body == "hello-from-8000\n", body)
    server.kill()

    with httpx.Client(http2=True, verify=tls) as client:
        resp = client.get(
            f"https://api.{domain}/sandboxes/{sbx.sandbox_id}",
            headers={"X-API-Key": os.environ["E2B_API_KEY"]},
        )
    check("the API over HTTP/2", resp.http_version == "HTTP/2" and resp.status_code == 200, resp)

    ids = [s.sandbox_id for s in Sandbox.list().next_items()]
    check("list", sbx.sandbox_id in ids, ids)
    info = sbx.get_info()
    check("get_info", info.sandbox_id == sbx.sandbox_id, info)
    again = Sandbox.connect(sbx.sandbox_id)
    check("connect", again.commands.run("cat /tmp/tls.txt").stdout == "written over tls")
finally:
    sbx.kill()
check("killed", not Sandbox.kill(sbx.sandbox_id))

vol = Volume.create(f"domain-{os.getpid()}")
try:
    vol.write_file("/hello.txt", "through the volume api")
    check("a volume's content api over https", vol.read_file("/hello.txt") == "through the volume api")
    user = Sandbox.create(template, timeout=120, volume_mounts={"/mnt/data": vol})
    try:
        r = user.commands.run("cat /mnt/data/hello.txt")
        check("the volume mounted in a sandbox", r.stdout == "through the volume api", r.stdout)
    finally:
        user.kill()
finally:
    check("the volume destroyed", Volume.destroy(vol.volume_id))
summary()
