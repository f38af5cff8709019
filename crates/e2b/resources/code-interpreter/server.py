#!/usr/bin/env python3
"""brig's in-sandbox code interpreter: E2B's port-49999 protocol over real Jupyter kernels.

    python3 server.py [--host 0.0.0.0] [--port 49999] [--cwd /home/user]
                      [--execution-timeout SECONDS] [--default-kernels python,bash]

Start reading at `Interpreter` (contexts, one kernel each) and `handle_execute`
(one POST /execute, streamed as NDJSON). The protocol and the design are in
README.md next to this file.

Only the standard library and jupyter_client (which talks ZMQ to the kernels
through pyzmq) are used. The HTTP/1.1 server is a small asyncio one so that a
client disconnect is noticed while a cell runs (EOF on the socket) and can
interrupt the kernel; everything runs on one event loop, so there are no locks
between threads. jupyter_client is imported after the socket is listening:
/health answers within a few tens of milliseconds of start.
"""

import argparse
import asyncio
import datetime
import importlib.util
import json
import logging
import os
import re
import signal
import sys
import uuid

log = logging.getLogger("brig-code-interpreter")

KEEPALIVE_INTERVAL = 5.0
# After an interrupt (client gone, timeout) the kernel gets this long to go idle
# before it is restarted: a cell can catch KeyboardInterrupt or sit in C code.
INTERRUPT_GRACE = 5.0
# ipykernel ignores SIGINT until it has begun to run a cell (it installs its
# handler around the cell), so an interrupt sent between the request and the
# cell's start is lost: it is sent again this often until the kernel says the
# cell started (execute_input).
INTERRUPT_RETRY = 0.2
# An interrupt that lands in ipykernel's own code around the cell is caught
# there: the request ends with its idle status and no reply. Idle, then this
# long without a reply, counts as the request being over.
IDLE_WITHOUT_REPLY = 0.5
# brig writes this file next to the server when a sandbox is restored from a
# warm start (a checkpoint of a sandbox whose kernels were ready): the
# sandbox's own env vars, for the kernels started before it existed.
RESTORED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "restored.json")  # --restored-file
# Run once in each Python kernel of a restored sandbox: a checkpoint's
# copies would otherwise draw the same "random" numbers.
RESEED_PY = ("import random as _brig_random, os as _brig_os, sys as _brig_sys\n"
             "_brig_random.seed(_brig_os.urandom(32))\n"
             "if 'numpy' in _brig_sys.modules: _brig_sys.modules['numpy'].random.seed()\n"
             "del _brig_random, _brig_os, _brig_sys\n")
# --kernel-start-timeout. A Python kernel imports ipykernel (and with it
# IPython, zmq, tornado): about 2 s on a quiet host, 15-20 s under gVisor's
# ptrace platform, and more than 60 s measured there in a CI run with two
# TCG guests beside it. E2B's clients wait for run_code as long as the
# execution timeout (300 s by default), so the server may wait this long.
KERNEL_START_TIMEOUT = 180.0
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_REQUEST_BODY = 64 << 20


# --------------------------------------------------------------------------
# HTTP/1.1
# --------------------------------------------------------------------------


class HttpError(Exception):
    """An error answered before any streaming started: status + plain text body."""

    def __init__(self, status, message, content_type="text/plain; charset=utf-8"):
        super().__init__(message)
        self.status = status
        self.body = message.encode()
        self.content_type = content_type


def json_error(status, detail):
    """FastAPI's shape for routing errors ({"detail": ...})."""
    return HttpError(status, json.dumps({"detail": detail}), "application/json")


REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found",
           405: "Method Not Allowed", 413: "Payload Too Large", 500: "Internal Server Error"}


class Request:
    def __init__(self, method, target, version, headers, body):
        self.method = method
        self.path = target.split("?", 1)[0]
        self.version = version
        self.headers = headers
        self.body = body

    @property
    def keep_alive(self):
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"


class Connection:
    """One client connection. Bytes read ahead (a pipelined request, or bytes
    read while watching for EOF during a stream) stay in `buf`."""

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self._watch = None
        self.gone = asyncio.Event()  # set when the peer closed or a write failed

    async def _fill(self):
        data = await self.reader.read(65536)
        if not data:
            self.eof = True
            self.gone.set()
            return False
        self.buf += data
        return True

    async def _read_until(self, sep, limit):
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            if len(self.buf) > limit:
                raise HttpError(400, "request head too large")
            if not await self._fill():
                return None

    async def _read_exact(self, n):
        while len(self.buf) < n:
            if not await self._fill():
                raise HttpError(400, "request body truncated")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def read_request(self):
        head = await self._read_until(b"\r\n\r\n", 65536)
        if head is None:
            return None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            raise HttpError(400, "malformed request line")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await self._read_until(b"\r\n", 1024)
                if size_line is None:
                    raise HttpError(400, "request body truncated")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self._read_until(b"\r\n", 65536)) not in (b"\r\n", None):
                        pass  # trailers
                    break
                if len(body) + size > MAX_REQUEST_BODY:
                    raise HttpError(413, "request body too large")
                body += await self._read_exact(size)
                await self._read_exact(2)
            body = bytes(body)
        else:
            n = int(headers.get("content-length", "0") or 0)
            if n > MAX_REQUEST_BODY:
                raise HttpError(413, "request body too large")
            body = await self._read_exact(n) if n else b""
        return Request(method, target, version, headers, body)

    def _head(self, status, content_type, extra):
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
                 f"content-type: {content_type}", "server: brig-code-interpreter"]
        lines += [f"{k}: {v}" for k, v in extra]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def respond(self, status, body, content_type, keep_alive):
        extra = [("content-length", str(len(body)))]
        if not keep_alive:
            extra.append(("connection", "close"))
        await self._write(self._head(status, content_type, extra) + body)

    # Streaming: chunked transfer encoding, one NDJSON line per chunk.

    async def start_stream(self, content_type):
        await self._write(self._head(200, content_type, [("transfer-encoding", "chunked")]))
        # Watch for EOF while the response streams: the SDKs make no other
        # request on this connection until the body is read, so any read
        # that returns nothing means the client went away.
        self._watch = asyncio.ensure_future(self._watch_eof())

    async def _watch_eof(self):
        try:
            while await self._fill():
                pass
        except (ConnectionError, OSError):
            self.gone.set()

    async def send_chunk(self, data):
        await self._write(b"%x\r\n%s\r\n" % (len(data), data))

    async def end_stream(self):
        await self._write(b"0\r\n\r\n")
        # Stop the EOF watch before the next request is read: only one
        # coroutine may wait on the reader.
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except asyncio.CancelledError:
                pass
            self._watch = None

    async def _write(self, data):
        if self.gone.is_set() and self.eof:
            raise ConnectionResetError("client closed the connection")
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            self.gone.set()
            raise ConnectionResetError("client closed the connection")

    def close(self):
        if self._watch is not None:
            self._watch.cancel()
        try:
            self.writer.close()
        except Exception:
            pass


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------

