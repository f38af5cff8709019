"""brig as an MCP server, driven by the official MCP Python SDK client.

    python mcp_sdk.py stdio BRIG_BINARY         # `brig mcp` (BRIG_HOME etc. from the environment)
    python mcp_sdk.py http URL KEY [OTHER_KEY]  # `brig serve --mcp` at URL/mcp
    python mcp_sdk.py vm-warm BRIG_BINARY HOME  # `brig mcp`: run_code on vm warm starts

Every tool, an image from a matplotlib plot, progress notifications,
cancellation (a long `sleep` cancelled: the process is gone), schema
rejections naming the field, resources, and, over HTTP, 401 without a key,
tenant isolation (OTHER_KEY, another tenant's, sees none of this client's
sandboxes) and the end of a session's sandboxes when the client
disconnects. Prints `ok NAME` per check and `N passed, 0 failed` at the
end; stops at the first failure. Lines starting with `sandbox ` name the
sandboxes the session made, for the Rust runner to check they are gone.
"""

import base64
import json
import os
import sys
import time

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

passed = 0


def check(name, cond, detail=""):
    global passed
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    passed += 1
    print(f"ok {name}", flush=True)


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


TOOLS = {
    "run_code", "run_command", "create_sandbox", "read_file", "write_file", "upload_file",
    "list_files", "start_process", "read_process_output", "kill_process", "list_sandboxes",
    "kill_sandbox", "extend_timeout",
}


