"""runcell's language-state snapshots (issue 17, durable sessions), inside the sandbox.

Two parts:

* The file format, shared by the Python and bash kernels. The host only stores a snapshot's
  bytes and hands them back: pickles are code, so everything that reads one runs here.
* The Python kernel's serializer for its namespace (cloudpickle, one pickle per name).

The file, format 1 (integers big-endian)::

    magic          16 bytes  MAGIC
    format         u32       FORMAT_VERSION
    body length    u64       bytes after this 32-byte prefix
    body crc32     u32       zlib.crc32 of the body
    body:
      header length  u32
      header         UTF-8 JSON: language, language_version, serializer,
                     serializer_version, entries [{name, kind, sizes, ...}]
      pieces         the entries' pieces, in order, each as long as its `sizes` says

The format version sits before anything else so a later layout is refused as incompatible
rather than misread; the length and the checksum are checked before the header is trusted
and before anything is unpickled, so a truncated or damaged file is refused and never
half-loaded. crc32 and not a cryptographic hash: it guards against damage, not an attacker
(whoever can write the file can already run code in the sandbox), and takes half of
sha256's time on the 10 MB a DataFrame-sized snapshot holds.

Stdlib only; cloudpickle is used when the runtime has it. Imports beyond what the kernels
already hold are made on first use, so a kernel that never snapshots pays nothing.
"""

import json
import os
import struct
import sys
import time
import types

MAGIC = b"\x93RUNCELL-SNAP\r\n\x1a"  # \r\n and \x1a catch text-mode mangling, as PNG's do
FORMAT_VERSION = 1
PREFIX = struct.Struct(">16sIQI")
HEADER_LENGTH = struct.Struct(">I")
MAX_HEADER = 64 * 1024 * 1024
# Names a report lists at most (runcell-protocol's MAX_REPORT_NAMES).
MAX_REPORT_NAMES = 4096
MAX_REASON = 300  # characters of one skip reason


class Refused(Exception):
    """A snapshot file that cannot be restored; nothing in it was unpickled."""

    def __init__(self, reason, message="", field=None, found=None, expected=None):
        super().__init__(message or f"{field}: {found!r} is not {expected!r}")
        self.reason = reason  # missing | truncated | corrupt | incompatible
        self.message = message
        self.field = field
        self.found = found
        self.expected = expected

    def refusal(self):
        """The `refusal` object of a snapshot_refused message."""
        if self.reason == "incompatible":
            return {"reason": "incompatible", "field": self.field, "found": str(self.found), "expected": str(self.expected)}
        return {"reason": self.reason, "message": self.message}


class Incompatible(Refused):
    def __init__(self, field, found, expected):
        super().__init__("incompatible", field=field, found=found, expected=expected)


# --------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------


def write(path, header, pieces):
    """Write a snapshot atomically: a temporary file beside `path`, renamed over it once
    complete, so a reader sees the old file or the new one, never half of one. Returns its
    size. `pieces` are bytes-like objects (memoryviews of live arrays are not copied).

    No fsync: the host copies the file out of the sandbox when it keeps it, and that copy is
    what has to be durable; a sync here would only add a disk flush to every pause."""
    import zlib

    header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    head = HEADER_LENGTH.pack(len(header_bytes)) + header_bytes
    crc = zlib.crc32(head)
    length = len(head)
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
        length += memoryview(piece).nbytes
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb", buffering=0, closefd=True) as f:
            _write_all(f, PREFIX.pack(MAGIC, FORMAT_VERSION, length, crc) + head)
            for piece in pieces:
                _write_all(f, piece)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return PREFIX.size + length


def _write_all(f, data):
    view = memoryview(data).cast("B")
    while view:
        view = view[f.write(view) :]


# Pieces this big are read into memory mapped and populated in one system call rather than
# a bytearray: a bytearray's memset faults its pages in one by one, and a kernel forked from
# the zygote has none to reuse (10 MB: ~20 ms of page faults on a VM, ~8 ms populated).
POPULATE_FROM = 1 << 20


def _buffer(n):
    """A writable buffer of `n` bytes that the restored object may keep (an array's memory)."""
    if n < POPULATE_FROM:
        return bytearray(n)
    import mmap

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    try:
        return mmap.mmap(-1, n, flags=flags)
    except OSError:
        return bytearray(n)


