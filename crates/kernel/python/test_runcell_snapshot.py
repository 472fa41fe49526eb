#!/usr/bin/env python3
"""Tests for the kernels' snapshots (runcell_snapshot.py and the `snapshot`/`restore`
messages): each starts real kernels as subprocesses with a socketpair on fd 3, as the host
does, snapshots one and restores into another.

Run: python3 test_runcell_snapshot.py   (stdlib only; the cases that need cloudpickle,
numpy, pandas or scikit-learn are skipped when the interpreter running the tests lacks them,
so the data-science runtime runs them all).
"""

import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import unittest
import zlib

from test_runcell_kernel import HERE, KernelProcess, has_module

SNAPSHOT_MODULE = os.path.join(HERE, "runcell_snapshot.py")
_spec = importlib.util.spec_from_file_location("runcell_snapshot_under_test", SNAPSHOT_MODULE)
snap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snap)

HAS_CLOUDPICKLE = has_module("cloudpickle")


class Kernels(unittest.TestCase):
    """Two kernels (the one snapshotted and a fresh one to restore into) and a directory."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="runcell-snapshot-test-")
        self.path = os.path.join(self.dir, "state.snap")
        self.kernels = []
        self.addCleanup(self._close)

    def _close(self):
        for k in self.kernels:
            if k.proc.poll() is None:
                k.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def kernel(self):
        k = KernelProcess()
        self.kernels.append(k)
        return k

    def run_ok(self, kernel, code):
        outcome = kernel.run(code)
        self.assertEqual(outcome.status, "ok", (outcome.messages, outcome.stderr))
        return outcome

    def request(self, kernel, kind, path=None, msg_id="snap", **fields):
        kernel.start_request = None
        kernel.marks = (len(kernel.buffers["stdout"]), len(kernel.buffers["stderr"]))
        kernel.send(dict(fields, type=kind, id=msg_id, path=self.path if path is None else path))
        return kernel.finish(msg_id)

    def snapshot(self, kernel):
        outcome = self.request(kernel, "snapshot")
        self.assertEqual(outcome.status, "ok", (outcome.messages, outcome.stderr))
        (report,) = [m for m in outcome.messages if m["type"] == "snapshotted"]
        return report

    def restore(self, kernel, path=None):
        outcome = self.request(kernel, "restore", path)
        self.assertEqual(outcome.status, "ok", (outcome.messages, outcome.stderr))
        (report,) = [m for m in outcome.messages if m["type"] == "restored"]
        return report

    def refusal(self, kernel, path=None, **fields):
        outcome = self.request(kernel, "restore", path, **fields)
        self.assertEqual(outcome.status, "error", outcome.messages)
        (refused,) = [m for m in outcome.messages if m["type"] == "snapshot_refused"]
        return refused["refusal"], outcome

    def value(self, kernel, expression):
        return self.run_ok(kernel, expression).text

    def skipped(self, report):
        return {s["name"]: s["reason"] for s in report["skipped"]}


class PlainRoundTrip(Kernels):
    """What the stdlib's pickle alone can carry, with any interpreter."""

    def test_values_modules_and_aliases_round_trip(self):
        a = self.kernel()
        self.run_ok(
            a,
            "import os.path as osp\nimport json\nfrom math import sqrt\n"
            "n = 42\ntext = 'ünï ☃'\ndata = {'k': [1, 2.5, None, (3, 4)]}\nsame = data\n"
            "blob = bytes(range(256)) * 10\n_private = 'kept'\nbig = 10**5000",
        )
        report = self.snapshot(a)
        self.assertEqual(report["skipped"], [])
        self.assertEqual(
            set(report["names"]), {"osp", "json", "sqrt", "n", "text", "data", "same", "blob", "_private", "big"}
        )
        self.assertEqual(report["bytes"], os.path.getsize(self.path))
        self.assertGreater(report["duration_us"], 0)
        b = self.kernel()
        restored = self.restore(b)
        self.assertEqual(set(restored["names"]), set(report["names"]))
        self.assertEqual(restored["skipped"], [])
        self.assertEqual(
            self.value(b, "(osp.join('a', 'b'), json.dumps(data), sqrt(16), n, text, len(blob), _private, big % 97)"),
            repr(("a/b", json.dumps({"k": [1, 2.5, None, [3, 4]]}), 4.0, 42, "ünï ☃", 2560, "kept", 10**5000 % 97)),
        )
        # An alias is the same object again, not a copy.
        self.assertEqual(self.value(b, "same is data"), "True")
        # The kernel's execution count is the new session's own.
        self.assertEqual(b.run("1").done["execution_count"], 3)

    def test_os_environ_changes_round_trip(self):
        a = self.kernel()
        self.run_ok(
            a,
            "import os\nos.environ['RUNCELL_T_SET'] = 'a b=c'\nos.environ['HOME'] = '/elsewhere'\n"
            "os.environ.pop('RUNCELL_T_GONE', None)\nx = 1",
        )
        report = self.snapshot(a)
        self.assertIn("os.environ", report["names"])
        b = self.kernel()
        restored = self.restore(b)
        self.assertIn("os.environ", restored["names"])
        self.assertEqual(
            self.value(b, "import os\n(os.environ['RUNCELL_T_SET'], os.environ['HOME'], 'RUNCELL_T_GONE' in os.environ, x)"),
            "('a b=c', '/elsewhere', False, 1)",
        )
        # Control: a kernel that did not restore has its own environment.
        c = self.kernel()
        self.assertEqual(self.value(c, "import os\n'RUNCELL_T_SET' in os.environ"), "False")
        # A variable the session removed (one it started with, one it had set) stays removed.
        self.assertEqual(self.value(c, "'PATH' in os.environ"), "True")
        self.run_ok(b, "del os.environ['RUNCELL_T_SET']\ndel os.environ['PATH']")
        self.snapshot(b)
        d = self.kernel()
        self.restore(d)
        self.assertEqual(
            self.value(d, "import os\n'RUNCELL_T_SET' in os.environ, 'PATH' in os.environ, os.environ['HOME']"),
            "(False, False, '/elsewhere')",
        )

    def test_open_file_generator_socket_thread_and_lock_are_skipped_and_named(self):
        a = self.kernel()
        self.run_ok(
            a,
            "import socket, threading\nkeep = [1, 2]\nf = open('notes.txt', 'w')\n"
            "gen = (i for i in range(3))\nsock = socket.socket()\nlock = threading.Lock()\n"
            "t = threading.Thread(target=lambda: None)\nnested = {'inner': f}\n"
            "open('data.txt', 'w').close()\nreader = 1\nreading = open('data.txt')",
        )
        report = self.snapshot(a)
        skipped = self.skipped(report)
        self.assertEqual(set(skipped), {"f", "gen", "sock", "lock", "t", "nested", "reading"}, report)
        self.assertEqual(skipped["f"], "open file 'notes.txt'")
        self.assertEqual(skipped["gen"], "generator")
        self.assertEqual(skipped["sock"], "socket")
        self.assertEqual(skipped["lock"], "lock")
        self.assertEqual(skipped["t"], "thread")
        self.assertIn("open file 'notes.txt'", skipped["nested"])
        self.assertIn("reader", report["names"])
        self.assertIn("keep", report["names"])
        self.assertIn("socket", report["names"])
        b = self.kernel()
        restored = self.restore(b)
        self.assertEqual(restored["skipped"], [])
        self.assertEqual(self.value(b, "keep"), "[1, 2]")
        self.assertEqual(b.run("f").error["name"], "NameError")

    def test_a_name_that_fails_to_load_is_skipped_and_the_rest_restored(self):
        a = self.kernel()
        # A class from a module that the restoring session cannot import.
        with open(os.path.join(a.workdir, "mymod.py"), "w") as f:
            f.write("class Thing:\n    pass\n")
        self.run_ok(a, "import mymod\nthing = mymod.Thing()\nother = 5")
        report = self.snapshot(a)
        self.assertEqual(report["skipped"], [])
        b = self.kernel()  # its workspace has no mymod.py
        restored = self.restore(b)
        skipped = self.skipped(restored)
        self.assertEqual(set(skipped), {"mymod", "thing"}, restored)
        self.assertIn("ModuleNotFoundError", skipped["mymod"])
        self.assertEqual(restored["names"], ["other"])
        self.assertEqual(self.value(b, "other"), "5")

    def test_interrupt_style_failures_leave_no_file_and_an_error(self):
        a = self.kernel()
        self.run_ok(a, "x = 1")
        outcome = self.request(a, "snapshot", os.path.join(self.dir, "no-such-dir", "s.snap"))
        self.assertEqual(outcome.status, "error")
        self.assertEqual(outcome.error["name"], "SnapshotError")
        self.assertIn("FileNotFoundError", outcome.error["value"])
        outcome = self.request(a, "snapshot", "")
        self.assertEqual(outcome.error["name"], "ProtocolError")
        # The kernel goes on.
        self.assertEqual(self.value(a, "x"), "1")


