#!/usr/bin/env python3
"""Tests for runcell_kernel.py: each starts the kernel as a subprocess with a
socketpair on fd 3 and speaks the protocol, as the host does.

Run: python3 test_runcell_kernel.py   (stdlib only; pandas/matplotlib/numpy
tests are skipped when the interpreter running the tests lacks them; the
kernel runs under that same interpreter).
"""

import base64
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = os.path.join(HERE, "runcell_kernel.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TIMEOUT = 60.0


def has_module(name):
    return importlib.util.find_spec(name) is not None


def frame(message):
    body = json.dumps(message).encode("utf-8")
    return struct.pack(">I", len(body)) + body


class Outcome:
    """Everything one execute produced."""

    def __init__(self, messages, stdout, stderr):
        self.messages = messages
        self.stdout = stdout
        self.stderr = stderr
        self.done = messages[-1]
        self.displays = [m["data"] for m in messages if m["type"] == "display"]
        results = [m["data"] for m in messages if m["type"] == "result"]
        errors = [m for m in messages if m["type"] == "error"]
        assert len(results) <= 1 and len(errors) <= 1, messages
        self.result = results[0] if results else None
        self.error = errors[0] if errors else None

    @property
    def status(self):
        return self.done["status"]

    @property
    def text(self):
        return self.result["text/plain"] if self.result else None


class KernelProcess:
    """A kernel subprocess plus a single-threaded reader of its channel and pipes."""

    def __init__(self, python=sys.executable):
        self.workdir = tempfile.mkdtemp(prefix="runcell-kernel-test-")
        self.sock, child = socket.socketpair()
        child_fd = child.fileno()

        def put_channel_on_fd3():
            if child_fd == 3:
                os.set_inheritable(3, True)
            else:
                os.dup2(child_fd, 3)

        env = dict(os.environ, MPLBACKEND="Agg", HOME=self.workdir)
        self.proc = subprocess.Popen(
            [python, KERNEL],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            env=env,
            preexec_fn=put_channel_on_fd3,
            close_fds=False,  # the fds Python opens are non-inheritable anyway
        )
        child.close()
        self.proc.stdin.close()  # the host's stdin pipe is closed, as in the sandbox
        self.buffers = {"sock": bytearray(), "stdout": bytearray(), "stderr": bytearray()}
        self.open = {
            "sock": self.sock.fileno(),
            "stdout": self.proc.stdout.fileno(),
            "stderr": self.proc.stderr.fileno(),
        }
        self.ready = self.recv()

    # ---- low level ----

    def _pump(self, timeout):
        """Read whatever is available (waiting up to timeout); False if nothing could arrive."""
        fds = {fd: name for name, fd in self.open.items()}
        if not fds:
            return False
        readable, _, _ = select.select(list(fds), [], [], max(timeout, 0))
        for fd in readable:
            data = os.read(fd, 1 << 20)
            if data:
                self.buffers[fds[fd]] += data
            else:
                del self.open[fds[fd]]
        return True

    def drain_pipes(self):
        """Take what is already in the stdout/stderr pipes, without waiting."""
        while True:
            fds = [fd for name, fd in self.open.items() if name != "sock"]
            if not fds or not select.select(fds, [], [], 0)[0]:
                return
            self._pump(0)

    def _take_frame(self):
        buf = self.buffers["sock"]
        if len(buf) < 4:
            return None
        (length,) = struct.unpack(">I", buf[:4])
        if len(buf) < 4 + length:
            return None
        body = bytes(buf[4 : 4 + length])
        del buf[: 4 + length]
        return json.loads(body.decode("utf-8"))

    def recv(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            message = self._take_frame()
            if message is not None:
                return message
            if "sock" not in self.open:
                raise EOFError("kernel closed the channel; stderr:\n" + self.stderr_text())
            if time.monotonic() > deadline:
                raise TimeoutError("no message from the kernel; stderr:\n" + self.stderr_text())
            self._pump(deadline - time.monotonic())

    def send(self, message):
        self.sock.sendall(frame(message))

    def wait_for_stdout(self, text, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while text not in self.buffers["stdout"].decode("utf-8", "replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} never appeared on stdout")
            self._pump(deadline - time.monotonic())

    def stderr_text(self):
        return self.buffers["stderr"].decode("utf-8", "replace")

    # ---- high level ----

    def start(self, code, msg_id="ex"):
        self.marks = (len(self.buffers["stdout"]), len(self.buffers["stderr"]))
        self.send({"type": "execute", "id": msg_id, "code": code})

    def finish(self, msg_id="ex", timeout=TIMEOUT):
        messages = []
        while True:
            message = self.recv(timeout)
            messages.append(message)
            if message["type"] == "done":
                break
        assert all(m["id"] == msg_id for m in messages), messages
        # Whatever the cell printed must already be in the pipes: no waiting here.
        self.drain_pipes()
        out = self.buffers["stdout"][self.marks[0] :].decode("utf-8", "replace")
        err = self.buffers["stderr"][self.marks[1] :].decode("utf-8", "replace")
        return Outcome(messages, out, err)

    def run(self, code, msg_id="ex", timeout=TIMEOUT):
        self.start(code, msg_id)
        return self.finish(msg_id, timeout)

    def close(self):
        self.sock.close()
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code


class KernelTestCase(unittest.TestCase):
    def setUp(self):
        self.kernel = KernelProcess()
        self.addCleanup(self._close)

    def _close(self):
        if self.kernel.proc.poll() is None:
            self.kernel.close()
        else:
            self.kernel.sock.close()
            self.kernel.proc.stdout.close()
            self.kernel.proc.stderr.close()
            shutil.rmtree(self.kernel.workdir, ignore_errors=True)

    def run_ok(self, code):
        outcome = self.kernel.run(code)
        self.assertEqual(outcome.status, "ok", outcome.messages)
        return outcome


class EncodingTests(unittest.TestCase):
    """The kernel's hand-made JSON for its frequent messages must be json.dumps' text."""

    @classmethod
    def setUpClass(cls):
        spec = importlib.util.spec_from_file_location("runcell_kernel_under_test", KERNEL)
        cls.k = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cls.k)

    STRINGS = ["", "2", 'q"uote\\back', "new\nline\ttab\x00\x1f\x7f", "ünï ☃ 𝄞", "\ud800 lone", "</script>"]

    def test_bundle_json_is_json_dumps(self):
        for kind in ("result", "display"):
            for text in self.STRINGS:
                bundle = {"text/plain": text, "text/html": text[::-1]}
                expected = json.dumps({"type": kind, "id": text, "data": bundle}, ensure_ascii=False)
                self.assertEqual(self.k._bundle_json(kind, text, bundle), expected)
        self.assertEqual(self.k._bundle_json("result", "x", {}), '{"type": "result", "id": "x", "data": {}}')

    def test_done_frame_is_json_dumps(self):
        class Channel:
            frames = []

            encode = staticmethod(self.k.Channel.encode)

            def send_frames(self, data, interruptible=True):
                self.frames.append(data)

        kernel = self.k.Kernel(Channel())
        kernel.run_cell = lambda code: ("ok", b"")
        for msg_id in self.STRINGS:
            Channel.frames.clear()
            kernel.execute(msg_id, "")
            (frame,) = Channel.frames
            message = {"type": "done", "id": msg_id, "status": "ok", "execution_count": kernel.execution_count}
            body = json.dumps(message, ensure_ascii=False).encode("utf-8", "replace")
            self.assertEqual(frame, struct.pack(">I", len(body)) + body)


class ProtocolTests(KernelTestCase):
    def test_ready(self):
        ready = self.kernel.ready
        self.assertEqual(ready["type"], "ready")
        self.assertEqual(ready["language"], "python")
        self.assertEqual(ready["version"], "%d.%d.%d" % sys.version_info[:3])
        self.assertEqual(ready["pid"], self.kernel.proc.pid)

    def test_execution_count_increments_on_every_execute(self):
        counts = [self.kernel.run(code).done["execution_count"] for code in ("1", "1/0", "x = (", "2")]
        self.assertEqual(counts, [1, 2, 3, 4])

    def test_done_echoes_the_id(self):
        outcome = self.kernel.run("print('x')", msg_id="ex_123")
        self.assertEqual(outcome.done, {"type": "done", "id": "ex_123", "status": "ok", "execution_count": 1})

    def test_unknown_message_type(self):
        self.kernel.send({"type": "frobnicate", "id": "x"})
        reply = self.kernel.recv()
        self.assertEqual(reply["type"], "error")
        self.assertIsNone(reply["id"])
        self.assertEqual(reply["name"], "ProtocolError")
        self.assertEqual(self.kernel.run("6*7").text, "42")

    def test_execute_without_code(self):
        self.kernel.send({"type": "execute", "id": "bad"})
        error, done = self.kernel.recv(), self.kernel.recv()
        self.assertEqual((error["name"], error["id"]), ("ProtocolError", "bad"))
        self.assertEqual((done["type"], done["status"]), ("done", "error"))
        self.assertEqual(self.kernel.run("1").text, "1")

    def test_eof_exits_zero(self):
        self.assertEqual(self.kernel.run("x = 1").status, "ok")
        self.assertEqual(self.kernel.close(), 0)

    def test_eof_exits_promptly_despite_a_running_thread(self):
        self.run_ok("import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()")
        self.assertEqual(self.kernel.close(), 0)

    def test_malformed_frame_exits_3(self):
        self.kernel.sock.sendall(struct.pack(">I", 5) + b"nope!")
        self.assertEqual(self.kernel.proc.wait(timeout=TIMEOUT), 3)
        self.kernel._pump(1)
        self.assertIn("malformed", self.kernel.stderr_text())

    def test_oversized_frame_exits_3(self):
        self.kernel.sock.sendall(struct.pack(">I", (64 << 20) + 1))
        self.assertEqual(self.kernel.proc.wait(timeout=TIMEOUT), 3)

    def test_user_output_never_on_the_channel(self):
        outcome = self.run_ok("import sys\nprint('out')\nprint('err', file=sys.stderr)")
        self.assertEqual([m["type"] for m in outcome.messages], ["done"])
        self.assertEqual((outcome.stdout, outcome.stderr), ("out\n", "err\n"))

    def test_unicode_round_trip(self):
        outcome = self.run_ok("s = 'héllo ✓ 🐍'\nprint(s)\ns")
        self.assertEqual(outcome.stdout, "héllo ✓ 🐍\n")
        self.assertEqual(outcome.text, "'héllo ✓ 🐍'")

    def test_lone_surrogate_does_not_break_the_channel(self):
        outcome = self.run_ok("'\\udcff'")
        self.assertIsInstance(outcome.text, str)
        self.assertEqual(self.kernel.run("1").text, "1")


class ExecutionTests(KernelTestCase):
    @unittest.skipUnless(sys.platform == "linux" and os.path.exists("/proc/self/status"), "Linux only")
    def test_free_heap_pages_go_back_to_the_system_after_a_cell(self):
        # Blocks of 8 KiB (malloc's heap, not pymalloc's arenas), one in sixteen kept: the
        # freed ones leave page-sized holes below live blocks, which free() itself never
        # returns. Positive control: still resident at the cell's end, before the kernel's
        # malloc_trim; resident no more in the next cell.
        rss = "int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
        self.run_ok("import gc\nbefore = " + rss)
        held = self.run_ok(
            "blocks = [bytearray(8192) for _ in range(8192)]\n"
            "kept = blocks[::16]\n"
            "del blocks\n"
            "gc.collect()\n"
            "held = " + rss + " - before\nheld"
        )
        self.assertGreater(int(held.text), 40_000, "the holes were never resident (KiB)")
        after = self.run_ok(rss + " - before")
        self.assertLess(int(after.text), int(held.text) - 30_000, f"{held.text} KiB then {after.text} KiB")

    def test_state_persists_across_cells(self):
        self.run_ok("x = 41\ndef inc(v):\n    return v + 1")
        self.assertEqual(self.run_ok("inc(x)").text, "42")

    def test_result_is_last_expression(self):
        outcome = self.run_ok("print(1); 5")
        self.assertEqual(outcome.result, {"text/plain": "5"})
        self.assertEqual(outcome.stdout, "1\n")
        self.assertEqual(outcome.messages[0]["type"], "result")

    def test_no_result_for_assignment_or_none(self):
        for code in ("x = 1", "None", "print('hi')", "import os", ""):
            with self.subTest(code=code):
                self.assertIsNone(self.run_ok(code).result)

    def test_trailing_semicolon_suppresses_result(self):
        self.assertIsNone(self.run_ok("1 + 1;").result)
        self.assertIsNone(self.run_ok("x = 'é'; x ;  # comment").result)
        self.assertEqual(self.run_ok("'a;b'").text, "'a;b'")

    def test_line_numbers_count_like_python(self):
        # str.splitlines() would also split at the form feed and shift every later line.
        tb = self.kernel.run("s = '\x0c'\r\nt = 1\n1/0").error["traceback"]
        self.assertIn("line 3, in <module>\n    1/0\n", tb)

    def test_multiline_last_expression(self):
        self.assertEqual(self.run_ok("x = 2\n(x +\n 3)").text, "5")

    def test_big_int(self):
        self.assertEqual(self.run_ok("2**100").text, str(2**100))
        expected = "1" + "0" * 10000  # past Python's 4300-digit str() guard
        self.assertEqual(self.run_ok("10**10000").text, expected)
        self.assertEqual(self.run_ok("[10**10000]").text, f"[{expected}]")
        self.assertIn("decimal digits", self.run_ok("10**1000000").text)

    def test_long_containers_are_pretty_printed(self):
        text = self.run_ok("{i: 'x' * 20 for i in range(5)}").text
        self.assertEqual(text.count("\n"), 4)

    def test_huge_repr_is_capped(self):
        text = self.run_ok("'x' * (3 * 1024 * 1024)").text
        self.assertLess(len(text), 1024 * 1024 + 100)
        self.assertIn("truncated", text)

    def test_dunder_main_namespace(self):
        self.assertEqual(self.run_ok("__name__").text, "'__main__'")
        self.assertEqual(self.run_ok("import __main__\n__main__.__dict__ is globals()").text, "True")

    def test_pickle_and_multiprocessing_of_cell_functions(self):
        self.run_ok(
            "import pickle\nclass Point:\n    def __init__(self, x):\n        self.x = x\ndef square(v):\n    return v * v"
        )
        self.assertEqual(self.run_ok("pickle.loads(pickle.dumps(Point(3))).x").text, "3")
        code = "import multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as pool:\n    r = pool.map(square, range(5))\nr"
        self.assertEqual(self.run_ok(code).text, "[0, 1, 4, 9, 16]")

    def test_interpreter_like_argv_and_path(self):
        self.run_ok("open('mymod.py', 'w').write('VALUE = 5\\n')")
        self.assertEqual(self.run_ok("import sys, mymod\nsys.argv, sys.path[0], mymod.VALUE").text, "([''], '', 5)")

    def test_stdin_is_empty(self):
        self.assertEqual(self.run_ok("import sys\nsys.stdin.read()").text, "''")
        outcome = self.kernel.run("input('name? ')")
        self.assertEqual(outcome.error["name"], "EOFError")

    def test_os_system_output_arrives_before_done(self):
        outcome = self.run_ok("import os\nos.system('echo hi')")
        self.assertEqual(outcome.stdout, "hi\n")

    def test_print_without_newline_arrives_before_done(self):
        self.assertEqual(self.run_ok("print('partial', end='')").stdout, "partial")

    def test_channel_not_inherited_by_subprocesses(self):
        code = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import os; print(os.path.exists(\"/proc/self/fd/3\"))'], close_fds=False)"
        self.assertEqual(self.run_ok(code).stdout, "False\n")

    def test_top_level_await(self):
        self.run_ok("import asyncio\nasync def twice(v):\n    await asyncio.sleep(0.01)\n    return 2 * v")
        self.assertEqual(self.run_ok("await twice(21)").text, "42")
        self.assertIsNone(self.run_ok("y = await twice(2)").result)
        self.assertEqual(self.run_ok("y").text, "4")
        # A task started in one cell keeps running on the same loop in the next.
        self.run_ok("task = asyncio.ensure_future(twice(5))")
        self.assertEqual(self.run_ok("await task").text, "10")

    def test_asyncio_run_in_a_plain_cell(self):
        self.assertEqual(
            self.run_ok("import asyncio\nasync def f():\n    return 3\nasyncio.run(f())").text, "3"
        )
        self.assertEqual(self.run_ok("await f()").text, "3")

    def test_future_import_carries_over(self):
        self.run_ok("from __future__ import annotations")
        self.assertEqual(
            self.run_ok("def f(x: Undefined) -> None: pass\nf.__annotations__['x']").text, "'Undefined'"
        )

    def test_reseed_changes_random(self):
        a = self.run_ok("import random\nrandom.random()").text
        other = KernelProcess()
        try:
            b = other.run("import random\nrandom.random()").text
        finally:
            other.close()
        self.assertNotEqual(a, b)

    def test_reseed_imports_nothing_and_reseeds_what_is_loaded(self):
        # In a fresh interpreter (the test process has imported random long ago): reseed leaves
        # `random` unimported (it would seed itself on import), and reseeds it once loaded.
        code = (
            "import sys, runcell_kernel\n"
            "runcell_kernel.reseed()\n"
            "print('random' in sys.modules)\n"
            "import random\n"
            "random.seed(0); a = random.random()\n"
            "random.seed(0); runcell_kernel.reseed(); b = random.random()\n"
            "print(a != b)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout
        self.assertEqual(out, "False\nTrue\n")

    def test_forked_child_does_not_speak_the_protocol(self):
        code = "import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n    print('parent')"
        outcome = self.run_ok(code)
        self.assertEqual(sorted(outcome.stdout.split()), ["child", "parent"])
        self.assertEqual(self.run_ok("1").text, "1")


class DisplayTests(KernelTestCase):
    def test_display_multiple_objects(self):
        code = """
class Rich:
    def _repr_html_(self):
        return '<b>rich</b>'
    def _repr_png_(self):
        return b'\\x89PNG\\r\\n\\x1a\\nfake'
    def _repr_json_(self):
        return {'a': [1, 2]}
    def __repr__(self):
        return 'Rich()'
display(1, 'two', Rich())
print('after')
"""
        outcome = self.run_ok(code)
        self.assertEqual(outcome.displays[:2], [{"text/plain": "1"}, {"text/plain": "'two'"}])
        rich = outcome.displays[2]
        self.assertEqual(rich["text/plain"], "Rich()")
        self.assertEqual(rich["text/html"], "<b>rich</b>")
        self.assertEqual(base64.b64decode(rich["image/png"]), PNG_SIGNATURE + b"fake")
        self.assertEqual(json.loads(rich["application/json"]), {"a": [1, 2]})
        self.assertIsNone(outcome.result)
        self.assertEqual(outcome.stdout, "after\n")

    def test_all_repr_methods_and_mimebundle(self):
        code = """
class Many:
    def _repr_markdown_(self): return '# md'
    def _repr_svg_(self): return '<svg/>'
    def _repr_latex_(self): return ('$x$', {'meta': 1})
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {'text/html': '<i>bundle</i>', 'application/vnd.custom+json': {'k': 1}}
Many()
"""
        data = self.run_ok(code).result
        self.assertEqual(data["text/markdown"], "# md")
        self.assertEqual(data["image/svg+xml"], "<svg/>")
        self.assertEqual(data["text/latex"], "$x$")
        self.assertEqual(data["text/html"], "<i>bundle</i>")
        self.assertEqual(json.loads(data["application/vnd.custom+json"]), {"k": 1})
        self.assertTrue(data["text/plain"].startswith("<__main__.Many object at"))

    def test_broken_formatters_fall_back_to_text(self):
        code = """
class Broken:
    def _repr_html_(self): raise RuntimeError('no html')
    def _repr_json_(self): return {'nan': float('nan')}
    def __repr__(self): return 'Broken()'
class NoRepr:
    def __repr__(self): raise ValueError('no repr')
display(Broken())
NoRepr()
"""
        outcome = self.run_ok(code)
        self.assertEqual(outcome.displays, [{"text/plain": "Broken()"}])
        self.assertIn("NoRepr object at", outcome.text)
        self.assertIn("no html", outcome.stderr)

    def test_classes_show_as_text(self):
        code = "class C:\n    def _repr_html_(self): return '<b/>'\nC"
        self.assertEqual(self.run_ok(code).result, {"text/plain": "<class '__main__.C'>"})

    def test_bundle_too_big_for_a_frame_falls_back_to_text(self):
        # Control characters take 6 bytes each in JSON: 12 such MiB-sized types overflow 64 MiB.
        code = "bundle = {f'text/x-{i}': '\\x01' * (1024 * 1024 - 1) for i in range(12)}\nbundle['text/plain'] = 'small'\ndisplay(bundle, raw=True)"
        outcome = self.run_ok(code)
        self.assertEqual(outcome.displays, [{"text/plain": "small"}])

    def test_a_bundle_over_the_result_limit_falls_back_to_text(self):
        # 9 MiB of base64 fits the 16 MiB image cap, but not the 8 MiB per result.
        code = "display({'image/png': 'A' * (9 << 20), 'text/plain': 'big'}, raw=True)"
        outcome = self.run_ok(code)
        self.assertEqual(outcome.displays, [{"text/plain": "big"}])
        self.assertIn("over the 8388608-byte limit", outcome.stderr)

    def test_results_over_the_cell_limits_are_counted_not_sent(self):
        # 300 displays of ~1 MB: 16 fit in 16 MiB, the rest are dropped and counted in done.
        code = "for i in range(300):\n    display({'text/html': 'x' * 1_000_000, 'text/plain': str(i)}, raw=True)\n7"
        outcome = self.run_ok(code)
        self.assertEqual(len(outcome.displays), 16)
        self.assertEqual(outcome.displays[-1]["text/plain"], "15")
        self.assertEqual(outcome.text, "7")  # a later result that still fits is kept
        self.assertEqual(outcome.done["dropped_results"], 284)
        self.assertGreater(outcome.done["dropped_bytes"], 284_000_000)
        # Counted by number too, and afresh in every cell.
        outcome = self.run_ok("for i in range(70):\n    display(i)")
        self.assertEqual(len(outcome.displays), 64)
        self.assertEqual(outcome.done["dropped_results"], 6)
        self.assertNotIn("dropped_results", self.run_ok("display(1)").done)

    def test_an_error_too_big_for_a_result_frame_is_shortened(self):
        # 1 MiB characters of control characters are 6 MiB of JSON, twice over the limit.
        outcome = self.kernel.run("raise ValueError('\\x01' * (1 << 20))")
        self.assertEqual(outcome.error["name"], "ValueError")
        self.assertIn("more characters]", outcome.error["value"])
        self.assertLess(len(outcome.error["value"]), 200_000)

    def test_display_raw_bundle(self):
        outcome = self.run_ok("display({'text/html': '<p>x</p>', 'text/plain': 'x'}, raw=True)")
        self.assertEqual(outcome.displays, [{"text/html": "<p>x</p>", "text/plain": "x"}])

    def test_every_rich_mime_type(self):
        code = """
class Doc:
    def _repr_pdf_(self): return b'%PDF-1.4 fake'
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {'application/vnd.vegalite.v5+json': {'mark': 'bar', 'data': {'values': [{'a': 1}]}},
                'application/vnd.plotly.v1+json': {'data': [{'type': 'bar', 'y': [1, 2]}], 'layout': {}}}
    def _repr_jpeg_(self): return b'\\xff\\xd8\\xff fake'
Doc()
"""
        data = self.run_ok(code).result
        self.assertEqual(base64.b64decode(data["application/pdf"]), b"%PDF-1.4 fake")
        self.assertEqual(base64.b64decode(data["image/jpeg"]), b"\xff\xd8\xff fake")
        self.assertEqual(json.loads(data["application/vnd.vegalite.v5+json"])["mark"], "bar")
        self.assertEqual(json.loads(data["application/vnd.plotly.v1+json"])["data"][0]["y"], [1, 2])

    @unittest.skipIf(has_module("IPython"), "the real IPython is installed")
    def test_ipython_fallback_math_svg_json_and_jpeg(self):
        code = (
            "from IPython.display import Math, SVG, JSON, Image\n"
            "display(Math('x^2'), SVG('<svg/>'), JSON({'a': 1}), Image(data=b'\\xff\\xd8\\xffjpeg'))"
        )
        displays = self.run_ok(code).displays
        self.assertEqual(displays[0]["text/latex"], "$\\displaystyle x^2$")
        self.assertEqual(displays[1]["image/svg+xml"], "<svg/>")
        self.assertEqual(json.loads(displays[2]["application/json"]), {"a": 1})
        self.assertEqual(base64.b64decode(displays[3]["image/jpeg"]), b"\xff\xd8\xffjpeg")

    @unittest.skipIf(has_module("IPython") or not has_module("matplotlib"), "needs the fallback and matplotlib")
    def test_figures_after_the_ipython_fallback_is_imported(self):
        # matplotlib's first figure reads IPython.version_info once IPython is imported.
        outcome = self.run_ok("from IPython.display import Markdown\nimport matplotlib.pyplot as plt\nplt.plot([1])\nplt.show()")
        self.assertIn("image/png", outcome.displays[0])

    @unittest.skipIf(has_module("IPython"), "the real IPython is installed")
    def test_ipython_display_fallback(self):
        code = "from IPython.display import display, HTML, Markdown\nfrom IPython import get_ipython\ndisplay(HTML('<b>x</b>'), Markdown('*y*'))\nget_ipython()"
        outcome = self.run_ok(code)
        self.assertEqual(outcome.displays[0]["text/html"], "<b>x</b>")
        self.assertEqual(outcome.displays[1]["text/markdown"], "*y*")
        self.assertIsNone(outcome.result)


class ErrorTests(KernelTestCase):
    def test_error_traceback_shows_user_frames_only(self):
        self.run_ok("def inner(d):\n    return 1 / d")
        outcome = self.kernel.run("x = 0\ninner(x)")
        self.assertEqual(outcome.status, "error")
        error = outcome.error
        self.assertEqual((error["name"], error["value"]), ("ZeroDivisionError", "division by zero"))
        tb = error["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):\n"), tb)
        self.assertIn('File "<cell-2>", line 2, in <module>\n    inner(x)', tb)
        self.assertIn('File "<cell-1>", line 2, in inner\n    return 1 / d', tb)
        self.assertTrue(tb.endswith("ZeroDivisionError: division by zero\n"), tb)
        self.assertNotIn("runcell_kernel", tb)
        self.assertIsNone(outcome.result)

    def test_plain_python_format(self):
        tb = self.kernel.run("1/0").error["traceback"]
        expected = 'Traceback (most recent call last):\n  File "<cell-1>", line 1, in <module>\n    1/0\n    ~^~\nZeroDivisionError: division by zero\n'
        self.assertEqual(tb, expected)

    def test_library_frames_are_kept(self):
        tb = self.kernel.run("import json\njson.loads('{')").error["traceback"]
        self.assertIn("json", tb)
        self.assertIn("decoder.py", tb)
        self.assertNotIn("runcell_kernel", tb)

    def test_chained_exceptions(self):
        code = "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('bad') from e"
        error = self.kernel.run(code).error
        self.assertEqual(error["name"], "ValueError")
        self.assertIn("KeyError: 'k'", error["traceback"])
        self.assertIn("direct cause", error["traceback"])
        self.assertNotIn("runcell_kernel", error["traceback"])

    def test_error_in_async_cell(self):
        code = "import asyncio\nasync def boom():\n    await asyncio.sleep(0)\n    raise RuntimeError('async boom')\nawait boom()"
        error = self.kernel.run(code).error
        self.assertEqual(error["name"], "RuntimeError")
        tb = error["traceback"]
        self.assertTrue(tb.startswith('Traceback (most recent call last):\n  File "<cell-1>"'), tb)
        self.assertNotIn("runcell_kernel", tb)
        self.assertNotIn("base_events", tb)

    def test_syntax_error(self):
        outcome = self.kernel.run("x = 1\ny = (")
        self.assertEqual(outcome.status, "error")
        error = outcome.error
        self.assertEqual(error["name"], "SyntaxError")
        self.assertIn('File "<cell-1>", line 2', error["traceback"])
        self.assertIn("    y = (\n", error["traceback"])
        self.assertIn("^", error["traceback"])
        self.assertNotIn("Traceback (most recent call last)", error["traceback"])
        self.assertNotIn("runcell_kernel", error["traceback"])
        self.assertEqual(self.run_ok("'x' in globals()").text, "False")

    def test_await_outside_async_is_fine_but_return_is_not(self):
        self.assertEqual(self.kernel.run("return 5").error["name"], "SyntaxError")

    def test_system_exit_keeps_kernel(self):
        self.run_ok("kept = 'yes'")
        outcome = self.kernel.run("import sys\nsys.exit(3)")
        self.assertEqual(outcome.status, "error")
        self.assertEqual((outcome.error["name"], outcome.error["value"]), ("SystemExit", "3"))
        self.assertEqual(self.run_ok("kept").text, "'yes'")
        self.assertEqual(self.kernel.run("exit()").error["name"], "SystemExit")

    def test_keyboard_interrupt(self):
        self.run_ok("before = 7")
        self.kernel.start("import time\nprint('sleeping', flush=True)\ntime.sleep(10)\nafter = 1")
        self.kernel.wait_for_stdout("sleeping")
        started = time.monotonic()
        os.kill(self.kernel.proc.pid, signal.SIGINT)
        outcome = self.kernel.finish(timeout=5)
        self.assertLess(time.monotonic() - started, 2)
        self.assertEqual(outcome.status, "interrupted")
        self.assertEqual(outcome.error["name"], "KeyboardInterrupt")
        self.assertIn("<cell-2>", outcome.error["traceback"])
        self.assertNotIn("runcell_kernel", outcome.error["traceback"])
        self.assertEqual(self.run_ok("before, 'after' in globals()").text, "(7, False)")

    def test_keyboard_interrupt_during_await(self):
        self.kernel.start("import asyncio\nprint('waiting', flush=True)\nawait asyncio.sleep(10)")
        self.kernel.wait_for_stdout("waiting")
        os.kill(self.kernel.proc.pid, signal.SIGINT)
        outcome = self.kernel.finish(timeout=5)
        self.assertEqual(outcome.status, "interrupted")
        self.assertEqual(self.run_ok("await asyncio.sleep(0, 'fine')").text, "'fine'")

    def test_interrupt_storm_never_desynchronises(self):
        stop = threading.Event()

        def storm():
            while not stop.is_set():
                os.kill(self.kernel.proc.pid, signal.SIGINT)
                time.sleep(0.001)

        codes = [
            "for i in range(3): display(i)\nprint(2)\n3",
            "1/0",
            "import asyncio\nawait asyncio.sleep(0.001)\n5",
        ]
        thread = threading.Thread(target=storm)
        thread.start()
        try:
            for i in range(150):
                outcome = self.kernel.run(codes[i % len(codes)], msg_id=f"e{i}", timeout=10)
                self.assertIn(outcome.status, ("ok", "error", "interrupted"))
                if outcome.status == "interrupted":
                    self.assertEqual(outcome.error["name"], "KeyboardInterrupt")
        finally:
            stop.set()
            thread.join()
        self.assertEqual(self.run_ok("'alive'").text, "'alive'")

    def test_sigint_while_idle_is_ignored(self):
        self.run_ok("z = 3")
        for _ in range(3):
            os.kill(self.kernel.proc.pid, signal.SIGINT)
        time.sleep(0.2)
        self.assertIsNone(self.kernel.proc.poll())
        self.assertEqual(self.run_ok("z").text, "3")

    def interrupted_sleep(self):
        """Interrupts a sleeping cell; returns its outcome."""
        self.kernel.start("import time\nprint('sleeping', flush=True)\ntime.sleep(10)")
        self.kernel.wait_for_stdout("sleeping")
        os.kill(self.kernel.proc.pid, signal.SIGINT)
        return self.kernel.finish(timeout=5)

    def test_a_sigint_handler_from_user_code_lasts_one_cell(self):
        # Within its cell the user's handler is in charge (here: it swallows the interrupt).
        self.run_ok("import signal, time\nseen = []\nsignal.signal(signal.SIGINT, lambda *a: seen.append(1))")
        self.assertEqual(self.interrupted_sleep().status, "interrupted")
        self.assertEqual(self.run_ok("seen").text, "[]")
        # Control: in its own cell it does see the signal.
        outcome = self.kernel.run(
            "import os\nsignal.signal(signal.SIGINT, lambda *a: seen.append(1))\n"
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.05)\nseen"
        )
        self.assertEqual((outcome.status, outcome.text), ("ok", "[1]"))

    def test_sigint_blocked_by_user_code_is_not_a_later_interrupt(self):
        # A cell leaves SIGINT blocked; one sent while idle stays pending in the kernel...
        self.run_ok("import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n1")
        os.kill(self.kernel.proc.pid, signal.SIGINT)
        time.sleep(0.1)
        # ...and must neither interrupt the next cell nor stop interrupts from working.
        self.assertEqual(self.run_ok("import time\ntime.sleep(0.2)\n'not interrupted'").text, "'not interrupted'")
        self.assertEqual(self.interrupted_sleep().status, "interrupted")


@unittest.skipUnless(has_module("numpy"), "numpy is not installed")
class NumpyTests(KernelTestCase):
    def test_numpy_random_differs_between_kernels(self):
        code = "import numpy as np\nnp.random.rand(3).tolist()"
        other = KernelProcess()
        try:
            b = other.run(code).text
        finally:
            other.close()
        self.assertNotEqual(self.run_ok(code).text, b)

    def test_reseed_reseeds_numpy(self):
        sys.path.insert(0, HERE)
        try:
            import numpy as np
            import runcell_kernel
        finally:
            sys.path.remove(HERE)
        np.random.seed(0)
        runcell_kernel.reseed()
        a = np.random.rand()
        np.random.seed(0)
        runcell_kernel.reseed()
        self.assertNotEqual(a, np.random.rand())


@unittest.skipUnless(has_module("pandas"), "pandas is not installed")
class PandasTests(KernelTestCase):
    def test_dataframe_result(self):
        data = self.run_ok(
            "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndf"
        ).result
        self.assertIn("<table", data["text/html"])
        self.assertEqual(data["text/plain"].split(), ["a", "b", "0", "1", "x", "1", "2", "y"])

    def test_series_result_has_html(self):
        data = self.run_ok("import pandas as pd\npd.Series([1, 2], name='s')").result
        self.assertIn("<table", data["text/html"])
        self.assertIn("Name: s", data["text/plain"])

    def test_display_dataframe(self):
        outcome = self.run_ok("import pandas as pd\ndisplay(pd.DataFrame({'a': [1]}))")
        self.assertIn("<table", outcome.displays[0]["text/html"])


@unittest.skipUnless(has_module("matplotlib"), "matplotlib is not installed")
class MatplotlibTests(KernelTestCase):
    def assert_png(self, data):
        self.assertTrue(base64.b64decode(data["image/png"]).startswith(PNG_SIGNATURE))

    def test_show_emits_one_png_and_closes(self):
        outcome = self.run_ok("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
        self.assertEqual(len(outcome.displays), 1)
        self.assert_png(outcome.displays[0])
        self.assertEqual(outcome.displays[0]["text/plain"], "<Figure size 640x480 with 1 Axes>")
        self.assertIsNone(outcome.result)
        self.assertNotIn("non-interactive", outcome.stderr)
        self.assertEqual(self.run_ok("plt.get_fignums()").text, "[]")

    def test_two_shows_in_the_cell_that_imports_pyplot(self):
        code = "import matplotlib.pyplot as plt\nfor i in range(2):\n    plt.plot([i, 2])\n    plt.show()"
        outcome = self.run_ok(code)
        self.assertEqual(len(outcome.displays), 2)
        for data in outcome.displays:
            self.assert_png(data)

    def test_pyplot_imported_in_a_later_cell(self):
        self.run_ok("import matplotlib")
        outcome = self.run_ok(
            "from matplotlib import pyplot as plt\nplt.plot([1])\nplt.show()\nplt.get_fignums()"
        )
        self.assertEqual(len(outcome.displays), 1)
        self.assertEqual(outcome.text, "[]")

    def test_open_figure_emitted_at_end_of_cell(self):
        outcome = self.run_ok("import matplotlib.pyplot as plt\nplt.plot([3, 1])\nx = 1")
        self.assertEqual(len(outcome.displays), 1)
        self.assert_png(outcome.displays[0])
        self.assertEqual(self.run_ok("plt.get_fignums()").text, "[]")

    def test_open_figure_emitted_even_when_the_cell_fails(self):
        outcome = self.kernel.run("import matplotlib.pyplot as plt\nplt.plot([3, 1])\n1/0")
        self.assertEqual(len(outcome.displays), 1)
        self.assertEqual(outcome.error["name"], "ZeroDivisionError")

    def test_figure_as_result_is_not_emitted_twice(self):
        outcome = self.run_ok("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.gcf()")
        self.assertEqual(outcome.displays, [])
        self.assert_png(outcome.result)
        self.assertEqual(self.run_ok("plt.get_fignums()").text, "[]")

    def test_displayed_figure_is_not_emitted_again(self):
        outcome = self.run_ok(
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1])\ndisplay(fig)"
        )
        self.assertEqual(len(outcome.displays), 1)

    def test_backend_is_agg(self):
        self.assertEqual(self.run_ok("import matplotlib\nmatplotlib.get_backend().lower()").text, "'agg'")

    def test_empty_figure_is_text_only(self):
        outcome = self.run_ok("import matplotlib.pyplot as plt\nplt.figure()\nx = 0")
        self.assertEqual(outcome.displays, [{"text/plain": "<Figure size 640x480 with 0 Axes>"}])


CHART_MIME = "application/vnd.runcell.chart+json"


@unittest.skipUnless(has_module("matplotlib"), "matplotlib is not installed")
class ChartTests(KernelTestCase):
    """Chart data of figures (issue 24): the values extracted are the values plotted."""

    def chart(self, code):
        outcome = self.run_ok("import matplotlib.pyplot as plt\n" + code)
        self.assertEqual(len(outcome.displays), 1, outcome.messages)
        data = outcome.displays[0]
        self.assertTrue(base64.b64decode(data["image/png"]).startswith(PNG_SIGNATURE))
        return json.loads(data[CHART_MIME]) if CHART_MIME in data else None

    def test_line(self):
        chart = self.chart(
            "plt.plot([1, 2, 3], [4.5, 5, -6], label='speed')\nplt.plot([0, 1], [1, 0])\n"
            "plt.title('T')\nplt.xlabel('time (s)')\nplt.ylabel('v [m/s]')\nplt.grid(True)\n"
            "plt.axhline(0)\nplt.xticks([1, 2, 3], ['a', 'b', 'c'])\nplt.show()"
        )
        self.assertEqual(chart["type"], "line")
        self.assertEqual((chart["title"], chart["x_label"], chart["y_label"]), ("T", "time (s)", "v [m/s]"))
        self.assertEqual((chart["x_unit"], chart["y_unit"]), ("s", "m/s"))
        self.assertEqual(chart["elements"], [
            {"label": "speed", "points": [[1, 4.5], [2, 5], [3, -6]]},
            {"label": "Line 2", "points": [[0, 1], [1, 0]]},
        ])
        self.assertEqual((chart["x_ticks"], chart["x_tick_labels"]), ([1, 2, 3], ["a", "b", "c"]))
        self.assertEqual(chart["x_scale"], "linear")
        self.assertEqual(len(chart["y_ticks"]), len(chart["y_tick_labels"]))

    def test_line_of_dates_and_nan(self):
        chart = self.chart(
            "import datetime\nd = [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2)]\n"
            "plt.plot(d, [1, float('nan')])\nplt.show()"
        )
        self.assertEqual(chart["x_scale"], "datetime")
        self.assertEqual(chart["elements"][0]["points"], [["2024-01-01T00:00:00", 1], ["2024-01-02T00:00:00", None]])
        self.assertTrue(all(isinstance(t, str) for t in chart["x_ticks"]))

    def test_long_series_are_bounded(self):
        # 10 000 points a series at most, 50 000 a figure: six series keep 8 333 each.
        chart = self.chart("for i in range(6):\n    plt.plot(range(12_000))\nplt.show()")
        self.assertEqual([len(e["points"]) for e in chart["elements"]], [8_333] * 6)
        self.assertEqual(chart["elements"][5]["points"][-1], [8_332, 8_332])

    def test_scatter(self):
        chart = self.chart("plt.scatter([1, 2, 3], [0.5, 0.25, 2], label='s')\nplt.scatter([9], [9])\nplt.yscale('log')\nplt.show()")
        self.assertEqual(chart["type"], "scatter")
        self.assertEqual(chart["y_scale"], "log")
        self.assertEqual(chart["elements"], [
            {"label": "s", "points": [[1, 0.5], [2, 0.25], [3, 2]]},
            {"label": "Series 2", "points": [[9, 9]]},
        ])

    def test_bar_vertical_horizontal_and_grouped(self):
        chart = self.chart("plt.bar(['x', 'y', 'z'], [3, 1.5, 2], label='n')\nplt.ylabel('count')\nplt.show()")
        self.assertEqual(chart["type"], "bar")
        self.assertEqual(chart["x_scale"], "categorical")
        self.assertEqual(chart["elements"], [
            {"label": "x", "group": "n", "value": 3},
            {"label": "y", "group": "n", "value": 1.5},
            {"label": "z", "group": "n", "value": 2},
        ])
        chart = self.chart("plt.barh(['p', 'q'], [5, 7])\nplt.show()")
        self.assertEqual([(e["label"], e["value"]) for e in chart["elements"]], [("p", 5), ("q", 7)])
        chart = self.chart(
            "import numpy as np\nx = np.arange(2)\nplt.bar(x - 0.2, [1, 2], 0.4, label='a')\n"
            "plt.bar(x + 0.2, [3, 4], 0.4, label='b')\nplt.xticks(x, ['m', 'n'])\nplt.show()"
        )
        self.assertEqual([(e["label"], e["group"], e["value"]) for e in chart["elements"]],
                         [("m", "a", 1), ("n", "a", 2), ("m", "b", 3), ("n", "b", 4)])

    def test_histogram(self):
        chart = self.chart("plt.hist([1, 2, 2, 3, 3, 3, 4], bins=[1, 2, 3, 4], label='h')\nplt.show()")
        self.assertEqual(chart["type"], "histogram")
        self.assertEqual(chart["elements"], [{"label": "h", "bin_edges": [1, 2, 3, 4], "counts": [1, 2, 4]}])

    def test_histograms_of_several_data_sets_stacked_and_steps(self):
        chart = self.chart("plt.hist([[1, 2, 2], [2, 3, 3]], bins=[1, 2, 3, 4], label=['p', 'q'])\nplt.show()")
        self.assertEqual(chart["elements"], [
            {"label": "p", "bin_edges": [1, 2, 3, 4], "counts": [1, 2, 0]},
            {"label": "q", "bin_edges": [1, 2, 3, 4], "counts": [0, 1, 2]},
        ])
        chart = self.chart("plt.hist([[1, 2, 2], [2, 3, 3]], bins=[1, 2, 3, 4], stacked=True)\nplt.show()")
        self.assertEqual([e["counts"] for e in chart["elements"]], [[1, 2, 0], [0, 1, 2]])
        chart = self.chart("plt.hist([1, 2, 2, 3], bins=[1, 2, 3, 4], histtype='step')\nplt.show()")
        self.assertEqual(chart["elements"], [{"label": "Series 1", "bin_edges": [1, 2, 3, 4], "counts": [1, 2, 1]}])

    def test_error_bars_go_with_their_line(self):
        chart = self.chart("plt.errorbar([1, 2, 3], [4, 5, 6], yerr=[0.1, 0.2, 0.3], label='m')\nplt.show()")
        self.assertEqual((chart["type"], chart["elements"]), ("line", [{"label": "m", "points": [[1, 4], [2, 5], [3, 6]]}]))

    def test_pie(self):
        chart = self.chart("plt.pie([1, 2, 5], labels=['a', 'b', 'c'])\nplt.title('P')\nplt.show()")
        self.assertEqual(chart, {"type": "pie", "title": "P", "elements": [
            {"label": "a", "angle": 45, "radius": 1},
            {"label": "b", "angle": 90, "radius": 1},
            {"label": "c", "angle": 225, "radius": 1},
        ]})

    def test_box_and_whisker(self):
        chart = self.chart(
            "plt.boxplot([[1, 2, 3, 4, 5, 50], [2, 3, 4]], tick_labels=['p', 'q'])\nplt.show()"
        )
        self.assertEqual(chart["type"], "box_and_whisker")
        self.assertEqual(chart["elements"], [
            {"label": "p", "min": 1, "first_quartile": 2.25, "median": 3.5, "third_quartile": 4.75, "max": 5, "outliers": [50]},
            {"label": "q", "min": 2, "first_quartile": 2.5, "median": 3, "third_quartile": 3.5, "max": 4, "outliers": []},
        ])

    def test_subplots_are_a_superchart(self):
        chart = self.chart(
            "fig, (a, b) = plt.subplots(1, 2)\na.plot([1, 2], [3, 4])\nb.pie([1, 1])\n"
            "fig.suptitle('both')\nplt.show()"
        )
        self.assertEqual((chart["type"], chart["title"]), ("superchart", "both"))
        self.assertEqual([c["type"] for c in chart["elements"]], ["line", "pie"])
        self.assertEqual(chart["elements"][0]["elements"][0]["points"], [[1, 3], [2, 4]])

    def test_unclassifiable_is_unknown_and_empty_is_chartless(self):
        chart = self.chart("plt.imshow([[0, 1], [1, 0]])\nplt.title('img')\nplt.show()")
        self.assertEqual((chart["type"], chart["title"], chart["elements"]), ("unknown", "img", []))
        chart = self.chart("plt.plot([1, 2])\nplt.scatter([0, 1], [0, 1])\nplt.show()")
        self.assertEqual(chart["type"], "unknown")
        chart = self.chart("plt.plot([1, 2])\nplt.fill_between([0, 1], [0, 1], alpha=0.2)\nplt.show()")
        self.assertEqual((chart["type"], chart["elements"][0]["points"]), ("line", [[0, 1], [1, 2]]))
        chart = self.chart("plt.gca().set_title('nothing')\nplt.show()")
        self.assertIsNone(chart)

    def test_a_figure_that_breaks_extraction_still_shows(self):
        chart = self.chart(
            "import runcell_charts\nruncell_charts._classify = lambda ax: 1 / 0\nplt.plot([1, 2])\nplt.show()"
        )
        self.assertEqual((chart["type"], chart["elements"]), ("unknown", []))
        self.assertIsNone(self.chart("runcell_charts.figure_chart = None\nplt.plot([1, 2])\nplt.show()"))

    @unittest.skipUnless(has_module("pandas"), "pandas is not installed")
    def test_pandas_plots(self):
        self.run_ok("import pandas as pd")
        chart = self.chart("pd.DataFrame({'u': [1, 2], 'v': [3, 4]}, index=['r', 's']).plot.bar()\nplt.show()")
        self.assertEqual([(e["label"], e["group"], e["value"]) for e in chart["elements"]],
                         [("r", "u", 1), ("s", "u", 2), ("r", "v", 3), ("s", "v", 4)])
        chart = self.chart(
            "pd.Series([1, 3, 2], index=pd.date_range('2024-01-01', periods=3, freq='D')).plot()\nplt.show()"
        )
        self.assertEqual(chart["elements"][0]["points"],
                         [["2024-01-01T00:00:00", 1], ["2024-01-02T00:00:00", 3], ["2024-01-03T00:00:00", 2]])
        chart = self.chart("pd.DataFrame({'a': [1, 2, 3, 4, 5]}).plot.box()\nplt.show()")
        self.assertEqual(chart["elements"][0]["label"], "a")
        self.assertEqual(chart["elements"][0]["median"], 3)
        chart = self.chart("pd.Series([1, 2, 2, 3]).plot.hist(bins=2)\nplt.show()")
        self.assertEqual(chart["elements"][0]["counts"], [1, 3])

    @unittest.skipUnless(has_module("seaborn") and has_module("pandas"), "seaborn is not installed")
    def test_seaborn_plots(self):
        self.run_ok("import seaborn as sns\nimport pandas as pd")
        chart = self.chart("sns.barplot(x=['a', 'b', 'a', 'b'], y=[1, 2, 3, 4], hue=['h', 'h', 'k', 'k'])\nplt.show()")
        self.assertEqual([(e["label"], e["group"], e["value"]) for e in chart["elements"]],
                         [("a", "h", 1), ("b", "h", 2), ("a", "k", 3), ("b", "k", 4)])
        chart = self.chart("sns.boxplot(x=['a', 'a', 'a', 'b', 'b', 'b'], y=[1, 2, 3, 4, 5, 6])\nplt.show()")
        self.assertEqual([(e["label"], e["median"]) for e in chart["elements"]], [("a", 2), ("b", 5)])
        chart = self.chart("sns.histplot([1, 2, 2, 3, 3, 3], bins=3)\nplt.show()")
        self.assertEqual(chart["type"], "histogram")
        self.assertEqual(chart["elements"][0]["counts"], [1, 2, 3])
        chart = self.chart("sns.scatterplot(x=[1, 2], y=[3, 4])\nplt.show()")
        self.assertEqual(chart["elements"][0]["points"], [[1, 3], [2, 4]])
        chart = self.chart("sns.lineplot(x=[1, 2, 3], y=[3, 4, 5])\nplt.show()")
        self.assertEqual(chart["elements"][0]["points"], [[1, 3], [2, 4], [3, 5]])
        # hue: series named by the legend seaborn draws apart from them
        chart = self.chart("sns.lineplot(x=[1, 2, 1, 2], y=[1, 2, 3, 4], hue=['p', 'p', 'q', 'q'])\nplt.show()")
        self.assertEqual(chart["elements"], [{"label": "p", "points": [[1, 1], [2, 2]]}, {"label": "q", "points": [[1, 3], [2, 4]]}])
        chart = self.chart("sns.scatterplot(x=[1, 2, 3, 4], y=[1, 3, 2, 4], hue=['x', 'y', 'x', 'y'])\nplt.show()")
        self.assertEqual(chart["elements"], [{"label": "x", "points": [[1, 1], [3, 2]]}, {"label": "y", "points": [[2, 3], [4, 4]]}])
        chart = self.chart(
            "d = pd.DataFrame({'a': [1., 2, 2, 3, 3, 3, 1, 2], 'g': ['x', 'y'] * 4})\n"
            "sns.histplot(data=d, x='a', hue='g', bins=3, kde=True)\nplt.show()"
        )
        self.assertEqual(chart["type"], "histogram")
        self.assertEqual(sorted((e["label"], e["counts"]) for e in chart["elements"]), [("x", [2, 1, 1]), ("y", [0, 2, 2])])
        chart = self.chart("sns.violinplot(x=['a', 'a', 'b', 'b'], y=[1, 2, 3, 4])\nplt.show()")
        self.assertEqual(chart["type"], "unknown", "a violin is no line")


MERGE_PROBE = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import runcell_kernel

def heap_mergeable():
    in_heap = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if not head.endswith(":"):
            in_heap = line.rstrip().endswith("[heap]")
        elif in_heap and head == "VmFlags:":
            return "mg" in line.split()[1:]
    return None

before = heap_mergeable()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, repr(heap_mergeable()).encode())
    os._exit(0)
os.close(w)
child = os.read(r, 100).decode()
os.waitpid(pid, 0)
print(before, runcell_kernel._merge_marked is not None and runcell_kernel._merge_marked > 0, heap_mergeable(), child)
"""


@unittest.skipUnless(os.path.exists("/sys/kernel/mm/ksm"), "needs a kernel with KSM")
class ZygoteMergeTests(unittest.TestCase):
    """RUNCELL_ZYGOTE_MERGE_PAGES (set by the engine for `serve --merge-session-pages`): the
    kernel imported as the zygote's module marks the process's memory mergeable at its first
    fork, and the child inherits the marking; without it nothing is marked."""

    def probe(self, extra):
        env = {k: v for k, v in os.environ.items() if k != "RUNCELL_ZYGOTE_MERGE_PAGES"}
        env.update(extra)
        out = subprocess.run(
            [sys.executable, "-c", MERGE_PROBE, HERE], env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.split()

    def test_marked_at_the_first_fork_and_inherited(self):
        self.assertEqual(self.probe({"RUNCELL_ZYGOTE_MERGE_PAGES": "1"}), ["False", "True", "True", "True"])

    def test_not_marked_without_the_switch(self):
        self.assertEqual(self.probe({}), ["False", "False", "False", "False"])



class WarmOneShotTests(unittest.TestCase):
    """`warm_one_shot` runs in a zygote before its forks: it must leave the process as it was."""

    PROBE = r"""
import atexit, importlib.util, json, os, sys, threading
spec = importlib.util.spec_from_file_location("runcell_kernel", KERNEL)
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
atexit.register(lambda: None)
def state():
    return {"environ": dict(os.environ), "path": list(sys.path), "argv": list(sys.argv),
            "main": id(sys.modules["__main__"]), "stdout": id(sys.stdout),
            "exit_handlers": atexit._ncallbacks(),
            "main_thread_alive": threading.main_thread().is_alive()}
before = state()
k.warm_one_shot()
after = state()
print(json.dumps({key: "kept" if before[key] == after[key] else after[key] for key in before}))
"""

    def test_warm_one_shot_leaves_the_process_as_it_was(self):
        # A variable of our own, to see the environment put back whole.
        env = dict(os.environ, RUNCELL_WARM_PROBE="kept")
        out = subprocess.run(
            [sys.executable, "-c", f"KERNEL = {KERNEL!r}\n" + self.PROBE],
            capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=HERE,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        # Only the probe's own line: the warm-up's `print(1)` went into a buffer.
        self.assertEqual(out.stdout.count("\n"), 1, out.stdout)
        changed = {key: v for key, v in json.loads(out.stdout).items() if v != "kept"}
        self.assertEqual(changed, {})


if __name__ == "__main__":
    unittest.main()