def read(path):
    """(header, [[piece, ...] per entry]) of the snapshot at `path`, each piece a buffer of
    its own (so a restored array holds its own memory, not the whole file's). Refused when
    the file is missing, truncated, foreign, of another format or damaged; the header's
    fields are for the caller to check (see `check`)."""
    import zlib

    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise Refused("missing", f"{path} does not exist") from None
    except IsADirectoryError:
        raise Refused("corrupt", f"{path} is a directory, not a snapshot") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        prefix = _read_exact(f, PREFIX.size)
        if prefix is None or len(prefix) < PREFIX.size:
            got = prefix or b""
            if MAGIC.startswith(got[: len(MAGIC)]) and got:
                raise Refused("truncated", f"{size} bytes, shorter than the {PREFIX.size}-byte prefix")
            raise Refused("corrupt", f"not a runcell snapshot ({size} bytes)")
        magic, version, length, crc = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise Refused("corrupt", "not a runcell snapshot (its first bytes are not runcell's)")
        if version != FORMAT_VERSION:
            raise Incompatible("format_version", version, FORMAT_VERSION)
        if size < PREFIX.size + length:
            raise Refused("truncated", f"{size} bytes, the header says {PREFIX.size + length}")
        if size > PREFIX.size + length:
            raise Refused("corrupt", f"{size - PREFIX.size - length} bytes after the end the header gives")
        head = _read_exact(f, HEADER_LENGTH.size)
        (header_length,) = HEADER_LENGTH.unpack(head)
        if header_length > min(length - HEADER_LENGTH.size, MAX_HEADER):
            raise Refused("corrupt", f"header length {header_length} is out of bounds")
        header_bytes = _read_exact(f, header_length)
        crc_now = zlib.crc32(header_bytes, zlib.crc32(head))
        # JSON is data, not code: reading it before the checksum is safe, and it says how the
        # rest is cut into pieces. A damaged header shows up here or in the checksum below.
        try:
            header = json.loads(header_bytes.decode("utf-8", "surrogatepass"))
            entries = header["entries"]
            sizes = [[int(n) for n in entry["sizes"]] for entry in entries]
        except (ValueError, KeyError, TypeError) as exc:
            raise Refused("corrupt", f"the header is damaged ({type(exc).__name__})") from None
        left = length - HEADER_LENGTH.size - header_length
        if any(n < 0 for s in sizes for n in s) or sum(map(sum, sizes)) != left:
            raise Refused("corrupt", "the header's sizes do not add up to the file's length")
        pieces = []
        for entry_sizes in sizes:
            own = []
            for n in entry_sizes:
                buf = _buffer(n)
                if _readinto_exact(f, buf) != n:
                    raise Refused("truncated", "the file changed while it was read")
                crc_now = zlib.crc32(buf, crc_now)
                own.append(buf)
            pieces.append(own)
        if crc_now != crc:
            raise Refused("corrupt", "its checksum does not match its content")
    return header, pieces


def _readinto_exact(f, buf):
    view = memoryview(buf)
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _read_exact(f, n):
    data = bytearray()
    while len(data) < n:
        chunk = f.read(n - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data) if data else None


def check(header, field, expected, same=None):
    """Incompatible unless the header's `field` matches `expected` (by `same(found,
    expected)`, equality by default)."""
    found = header.get(field)
    if not (same(found, expected) if same else found == expected):
        raise Incompatible(field, found, expected)


def same_minor(found, expected):
    """Versions X.Y.Z that agree in X.Y (Python's bytecode and pickled code objects do)."""
    return isinstance(found, str) and found.split(".")[:2] == expected.split(".")[:2]


def same_major(found, expected):
    return isinstance(found, str) and found.split(".")[:1] == expected.split(".")[:1]


def report_lists(names, skipped):
    """names and skipped cut to MAX_REPORT_NAMES together, and how many were left out."""
    names = list(names)
    skipped = list(skipped)
    keep_names = names[:MAX_REPORT_NAMES]
    keep_skipped = skipped[: max(0, MAX_REPORT_NAMES - len(keep_names))]
    omitted = len(names) + len(skipped) - len(keep_names) - len(keep_skipped)
    return keep_names, keep_skipped, omitted


def skip(name, reason):
    reason = str(reason)
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON] + "…"
    return {"name": name, "reason": reason}


# --------------------------------------------------------------------------
# The Python namespace
# --------------------------------------------------------------------------

PICKLE_PROTOCOL = 5  # out-of-band buffers: arrays are written from their own memory