class Refusals(Kernels):
    """A damaged, truncated, foreign or incompatible file is refused before any unpickling:
    the snapshot holds an object whose unpickling prints, and a refusal prints nothing."""

    MARKER_CELL = (
        "class Marker:\n    def __reduce__(self):\n        return (print, ('UNPICKLED',))\n"
        "marker = Marker()\nfiller = list(range(1000))"
    )

    def setUp(self):
        super().setUp()
        a = self.kernel()
        self.run_ok(a, self.MARKER_CELL)
        report = self.snapshot(a)
        self.assertIn("marker", report["names"])
        with open(self.path, "rb") as f:
            self.good = f.read()

    def write(self, data, name="bad.snap"):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def assert_refused(self, data, reason, **fields):
        k = self.kernel()
        refusal, outcome = self.refusal(k, self.write(data))
        self.assertEqual(refusal["reason"], reason, refusal)
        for key, value in fields.items():
            self.assertEqual(refusal[key], value, refusal)
        self.assertNotIn("UNPICKLED", outcome.stdout)
        self.assertEqual(k.run("marker").error["name"], "NameError")
        return refusal

    def test_the_intact_file_does_unpickle(self):
        # The positive control: the marker prints when the file is accepted.
        k = self.kernel()
        outcome = self.request(k, "restore", self.write(self.good))
        self.assertEqual(outcome.status, "ok", outcome.messages)
        self.assertIn("UNPICKLED", outcome.stdout)

    def test_truncated_files_are_refused(self):
        for cut in (len(self.good) - 1, len(self.good) // 2, 40, 20, 3):
            with self.subTest(cut=cut):
                self.assert_refused(self.good[:cut], "truncated")

    def test_a_flipped_byte_anywhere_after_the_prefix_is_refused_as_corrupt(self):
        for at in (33, 40, len(self.good) // 2, len(self.good) - 1):
            with self.subTest(at=at):
                data = bytearray(self.good)
                data[at] ^= 0x01
                refusal = self.assert_refused(bytes(data), "corrupt")
                self.assertTrue(refusal["message"], refusal)

    def test_a_flipped_checksum_or_length_is_refused(self):
        data = bytearray(self.good)
        data[31] ^= 0x80  # the crc
        self.assert_refused(bytes(data), "corrupt")
        # The body length (bytes 20-27) one more than there is, and one less.
        length = struct.unpack(">Q", self.good[20:28])[0]
        for delta, reason in ((1, "truncated"), (-1, "corrupt")):
            data = bytearray(self.good)
            data[20:28] = struct.pack(">Q", length + delta)
            self.assert_refused(bytes(data), reason)
        self.assert_refused(self.good + b"\0", "corrupt")

    def test_foreign_and_empty_files_are_refused(self):
        self.assert_refused(b"", "corrupt")
        self.assert_refused(b"\x80\x05K\x01.", "corrupt")  # a bare pickle is never loaded
        self.assert_refused(b"PK\x03\x04" + bytes(100), "corrupt")
        os.mkdir(os.path.join(self.dir, "a-directory"))
        refusal, _ = self.refusal(self.kernel(), os.path.join(self.dir, "a-directory"))
        self.assertEqual(refusal["reason"], "corrupt")

    def test_a_missing_file_is_refused_as_missing(self):
        refusal, _ = self.refusal(self.kernel(), os.path.join(self.dir, "absent.snap"))
        self.assertEqual(refusal["reason"], "missing")

    def test_another_format_version_is_incompatible(self):
        data = bytearray(self.good)
        data[16:20] = struct.pack(">I", snap.FORMAT_VERSION + 1)
        self.assert_refused(
            bytes(data),
            "incompatible",
            field="format_version",
            found=str(snap.FORMAT_VERSION + 1),
            expected=str(snap.FORMAT_VERSION),
        )

    def rewritten(self, **changes):
        """The good snapshot with header fields changed and a valid checksum: only the
        compatibility checks can refuse it."""
        header, pieces = snap.read(self.write(self.good, "good.snap"))
        header.update(changes)
        path = os.path.join(self.dir, "rewritten.snap")
        snap.write(path, header, [p for entry in pieces for p in entry])
        with open(path, "rb") as f:
            return f.read()

    def test_another_language_interpreter_or_serializer_is_incompatible(self):
        header, _ = snap.read(self.write(self.good, "good.snap"))
        self.assertEqual(header["language"], "python")
        cases = [
            ("language", "bash"),
            ("language_version", "2.7.18"),
            ("serializer", "dill"),
            ("serializer_version", "0.0.1"),
        ]
        for field, found in cases:
            with self.subTest(field=field):
                self.assert_refused(
                    self.rewritten(**{field: found}), "incompatible", field=field, found=found, expected=header[field]
                )

    def test_another_patch_release_of_the_interpreter_is_compatible(self):
        header, _ = snap.read(self.write(self.good, "good.snap"))
        major, minor, _ = header["language_version"].split(".")
        k = self.kernel()
        outcome = self.request(k, "restore", self.write(self.rewritten(language_version=f"{major}.{minor}.999")))
        self.assertEqual(outcome.status, "ok", outcome.messages)


@unittest.skipUnless(HAS_CLOUDPICKLE, "cloudpickle is not installed")
class CloudpickleRoundTrip(Kernels):
    """Functions, lambdas, closures and classes defined in cells."""

    CELL = """
y = 3
def f(x):
    return x + y
g = lambda x: f(x) * 2
def outer():
    k = 10
    def inner():
        return k + y
    return inner
h = outer()
class Point:
    def __init__(self, x):
        self.x = x
    def double(self):
        return Point(self.x * 2)
class Point3(Point):
    pass
p = Point(3)
pts = [Point(1), Point3(2)]
"""

    def test_functions_lambdas_closures_and_classes_round_trip(self):
        a = self.kernel()
        self.run_ok(a, self.CELL)
        report = self.snapshot(a)
        self.assertEqual(report["skipped"], [], report)
        b = self.kernel()
        restored = self.restore(b)
        self.assertEqual(restored["skipped"], [], restored)
        self.assertEqual(self.value(b, "(f(1), g(1), h(), p.x, p.double().x)"), "(4, 8, 13, 3, 6)")
        # Instances are of the restored classes, not of copies of them.
        self.assertEqual(
            self.value(b, "(type(p) is Point, isinstance(pts[1], Point), type(pts[1]) is Point3, Point3.__mro__[1] is Point)"),
            "(True, True, True, True)",
        )
        # Functions read the session's namespace, as before the pause: a later change shows.
        self.run_ok(b, "y = 100")
        self.assertEqual(self.value(b, "(f(1), g(1), h())"), "(101, 202, 110)")
        self.run_ok(b, "def f(x):\n    return -x")
        self.assertEqual(self.value(b, "g(1)"), "-2")
        self.assertEqual(self.value(b, "f.__module__, Point.__module__"), "('__main__', '__main__')")

    def test_a_snapshot_of_a_restored_session_round_trips_again(self):
        a = self.kernel()
        self.run_ok(a, self.CELL)
        self.snapshot(a)
        b = self.kernel()
        self.restore(b)
        self.run_ok(b, "y = 7")
        second = os.path.join(self.dir, "second.snap")
        outcome = self.request(b, "snapshot", second)
        self.assertEqual(outcome.status, "ok", outcome.messages)
        c = self.kernel()
        self.restore(c, second)
        self.assertEqual(self.value(c, "(f(1), h(), type(p.double()) is Point)"), "(8, 17, True)")


@unittest.skipUnless(
    HAS_CLOUDPICKLE and has_module("pandas") and has_module("sklearn"), "cloudpickle, pandas or scikit-learn is missing"
)
class DataScienceRoundTrip(Kernels):
    CELL = """
import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.ensemble import RandomForestClassifier
rng = np.random.default_rng(0)
df = pd.DataFrame({"a": rng.normal(size=1000), "b": rng.integers(0, 5, 1000), "c": ["x", "y"] * 500})
arr = np.arange(12.0).reshape(3, 4)
view_t = arr.T
X = df[["a", "b"]].to_numpy()
target = (df["a"] > 0).astype(int)
model = LogisticRegression().fit(X, target)
forest = RandomForestClassifier(n_estimators=5, random_state=0).fit(X, target)
same_df = df
big = np.arange(300_000.0)  # 2.4 MB: over POPULATE_FROM, read into a mapping of its own
"""

    def test_dataframes_arrays_and_fitted_models_round_trip(self):
        a = self.kernel()
        self.run_ok(a, self.CELL)
        expected = self.value(
            a, "(df.shape, float(df['a'].sum()), arr.tolist(), model.predict(X[:20]).tolist(), forest.predict(X[:20]).tolist())"
        )
        report = self.snapshot(a)
        self.assertEqual(report["skipped"], [], report)
        self.assertIn("np", report["names"])
        b = self.kernel()
        restored = self.restore(b)
        self.assertEqual(restored["skipped"], [], restored)
        got = self.value(
            b, "(df.shape, float(df['a'].sum()), arr.tolist(), model.predict(X[:20]).tolist(), forest.predict(X[:20]).tolist())"
        )
        self.assertEqual(got, expected)
        self.assertEqual(self.value(b, "(np.__name__, pd.__name__, same_df is df, view_t.shape)"), "('numpy', 'pandas', True, (4, 3))")
        # Restored arrays own writable memory.
        self.run_ok(b, "arr[0, 0] = 99.0\ndf.loc[0, 'a'] = 5.0\nbig[-1] = -1.0")
        self.assertEqual(
            self.value(b, "float(arr[0, 0]), float(df.loc[0, 'a']), float(big.sum()), big.flags.writeable"),
            f"(99.0, 5.0, {float(sum(range(299_999))) - 1.0}, True)",
        )


class FormatTests(unittest.TestCase):
    def test_write_is_atomic_and_leaves_no_temporary_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.snap")
            with open(path, "wb") as f:
                f.write(b"old")
            header = {"language": "python", "entries": [{"name": "x", "kind": "pickle", "sizes": [3, 2]}]}
            size = snap.write(path, header, [b"abc", memoryview(b"de")])
            self.assertEqual(os.listdir(d), ["s.snap"])
            self.assertEqual(size, os.path.getsize(path))
            got, pieces = snap.read(path)
            self.assertEqual(got, header)
            self.assertEqual(pieces, [[bytearray(b"abc"), bytearray(b"de")]])
            with open(path, "rb") as f:
                data = f.read()
            magic, version, length, crc = snap.PREFIX.unpack(data[: snap.PREFIX.size])
            self.assertEqual((magic, version, length), (snap.MAGIC, 1, len(data) - snap.PREFIX.size))
            self.assertEqual(crc, zlib.crc32(data[snap.PREFIX.size :]))
            self.assertEqual(json.loads(data[36 : 36 + struct.unpack(">I", data[32:36])[0]]), header)

    def test_a_failed_write_keeps_the_old_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.snap")
            with open(path, "wb") as f:
                f.write(b"old")

            with self.assertRaises(TypeError):
                snap.write(path, {"entries": []}, [object()])
            self.assertEqual(os.listdir(d), ["s.snap"])
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"old")

    def test_report_lists_are_bounded(self):
        names = [f"n{i}" for i in range(snap.MAX_REPORT_NAMES + 10)]
        kept, skipped, omitted = snap.report_lists(names, [snap.skip("s", "r" * 1000)])
        self.assertEqual((len(kept), skipped, omitted), (snap.MAX_REPORT_NAMES, [], 11))
        self.assertLessEqual(len(snap.skip("s", "r" * 1000)["reason"]), snap.MAX_REASON + 1)


if __name__ == "__main__":
    unittest.main()