async def session_checks(s: ClientSession, transport: str):
    init = await s.initialize()
    check("initialize names brig", init.server_info.name == "brig", init.server_info)
    tools = {t.name: t for t in (await s.list_tools()).tools}
    check("every tool is listed", TOOLS <= set(tools), sorted(tools))
    rc = tools["run_command"].input_schema
    check("run_command's schema requires command", rc.get("required") == ["command"], rc)
    check("schemas describe their fields",
          all("description" in p for p in rc["properties"].values()), rc)

    # run_command on the session's default sandbox (made on first use).
    r = await s.call_tool("run_command", {"command": "echo hi; echo oops >&2; exit 3"})
    t = text_of(r)
    check("run_command reports stdout, stderr and the exit code",
          not r.is_error and "exit code: 3" in t and "hi" in t and "oops" in t, t)
    sc = r.structured_content
    check("run_command's structured result", sc["exit_code"] == 3 and sc["stdout"] == "hi\n", sc)
    default_id = sc["sandbox_id"]
    print(f"sandbox {default_id}", flush=True)

    # Long output: truncated, the whole of it in a file.
    r = await s.call_tool("run_command", {"command": "seq 1 20000"})
    sc = r.structured_content
    check("long output is truncated with a note", sc["truncated"] and "cut here" in sc["stdout"], sc["stdout"][-300:])
    r2 = await s.call_tool("run_command", {"command": f"wc -l < {sc['full_output']}.stdout"})
    check("the full output is in the file named", r2.structured_content["stdout"].strip() == "20000",
          text_of(r2))

    # Files.
    r = await s.call_tool("write_file", {"path": "notes/hello.txt", "content": "hello from mcp\n"})
    check("write_file", not r.is_error, text_of(r))
    r = await s.call_tool("read_file", {"path": "notes/hello.txt"})
    check("read_file", text_of(r) == "hello from mcp\n", text_of(r))
    blob = bytes(range(256))
    r = await s.call_tool("upload_file", {"path": "/tmp/bin.dat", "data_base64": base64.b64encode(blob).decode()})
    check("upload_file", not r.is_error, text_of(r))
    r = await s.call_tool("run_command", {"command": "sha256sum /tmp/bin.dat | cut -c1-64"})
    import hashlib
    check("the upload arrived whole", r.structured_content["stdout"].strip() == hashlib.sha256(blob).hexdigest(), text_of(r))
    r = await s.call_tool("list_files", {"path": "notes"})
    names = [e["name"] for e in r.structured_content["entries"]]
    check("list_files", names == ["hello.txt"], r.structured_content)
    r = await s.call_tool("read_file", {"path": "/nonexistent/file"})
    check("a missing file is a tool error saying so", r.is_error and "/nonexistent/file" in text_of(r), text_of(r))

    # Resources: the default sandbox's files.
    templates = (await s.list_resource_templates()).resource_templates
    check("a resource template for sandbox files",
          any(t.uri_template.startswith("brig://") for t in templates), templates)
    listed = (await s.list_resources()).resources
    uri = f"brig://{default_id}" + "/home/user/notes/hello.txt"
    check("the default sandbox's files are listed as resources",
          any(str(res.uri) == uri for res in listed), [str(r.uri) for r in listed])
    got = await s.read_resource(uri)
    check("a file read as a resource", got.contents[0].text == "hello from mcp\n", got)

    # run_code: state between calls, a plot as an image, errors.
    r = await s.call_tool("run_code", {"code": "x = 6 * 7\nprint('side effect')"})
    check("run_code runs python", not r.is_error and "side effect" in text_of(r), text_of(r))
    r = await s.call_tool("run_code", {"code": "x + 1"})
    check("run_code keeps state between calls", "43" in text_of(r), text_of(r))
    plot = ("import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
            "%matplotlib inline\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
    r = await s.call_tool("run_code", {"code": plot})
    images = [c for c in r.content if getattr(c, "type", "") == "image"]
    check("a matplotlib plot comes back as image content",
          len(images) == 1 and images[0].mime_type == "image/png"
          and base64.b64decode(images[0].data)[:8] == b"\x89PNG\r\n\x1a\n", text_of(r))
    r = await s.call_tool("run_code", {"code": "1/0"})
    check("a python error is a tool error with its traceback",
          r.is_error and "ZeroDivisionError" in text_of(r), text_of(r))
    r = await s.call_tool("run_code", {"code": "echo from-bash-$((2+3))", "language": "bash"})
    check("run_code runs bash", "from-bash-5" in text_of(r), text_of(r))

    # Progress notifications from a long command.
    updates = []

    async def on_progress(progress, total, message):
        updates.append((progress, message))

    r = await s.call_tool("run_command", {"command": "sleep 3; echo done"}, progress_callback=on_progress)
    check("a long command reports progress", len(updates) >= 2 and "done" in text_of(r), updates)

    # Background processes.
    r = await s.call_tool("start_process", {"command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done; exit 7"})
    pid = r.structured_content["pid"]
    check("start_process returns a pid", isinstance(pid, int) and pid > 0, r.structured_content)
    r = await s.call_tool("read_process_output", {"pid": pid, "wait_seconds": 10})
    sc = r.structured_content
    check("read_process_output has its output and exit code",
          not sc["running"] and sc["exit_code"] == 7 and "tick 3" in sc["stdout"], sc)
    r = await s.call_tool("start_process", {"command": "sleep 1000"})
    pid = r.structured_content["pid"]
    r = await s.call_tool("read_process_output", {"pid": pid})
    check("a running process is said to be running", r.structured_content["running"], r.structured_content)
    r = await s.call_tool("kill_process", {"pid": pid})
    check("kill_process", not r.is_error, text_of(r))
    r = await s.call_tool("read_process_output", {"pid": pid, "wait_seconds": 5})
    check("the killed process has ended", not r.structured_content["running"], r.structured_content)

    # Cancellation: a long sleep cancelled from the client is killed.
    # (The pattern's brackets keep pgrep's own shell from matching.)
    started = time.monotonic()
    with anyio.move_on_after(2):
        await s.call_tool("run_command", {"command": "sleep 613; echo never"})
    check("the call was cut off while running", time.monotonic() - started >= 1.9)
    gone = False
    for _ in range(50):
        r = await s.call_tool("run_command", {"command": "pgrep -f 'slee[p] 613' || true"})
        if r.structured_content["stdout"].strip() == "":
            gone = True
            break
        await anyio.sleep(0.2)
    check("cancelling a call kills its command", gone, text_of(r))
    # ... and interrupts a cell: the kernel is free for the next one.
    with anyio.move_on_after(3):
        await s.call_tool("run_code", {"code": "import time\ntime.sleep(600)"})
    r = None
    with anyio.move_on_after(30):
        r = await s.call_tool("run_code", {"code": "'still here'"})
    check("cancelling run_code interrupts the kernel", r is not None and "still here" in text_of(r),
          r and text_of(r))

    # Schema rejections name the field; errors are results, not failures.
    r = await s.call_tool("run_command", {})
    check("a missing argument names the field", r.is_error and "command" in text_of(r), text_of(r))
    r = await s.call_tool("run_command", {"command": "true", "timeout_seconds": "soon"})
    check("a mistyped argument names the field", r.is_error and "timeout_seconds" in text_of(r), text_of(r))
    r = await s.call_tool("create_sandbox", {"memroy": "1G"})
    check("an unknown argument names it", r.is_error and "memroy" in text_of(r), text_of(r))
    r = await s.call_tool("create_sandbox", {"memory": "lots"})
    check("a bad size names the field", r.is_error and "memory" in text_of(r), text_of(r))
    r = await s.call_tool("run_command", {"command": "true", "sandbox_id": "0123456789ab"})
    check("an unknown sandbox is a tool error with a hint",
          r.is_error and "list_sandboxes" in text_of(r), text_of(r))

    # Sandboxes: create, list, extend, kill.
    r = await s.call_tool("create_sandbox", {"template": "host", "memory": "256M", "timeout": "5m", "network": "none"})
    check("create_sandbox", not r.is_error, text_of(r))
    other = r.structured_content["sandbox_id"]
    print(f"sandbox {other}", flush=True)
    r = await s.call_tool("run_command", {"command": "python3 -c 'b = bytearray(400 << 20); print(len(b))'", "sandbox_id": other})
    check("its memory limit holds", r.structured_content["exit_code"] != 0 or r.structured_content["signal"], text_of(r))
    r = await s.call_tool("run_command", {"command": "python3 -c 'b = bytearray(64 << 20); print(len(b))'", "sandbox_id": other})
    check("and it runs what fits", r.structured_content["exit_code"] == 0, text_of(r))
    r = await s.call_tool("list_sandboxes", {})
    ids = {x["sandbox_id"]: x for x in r.structured_content["sandboxes"]}
    check("list_sandboxes shows both, the default marked",
          other in ids and default_id in ids and ids[default_id]["default"], ids)
    r = await s.call_tool("extend_timeout", {"sandbox_id": other, "timeout": "20m"})
    check("extend_timeout", not r.is_error and "1200 s" in text_of(r), text_of(r))
    r = await s.call_tool("kill_sandbox", {"sandbox_id": other})
    check("kill_sandbox", not r.is_error, text_of(r))
    r = await s.call_tool("run_command", {"command": "true", "sandbox_id": other})
    check("a killed sandbox is said to have ended", r.is_error, text_of(r))
    r = await s.call_tool("create_sandbox", {"template": "host", "persist": True})
    kept = r.structured_content["sandbox_id"]
    print(f"persist {kept}", flush=True)
    r = await s.call_tool("create_sandbox", {"template": "host"})
    print(f"sandbox {r.structured_content['sandbox_id']}", flush=True)
    return default_id


async def modern_checks(client, transport):
    """The SDK's default client (mode "auto") negotiates the stateless
    revision; the tools work the same."""
    async with client as c:
        check(f"{transport}: the auto client negotiates 2026-07-28",
              c.protocol_version == "2026-07-28", c.protocol_version)
        r = await c.call_tool("run_command", {"command": "echo modern"})
        check(f"{transport}: run_command on the stateless revision",
              not r.is_error and r.structured_content["stdout"] == "modern\n", text_of(r))
        r = await c.call_tool("run_code", {"code": "21 * 2"})
        check(f"{transport}: run_code on the stateless revision", "42" in text_of(r), text_of(r))
        return r.structured_content["sandbox_id"]


async def stdio_main(brig):
    params = StdioServerParameters(command=brig, args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await session_checks(s, "stdio")
    # Through brig mcp's relay too, its sandboxes end with stdin.
    default = await modern_checks(Client(params), "stdio")
    print(f"sandbox {default}", flush=True)


def http_client(key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return create_mcp_http_client(headers=headers)


async def http_main(url, key, other_key):
    endpoint = url.rstrip("/") + "/mcp"
    # No key, a wrong key: 401 with a message saying what to send.
    async with httpx2.AsyncClient() as c:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        r = await c.post(endpoint, json=body, headers={"Accept": "application/json, text/event-stream"})
        check("no key: 401 saying what to send", r.status_code == 401 and "Bearer" in r.json()["message"], r.text)
        r = await c.post(endpoint, json=body, headers={"Authorization": "Bearer nope",
                                                       "Accept": "application/json, text/event-stream"})
        check("a wrong key: 401", r.status_code == 401, r.text)
    async with http_client(key) as hc:
        # Stateless: its default sandbox is the key's, until its timeout.
        await modern_checks(Client(streamable_http_client(endpoint, http_client=hc)), "http")
    async with http_client(key) as hc:
        async with streamable_http_client(endpoint, http_client=hc) as (read, write):
            async with ClientSession(read, write) as s:
                default_id = await session_checks(s, "http")
                if other_key:
                    async with http_client(other_key) as hc2:
                        async with streamable_http_client(endpoint, http_client=hc2) as (r2, w2):
                            async with ClientSession(r2, w2) as s2:
                                await s2.initialize()
                                r = await s2.call_tool("list_sandboxes", {"include_ended": True})
                                check("another tenant sees none of these sandboxes",
                                      r.structured_content["sandboxes"] == [], text_of(r))
                                r = await s2.call_tool("run_command", {"command": "true", "sandbox_id": default_id})
                                check("nor can it use one", r.is_error and "no sandbox" in text_of(r), text_of(r))
                                try:
                                    await s2.read_resource(f"brig://{default_id}/etc/hostname")
                                    check("nor read its files", False)
                                except Exception as e:
                                    check("nor read its files", "no sandbox" in str(e) or "not found" in str(e).lower(), e)


def kept_warm_starts(home):
    """The warm starts kept in brig home `home` (half-made ones excluded)."""
    warm = os.path.join(home, "warm")
    if not os.path.isdir(warm):
        return []
    return [d for d in os.listdir(warm)
            if not d.startswith(".") and os.path.exists(os.path.join(warm, d, "meta.json"))]


async def vm_warm_main(brig, home):
    """run_code on vm sandboxes: the first create starts cold and has the
    code interpreter's warm start made meanwhile; a create after it is kept
    restores it, and its first run_code answers at once with the create's
    env vars."""
    params = StdioServerParameters(command=brig, args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            check("no warm start before", kept_warm_starts(home) == [], kept_warm_starts(home))
            r = await s.call_tool("create_sandbox", {"template": "code-interpreter-v1",
                                                     "isolation": "vm"})
            check("a first vm create answers", not r.is_error, text_of(r))
            print(f"sandbox {r.structured_content['sandbox_id']}", flush=True)
            deadline = time.monotonic() + 1500
            while not kept_warm_starts(home):
                if time.monotonic() > deadline:
                    check("the warm start is made within 25 min", False)
                await anyio.sleep(5)
            check("one warm start kept", len(kept_warm_starts(home)) == 1, kept_warm_starts(home))
            t0 = time.monotonic()
            r = await s.call_tool("create_sandbox", {"template": "code-interpreter-v1",
                                                     "isolation": "vm",
                                                     "env": {"FROM_CREATE": "yes"}})
            made = time.monotonic() - t0
            check("a create after it answers", not r.is_error, text_of(r))
            sid = r.structured_content["sandbox_id"]
            print(f"sandbox {sid}", flush=True)
            t1 = time.monotonic()
            r = await s.call_tool("run_code", {
                "sandbox_id": sid,
                "code": "import os, random; (os.environ.get('FROM_CREATE'), random.random())"})
            ran = time.monotonic() - t1
            t = text_of(r)
            check("run_code in the restored sandbox: the create's env var", not r.is_error
                  and "('yes'," in t, t)
            # Cold, a kernel takes 1-3 minutes to start in a TCG guest.
            check("run_code in the restored sandbox answers at once", ran < 20, f"{ran:.1f} s")
            print(f"restored create {made:.2f} s, first run_code {ran:.2f} s", flush=True)


def main():
    mode = sys.argv[1]
    if mode == "stdio":
        anyio.run(stdio_main, sys.argv[2])
    elif mode == "vm-warm":
        anyio.run(vm_warm_main, sys.argv[2], sys.argv[3])
    else:
        anyio.run(http_main, sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    print(f"{passed} passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
