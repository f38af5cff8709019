"""Tests for server.py against real kernels (ipykernel, bash_kernel).

    python3 -m unittest -v test_server        (from this directory)

Needs Debian's python3-ipykernel, python3-jupyter-client, python3-matplotlib,
python3-pexpect and python3-filetype for the interpreter running the tests
(the server and its kernels use the same one). bash_kernel is not in Debian:
it is pip-installed (no deps, pure Python) into a directory used only by
these tests, ${BRIG_TEST_CACHE:-~/.cache/brig-test}/bash-kernel, unless
BRIG_CI_BASH_KERNEL_DIR names one that already holds it.
"""

import base64
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "server.py")
BASH_KERNEL = "bash_kernel==0.10.0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_bash_kernel_dir = None


def bash_kernel_dir():
    """A directory with bash_kernel importable, installed there if needed."""
    global _bash_kernel_dir
    if _bash_kernel_dir is None:
        _bash_kernel_dir = _install_bash_kernel()
    return _bash_kernel_dir


def _install_bash_kernel():
    d = os.environ.get("BRIG_CI_BASH_KERNEL_DIR")
    if not d:
        cache = os.environ.get("BRIG_TEST_CACHE") or os.path.expanduser("~/.cache/brig-test")
        d = os.path.join(cache, "bash-kernel")
    if os.path.isdir(os.path.join(d, "bash_kernel")):
        return d
    # Any pip will do: the wheel is pure Python and installed without deps
    # (pexpect and filetype come from Debian).
    for pip in ([sys.executable, "-m", "pip"], ["python3", "-m", "pip"], ["pip3"]):
        r = subprocess.run(pip + ["install", "-q", "--no-deps", "--disable-pip-version-check",
                                  "--target", d, BASH_KERNEL],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return d
    raise RuntimeError(f"could not pip-install {BASH_KERNEL} into {d}: {r.stderr[-500:]}")


DENO = "deno@2.9.6"
_deno = None


def deno_jupyter_path():
    """(JUPYTER_PATH dir with a `deno` kernelspec, None) or (None, why not).

    Deno has a Jupyter kernel built in; the npm package ships the binary in
    @deno/linux-x64-glibc. Installed once with npm into the test cache."""
    global _deno
    if _deno is None:
        _deno = _install_deno()
    return _deno


def _install_deno():
    cache = os.environ.get("BRIG_TEST_CACHE") or os.path.expanduser("~/.cache/brig-test")
    prefix = os.path.join(cache, "deno")
    binary = os.path.join(prefix, "node_modules", "@deno", "linux-x64-glibc", "deno")
    if not os.path.exists(binary):
        if shutil.which("npm") is None:
            return None, "npm is not installed"
        r = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund",
                            "--loglevel=error", DENO], capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(binary):
            return None, f"npm install {DENO} failed: {r.stderr[-500:]}"
    spec_dir = os.path.join(prefix, "jupyter", "kernels", "deno")
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": [binary, "jupyter", "--kernel", "--conn", "{connection_file}"],
                   "display_name": "Deno", "language": "typescript"}, f)
    return os.path.join(prefix, "jupyter"), None


class Server:
    """server.py as a subprocess on a free port."""

    def __init__(self, cwd, extra_env=None, args=()):
        self.port = free_port()
        env = dict(os.environ)
        pp = env.get("PYTHONPATH")
        env["PYTHONPATH"] = bash_kernel_dir() + (os.pathsep + pp if pp else "")
        jupyter_path, _ = deno_jupyter_path()
        if jupyter_path:
            env["JUPYTER_PATH"] = jupyter_path
        env.update(extra_env or {})
        self.log = tempfile.TemporaryFile()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--host", "127.0.0.1", "--port", str(self.port),
             "--cwd", cwd, "--keepalive-interval", "1", *args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.health_after = self._wait_health()

    def _wait_health(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                status, body = self.request("GET", "/health")
                if status == 200:
                    return time.monotonic() - self.t0
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("server did not answer /health within 10 s:\n" + self.output())

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)  # a kernel start on a loaded 2-core host
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data,
                         headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def execute(self, code, keepalives=False, **fields):
        """POST /execute; returns the parsed lines (keepalives dropped unless asked)."""
        status, body = self.request("POST", "/execute", {"code": code, **fields})
        if status != 200:
            raise AssertionError(f"/execute answered {status}: {body}")
        lines = [json.loads(line) for line in body.splitlines()]
        assert lines[-1] == {"type": "end_of_execution"}, lines
        if not keepalives:
            lines = [x for x in lines if x["type"] != "keepalive"]
        return lines

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def of_type(lines, t):
    return [x for x in lines if x["type"] == t]