def serializer():
    """(name, version, module): cloudpickle when the runtime has it, which saves functions,
    lambdas and classes defined in cells; the stdlib's pickle otherwise, which cannot."""
    try:
        import cloudpickle
    except ImportError:
        import pickle

        return "pickle", "%d.%d" % sys.version_info[:2], pickle
    return "cloudpickle", cloudpickle.__version__, cloudpickle


def python_version():
    return "%d.%d.%d" % sys.version_info[:3]


def _file_types():
    import io

    return (io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)


_FILE_TYPES = ()  # set on first use (importing io here would cost every kernel's start)


class _NamespaceRef:
    """Stands for the session's namespace in a pickle: the globals of restored functions are
    the namespace they are restored into, not a copy of the values they saw (so a function
    sees a variable changed after the restore, as it would have before the pause)."""

    __slots__ = ()


def _pickler_class(base, by_value):
    """A Pickler over `base` (cloudpickle's or the stdlib's) that keeps the links between
    the session's names: an object that is the value of a name saved earlier is written as
    "that name's value", and functions defined in cells get the live namespace as globals."""

    class NamespacePickler(base):
        def __init__(self, file, module, earlier, buffers):
            super().__init__(file, protocol=PICKLE_PROTOCOL, buffer_callback=buffers.append)
            self.module = module
            self.namespace = module.__dict__
            self.earlier = earlier  # id(value) -> name, for the names saved so far
            self.ref = _NamespaceRef()
            self.current = None
            self.needs = set()

        def reducer_override(self, obj):
            if type(obj) is _NamespaceRef:
                return getattr, (self.module, "__dict__")
            if obj is self.module:
                import importlib

                return importlib.import_module, ("__main__",)
            if obj is not self.current:
                name = self.earlier.get(id(obj))
                # Classes and functions from a library are written by their import path;
                # only what would be written by value becomes a reference to its name.
                if name is not None and (
                    not isinstance(obj, (type, types.FunctionType)) or obj.__module__ == "__main__"
                ):
                    import operator

                    self.needs.add(name)
                    return operator.getitem, (self.ref, name)
            if isinstance(obj, _FILE_TYPES):
                import pickle

                # cloudpickle would save a file open for reading as a copy of its content,
                # which restores as something else than a file: files are the workspace's.
                name = getattr(obj, "name", None)
                what = f"an open file {name!r}" if isinstance(name, str) else "an open file"
                raise pickle.PicklingError(f"it holds {what}")
            if not by_value and isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
                import pickle

                raise pickle.PicklingError(
                    "functions and classes defined in cells need cloudpickle, which this runtime lacks"
                )
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

        # cloudpickle's hook for a function it writes by value (its code, globals, closure).
        def _dynamic_function_reduce(self, func):
            reduced = super()._dynamic_function_reduce(func)
            if func.__globals__ is not self.namespace:
                return reduced
            make, newargs, state, *rest = reduced
            newargs = (newargs[0], self.ref, *newargs[2:])
            state, slotstate = state
            # The values it reads are the namespace's own at restore time: saving copies of
            # them here would duplicate them and overwrite the restored ones.
            slotstate = dict(slotstate, __globals__={})
            return (make, newargs, (state, slotstate), *rest)

        def dump_entry(self, value):
            self.current = value
            self.needs = set()
            self.dump(value)

    return NamespacePickler


def _skip_reason(value, exc):
    """Why `value` cannot be saved: its kind when that says it (an open file, a socket...),
    the pickler's complaint otherwise."""
    import io
    import socket
    import threading

    kind = None
    if isinstance(value, io.IOBase):
        name = getattr(value, "name", None)
        kind = f"open file {name!r}" if isinstance(name, str) else "open file"
    elif isinstance(value, socket.socket):
        kind = "socket"
    elif isinstance(value, threading.Thread):
        kind = "thread"
    elif isinstance(value, types.GeneratorType):
        kind = "generator"
    elif isinstance(value, types.AsyncGeneratorType):
        kind = "async generator"
    elif isinstance(value, types.CoroutineType):
        kind = "coroutine"
    elif isinstance(value, (type(threading.Lock()), type(threading.RLock()))):
        kind = "lock"
    elif isinstance(value, types.FrameType):
        kind = "frame"
    return kind or f"cannot be saved ({type(exc).__name__}: {exc})"


