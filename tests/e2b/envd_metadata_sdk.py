"""File metadata, owners and watch entries through the official E2B Python SDK
(driven by `official_python_sdk_metadata_and_owner` in
crates/e2b/tests/e2b_envd.rs).

    python envd_metadata_sdk.py SANDBOX_ID

SANDBOX_ID is a sandbox the test registered (default user root); E2B_API_KEY,
E2B_API_URL and E2B_SANDBOX_URL point at the daemon. Needs e2b >= 2.63 (the
client that sends metadata and include_entry; brig reports envd 0.6.4, so
the client's own version gates let every call through).

Covers: files.write/write_files with metadata (the answer, get_info, list,
rename, an overwrite clearing it, the client's own validation), owner and
group names (root, and nobody for a file written as nobody), and
watch_dir(include_entry=True) giving events with their EntryInfo.

Prints one line per check and `ALL OK` at the end; the first failed check
raises.
"""

import importlib.metadata
import sys
import time
import uuid

from e2b import FilesystemEventType, InvalidArgumentException, Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry

sid = sys.argv[1]
print(f"e2b {importlib.metadata.version('e2b')}", flush=True)


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"FAIL {name}: {detail}")
    print(f"ok   {name}", flush=True)


sbx = Sandbox.connect(sid)
check("envd version is 0.6.4", str(sbx._envd_version) == "0.6.4", sbx._envd_version)
base = f"/tmp/sdkmeta-{uuid.uuid4().hex[:8]}"
meta = {"author": "mish", "purpose": "upload"}

info = sbx.files.write(f"{base}/a.txt", "hello", metadata=meta)
check("write: the answer carries the metadata", info.metadata == meta, info)
stat = sbx.files.get_info(f"{base}/a.txt")
check("get_info: metadata", stat.metadata == meta, stat)
check("get_info: owner and group", (stat.owner, stat.group) == ("root", "root"), stat)

info = sbx.files.write(f"{base}/b.txt", "x", metadata=meta, use_octet_stream=True)
check("write (octet-stream): metadata", info.metadata == meta, info)

entries = sbx.files.list(base)
by_name = {e.name: e for e in entries}
check("list: metadata", by_name["a.txt"].metadata == meta, entries)

moved = sbx.files.rename(f"{base}/b.txt", f"{base}/c.txt")
check("rename: metadata kept", moved.metadata == meta, moved)

info = sbx.files.write(f"{base}/a.txt", "second")
check("overwrite without metadata: none in the answer", info.metadata is None, info)
check("overwrite without metadata: cleared", sbx.files.get_info(f"{base}/a.txt").metadata is None)

infos = sbx.files.write_files(
    [WriteEntry(path=f"{base}/m1.txt", data="1"), WriteEntry(path=f"{base}/m2.txt", data="2")],
    metadata={"source": "suite"},
)
check("write_files: metadata on every file", all(i.metadata == {"source": "suite"} for i in infos), infos)
check(
    "write_files: persisted",
    sbx.files.get_info(f"{base}/m2.txt").metadata == {"source": "suite"},
)

try:
    sbx.files.write(f"{base}/bad.txt", "x", metadata={"good": "bad\nvalue"})
    check("invalid metadata is refused", False)
except InvalidArgumentException:
    check("invalid metadata is refused", True)

# A write as a user is that user's own: into a directory they may write
# (/tmp), owned by them; into root's directory, refused as the kernel
# would refuse them.
theirs = f"/tmp/theirs-{uuid.uuid4().hex[:8]}.txt"
info = sbx.files.write(theirs, "x", user="nobody")
stat = sbx.files.get_info(theirs)
check("written as nobody: owned by nobody", (stat.owner, stat.group) == ("nobody", "nogroup"), stat)
try:
    sbx.files.write(f"{base}/theirs.txt", "x", user="nobody")
    check("nobody may not write into root's directory", False)
except Exception as e:  # the SDK's permission error
    check("nobody may not write into root's directory", "permission denied" in str(e).lower(), e)
mkdir = sbx.files.get_info(base)
check("a directory envd made: owner named", mkdir.owner == "root", mkdir)

handle = sbx.files.watch_dir(base, include_entry=True)
sbx.files.write(f"{base}/watched.txt", "w", metadata={"k": "v"})
deadline = time.time() + 15
seen = []
found = None
while time.time() < deadline and found is None:
    for ev in handle.get_new_events():
        seen.append(ev)
        if ev.name == "watched.txt" and ev.entry is not None and ev.entry.metadata == {"k": "v"}:
            found = ev
    time.sleep(0.2)
handle.stop()
check("watch_dir(include_entry=True): an event with the entry", found is not None, seen)
creates = [e for e in seen if e.type == FilesystemEventType.CREATE and e.name == "watched.txt"]
check(
    "watch_dir: the create has its entry",
    creates and creates[0].entry is not None and creates[0].entry.path == f"{base}/watched.txt",
    creates,
)

sbx.files.remove(base)
print("ALL OK", flush=True)