jc = None  # jupyter_client, imported in the background at start


def import_jupyter_client():
    global jc
    if jc is None:
        import jupyter_client
        import jupyter_client.kernelspec  # noqa: F401

        jc = jupyter_client
    return jc


# Kernels run their module through this shim (python3 -c SHIM PID MODULE ARGS),
# which sets PR_SET_PDEATHSIG so that a kernel dies with the server even when
# the server is SIGKILLed: no kernel outlives its server. (The check of the
# parent pid closes the race with a server that died before the prctl.)
KERNEL_SHIM = """\
import ctypes, os, runpy, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != int(sys.argv[1]):
        os._exit(1)
except OSError:
    pass
module = sys.argv[2]
sys.argv = [module] + sys.argv[3:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

# Python module that runs each language's kernel, when it is installed.
MODULE_KERNELS = {"python": "ipykernel_launcher", "bash": "bash_kernel"}
# Options for a module's kernel. IPython's history lives in memory: `In`,
# `Out`, `_` and `%history` work as usual, but no SQLite write to
# ~/.ipython follows each cell (about 0.5 ms of every run_code here).
MODULE_KERNEL_ARGS = {"python": ["--HistoryManager.hist_file=:memory:"]}
# Installed Jupyter kernelspecs tried for the other languages, in order.
KERNELSPEC_NAMES = {"javascript": ["javascript", "deno"]}


def normalize_language(language):
    """E2B's rules: lower-cased and trimmed, aliases, empty means python."""
    language = (language or "").strip().lower()
    if not language:
        return "python"
    # TypeScript runs on the JavaScript kernel (Deno runs both): one context.
    return {"js": "javascript", "ts": "javascript", "typescript": "javascript"}.get(
        language, language)


def kernel_spec_for(language):
    """The KernelSpec that runs `language`, or None.

    Python and bash run from their Python modules (ipykernel, bash_kernel)
    with this interpreter; any other language uses an installed Jupyter
    kernelspec of that name (e.g. a `javascript` kernel the template adds)."""
    ks = import_jupyter_client().kernelspec
    lookup = language
    module = MODULE_KERNELS.get(lookup)
    if module and importlib.util.find_spec(module) is not None:
        argv = [sys.executable, "-c", KERNEL_SHIM, str(os.getpid()), module,
                "-f", "{connection_file}", *MODULE_KERNEL_ARGS.get(lookup, [])]
        return ks.KernelSpec(argv=argv, display_name=lookup, language=lookup,
                             interrupt_mode="signal", env={}, metadata={})
    # JavaScript: a `javascript` kernelspec, else Deno's (`deno jupyter --install`).
    manager = ks.KernelSpecManager()
    installed = manager.find_kernel_specs()
    for name in KERNELSPEC_NAMES.get(lookup, [lookup]):
        if name in installed:
            try:
                spec = manager.get_kernel_spec(name)
            except Exception as e:
                log.warning("kernelspec %s is unusable: %s", name, e)
                continue
            if lookup == "javascript":
                # Deno colours text/plain (and so would node's inspect): E2B's
                # clients expect plain `2`, not an ANSI-coloured one.
                spec.env = {"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1", **(spec.env or {})}
            return spec
    return None