def save_namespace(module, path, extra=None):
    """Write the session's namespace (`module.__dict__`) to `path`. Returns the snapshot
    message's fields (bytes, names, skipped, omitted, duration_us). KeyboardInterrupt (the
    host's interrupt) ends it with nothing written."""
    import io

    global _FILE_TYPES
    started = time.perf_counter()
    _FILE_TYPES = _FILE_TYPES or _file_types()
    ser_name, ser_version, ser = serializer()
    base = ser.Pickler
    Pickler = _pickler_class(base, by_value=ser_name == "cloudpickle")
    namespace = module.__dict__
    entries, pieces, names, skipped = [], [], [], []
    earlier = {}
    for name, value in list(namespace.items()):
        # The module's own attributes (__name__, __builtins__, ...) belong to the new session.
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            # By name: re-imported on restore, never pickled.
            module_name = getattr(value, "__name__", None)
            if isinstance(module_name, str) and sys.modules.get(module_name) is value:
                entries.append({"name": name, "kind": "module", "module": module_name, "sizes": []})
                names.append(name)
            else:
                skipped.append(skip(name, "module that cannot be imported by name"))
            continue
        alias_of = earlier.get(id(value))
        if alias_of is not None and not isinstance(value, (int, float, str, bytes, bool, type(None))):
            # `b = a`: b is a again after the restore, not a copy of it.
            entries.append({"name": name, "kind": "alias", "of": alias_of, "sizes": []})
            names.append(name)
            continue
        buf = io.BytesIO()
        buffers = []
        pickler = Pickler(buf, module, earlier, buffers)
        try:
            pickler.dump_entry(value)
            raw = [b.raw() for b in buffers]
        except Exception as exc:  # not BaseException: an interrupt ends the whole snapshot
            skipped.append(skip(name, _skip_reason(value, exc)))
            continue
        data = buf.getbuffer()
        entry_pieces = [data, *raw]
        entries.append(
            {
                "name": name,
                "kind": "pickle",
                "sizes": [memoryview(p).nbytes for p in entry_pieces],
                "needs": sorted(pickler.needs),
            }
        )
        pieces.extend(entry_pieces)
        names.append(name)
        # Only objects the pickler would otherwise write again by value.
        earlier.setdefault(id(value), name)
    header = {
        "language": "python",
        "language_version": python_version(),
        "serializer": ser_name,
        "serializer_version": ser_version,
        "pickle_protocol": PICKLE_PROTOCOL,
        "entries": entries,
    }
    if extra:
        header["kernel"] = extra
    size = write(path, header, pieces)
    names, skipped, omitted = report_lists(names, skipped)
    return {
        "bytes": size,
        "names": names,
        "skipped": skipped,
        "omitted": omitted,
        "duration_us": int((time.perf_counter() - started) * 1e6),
    }


def load_namespace(module, path):
    """Read the snapshot at `path` into `module.__dict__`. Returns (restored message's fields,
    the header's `kernel` extras). Refused (nothing unpickled) when the file is missing,
    damaged or from an incompatible runtime; a name that fails to load (a library class that
    is gone) is skipped with its reason, and so are the names that depend on it."""
    import importlib
    import pickle

    started = time.perf_counter()
    header, pieces = read(path)
    ser_name, ser_version, _ = serializer()
    check(header, "language", "python")
    check(header, "language_version", python_version(), same_minor)
    check(header, "serializer", ser_name)
    check(header, "serializer_version", ser_version)
    namespace = module.__dict__
    names, skipped = [], []
    failed = set()
    for entry, entry_pieces in zip(header["entries"], pieces):
        name = entry.get("name")
        kind = entry.get("kind")
        if not isinstance(name, str):
            continue
        try:
            if kind == "module":
                value = importlib.import_module(entry["module"])
            elif kind == "alias":
                of = entry.get("of")
                if of in failed or of not in namespace:
                    raise LookupError(f"it is {of}, which could not be restored")
                value = namespace[of]
            elif kind == "pickle":
                missing = [n for n in entry.get("needs", ()) if n in failed]
                if missing:
                    raise LookupError(f"it refers to {', '.join(missing)}, which could not be restored")
                data, *buffers = entry_pieces
                value = pickle.loads(data, buffers=buffers)
            else:
                raise ValueError(f"unknown entry kind {kind!r}")
        except Exception as exc:
            failed.add(name)
            skipped.append(skip(name, f"cannot be restored ({type(exc).__name__}: {exc})"))
            continue
        namespace[name] = value
        names.append(name)
    names, skipped, omitted = report_lists(names, skipped)
    return (
        {
            "names": names,
            "skipped": skipped,
            "omitted": omitted,
            "duration_us": int((time.perf_counter() - started) * 1e6),
        },
        header.get("kernel") or {},
    )
