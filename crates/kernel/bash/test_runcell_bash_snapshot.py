#!/usr/bin/env python3
"""Tests for the bash kernel's snapshots: the shell's variables, arrays, functions, aliases,
options and working directory written by one kernel and read back by a fresh one.

Run: /usr/bin/python3 test_runcell_bash_snapshot.py   (stdlib only)
"""

import os
import shutil
import struct
import tempfile
import unittest

from test_runcell_bash_kernel import Kernel


class BashSnapshotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="runcell-bash-snapshot-")
        self.path = os.path.join(self.dir, "state.snap")
        self.kernels = []
        self.addCleanup(shutil.rmtree, self.dir, True)

    def kernel(self):
        k = Kernel()
        self.addCleanup(k.cleanup)
        return k

    def ok(self, k, code):
        result = k.run(code)
        self.assertEqual(result.status, "ok", (code, result.messages, result.stderr))
        return result.stdout

    def request(self, k, kind, path=None):
        k.marks = (len(k.data["out"]), len(k.data["err"]))
        k.send({"type": kind, "id": "snap", "path": path or self.path})
        return k.finish("snap")

    def report(self, k, kind, path=None):
        result = self.request(k, kind, path)
        self.assertEqual(result.status, "ok", (result.messages, result.stderr))
        (report,) = [m for m in result.messages if m["type"] in ("snapshotted", "restored")]
        return report

    STATE = r"""
greeting='hello "world" $x `y`
second line'
declare -i count=41
count+=1
list=(one "two words" three)
declare -A colors=([sky]=blue [grass]=green)
export EXPORTED=yes
readonly FIXED=1
PATH="$PATH:/opt/extra"
shout() { echo "${1^^}!"; }
export -f shout
alias ll='echo listing'
mkdir -p sub/dir && cd sub/dir
set -o pipefail
"""

    def test_state_round_trips_into_a_fresh_kernel(self):
        a = self.kernel()
        self.ok(a, self.STATE)
        report = self.report(a, "snapshot")
        names = set(report["names"])
        for name in ("greeting", "count", "list", "colors", "EXPORTED", "PATH", "shout()", "alias ll", "cwd", "set -o"):
            self.assertIn(name, names, report)
        self.assertEqual(report["skipped"], [{"name": "FIXED", "reason": "readonly variable"}])
        # Bash's own variables and the kernel's are the new shell's: not in the snapshot.
        for name in ("BASHPID", "RANDOM", "PPID", "PWD", "PROMPT_COMMAND", "exit()", "HOME"):
            self.assertNotIn(name, names)
        self.assertEqual(report["bytes"], os.path.getsize(self.path))

        b = self.kernel()
        restored = self.report(b, "restore")
        self.assertEqual(restored["skipped"], [], restored)
        self.assertEqual(set(restored["names"]), names)
        out = self.ok(
            b,
            'printf "%s|" "$greeting" "$count" "${#list[@]}" "${list[1]}" "${colors[grass]}" "$EXPORTED"; echo\n'
            "count+=1; echo $count\n"
            "shout hey; ll; pwd; [[ $PATH == *:/opt/extra ]] && echo path\n"
            "bash -c 'echo $EXPORTED; shout child'\n"
            "set -o | grep pipefail\n"
            'echo "fixed=${FIXED-unset}"',
        )
        lines = out.splitlines()
        self.assertEqual(lines[0], 'hello "world" $x `y`')
        self.assertEqual(lines[1], "second line|42|3|two words|green|yes|")
        self.assertEqual(lines[2], "43")  # still an integer variable
        self.assertEqual(lines[3:6], ["HEY!", "listing", os.path.join(a.workdir, "sub/dir")])
        self.assertEqual(lines[6], "path")
        self.assertEqual(lines[7:9], ["yes", "CHILD!"])  # exported variable and function
        self.assertEqual(lines[9].split(), ["pipefail", "on"])
        self.assertEqual(lines[10], "fixed=unset")
        # The kernel still works as before: its own exit and errexit handling.
        self.assertEqual(b.run("exit 3").error["value"], "3")
        self.assertEqual(self.ok(b, "echo after"), "after\n")

    def test_what_cannot_be_put_back_is_named_and_the_rest_restored(self):
        a = self.kernel()
        self.ok(a, "keep=1\nmkdir gone && cd gone\nclash=2")
        self.report(a, "snapshot")
        b = self.kernel()
        self.ok(b, "readonly clash=0")  # the new shell's own read-only variable wins
        shutil.rmtree(os.path.join(a.workdir, "gone"))
        restored = self.report(b, "restore")
        skipped = {s["name"]: s["reason"] for s in restored["skipped"]}
        self.assertEqual(set(skipped), {"cwd", "clash"}, restored)
        self.assertIn("readonly", skipped["clash"])
        self.assertIn("keep", restored["names"])
        self.assertEqual(self.ok(b, "echo $keep $clash"), "1 0\n")

    def test_refusals(self):
        a = self.kernel()
        self.ok(a, "x=1")
        self.report(a, "snapshot")
        with open(self.path, "rb") as f:
            good = f.read()
        b = self.kernel()
        cases = [
            (good[:-1], "truncated"),
            (good[:40] + bytes([good[40] ^ 1]) + good[41:], "corrupt"),
            (good[:16] + struct.pack(">I", 2) + good[20:], "incompatible"),
            (b"#!/bin/bash\necho hi\n", "corrupt"),
        ]
        for data, reason in cases:
            with self.subTest(reason=reason):
                bad = os.path.join(self.dir, "bad.snap")
                with open(bad, "wb") as f:
                    f.write(data)
                result = self.request(b, "restore", bad)
                self.assertEqual(result.status, "error", result.messages)
                (refused,) = [m for m in result.messages if m["type"] == "snapshot_refused"]
                self.assertEqual(refused["refusal"]["reason"], reason, refused)
        result = self.request(b, "restore", os.path.join(self.dir, "absent"))
        self.assertEqual(result.messages[0]["refusal"]["reason"], "missing")
        self.assertEqual(self.ok(b, "echo ${x-unset}"), "unset\n")

    def test_a_python_snapshot_is_refused_as_another_language(self):
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("snap", os.path.join(here, "..", "python", "runcell_snapshot.py"))
        snap = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(snap)
        snap.write(self.path, {"language": "python", "language_version": "3.11.2", "entries": []}, [])
        b = self.kernel()
        result = self.request(b, "restore")
        (refused,) = [m for m in result.messages if m["type"] == "snapshot_refused"]
        self.assertEqual(refused["refusal"], {"reason": "incompatible", "field": "language", "found": "python", "expected": "bash"})

    def test_a_snapshot_keeps_the_last_status_and_the_count(self):
        a = self.kernel()
        a.run("false")
        self.report(a, "snapshot")
        result = a.run("echo $?")
        self.assertEqual(result.stdout, "1\n")
        self.assertEqual(result.done["execution_count"], 2)


if __name__ == "__main__":
    unittest.main()