def main_text(lines):
    results = [x for x in lines if x["type"] == "result" and x["is_main_result"]]
    return results[0].get("text") if results else None


class CodeInterpreterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="brig-ci-test-")
        cls.home = os.path.join(cls.tmp, "home")
        os.mkdir(cls.home)
        cls.server = Server(cls.home)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def new_context(self, **body):
        status, text = self.server.request("POST", "/contexts", body)
        self.assertEqual(status, 200, text)
        return json.loads(text)

    # --- basics -----------------------------------------------------------

    def test_health_is_fast(self):
        status, body = self.server.request("GET", "/health")
        self.assertEqual((status, json.loads(body)), (200, "OK"))
        self.assertLess(self.server.health_after, 3.0, "/health took too long after start")

    def test_keep_alive_connection_serves_several_requests(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        try:
            for i in range(3):
                conn.request("POST", "/execute", json.dumps({"code": f"{i} * 2"}))
                r = conn.getresponse()
                lines = [json.loads(x) for x in r.read().splitlines()]
                self.assertEqual(main_text(lines), str(i * 2))
            conn.request("GET", "/health")
            self.assertEqual(conn.getresponse().read(), b'"OK"')
        finally:
            conn.close()

    def test_unknown_path_is_404(self):
        status, _ = self.server.request("GET", "/nope")
        self.assertEqual(status, 404)

    def test_state_and_execution_count(self):
        ctx = self.new_context()
        first = self.server.execute("x = 41", context_id=ctx["id"])
        second = self.server.execute("x + 1", context_id=ctx["id"])
        counts = [of_type(r, "number_of_executions")[0]["execution_count"] for r in (first, second)]
        self.assertEqual(counts, [1, 2])
        self.assertEqual(main_text(second), "42")

    def test_history_works_in_memory(self):
        # The history is kept in memory only (MODULE_KERNEL_ARGS): In, Out,
        # _ and %history still work.
        ctx = self.new_context()
        self.server.execute("6 * 7", context_id=ctx["id"])
        lines = self.server.execute("(In[1], Out[1], _)", context_id=ctx["id"])
        self.assertEqual(main_text(lines), "('6 * 7', 42, 42)")
        lines = self.server.execute("%history -n 1", context_id=ctx["id"])
        self.assertIn("6 * 7", "".join(l["text"] for l in of_type(lines, "stdout")))
        lines = self.server.execute("import IPython; IPython.get_ipython().history_manager.hist_file",
                                    context_id=ctx["id"])
        self.assertEqual(main_text(lines), ":memory:")

    def test_default_context_is_python(self):
        lines = self.server.execute("import sys; sys.version_info[0]")
        self.assertEqual(main_text(lines), "3")
        lines = self.server.execute("'abc'", language="python")
        self.assertEqual(main_text(lines), "abc", "one pair of single quotes is stripped")

    def test_stdout_stderr_order_and_timestamps(self):
        code = ("import sys\n"
                "print('a'); sys.stdout.flush()\n"
                "print('b', file=sys.stderr); sys.stderr.flush()\n"
                "print('c')\n")
        lines = self.server.execute(code)
        streams = [(x["type"], x["text"]) for x in lines if x["type"] in ("stdout", "stderr")]
        self.assertEqual(streams, [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")])
        for x in lines:
            if x["type"] == "stdout":
                self.assertRegex(x["timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")

    def test_output_is_streamed_as_it_happens(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        t0 = time.monotonic()
        conn.request("POST", "/execute", json.dumps(
            {"code": "import time\nprint('early', flush=True)\ntime.sleep(3)\nprint('late')"}))
        r = conn.getresponse()
        seen = None
        while True:
            line = json.loads(r.readline())
            if line["type"] == "stdout":
                seen = (line["text"], time.monotonic() - t0)
                break
        r.read()
        r.close()
        conn.close()
        self.assertEqual(seen[0], "early\n")
        self.assertLess(seen[1], 2.5, "the first line waited for the whole cell")

    def test_keepalive_during_silence(self):
        lines = self.server.execute("import time; time.sleep(1.6)", keepalives=True)
        self.assertGreaterEqual(len(of_type(lines, "keepalive")), 1)

    def test_error(self):
        lines = self.server.execute("def f():\n    raise ValueError('boom')\nf()")
        errors = of_type(lines, "error")
        self.assertEqual(len(errors), 1, lines)
        self.assertEqual((errors[0]["name"], errors[0]["value"]), ("ValueError", "boom"))
        traceback = re.sub(r"\x1b\[[0-9;]*m", "", errors[0]["traceback"])  # IPython colours it
        self.assertIn("raise ValueError('boom')", traceback)
        self.assertIn("ValueError: boom", traceback)
        # The context survives an error.
        self.assertEqual(main_text(self.server.execute("1 + 1")), "2")

    # --- rich results -----------------------------------------------------

    def test_matplotlib_png(self):
        lines = self.server.execute(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
        pngs = [x for x in of_type(lines, "result") if "png" in x]
        self.assertEqual(len(pngs), 1, lines)
        self.assertFalse(pngs[0]["is_main_result"])
        self.assertEqual(base64.b64decode(pngs[0]["png"])[:8], b"\x89PNG\r\n\x1a\n")

    def test_display_data_and_main_result(self):
        lines = self.server.execute("from IPython.display import display\ndisplay(7)\n8")
        results = of_type(lines, "result")
        self.assertEqual([(x["text"], x["is_main_result"]) for x in results],
                         [("7", False), ("8", True)])
        self.assertEqual(results[0]["extra"], {})

    def test_rich_mime_types(self):
        code = ("from IPython.display import display, HTML, Markdown, SVG, JSON, Latex, Javascript\n"
                "display(HTML('<b>h</b>'))\n"
                "display(Markdown('# m'))\n"
                "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>'))\n"
                "display(JSON({'k': [1, 2]}))\n"
                "display(Latex('$x^2$'))\n"
                "display(Javascript('1;'))\n"
                "display({'text/plain': 'p', 'application/x-custom': 'c'}, raw=True)\n")
        res = of_type(self.server.execute(code), "result")
        self.assertEqual(res[0]["html"], "<b>h</b>")
        self.assertEqual(res[1]["markdown"], "# m")
        self.assertIn("<rect", res[2]["svg"])
        self.assertEqual(res[3]["json"], {"k": [1, 2]})
        self.assertEqual(res[4]["latex"], "$x^2$")
        self.assertEqual(res[5]["javascript"], "1;")
        self.assertEqual((res[6]["text"], res[6]["extra"]), ("p", {"application/x-custom": "c"}))
        self.assertTrue(all(not x["is_main_result"] for x in res))

    # --- env vars ---------------------------------------------------------

    def test_env_vars_per_execution_are_restored(self):
        ctx = self.new_context()
        cid = ctx["id"]
        self.server.execute("import os; os.environ['KEEP'] = 'orig'", context_id=cid)
        lines = self.server.execute(
            "import os, subprocess\n"
            "print(os.environ['FOO'], os.environ['KEEP'])\n"
            "print(subprocess.run(['sh', '-c', 'echo $FOO'], capture_output=True, text=True).stdout)",
            context_id=cid, env_vars={"FOO": "it's \"quoted\"", "KEEP": "tmp"})
        out = "".join(x["text"] for x in of_type(lines, "stdout"))
        self.assertEqual(out, "it's \"quoted\" tmp\nit's \"quoted\"\n\n")
        after = self.server.execute("import os; (os.environ.get('FOO'), os.environ.get('KEEP'))",
                                    context_id=cid)
        self.assertEqual(main_text(after), "(None, 'orig')")
        # The helper code left nothing in the user's namespace.
        names = self.server.execute("sorted(n for n in dir() if 'brig' in n)", context_id=cid)
        self.assertEqual(main_text(names), "[]")

    def test_bad_env_var_name_is_400(self):
        status, body = self.server.request(
            "POST", "/execute", {"code": "1", "env_vars": {"A B": "x"}})
        self.assertEqual(status, 400, body)

    # --- contexts ---------------------------------------------------------

    def test_contexts_lifecycle_and_cwd(self):
        sub = os.path.join(self.tmp, "work dir")
        os.makedirs(sub, exist_ok=True)
        ctx = self.new_context(cwd=sub)
        self.assertEqual((ctx["language"], ctx["cwd"]), ("python", sub))
        cid = ctx["id"]
        self.assertEqual(main_text(self.server.execute("import os; os.getcwd()", context_id=cid)),
                         sub)
        # Default context keeps the default cwd, and does not see this context's state.
        self.server.execute("only_here = 1", context_id=cid)
        self.assertEqual(main_text(self.server.execute("import os; os.getcwd()")), self.home)
        other = of_type(self.server.execute("only_here"), "error")
        self.assertEqual(other[0]["name"], "NameError")

        status, body = self.server.request("GET", "/contexts")
        self.assertEqual(status, 200)
        listed = {c["id"]: c for c in json.loads(body)}
        self.assertEqual(listed[cid], ctx)
        self.assertIn("python", {c["language"] for c in listed.values()})

        status, body = self.server.request("POST", f"/contexts/{cid}/restart")
        self.assertEqual((status, body), (200, "null"))
        lines = self.server.execute("import os\nprint(os.getcwd())\nonly_here", context_id=cid)
        self.assertEqual(of_type(lines, "stdout")[0]["text"], sub + "\n", "cwd survives restart")
        self.assertEqual(of_type(lines, "error")[0]["name"], "NameError", "state does not")
        self.assertEqual(of_type(lines, "number_of_executions")[0]["execution_count"], 1)

        status, body = self.server.request("DELETE", f"/contexts/{cid}")
        self.assertEqual((status, body), (200, "null"))
        status, body = self.server.request("GET", "/contexts")
        self.assertNotIn(cid, {c["id"] for c in json.loads(body)})
        status, body = self.server.request("POST", "/execute", {"code": "1", "context_id": cid})
        self.assertEqual((status, body), (404, f"Context {cid} not found"))

    def test_missing_context_is_404(self):
        for method, path, body in [("POST", "/execute", {"code": "1", "context_id": "nope"}),
                                   ("POST", "/contexts/nope/restart", None),
                                   ("DELETE", "/contexts/nope", None)]:
            status, text = self.server.request(method, path, body)
            self.assertEqual((status, text), (404, "Context nope not found"))

    def test_context_id_and_language_is_400(self):
        status, body = self.server.request(
            "POST", "/execute", {"code": "1", "context_id": "x", "language": "python"})
        self.assertEqual((status, body), (400, "Only one of context_id or language can be provided"))

    def test_bad_cwd_and_language_are_400(self):
        status, _ = self.server.request("POST", "/contexts", {"cwd": "/no/such/dir"})
        self.assertEqual(status, 400)
        status, body = self.server.request("POST", "/execute", {"code": "1", "language": "cobol"})
        self.assertEqual(status, 400, body)
        self.assertIn("cobol", body)

    def test_contexts_run_in_parallel(self):
        a, b = self.new_context()["id"], self.new_context()["id"]
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.server.execute,
                                    args=("import time; time.sleep(2)",), kwargs={"context_id": c})
                   for c in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLess(time.monotonic() - t0, 3.7, "one after the other would take 4 s")

    # --- bash ---------------------------------------------------------------

    def test_bash(self):
        lines = self.server.execute("X=5\necho hi $X\npwd", language="bash")
        out = "".join(x["text"] for x in of_type(lines, "stdout"))
        self.assertEqual(out, f"hi 5\n{self.home}\n")
        self.assertEqual(of_type(lines, "error"), [])
        lines = self.server.execute("echo again $X", language="bash")  # same default context
        self.assertEqual("".join(x["text"] for x in of_type(lines, "stdout")), "again 5\n")
        lines = self.server.execute("echo \"$FOO\"", language="bash", env_vars={"FOO": "a'b c"})
        self.assertEqual("".join(x["text"] for x in of_type(lines, "stdout")), "a'b c\n")
        lines = self.server.execute("echo \"[${FOO-unset}]\"", language="bash")
        self.assertEqual("".join(x["text"] for x in of_type(lines, "stdout")), "[unset]\n")
        lines = self.server.execute("false", language="bash")
        self.assertEqual(len(of_type(lines, "error")), 1, lines)

    def test_bash_context_with_cwd(self):
        ctx = self.new_context(language="bash", cwd=self.tmp)
        self.assertEqual(ctx["language"], "bash")
        lines = self.server.execute("pwd", context_id=ctx["id"])
        self.assertEqual(of_type(lines, "stdout")[0]["text"], self.tmp + "\n")

    # --- javascript (Deno's kernel) -----------------------------------------

    def test_javascript(self):
        _, why = deno_jupyter_path()
        if why:
            if os.environ.get("BRIG_TEST_STRICT") == "1":
                self.fail(f"BRIG_TEST_STRICT=1 and no JavaScript kernel: {why}")
            self.skipTest(f"no JavaScript kernel: {why}")
        lines = self.server.execute("const n: number = 40;\nconsole.log('hi');\nn + 2",
                                    language="ts")
        self.assertEqual(of_type(lines, "stdout")[0]["text"], "hi\n")
        self.assertEqual(main_text(lines), "42", "plain text, no ANSI colours")
        lines = self.server.execute("n * 2", language="javascript")  # same context as ts
        self.assertEqual(main_text(lines), "80")
        lines = self.server.execute("process.env.FOO", language="js", env_vars={"FOO": "bar"})
        self.assertEqual(main_text(lines), '"bar"')
        lines = self.server.execute("String(process.env.FOO)", language="js")
        self.assertEqual(main_text(lines), '"undefined"')
        errors = of_type(self.server.execute("throw new Error('boom')", language="js"), "error")
        self.assertEqual((errors[0]["name"], errors[0]["value"]), ("Error", "boom"))

    # --- interrupt, timeout, dead kernels ---------------------------------

    def test_client_disconnect_interrupts(self):
        cid = self.new_context()["id"]
        self.server.execute("state = 'kept'", context_id=cid)
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request("POST", "/execute", json.dumps({"code": "while True: pass", "context_id": cid}))
        r = conn.getresponse()
        self.assertEqual(json.loads(r.readline())["type"], "number_of_executions")
        conn.sock.shutdown(socket.SHUT_RDWR)
        r.close()
        conn.close()
        t0 = time.monotonic()
        lines = self.server.execute("state", context_id=cid)
        self.assertEqual(main_text(lines), "kept", "interrupted, not restarted")
        self.assertLess(time.monotonic() - t0, 6.0)

    def test_disconnect_before_the_cell_starts_still_interrupts(self):
        # The client leaves before the kernel has begun the cell: ipykernel
        # ignores SIGINT until its handler is installed around the cell, so
        # one interrupt sent then is lost and the kernel would be restarted.
        cid = self.new_context()["id"]
        self.server.execute("state = 'kept'", context_id=cid)
        for _ in range(5):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
            conn.request("POST", "/execute",
                         json.dumps({"code": "while True: pass", "context_id": cid}))
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            lines = self.server.execute("state", context_id=cid)
            self.assertEqual(main_text(lines), "kept", f"interrupted, not restarted: {lines}")

    def test_timeout(self):
        cid = self.new_context()["id"]
        self.server.execute("state = 'kept'", context_id=cid)
        t0 = time.monotonic()
        lines = self.server.execute("import time\nprint('before', flush=True)\ntime.sleep(60)",
                                    context_id=cid, timeout=1)
        self.assertLess(time.monotonic() - t0, 6.0)
        self.assertEqual(of_type(lines, "stdout")[0]["text"], "before\n")
        errors = of_type(lines, "error")
        self.assertEqual([e["name"] for e in errors], ["TimeoutError"])
        self.assertEqual(main_text(self.server.execute("state", context_id=cid)), "kept")

    def test_a_kernel_killed_while_starting_says_so(self):
        # What the memory limit's OOM killer does to a kernel that starts
        # (Deno's did, at 512 MiB): the error names SIGKILL and memory.
        specs = os.path.join(self.tmp, "killed-jupyter")
        os.makedirs(os.path.join(specs, "kernels", "killed"))
        with open(os.path.join(specs, "kernels", "killed", "kernel.json"), "w") as f:
            json.dump({"argv": ["/bin/sh", "-c", "kill -9 $$", "{connection_file}"],
                       "display_name": "killed", "language": "killed"}, f)
        server = Server(self.home, extra_env={"JUPYTER_PATH": specs})
        try:
            status, text = server.request("POST", "/execute", {"code": "1", "language": "killed"})
        finally:
            server.stop()
        self.assertEqual(status, 500, text)
        self.assertIn("killed by SIGKILL", text)
        self.assertIn("memory", text)

    def test_dead_kernel_is_replaced(self):
        cid = self.new_context()["id"]
        lines = self.server.execute("import os; os._exit(3)", context_id=cid)
        self.assertEqual(of_type(lines, "error")[0]["name"], "ContextRestarting")
        self.assertEqual(main_text(self.server.execute("6 * 7", context_id=cid)), "42")


class NoLeftoversTest(unittest.TestCase):
    """Kernels (and what they run) die with the server, even on SIGKILL."""

    def alive(self, pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie of ours would still answer; read its state.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"

    def kernel_pids(self, server):
        py = int(main_text(server.execute("import os; os.getpid()")))
        lines = server.execute("echo $$ $PPID", language="bash")
        bash, bash_kernel = map(int, of_type(lines, "stdout")[0]["text"].split())
        return [py, bash, bash_kernel]

    def check(self, sig):
        tmp = tempfile.mkdtemp(prefix="brig-ci-leak-")
        server = Server(tmp, args=["--default-kernels", "python,bash"])
        try:
            pids = self.kernel_pids(server)
            self.assertTrue(all(self.alive(p) for p in pids))
            server.proc.send_signal(sig)
            server.proc.wait(10)
            deadline = time.monotonic() + 5
            while any(self.alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual([p for p in pids if self.alive(p)], [], f"left after {sig!r}")
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_sigkill(self):
        self.check(signal.SIGKILL)

    def test_sigterm(self):
        self.check(signal.SIGTERM)


class WarmStartTest(unittest.TestCase):
    """What brig's warm starts use: /brig/ready once the default contexts
    are up, spare kernels new contexts take (moved to their cwd), and the
    restored file's env vars and reseeding."""

    def children(self, pid):
        out = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.update(int(x) for x in f.read().split())
        return out

    def test_ready_spares_and_restored(self):
        tmp = tempfile.mkdtemp(prefix="brig-ci-warm-")
        restored = os.path.join(tmp, "restored.json")
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        server = Server(tmp, args=["--default-kernels", "python,bash",
                                   "--spare-kernels", "python,bash",
                                   "--restored-file", restored])
        self.server = server
        try:
            status, body = server.request("GET", "/brig/ready")
            self.assertEqual(status, 200, body)
            ready = json.loads(body)
            self.assertEqual(sorted(c["language"] for c in ready["contexts"]), ["bash", "python"])
            self.assertEqual(ready["spares"], {"python": 1, "bash": 1})
            before = self.children(server.proc.pid)
            # 2 default kernels and 2 spares (bash_kernel's bash is a grandchild).
            self.assertEqual(len(before), 4, before)

            ctx = self.new_context(language="python", cwd=work)
            lines = server.execute("import os; (os.getpid(), os.getcwd())", context_id=ctx["id"])
            pid, cwd = eval(main_text(lines))
            self.assertIn(pid, before, "the new context took a spare kernel")
            self.assertEqual(cwd, work)
            bctx = self.new_context(language="bash", cwd=work)
            lines = server.execute("echo $PPID; pwd", context_id=bctx["id"])
            ppid, pwd = "".join(x["text"] for x in of_type(lines, "stdout")).split()
            self.assertIn(int(ppid), before, "the bash context took a spare kernel")
            self.assertEqual(pwd, work)
            # Taken spares are replaced.
            self.wait_for_spares(server, {"python": 1, "bash": 1}, 120, "spares not replaced")

            # A restart takes a spare too (in the context's cwd).
            ready_spares = self.children(server.proc.pid)
            status, body = server.request("POST", f"/contexts/{ctx['id']}/restart")
            self.assertEqual(status, 200, body)
            lines = server.execute("import os; (os.getpid(), os.getcwd())", context_id=ctx["id"])
            pid2, cwd2 = eval(main_text(lines))
            self.assertNotEqual(pid2, pid)
            self.assertIn(pid2, ready_spares, "the restart took a spare kernel")
            self.assertEqual(cwd2, work)

            # A restore: the sandbox's env vars reach running kernels, and
            # random numbers are reseeded.
            seeded = main_text(server.execute("import random; random.seed(1); random.random()"))
            server.execute("random.seed(1)")
            with open(restored, "w") as f:
                json.dump({"envs": {"RESTORED_VAR": "yes"}}, f)
            lines = server.execute("import os; (os.environ.get('RESTORED_VAR'), random.random())")
            var, drawn = eval(main_text(lines))
            self.assertEqual(var, "yes")
            self.assertNotEqual(repr(drawn), seeded, "not reseeded")
            lines = server.execute("echo $RESTORED_VAR", language="bash")
            self.assertEqual(of_type(lines, "stdout")[0]["text"], "yes\n")
            lines = server.execute("os.environ.get('RESTORED_VAR')", context_id=ctx["id"])
            self.assertEqual(main_text(lines), "yes")
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def wait_for_spares(self, server, want, timeout, why):
        """Until /brig/ready counts `want` ready spares per language."""
        deadline = time.monotonic() + timeout
        while json.loads(server.request("GET", "/brig/ready")[1])["spares"] != want:
            self.assertLess(time.monotonic(), deadline, why)
            time.sleep(0.2)

    def slow_kernel_server(self, tmp, args):
        """A server in `tmp` whose kernels each take 3 s longer to start: a
        sitecustomize that sleeps in any Python the test did not start
        itself (the server is the test's child, its kernels are not)."""
        slow = os.path.join(tmp, "slow")
        os.mkdir(slow)
        with open(os.path.join(slow, "sitecustomize.py"), "w") as f:
            f.write("import os, time\n"
                    f"if os.getppid() != {os.getpid()}: time.sleep(3)\n")
        return Server(tmp, extra_env={"PYTHONPATH": slow + os.pathsep + bash_kernel_dir()},
                      args=args)

    def test_a_context_waits_for_a_starting_spare(self):
        # Kernels slowed 3 s (slow_kernel_server): a new
        # context asked for while the spare is starting takes that spare
        # rather than starting a second kernel beside it, and its
        # replacement starts only once it is up.
        tmp = tempfile.mkdtemp(prefix="brig-ci-warm-")
        server = self.slow_kernel_server(tmp, ["--default-kernels", "python",
                                               "--spare-kernels", "python"])
        self.server = server
        try:
            # The default kernel starts first, the spare once it is up
            # (/brig/ready would wait for the spare too).
            deadline = time.monotonic() + 60
            while len(self.children(server.proc.pid)) < 2:
                self.assertLess(time.monotonic(), deadline, "no spare kernel started")
                time.sleep(0.02)
            status, body = server.request("GET", "/health")
            self.assertEqual(status, 200, body)
            default = server.execute("import os; os.getpid()")
            starting = self.children(server.proc.pid) - {int(main_text(default))}
            self.assertEqual(len(starting), 1, starting)
            ctx = self.new_context(language="python", cwd=tmp)
            lines = server.execute("import os; (os.getpid(), os.getcwd())", context_id=ctx["id"])
            pid, cwd = eval(main_text(lines))
            self.assertEqual({pid}, starting, "the context took the spare that was starting")
            self.assertEqual(cwd, tmp)
            self.wait_for_spares(server, {"python": 1}, 60, "the spare was not replaced")
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_spares_are_replaced_one_at_a_time(self):
        # Kernels slowed 3 s (slow_kernel_server): two spares taken at once are
        # replaced one after the other, not side by side.
        tmp = tempfile.mkdtemp(prefix="brig-ci-warm-")
        server = self.slow_kernel_server(tmp, ["--no-default-kernel",
                                               "--spare-kernels", "python,python"])
        self.server = server
        try:
            status, body = server.request("GET", "/brig/ready")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["spares"], {"python": 2}, body)
            spares = self.children(server.proc.pid)
            for _ in range(2):
                self.new_context(language="python", cwd=tmp)
            # Their replacements: one process at once for the first 2 s
            # (each sleeps 3 s before it is a kernel).
            seen = set()
            until = time.monotonic() + 2
            while time.monotonic() < until:
                seen |= self.children(server.proc.pid) - spares
                time.sleep(0.05)
            self.assertEqual(len(seen), 1, f"replacements started at once: {seen}")
            self.wait_for_spares(server, {"python": 2}, 60, "the spares were not replaced")
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def new_context(self, **body):
        return CodeInterpreterTest.new_context(self, **body)


class _Envd(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/envs" and self.headers.get("X-Access-Token") == "tok"
        body = json.dumps({"SANDBOX_VAR": "from-envd"} if ok else {"code": 401}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class EnvdEnvVarsTest(unittest.TestCase):
    """Sandbox-wide env vars from envd's /envs (BRIG_ENVD_URL): fetched at
    boot with BRIG_ENVD_ACCESS_TOKEN, or else with the X-Access-Token of an
    /execute, and then applied to running kernels."""

    def test_envs_from_envd(self):
        envd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Envd)
        threading.Thread(target=envd.serve_forever, daemon=True).start()
        tmp = tempfile.mkdtemp(prefix="brig-ci-envd-")
        server = Server(tmp, {"BRIG_ENVD_URL": f"http://127.0.0.1:{envd.server_address[1]}",
                              "BRIG_ENVD_ACCESS_TOKEN": "tok"})
        try:
            code = "import os; os.environ.get('SANDBOX_VAR')"
            self.assertEqual(main_text(server.execute(code)), "from-envd")
            lines = server.execute(code, env_vars={"SANDBOX_VAR": "override"})
            self.assertEqual(main_text(lines), "override")
            self.assertEqual(main_text(server.execute(code)), "from-envd", "restored to the global")
            lines = server.execute("echo $SANDBOX_VAR", language="bash")
            self.assertEqual(of_type(lines, "stdout")[0]["text"], "from-envd\n")
        finally:
            server.stop()
            envd.shutdown()
            envd.server_close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_envs_fetched_with_request_token(self):
        envd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Envd)
        threading.Thread(target=envd.serve_forever, daemon=True).start()
        tmp = tempfile.mkdtemp(prefix="brig-ci-envd-")
        server = Server(tmp, {"BRIG_ENVD_URL": f"http://127.0.0.1:{envd.server_address[1]}"})
        try:
            code = "import os; str(os.environ.get('SANDBOX_VAR'))"
            lines = server.execute(code)
            self.assertEqual(main_text(lines), "None", "no token: the fetch was refused")
            status, body = server.request("POST", "/execute", {"code": code},
                                          headers={"X-Access-Token": "tok"})
            self.assertEqual(status, 200)
            lines = [json.loads(x) for x in body.splitlines()]
            self.assertEqual(main_text(lines), "from-envd")
        finally:
            server.stop()
            envd.shutdown()
            envd.server_close()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