def make_spec_manager(spec):
    """A KernelSpecManager that answers with `spec` whatever the name."""
    class OneSpec(jc.kernelspec.KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return spec

    return OneSpec()


def iso_date(value):
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    return value if isinstance(value, str) else datetime.datetime.now(
        datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class KernelStartError(Exception):
    pass


class Pending:
    """One execute_request in flight: its messages, routed by parent msg_id."""

    def __init__(self):
        self.queue = asyncio.Queue()
        self.reply = None  # execute_reply content
        self.idle = False  # iopub status idle seen
        self.started = False  # execute_input seen: the cell is running

    @property
    def done(self):
        return self.reply is not None and self.idle


# Sentinels put into a Pending's queue besides Jupyter messages.
DONE = "done"
KERNEL_DIED = "kernel-died"
RESTARTED = "restarted"
IDLE = "idle"  # the idle status came before the reply (or with none)


class Kernel:
    """One kernel process and our ZMQ channels to it. Messages from the shell
    and iopub channels are read by two tasks and routed to the `Pending` of
    their parent request."""

    def __init__(self, spec, cwd, env):
        self.spec = spec
        self.cwd = cwd
        self.env = env
        self.km = None
        self.kc = None
        self.pending = {}
        self.tasks = []
        self.dead = False
        # ipykernel publishes a request's output before its idle status, as
        # the protocol says. Deno's kernel (2.9) does not: on a cold kernel,
        # stdout and execute_result came 10-20 ms after idle. For kernels
        # other than ours (ipykernel, bash_kernel), wait this long for quiet.
        self.settle = 0.0 if spec.argv[:2] == [sys.executable, "-c"] else 0.05

    async def start(self):
        self.km = jc.AsyncKernelManager(kernel_spec_manager=make_spec_manager(self.spec),
                                        kernel_name=self.spec.language)
        env = dict(self.env)
        env.update(self.spec.env or {})
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        try:
            await self.km.start_kernel(cwd=self.cwd, env=env)
        except Exception as e:
            raise KernelStartError(f"could not start the {self.spec.language} kernel: {e}")
        self.kc = self.km.client()
        self.kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        self.tasks = [asyncio.ensure_future(self._pump(self.kc.shell_channel, False)),
                      asyncio.ensure_future(self._pump(self.kc.iopub_channel, True)),
                      asyncio.ensure_future(self._watch_process())]
        try:
            await asyncio.wait_for(self._handshake(), KERNEL_START_TIMEOUT)
        except asyncio.TimeoutError:
            await self.shutdown()
            raise KernelStartError(f"the {self.spec.language} kernel did not answer within "
                                   f"{KERNEL_START_TIMEOUT:.0f} s")
        if self.dead:
            why = self._exit_reason()  # before shutdown forgets the process
            await self.shutdown()
            raise KernelStartError(f"the {self.spec.language} kernel exited while starting"
                                   f"{why}; see the server's log for its output")

    def _exit_reason(self):
        """How the kernel's process ended, for an error message."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        rc = getattr(process, "poll", lambda: None)()
        if rc is None:
            return ""
        if rc == -signal.SIGKILL:
            return (" (killed by SIGKILL: most likely the sandbox's memory limit; "
                    "create it with more memory)")
        if rc < 0:
            return f" (killed by signal {-rc})"
        return f" (exit status {rc})"

    async def _handshake(self):
        """Ready = a kernel_info_request answered on shell AND its busy/idle
        seen on iopub, which proves our iopub subscription is live (a SUB
        socket drops what is published before it is connected)."""
        while not self.dead:
            msg = self.kc.session.msg("kernel_info_request")
            p = self.pending[msg["header"]["msg_id"]] = Pending()
            self.kc.shell_channel.send(msg)
            try:
                await asyncio.wait_for(self._until_done(p), 0.5)
                return
            except asyncio.TimeoutError:
                pass
            finally:
                self.pending.pop(msg["header"]["msg_id"], None)

    async def _until_done(self, p):
        while True:
            item = await p.queue.get()
            if item is DONE or item in (KERNEL_DIED, RESTARTED):
                return

    async def _pump(self, channel, iopub):
        while True:
            try:
                msg = await channel.get_msg()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a malformed message must not stop the pump
                if self.dead:
                    return
                log.warning("dropping an unreadable kernel message: %s", e)
                continue
            parent = (msg.get("parent_header") or {}).get("msg_id")
            p = self.pending.get(parent)
            if p is None:
                continue
            mtype = msg["msg_type"]
            if not iopub:
                if mtype.endswith("_reply"):
                    p.reply = msg["content"]
                    if p.done:
                        p.queue.put_nowait(DONE)
                continue
            if mtype == "execute_input":
                p.started = True
            if mtype == "status":
                if msg["content"].get("execution_state") == "idle":
                    p.idle = True
                    p.queue.put_nowait(DONE if p.done else IDLE)
                continue
            p.queue.put_nowait(msg)

    async def _watch_process(self):
        """Notice a kernel that died (OOM kill, os._exit, segfault)."""
        while True:
            await asyncio.sleep(0.5)
            try:
                alive = await self.km.is_alive()
            except Exception:
                alive = False
            if not alive:
                self.dead = True
                for p in self.pending.values():
                    p.queue.put_nowait(KERNEL_DIED)
                return

    def execute(self, code, silent=False):
        msg_id = self.kc.execute(code, silent=silent, store_history=not silent,
                                 allow_stdin=False, stop_on_error=False)
        p = self.pending[msg_id] = Pending()
        if self.dead:
            p.queue.put_nowait(KERNEL_DIED)
        return msg_id, p

    def forget(self, msg_id):
        self.pending.pop(msg_id, None)

    async def run_silent(self, code, timeout=30.0):
        """Run helper code (env vars) with no output; returns the reply status."""
        msg_id, p = self.execute(code, silent=True)
        try:
            await asyncio.wait_for(self._until_done(p), timeout)
            return (p.reply or {}).get("status", "error")
        except asyncio.TimeoutError:
            return "timeout"
        finally:
            self.forget(msg_id)

    async def interrupt(self):
        try:
            await self.km.interrupt_kernel()
        except Exception as e:
            log.warning("interrupting the kernel failed: %s", e)

    def notify_restart(self):
        for p in self.pending.values():
            p.queue.put_nowait(RESTARTED)

    async def shutdown(self):
        for t in self.tasks:
            t.cancel()
        self.tasks = []
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:
                pass
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception as e:
                log.warning("shutting a kernel down failed: %s", e)


# --------------------------------------------------------------------------
# Env var snippets, per language
# --------------------------------------------------------------------------

# Python: run in a throwaway namespace (exec with its own globals) so nothing
# appears in the user's namespace; the previous values wait in os._brig_saved_env.
PY_SET = ("import os\n"
          "os._brig_saved_env = {k: os.environ.get(k) for k in env}\n"
          "os.environ.update(env)\n")
PY_RESTORE = ("import os\n"
              "for k, v in getattr(os, '_brig_saved_env', {}).items():\n"
              "    if v is None:\n"
              "        os.environ.pop(k, None)\n"
              "    else:\n"
              "        os.environ[k] = v\n"
              "os._brig_saved_env = {}\n")
PY_APPLY = "import os\nos.environ.update(env)\n"


def sh_quote(value):
    return "'" + value.replace("'", "'\\''") + "'"


def chdir_code(language, cwd):
    """Code that moves a kernel of `language` to `cwd` (a spare kernel,
    started in the default cwd)."""
    if language == "python":
        return f"import os as _brig_os; _brig_os.chdir({cwd!r}); del _brig_os"
    if language == "bash":
        return f"cd {sh_quote(cwd)}"
    if language == "javascript":
        return f"Deno.chdir({json.dumps(cwd)});"
    return None


def env_set_code(language, env, save):
    if language == "python":
        return f"exec({(PY_SET if save else PY_APPLY)!r}, {{'env': {env!r}}})"
    if language == "javascript":  # process.env: Node, and Deno's Node compatibility
        if save:
            return (f"globalThis.__brig_saved_env = Object.fromEntries("
                    f"{json.dumps(list(env))}.map((k) => [k, process.env[k]])); "
                    f"Object.assign(process.env, {json.dumps(env)});")
        return f"Object.assign(process.env, {json.dumps(env)});"
    if language == "bash":
        parts = []
        for k, v in env.items():
            if save:
                parts.append(f'if [ "${{{k}+set}}" = set ]; then __brig_restore_{k}="export {k}=$(printf %q "${k}")"; '
                             f'else __brig_restore_{k}="unset {k}"; fi')
            parts.append(f"export {k}={sh_quote(v)}")
        return "\n".join(parts)
    return None


def env_restore_code(language, env):
    if language == "python":
        return f"exec({PY_RESTORE!r}, {{}})"
    if language == "javascript":
        return ("for (const [k, v] of Object.entries(globalThis.__brig_saved_env ?? {})) "
                "{ if (v === undefined) delete process.env[k]; else process.env[k] = v; } "
                "delete globalThis.__brig_saved_env;")
    if language == "bash":
        return "\n".join(f'eval "$__brig_restore_{k}"; unset __brig_restore_{k}' for k in env)
    return None


# --------------------------------------------------------------------------
# Contexts
# --------------------------------------------------------------------------


class Context:
    """A stateful kernel with its own cwd. Executions in one context run one at
    a time (`lock`); different contexts run in parallel."""

    def __init__(self, interp, language, cwd):
        self.interp = interp
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = asyncio.Lock()
        self.kernel = None
        self.ready = None  # Future: the current kernel started (or failed)
        self.globals_applied = False
        self.reseed = False  # restored from a warm start: reseed before the next cell
        self.chdir = False  # a spare kernel: move it to cwd before the next cell

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def adopt(self, kernel, ready):
        """Take a spare kernel started for another context's use (see
        Interpreter.spares): moved to this context's cwd at its first cell,
        its random numbers reseeded."""
        self.kernel = kernel
        self.ready = ready
        self.globals_applied = False
        self.reseed = True
        self.chdir = True

    def start(self):
        spec = kernel_spec_for(self.language)
        if spec is None:
            raise HttpError(400, f"no kernel for language '{self.language}' in this sandbox "
                                 "(python and bash have one; others need a Jupyter kernelspec)")
        env = dict(os.environ)
        if self.interp.global_envs:
            env.update(self.interp.global_envs)
            self.globals_applied = True
        self.kernel = Kernel(spec, self.cwd, env)
        self.ready = asyncio.ensure_future(self.kernel.start())
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def wait_ready(self):
        try:
            await asyncio.shield(self.ready)
        except KernelStartError:
            raise
        except Exception as e:
            raise KernelStartError(f"could not start the {self.language} kernel: {e}")

    async def restart(self):
        old = self.kernel
        if old is not None:
            old.notify_restart()
            await old.shutdown()
        self.globals_applied = False
        spare = self.interp.take_spare(self.language)
        if spare is not None:
            self.adopt(*spare)
        else:
            self.start()
        await self.wait_ready()

    async def close(self):
        if self.kernel is not None:
            self.kernel.notify_restart()
            await self.kernel.shutdown()


class Interpreter:
    def __init__(self, args):
        self.args = args
        self.contexts = {}
        self.defaults = {}  # language -> context id (lazily created)
        self.global_envs = None  # from envd /envs, when BRIG_ENVD_URL is set
        self.envd_url = os.environ.get("BRIG_ENVD_URL")
        self.envs_tried = set()  # access tokens /envs was asked with
        self.ready = asyncio.get_running_loop().create_future()  # jupyter_client imported
        self.booted = asyncio.get_running_loop().create_future()  # default contexts tried
        self.restored_seen = None  # RESTORED_FILE's (mtime, size) last read
        # --spare-kernels: kernels started ahead, per language, each (kernel,
        # its start future), for new contexts to take at once.
        self.spare_wanted = [normalize_language(x) for x in args.spare_kernels.split(",")
                             if x.strip()]
        self.spares = {}
        # One spare starts at a time: the one a context may be waiting for
        # (take_spare) gets the CPU to itself, not half of it.
        self.spare_starts = asyncio.Lock()
        self.boot_errors = {}  # language -> why its default context did not start

    def check_restored(self):
        """Take the sandbox's env vars from RESTORED_FILE if it is new: for
        every context (at its next cell) and every kernel started later."""
        try:
            st = os.stat(self.args.restored_file)
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self.restored_seen:
            return
        self.restored_seen = seen
        try:
            with open(self.args.restored_file) as f:
                envs = json.load(f).get("envs") or {}
        except (OSError, ValueError, AttributeError) as e:
            log.warning("cannot read %s: %s", self.args.restored_file, e)
            return
        self.global_envs = {str(k): str(v) for k, v in envs.items()}
        for ctx in self.contexts.values():
            ctx.globals_applied = False
            ctx.reseed = True
        log.info("restored from a warm start: %d env vars", len(self.global_envs))

    async def boot(self):
        try:
            await self._boot()
        finally:
            if not self.booted.done():
                self.booted.set_result(None)

    async def _boot(self):
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, import_jupyter_client)
        except Exception as e:
            log.error("cannot import jupyter_client (install python3-jupyter-client): %s", e)
            self.ready.set_exception(KernelStartError(f"jupyter_client is not installed: {e}"))
            return
        self.ready.set_result(None)
        if self.envd_url:
            await loop.run_in_executor(None, self.fetch_envs, os.environ.get("BRIG_ENVD_ACCESS_TOKEN"))
        languages = self.default_languages()
        results = await asyncio.gather(*(self.default_context(x) for x in languages),
                                       return_exceptions=True)
        for language, result in zip(languages, results):
            if isinstance(result, BaseException):
                why = getattr(result, "body", b"").decode() or str(result)
                self.boot_errors[language] = why
                log.error("default %s context failed to start: %s", language, why)
            else:
                log.info("default %s context ready", language)
        for language in self.spare_wanted:
            await self.start_spare(language)

    def default_languages(self):
        if self.args.no_default_kernel:
            return []
        return [normalize_language(x) for x in self.args.default_kernels.split(",") if x.strip()]

    def spare_env(self):
        env = dict(os.environ)
        if self.global_envs:
            env.update(self.global_envs)
        return env

    async def start_spare(self, language):
        """Start one spare kernel of `language` and wait until it answers."""
        spec = kernel_spec_for(language)
        if spec is None:
            log.error("no kernel for spare language %s", language)
            return
        async with self.spare_starts:
            cwd = self.args.cwd if os.path.isdir(self.args.cwd) else os.getcwd()
            kernel = Kernel(spec, cwd, self.spare_env())
            ready = asyncio.ensure_future(kernel.start())
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())
            self.spares.setdefault(language, []).append((kernel, ready))
            try:
                await asyncio.shield(ready)
                log.info("spare %s kernel ready", language)
            except Exception as e:
                log.error("spare %s kernel failed to start: %s", language, e)
                entry = (kernel, ready)
                if entry in self.spares.get(language, []):
                    self.spares[language].remove(entry)

    def take_spare(self, language):
        """A spare kernel of `language`: a ready one, or else the one that
        began starting first, or None. Waiting for a spare that is starting
        costs less than starting another kernel beside it: two kernels
        starting at once on a loaded host or a guest's one emulated vCPU
        each take about twice as long (a restored TCG guest took minutes).
        Its replacement starts once the taken one is up, for the same
        reason."""
        usable = [(kernel, ready) for kernel, ready in self.spares.get(language, [])
                  if not kernel.dead and not (ready.done() and (ready.cancelled()
                                                                or ready.exception() is not None))]
        if not usable:
            return None
        started = [entry for entry in usable if entry[1].done()]
        entry = (started or usable)[0]
        self.spares[language].remove(entry)

        async def replace():
            try:
                await asyncio.shield(entry[1])
            except Exception:
                pass  # the context that took it reports why
            await self.start_spare(language)

        asyncio.ensure_future(replace())
        return entry

    def fetch_envs(self, token):
        # One attempt per distinct token: a failing envd must not cost every
        # execution a round trip.
        if token in self.envs_tried:
            return
        self.envs_tried.add(token)
        import urllib.request  # not at the top: it costs ~15 ms of start-up

        req = urllib.request.Request(self.envd_url.rstrip("/") + "/envs")
        if token:
            req.add_header("X-Access-Token", token)
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                envs = json.load(r)
            if isinstance(envs, dict):
                self.global_envs = {str(k): str(v) for k, v in envs.items()}
        except Exception as e:
            log.warning("could not fetch the sandbox env vars from %s/envs: %s", self.envd_url, e)

    async def new_context(self, language, cwd):
        await asyncio.shield(self.ready)
        if not os.path.isdir(cwd):
            raise HttpError(400, f"cwd {cwd} is not a directory in the sandbox")
        ctx = Context(self, language, cwd)
        spare = self.take_spare(language)
        if spare is not None:
            ctx.adopt(*spare)
        else:
            ctx.start()
        self.contexts[ctx.id] = ctx
        try:
            await ctx.wait_ready()
        except Exception:
            self.contexts.pop(ctx.id, None)
            await ctx.close()
            raise
        return ctx

    async def default_context(self, language):
        await asyncio.shield(self.ready)
        ctx = self.contexts.get(self.defaults.get(language))
        if ctx is not None:
            await ctx.wait_ready()
            return ctx
        # No await between the lookup above and the registration below, so
        # concurrent first requests for a language share one context.
        cwd = self.args.cwd if os.path.isdir(self.args.cwd) else os.getcwd()
        ctx = Context(self, language, cwd)
        ctx.start()
        self.contexts[ctx.id] = ctx
        self.defaults[language] = ctx.id
        try:
            await ctx.wait_ready()
        except Exception:
            self.contexts.pop(ctx.id, None)
            self.defaults.pop(language, None)
            await ctx.close()
            raise
        return ctx

    async def delete(self, ctx):
        self.contexts.pop(ctx.id, None)
        for lang, cid in list(self.defaults.items()):
            if cid == ctx.id:
                del self.defaults[lang]
        await ctx.close()

    async def close(self):
        spares = [k.shutdown() for entries in self.spares.values() for k, _ in entries]
        await asyncio.gather(*(c.close() for c in list(self.contexts.values())), *spares,
                             return_exceptions=True)


# --------------------------------------------------------------------------
# Jupyter messages -> E2B output lines
# --------------------------------------------------------------------------

MIME_FIELDS = [("text/html", "html"), ("text/markdown", "markdown"), ("image/svg+xml", "svg"),
               ("image/png", "png"), ("image/jpeg", "jpeg"), ("application/pdf", "pdf"),
               ("text/latex", "latex"), ("application/json", "json"),
               ("application/javascript", "javascript"), ("e2b/data", "data"),
               ("e2b/chart", "chart")]


def result_line(data, is_main):
    data = dict(data)
    out = {"type": "result"}
    text = data.pop("text/plain", None)
    # E2B strips one pair of single quotes: a str repr 'abc' reads as abc.
    if text and text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    if text is not None:
        out["text"] = text
    for mime, field in MIME_FIELDS:
        value = data.pop(mime, None)
        if value is not None:
            out[field] = value
    out["extra"] = data
    out["is_main_result"] = is_main
    return out


def error_line(name, value, traceback):
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def to_line(msg):
    mtype = msg["msg_type"]
    content = msg["content"]
    if mtype == "stream":
        name = content.get("name")
        if name in ("stdout", "stderr"):
            return {"type": name, "text": content.get("text", ""),
                    "timestamp": iso_date(msg["header"].get("date"))}
    elif mtype == "execute_result":
        return result_line(content.get("data", {}), True)
    elif mtype == "display_data":
        return result_line(content.get("data", {}), False)
    elif mtype == "execute_input":
        return {"type": "number_of_executions", "execution_count": content.get("execution_count")}
    elif mtype == "error":
        return error_line(content.get("ename", ""), content.get("evalue", ""),
                          "\n".join(content.get("traceback", [])))
    return None


# --------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------


def parse_json(req):
    try:
        return json.loads(req.body or b"null")
    except ValueError as e:
        raise HttpError(400, f"request body is not valid JSON: {e}")


async def handle_execute(interp, conn, req):
    body = parse_json(req)
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise HttpError(400, 'request body must be a JSON object with a string field "code"')
    context_id = body.get("context_id")
    language = body.get("language")
    if context_id and language:
        raise HttpError(400, "Only one of context_id or language can be provided")
    env_vars = body.get("env_vars") or {}
    if not isinstance(env_vars, dict):
        raise HttpError(400, "env_vars must be an object of strings")
    env_vars = {str(k): "" if v is None else str(v) for k, v in env_vars.items()}
    bad = [k for k in env_vars if not ENV_NAME.match(k)]
    if bad:
        raise HttpError(400, f"invalid env var name {bad[0]!r}: use letters, digits and _")
    timeout = body.get("timeout", interp.args.execution_timeout)
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise HttpError(400, "timeout must be a number of seconds (0: none)")

    try:
        if context_id:
            ctx = interp.contexts.get(context_id)
            if ctx is None:
                raise HttpError(404, f"Context {context_id} not found")
            await ctx.wait_ready()
        else:
            ctx = await interp.default_context(normalize_language(language))
    except KernelStartError as e:
        raise HttpError(500, str(e))

    if (interp.envd_url and interp.global_envs is None
            and req.headers.get("x-access-token") not in interp.envs_tried):
        await asyncio.get_running_loop().run_in_executor(
            None, interp.fetch_envs, req.headers.get("x-access-token"))

    await conn.start_stream("application/x-ndjson")

    async def send(line):
        await conn.send_chunk(json.dumps(line).encode() + b"\n")

    gone = asyncio.ensure_future(conn.gone.wait())
    try:
        if await acquire_or_gone(ctx.lock, gone, send):
            try:
                await run_cell(ctx, gone, send, body["code"], env_vars, timeout or None)
            except ConnectionResetError:
                raise
            except Exception as e:  # the stream has started: report in it, not as a status
                log.exception("execution failed")
                await send(error_line(type(e).__name__, str(e), ""))
            finally:
                ctx.lock.release()
    finally:
        gone.cancel()
    await send({"type": "end_of_execution"})
    await conn.end_stream()


async def acquire_or_gone(lock, gone, send):
    """Wait for the context's lock (another execution is running), with
    keepalives; False if the client left first."""
    acq = asyncio.ensure_future(lock.acquire())
    while True:
        done, _ = await asyncio.wait({acq, gone}, timeout=KEEPALIVE_INTERVAL,
                                     return_when=asyncio.FIRST_COMPLETED)
        if acq in done:
            return True
        if gone in done:
            acq.cancel()
            try:
                await acq
                lock.release()  # acquired just before the cancel
            except asyncio.CancelledError:
                pass
            return False
        try:
            await send({"type": "keepalive"})
        except ConnectionResetError:
            continue  # `gone` is set now


async def run_cell(ctx, gone, send, code, env_vars, timeout):
    """Stream one cell. Returns once the kernel is idle again (or replaced), so
    the next execution in this context starts on a quiet kernel."""
    if ctx.kernel.dead:  # died between executions: start afresh
        await ctx.restart()
    kernel = ctx.kernel
    lang = ctx.language
    if ctx.chdir:
        ctx.chdir = False
        code_ = chdir_code(lang, ctx.cwd)
        if code_:
            await kernel.run_silent(code_)
    if ctx.reseed:
        ctx.reseed = False
        if lang == "python":
            await kernel.run_silent(RESEED_PY)
    if ctx.interp.global_envs and not ctx.globals_applied:
        code_ = env_set_code(lang, ctx.interp.global_envs, save=False)
        if code_:
            await kernel.run_silent(code_)
        ctx.globals_applied = True
    if env_vars:
        code_ = env_set_code(lang, env_vars, save=True)
        if code_:
            await kernel.run_silent(code_)

    msg_id, p = kernel.execute(code)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    outcome = "done"
    errored = False
    try:
        while True:
            if gone.done():
                outcome = "gone"
                break
            if deadline is not None and loop.time() >= deadline:
                outcome = "timeout"
                break
            # Messages come in bursts: take what is there without the cost
            # of a task and a timer per message (a fair share of a short
            # cell's time in this server).
            try:
                item = p.queue.get_nowait()
            except asyncio.QueueEmpty:
                wait = KEEPALIVE_INTERVAL
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - loop.time()))
                get = asyncio.ensure_future(p.queue.get())
                finished, _ = await asyncio.wait({get, gone}, timeout=wait,
                                                 return_when=asyncio.FIRST_COMPLETED)
                if get not in finished:
                    get.cancel()
                    if gone in finished:
                        outcome = "gone"
                        break
                    if deadline is not None and loop.time() >= deadline:
                        outcome = "timeout"
                        break
                    await send({"type": "keepalive"})
                    continue
                item = get.result()
            if item is IDLE:
                continue
            if item is DONE:
                reply = p.reply or {}
                if reply.get("status") == "aborted":
                    await send(error_line("ExecutionAborted", "Execution was aborted", ""))
                elif reply.get("status") == "error" and not errored:
                    # A kernel may report the error only in its reply.
                    await send(error_line(reply.get("ename", ""), reply.get("evalue", ""),
                                          "\n".join(reply.get("traceback", []))))
                if kernel.settle:
                    await _settle(p, kernel.settle, send)
                break
            if item is RESTARTED:
                await send(error_line("ContextRestarting", "Context was restarted", ""))
                outcome = "restarted"
                break
            if item is KERNEL_DIED:
                await send(error_line(
                    "ContextRestarting",
                    f"the {lang} kernel died during the execution (out of memory, or the "
                    "process exited); it was restarted and its state is lost", ""))
                outcome = "died"
                break
            line = to_line(item)
            if line is None:
                continue
            if line["type"] == "error":
                if errored:
                    continue  # the SDKs keep one error per execution: the first
                errored = True
            await send(line)
    except ConnectionResetError:
        outcome = "gone"

    if outcome == "timeout":
        try:
            await send(error_line(
                "TimeoutError",
                f"Execution timed out after {timeout:g} s and was interrupted", ""))
        except ConnectionResetError:
            pass
    if outcome in ("timeout", "gone"):
        last = await _interrupt(kernel, p)
        outcome = {DONE: "done", RESTARTED: "restarted"}.get(last, "died")
    kernel.forget(msg_id)
    if outcome == "died":
        if ctx.kernel is kernel:
            await ctx.restart()
        return
    if outcome == "restarted":
        return
    if env_vars:
        code_ = env_restore_code(lang, env_vars)
        if code_:
            await kernel.run_silent(code_)


async def _settle(p, quiet, send):
    """Forward output that arrives after the request's idle status, until
    `quiet` seconds pass without any (for kernels that break the ordering)."""
    while True:
        try:
            item = await asyncio.wait_for(p.queue.get(), quiet)
        except asyncio.TimeoutError:
            return
        if isinstance(item, dict):
            line = to_line(item)
            if line is not None:
                await send(line)


async def _interrupt(kernel, p):
    """Interrupt the cell and wait up to INTERRUPT_GRACE for the kernel to
    finish it. Returns how it ended; KERNEL_DIED when it is stuck despite the
    interrupt (the caller replaces the kernel)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + INTERRUPT_GRACE
    drain = asyncio.ensure_future(_drain(p))
    try:
        while True:
            # Seen before the signal goes: this one reaches a running cell.
            started = p.started
            await kernel.interrupt()
            left = end - loop.time()
            if left <= 0:
                return KERNEL_DIED
            done, _ = await asyncio.wait({drain}, timeout=left if started
                                         else min(INTERRUPT_RETRY, left))
            if drain in done:
                return drain.result()
            if started:
                return KERNEL_DIED
    finally:
        drain.cancel()


async def _drain(p):
    """Until the request is over: DONE, KERNEL_DIED or RESTARTED."""
    while True:
        if p.idle and p.reply is None:
            try:
                item = await asyncio.wait_for(p.queue.get(), IDLE_WITHOUT_REPLY)
            except asyncio.TimeoutError:
                return DONE
        else:
            item = await p.queue.get()
        if item in (DONE, KERNEL_DIED, RESTARTED):
            return item


async def handle_contexts_post(interp, req):
    body = parse_json(req) or {}
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    language = normalize_language(body.get("language"))
    cwd = body.get("cwd") or interp.args.cwd
    try:
        ctx = await interp.new_context(language, cwd)
    except KernelStartError as e:
        raise HttpError(500, str(e))
    return ctx.describe()


def context_or_404(interp, cid):
    ctx = interp.contexts.get(cid)
    if ctx is None:
        raise HttpError(404, f"Context {cid} not found")
    return ctx


async def dispatch(interp, conn, req):
    """Returns (status, body, content type) for plain responses, or None when
    the handler streamed its own response."""
    path = req.path.rstrip("/") or "/"
    m = req.method
    if path == "/health":
        if m != "GET":
            raise json_error(405, "Method Not Allowed")
        return 200, json.dumps("OK")
    if path == "/brig/ready":
        # brig's warm-up: answers once the default contexts have started
        # (and the spares wanted at boot), with the spares ready now.
        if m != "GET":
            raise json_error(405, "Method Not Allowed")
        await asyncio.shield(interp.booted)
        ready = [c.describe() for c in interp.contexts.values() if c.ready and c.ready.done()
                 and not c.ready.cancelled() and c.ready.exception() is None]
        wanted = set(interp.default_languages())
        missing = wanted - {c["language"] for c in ready}
        if missing:
            raise json_error(500, "default contexts did not start: " + "; ".join(
                f"{x}: {interp.boot_errors.get(x, 'unknown (see the server log)')}"
                for x in sorted(missing)))
        spares = {lang: sum(1 for k, f in entries if f.done() and not f.cancelled()
                            and f.exception() is None and not k.dead)
                  for lang, entries in interp.spares.items()}
        return 200, json.dumps({"contexts": ready, "spares": spares})
    interp.check_restored()
    if path == "/execute":
        if m != "POST":
            raise json_error(405, "Method Not Allowed")
        await handle_execute(interp, conn, req)
        return None
    if path == "/contexts":
        if m == "POST":
            return 200, json.dumps(await handle_contexts_post(interp, req))
        if m == "GET":
            return 200, json.dumps([c.describe() for c in interp.contexts.values()])
        raise json_error(405, "Method Not Allowed")
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "contexts" and parts[3] == "restart":
        if m != "POST":
            raise json_error(405, "Method Not Allowed")
        ctx = context_or_404(interp, parts[2])
        try:
            await ctx.restart()
        except KernelStartError as e:
            raise HttpError(500, f"Failed to restart context {ctx.id}: {e}")
        return 200, "null"
    if len(parts) == 3 and parts[1] == "contexts":
        if m != "DELETE":
            raise json_error(405, "Method Not Allowed")
        await interp.delete(context_or_404(interp, parts[2]))
        return 200, "null"
    raise json_error(404, "Not Found")


async def serve_connection(interp, reader, writer):
    conn = Connection(reader, writer)
    try:
        while True:
            try:
                req = await conn.read_request()
            except HttpError as e:
                await conn.respond(e.status, e.body, e.content_type, False)
                return
            if req is None:
                return
            try:
                out = await dispatch(interp, conn, req)
            except HttpError as e:
                await conn.respond(e.status, e.body, e.content_type, req.keep_alive)
                continue
            except ConnectionResetError:
                return
            except Exception as e:  # a bug here must cost one request, not the server
                log.exception("request %s %s failed", req.method, req.path)
                try:
                    await conn.respond(500, f"internal error: {e}".encode(),
                                       "text/plain; charset=utf-8", False)
                except ConnectionResetError:
                    pass
                return
            if out is not None:
                await conn.respond(out[0], out[1].encode(), "application/json", req.keep_alive)
            if not req.keep_alive:
                return
    except (ConnectionError, OSError):
        pass
    except Exception:  # never let one connection's failure reach the loop
        log.exception("connection failed")
    finally:
        conn.close()


async def main_async(args):
    interp = Interpreter(args)
    server = await asyncio.start_server(
        lambda r, w: serve_connection(interp, r, w), args.host, args.port, reuse_address=True)
    log.info("listening on %s:%d", args.host, args.port)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    boot = asyncio.ensure_future(interp.boot())
    await stop
    boot.cancel()
    server.close()
    await interp.close()


def main():
    global KEEPALIVE_INTERVAL, KERNEL_START_TIMEOUT
    ap = argparse.ArgumentParser(description="brig's code interpreter server (E2B protocol)")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=49999)
    ap.add_argument("--cwd", default="/home/user", help="default cwd of contexts")
    ap.add_argument("--execution-timeout", type=float, default=None,
                    help="default per-execution timeout in seconds (none by default)")
    ap.add_argument("--default-kernels", default="python",
                    help="languages whose default context starts at boot, comma-separated "
                         "(others start on first use: bash takes ~3 s)")
    ap.add_argument("--kernel-start-timeout", type=float, default=KERNEL_START_TIMEOUT,
                    help="seconds a kernel may take to answer once started (a vm guest under "
                         "TCG needs far more than the default)")
    ap.add_argument("--restored-file", default=RESTORED_FILE,
                    help="where brig writes the sandbox's env vars when it restores a warm start")
    ap.add_argument("--spare-kernels", default="",
                    help="languages (repeat one for more) whose kernels are started ahead for "
                         "new contexts to take at once, each replaced when taken "
                         "(brig's warm starts: kernels are slow to start in a vm guest)")
    ap.add_argument("--no-default-kernel", action="store_true",
                    help="start no kernel at boot")
    ap.add_argument("--keepalive-interval", type=float, default=KEEPALIVE_INTERVAL,
                    help="seconds of silence before a keepalive line (E2B: 5)")
    ap.add_argument("--log-level", default=os.environ.get("BRIG_CI_LOG", "INFO"))
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    KEEPALIVE_INTERVAL = args.keepalive_interval
    KERNEL_START_TIMEOUT = args.kernel_start_timeout
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
