#!/usr/bin/env python3
"""Tests for runcell_bash_kernel.py. Each test starts the kernel as a subprocess
in a fresh temporary directory, with one end of a socketpair on its fd 3 and
pipes on fds 1 and 2, and speaks the protocol to it the way the host does.

Run: /usr/bin/python3 test_runcell_bash_kernel.py   (stdlib only; exits non-zero on failure)
"""

import atexit
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# The kernel runs from a directory laid out like the sandbox's kernel directory: itself and the
# modules it imports (../python/runcell_wire.py, ../python/runcell_snapshot.py) side by side.
KERNEL_DIR = tempfile.mkdtemp(prefix="runcell-bash-kernel-")
atexit.register(shutil.rmtree, KERNEL_DIR, True)
for _source in ("runcell_bash_kernel.py", "../python/runcell_wire.py", "../python/runcell_snapshot.py"):
    shutil.copy(os.path.join(HERE, _source), KERNEL_DIR)
KERNEL = os.path.join(KERNEL_DIR, "runcell_bash_kernel.py")
TIMEOUT = 30.0


def bash_version():
    first = subprocess.run(["/bin/bash", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return re.search(r"version (\d+\.\d+\.\d+)", first).group(1)


class Result:
    """What one execute produced: the messages up to `done`, and the output meanwhile."""

    def __init__(self, messages, stdout, stderr):
        self.messages = messages
        self.done = messages[-1]
        self.status = self.done["status"]
        errors = [m for m in messages if m["type"] == "error"]
        assert len(errors) <= 1, messages
        self.error = errors[0] if errors else None
        self.stdout = stdout
        self.stderr = stderr


class Kernel:
    """The kernel under test, with one select loop over its channel and pipes."""

    def __init__(self):
        self.workdir = tempfile.mkdtemp(prefix="runcell-bash-test-")
        self.sock, theirs = socket.socketpair()
        theirs_fd = theirs.fileno()

        def channel_on_fd3():
            os.dup2(theirs_fd, 3)  # dup2 clears close-on-exec on the copy

        self.proc = subprocess.Popen(
            [sys.executable, KERNEL],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            # TMPDIR: the kernel's cell files go away with the workdir even when it is killed.
            env=dict(os.environ, HOME=self.workdir, TMPDIR=self.workdir),
            preexec_fn=channel_on_fd3,
            close_fds=False,  # it would close fd 3 after preexec_fn; our own fds are non-inheritable
        )
        theirs.close()
        self.fds = {"chan": self.sock.fileno(), "out": self.proc.stdout.fileno(), "err": self.proc.stderr.fileno()}
        self.data = {name: bytearray() for name in self.fds}
        try:
            self.ready = self.recv()
        except BaseException:
            self.cleanup()
            raise

    def pump(self, timeout):
        live = {fd: name for name, fd in self.fds.items() if fd is not None}
        if not live:
            time.sleep(max(timeout, 0))
            return
        readable, _, _ = select.select(list(live), [], [], max(timeout, 0))
        for fd in readable:
            chunk = os.read(fd, 65536)
            if chunk:
                self.data[live[fd]] += chunk
            else:
                self.fds[live[fd]] = None

    def recv(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            buf = self.data["chan"]
            if len(buf) >= 4:
                (length,) = struct.unpack(">I", buf[:4])
                if len(buf) >= 4 + length:
                    body = bytes(buf[4 : 4 + length])
                    del buf[: 4 + length]
                    return json.loads(body)
            if self.fds["chan"] is None:
                raise EOFError("the kernel closed the channel; stderr: " + self.text("err"))
            if time.monotonic() > deadline:
                raise TimeoutError("no message; stderr: " + self.text("err"))
            self.pump(deadline - time.monotonic())

    def text(self, name, start=0):
        return self.data[name][start:].decode("utf-8", "replace")

    def send(self, message):
        body = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def start(self, code, msg_id="ex"):
        self.marks = (len(self.data["out"]), len(self.data["err"]))
        self.send({"type": "execute", "id": msg_id, "code": code})

    def finish(self, msg_id="ex", timeout=TIMEOUT):
        messages = [self.recv(timeout)]
        while messages[-1]["type"] != "done":
            messages.append(self.recv(timeout))
        assert all(m["id"] == msg_id for m in messages), messages
        self.pump(0.05)  # what the cell printed is already in the pipes; take it
        return Result(messages, self.text("out", self.marks[0]), self.text("err", self.marks[1]))

    def run(self, code, msg_id="ex", timeout=TIMEOUT):
        self.start(code, msg_id)
        return self.finish(msg_id, timeout)

    def wait_for_stdout(self, text, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while text not in self.text("out"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} never appeared on stdout")
            self.pump(deadline - time.monotonic())

    def exit_code(self, timeout=TIMEOUT):
        code = self.proc.wait(timeout=timeout)
        return code

    def close(self):
        self.sock.close()
        try:
            return self.proc.wait(timeout=TIMEOUT)
        finally:
            self.cleanup()

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self.proc.stdout.close()
        self.proc.stderr.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class BashKernelTest(unittest.TestCase):
    def setUp(self):
        self.k = Kernel()
        self.addCleanup(self.k.cleanup)

    def ok(self, code):
        result = self.k.run(code)
        self.assertEqual(result.status, "ok", (code, result.messages, result.stderr))
        self.assertIsNone(result.error)
        return result

    def failed(self, code, status):
        result = self.k.run(code)
        self.assertEqual(result.status, "error", (code, result.messages))
        self.assertEqual(result.error["name"], "ExitCode")
        self.assertEqual(result.error["value"], str(status))
        self.assertEqual(result.error["traceback"], "")
        return result

    # ---- protocol ----

    def test_ready(self):
        self.assertEqual(
            self.k.ready,
            {"type": "ready", "language": "bash", "version": bash_version(), "pid": self.k.proc.pid},
        )

    def test_execution_count_and_id(self):
        counts = [self.k.run(code).done["execution_count"] for code in ("true", "false", "if then fi", "exit 2", ":")]
        self.assertEqual(counts, [1, 2, 3, 4, 5])
        result = self.k.run("echo hi", msg_id="ex_42")
        self.assertEqual(result.done, {"type": "done", "id": "ex_42", "status": "ok", "execution_count": 6})
        self.assertEqual([m["type"] for m in result.messages], ["done"])  # output never on the channel

    def test_unknown_message_type(self):
        self.k.send({"type": "frobnicate", "id": "x"})
        reply = self.k.recv()
        self.assertEqual((reply["type"], reply["id"], reply["name"]), ("error", None, "ProtocolError"))
        self.assertEqual(self.ok("echo still here").stdout, "still here\n")

    def test_execute_without_code(self):
        self.k.send({"type": "execute", "id": "bad"})
        error, done = self.k.recv(), self.k.recv()
        self.assertEqual((error["name"], error["id"]), ("ProtocolError", "bad"))
        self.assertEqual((done["type"], done["status"]), ("done", "error"))
        self.ok("true")

    def test_eof_exits_zero(self):
        self.ok("x=1")
        self.assertEqual(self.k.close(), 0)

    def test_eof_exits_promptly_despite_a_background_job(self):
        self.ok("sleep 600 &")
        started = time.monotonic()
        self.assertEqual(self.k.close(), 0)
        self.assertLess(time.monotonic() - started, 5)

    def test_eof_during_a_cell_exits_zero_promptly(self):
        self.k.start("sleep 30")
        time.sleep(0.2)
        started = time.monotonic()
        self.assertEqual(self.k.close(), 0)
        self.assertLess(time.monotonic() - started, 5)

    def test_malformed_frame_exits_3(self):
        self.k.sock.sendall(struct.pack(">I", 5) + b"nope!")
        self.assertEqual(self.k.exit_code(), 3)

    # ---- state ----

    def test_cd_persists(self):
        os.mkdir(os.path.join(self.k.workdir, "sub"))
        self.ok("cd sub")
        self.assertEqual(self.ok("pwd").stdout, os.path.join(os.path.realpath(self.k.workdir), "sub") + "\n")

    def test_variables_functions_aliases_and_options_persist(self):
        self.ok("x=41\ngreet() { echo \"hello $1\"; }\nalias hi='echo hi-alias'\nset -o pipefail\nexport EXP=yes")
        self.assertEqual(self.ok("echo $((x + 1))").stdout, "42\n")
        self.assertEqual(self.ok("greet world").stdout, "hello world\n")
        self.assertEqual(self.ok("hi").stdout, "hi-alias\n")
        self.assertEqual(self.ok("[[ -o pipefail ]] && echo on").stdout, "on\n")
        self.assertEqual(self.ok("bash -c 'echo $EXP'").stdout, "yes\n")

    def test_user_definitions_do_not_break_the_kernel(self):
        self.ok("alias source=false printf=false read=false\n"
                "trap() { :; }; kill() { :; }; local() { :; }; set() { :; }")
        self.assertEqual(self.ok("echo fine").stdout, "fine\n")
        self.failed("exit 9", 9)
        self.interrupt_after("sleep 30")
        self.ok("unset -f set; set -u")  # the kernel's own code must not trip over unset variables
        self.failed("echo $nope", 1)
        self.assertEqual(self.ok("echo still fine").stdout, "still fine\n")

    def test_previous_status_is_the_next_cells_dollar_question(self):
        self.k.run("false")
        self.assertEqual(self.ok("echo $?").stdout, "1\n")

    # ---- status ----

    def test_false_is_exit_code_1(self):
        self.failed("false", 1)

    def test_status_is_the_last_commands(self):
        self.ok("false\ntrue")
        self.failed("true; (exit 7)", 7)

    def test_exit_ends_the_cell_not_the_session(self):
        result = self.failed("y=before\necho a\nexit 3\necho b", 3)
        self.assertEqual((result.stdout, result.stderr), ("a\n", ""))
        self.assertEqual(self.ok("echo $y").stdout, "before\n")
        self.failed("f() { exit 4; }; f; echo not-reached", 4)
        self.ok("exit 0")
        self.failed("false; exit", 1)
        self.failed("exit 300", 44)
        self.assertIn("numeric argument required", self.failed("exit nope", 2).stderr)
        self.assertEqual(self.k.proc.poll(), None)

    def test_exit_in_a_subshell_is_an_ordinary_exit(self):
        self.assertEqual(self.ok("(exit 4); echo $?; x=$(exit 5); echo $?").stdout, "4\n5\n")

    def test_set_e_ends_the_cell_and_stays_on(self):
        result = self.failed("set -e\necho a\nfalse\necho b", 1)
        self.assertEqual(result.stdout, "a\n")
        self.failed("f() { false; echo in-f; }; f; echo after", 1)
        self.assertEqual(self.ok("false || echo handled; [[ $- == *e* ]] && echo still-e").stdout, "handled\nstill-e\n")
        self.ok("set +e; false; true")

    def test_syntax_error_is_an_error_and_the_shell_survives(self):
        result = self.k.run("if then fi")
        self.assertEqual(result.status, "error")
        self.assertEqual(result.error["name"], "ExitCode")
        self.assertIn("syntax error", result.stderr)
        self.assertEqual(self.ok("echo alive").stdout, "alive\n")

    def test_return_at_top_level_ends_the_cell(self):
        result = self.failed("echo a; return 6; echo b", 6)
        self.assertEqual(result.stdout, "a\n")

    # ---- input and output ----

    def test_stdout_and_stderr_are_separate(self):
        result = self.ok("echo out; echo err >&2; ls /nonexistent-dir 2>&1 >/dev/null | wc -l >&2; printf 'x\\n'")
        self.assertEqual(result.stdout, "out\nx\n")
        self.assertEqual(result.stderr, "err\n1\n")

    def test_heredoc(self):
        result = self.ok("name=world\ncat <<EOF\nhello $name\n  indented\nEOF\ncat <<'RAW'\n$name\nRAW")
        self.assertEqual(result.stdout, "hello world\n  indented\n$name\n")

    def test_multiline_loops_and_functions(self):
        code = "total=0\nfor i in 1 2 3; do\n  total=$((total + i))\ndone\nshow() {\n  echo \"total=$total\"\n}\nshow"
        self.assertEqual(self.ok(code).stdout, "total=6\n")

    def test_stdin_is_empty(self):
        result = self.k.run('read x; echo "status=$? x=[$x]"; cat; echo after-cat')
        self.assertEqual(result.stdout, "status=1 x=[]\nafter-cat\n")
        self.assertEqual(self.ok("echo next").stdout, "next\n")

    def test_unicode(self):
        self.assertEqual(self.ok("echo 'héllo ✓ 🐚'").stdout, "héllo ✓ 🐚\n")

    def test_background_job_output(self):
        self.assertEqual(self.ok("(echo from-bg) &\nwait").stdout, "from-bg\n")
        self.ok("(sleep 0.3; echo late-bg) &")
        self.k.wait_for_stdout("late-bg", timeout=10)
        self.ok("true")

    def test_no_kernel_descriptors_leak_into_cells(self):
        fds = self.ok("ls /proc/self/fd").stdout.split()
        self.assertEqual(sorted(fds, key=int), ["0", "1", "2", "3"])  # 3: ls's own directory

    # ---- interrupts ----

    def interrupt_after(self, code, delay=0.3, budget=2.0):
        self.k.start(code)
        time.sleep(delay)
        sent = time.monotonic()
        os.kill(self.k.proc.pid, signal.SIGINT)
        result = self.k.finish(timeout=budget)
        self.assertLess(time.monotonic() - sent, budget)
        self.assertEqual(result.status, "interrupted", result.messages)
        self.assertEqual((result.error["name"], result.error["value"]), ("KeyboardInterrupt", ""))
        return result

    def test_interrupt_sleep(self):
        self.ok("v=kept; cd /tmp")
        result = self.interrupt_after("echo before\nsleep 30\necho after")
        self.assertEqual((result.stdout, result.stderr), ("before\n", ""))
        self.assertEqual(self.ok("echo $v; pwd").stdout, "kept\n/tmp\n")

    def test_interrupt_busy_builtin_loop_in_a_function(self):
        self.interrupt_after("spin() { while :; do :; done; }\nspin\necho after")
        self.assertEqual(self.ok("echo alive").stdout, "alive\n")

    def test_interrupt_pipeline_and_redirections_are_restored(self):
        self.interrupt_after("{ sleep 30 | cat; } >captured.txt 2>&1")
        result = self.ok("echo out; echo err >&2")
        self.assertEqual((result.stdout, result.stderr), ("out\n", "err\n"))

    def test_interrupt_right_after_execute(self):
        self.interrupt_after("sleep 30", delay=0)
        self.ok("true")

    def test_sigint_between_cells_is_ignored(self):
        self.ok("x=1")
        os.kill(self.k.proc.pid, signal.SIGINT)
        time.sleep(0.3)
        self.assertEqual(self.ok("echo $x").stdout, "1\n")

    def test_background_jobs_survive_an_interrupt(self):
        self.ok("(sleep 1; echo bg-survived) &")
        self.interrupt_after("sleep 30", delay=0.1)
        self.k.wait_for_stdout("bg-survived", timeout=10)

    # ---- death ----

    def test_bash_killed_is_kernel_died(self):
        self.k.start("kill -9 $$")
        error = self.k.recv()
        self.assertEqual((error["type"], error["id"], error["name"]), ("error", "ex", "KernelDied"))
        with self.assertRaises(EOFError):
            self.k.recv()
        self.assertNotEqual(self.k.exit_code(), 0)

    def test_exec_of_another_program_is_kernel_died(self):
        self.k.start("exec sleep 30")
        self.assertEqual(self.k.recv()["name"], "KernelDied")
        self.assertNotEqual(self.k.exit_code(), 0)

    def test_bash_dying_between_cells_ends_the_kernel(self):
        self.ok("(sleep 0.2; kill -9 $$) &")
        self.assertNotEqual(self.k.exit_code(), 0)


if __name__ == "__main__":
    unittest.main()
