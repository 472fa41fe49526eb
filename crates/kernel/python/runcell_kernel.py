#!/usr/bin/env python3
"""runcell's in-sandbox Python kernel.

Runs code cells in one persistent namespace, Jupyter style, and reports on a
framed-JSON channel to the host:

* fd 3: the protocol channel (bidirectional Unix stream socket). Each frame is a
  4-byte big-endian length followed by one UTF-8 JSON object (at most 64 MiB;
  displays, results and errors at most MAX_RESULT, which is all the host keeps).
* fds 1 and 2: the user's stdout and stderr, read raw by the host. Nothing the
  user prints ever travels on fd 3.

Stdlib only. numpy, pandas and matplotlib are used when the user has imported
them and never imported here, so start-up stays cheap. Frames are made and
checked by runcell_wire.py, which the bash kernel shares and which ships beside
this file.

Start it as ``python3 runcell_kernel.py`` with the channel on fd 3.
"""

import ast
import base64
import builtins
import fcntl
import importlib.machinery
import io
import json
import linecache
import os
import select
import signal
import struct
import sys
import threading
import traceback
import types
import __future__

import runcell_wire
from runcell_wire import CHANNEL_FD, FrameTooLarge, ProtocolViolation

try:
    # Snapshots of the namespace (issue 17), beside this file; imported now, while sys.path[0]
    # is still this file's directory (prepare_process points it at the workspace), and in the
    # zygote with the kernel, so forked sessions have it preloaded.
    import runcell_snapshot
except ImportError as _exc:  # a kernel copied without it still runs cells
    runcell_snapshot = None
    _snapshot_import_error = _exc

try:
    # Tools called from the cell (issue 22), beside this file like runcell_snapshot.
    import runcell_tools
except ImportError:  # a kernel copied without it still runs cells (tool calls are refused)
    runcell_tools = None

try:
    # Chart data of matplotlib figures (issue 24), beside this file like runcell_snapshot.
    import runcell_charts
except ImportError:  # figures still come back as PNGs
    runcell_charts = None

try:
    # The C functions behind `signal`: its Python wrappers convert every argument and result
    # to enums, which cost more than the system calls themselves on the per-cell path.
    import _signal as _sig
except ImportError:  # not CPython
    _sig = signal

try:
    # glibc's malloc_trim, called between cells (see _release_free_memory). Imported with the
    # kernel, so in the zygote: a forked session finds it loaded.
    import ctypes as _ctypes

    _malloc_trim = _ctypes.CDLL(None).malloc_trim
    _malloc_trim.argtypes = (_ctypes.c_size_t,)
except (ImportError, OSError, AttributeError):  # not glibc: nothing to trim
    _malloc_trim = None

SIGINT = int(signal.SIGINT)
SIGINT_SET = (SIGINT,)

# What one cell's displays and results may take, as frames (the host enforces the same
# limits, crates/kernel/src/process.rs; checking here first saves sending what it drops).
MAX_RESULT = 8 * 1024 * 1024  # bytes per display, result or error frame
MAX_RESULTS = 64  # displays and results per cell
MAX_RESULTS_BYTES = 16 * 1024 * 1024  # bytes of them per cell
MAX_TEXT = 1024 * 1024  # characters per text MIME string
MAX_IMAGE = 16 * 1024 * 1024  # characters per base64 image string
# Ints up to this many digits are shown in full; str() of an int is quadratic in
# 3.11 (about 0.1 s for 100k digits, 13 s for a million), so bigger ones are summarised.
MAX_INT_DIGITS = 200_000
PRETTY_WIDTH = 79
CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect
FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag
del _feature


def _code_filename():
    return _code_filename.__code__.co_filename


# Frames from this file and the framing module are hidden from user tracebacks.
KERNEL_FILES = frozenset(
    (_code_filename(), runcell_wire.encode.__code__.co_filename)
    + ((runcell_tools._call.__code__.co_filename,) if runcell_tools is not None else ())
)


def _warn(message):
    """A one-line note for the user on stderr; never raises."""
    try:
        sys.stderr.write(f"runcell: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _flush_std():
    """Push buffered Python-level output into fds 1 and 2 before telling the host anything."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


# --------------------------------------------------------------------------
# Signals: KeyboardInterrupt only while user code runs
# --------------------------------------------------------------------------


# Whether a SIGINT raises KeyboardInterrupt now: only while user code runs (see guarded).
_interruptible = False


def _on_sigint(signum, frame):
    """SIGINT's handler for the kernel's whole life: KeyboardInterrupt while user code runs,
    nothing otherwise (the host's interrupts are for running cells; one that arrives after
    the cell's code has finished is dropped). A flag instead of switching the disposition
    between the default handler and SIG_IGN around every cell saves four system calls a cell."""
    if _interruptible:
        raise KeyboardInterrupt


def _own_sigint():
    """Take SIGINT back from a handler the user's code installed (no system call when it
    is still ours: Python keeps the handler table itself)."""
    if _sig.getsignal(SIGINT) is not _on_sigint:
        _sig.signal(SIGINT, _on_sigint)


def _allow_interrupts():
    global _interruptible
    _own_sigint()
    # Unblocked while still not interruptible: a SIGINT left pending by a mask the user's
    # code set in an earlier cell is delivered, and dropped, here rather than in this cell.
    _sig.pthread_sigmask(_sig.SIG_UNBLOCK, SIGINT_SET)
    _interruptible = True


def _ignore_interrupts():
    """No KeyboardInterrupt from here on: SIGINT is dropped until the next user code.

    A KeyboardInterrupt that surfaces before this returns came after the user's code had
    finished; callers treat it like any interrupt of the cell."""
    global _interruptible
    _interruptible = False
    _own_sigint()


def _block_sigint():
    """Block SIGINT in this thread and return the previous mask.

    pthread_sigmask() runs pending Python signal handlers after changing the
    mask, so a KeyboardInterrupt can come out of it with SIGINT already
    blocked: undo the block then, or interrupts would stop working.
    """
    try:
        return _sig.pthread_sigmask(_sig.SIG_BLOCK, SIGINT_SET)
    except KeyboardInterrupt:
        _sig.pthread_sigmask(_sig.SIG_UNBLOCK, SIGINT_SET)
        raise


# --------------------------------------------------------------------------
# The protocol channel
# --------------------------------------------------------------------------


class ChannelClosed(BaseException):
    """The host went away. A BaseException so user `except Exception` can't swallow it."""

    def __init__(self, exit_code=0):
        super().__init__(exit_code)
        self.exit_code = exit_code


class Channel:
    """Length-prefixed JSON frames over a file descriptor."""

    # Reads ask for this much at once, so a whole small frame (header and body) usually
    # takes one system call; what belongs to the next frame waits in the buffer.
    READ_SIZE = 64 * 1024

    def __init__(self, fd):
        self.fd = fd
        self._write_lock = threading.Lock()
        self._buffer = bytearray()
        # Reads wait in poll(), not in read(): a read blocked on a Unix stream socket is woken
        # by every wake-up of the socket, including the host taking our last reply off it
        # (which frees send space), and goes back to sleep; poll() is woken only for input.
        # That spurious wake-up is a context switch per cell.
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def recv(self):
        """The next message, or None on a clean EOF between frames."""
        return runcell_wire.read_message(self._read_exact)

    def _read_exact(self, size):
        buf = self._buffer
        while len(buf) < size:
            try:
                self._poll.poll()
                chunk = os.read(self.fd, max(size - len(buf), self.READ_SIZE))
            except ConnectionResetError:
                chunk = b""
            except OSError as exc:
                _warn(f"protocol channel unreadable: {exc}")
                raise ChannelClosed(1) from None
            if not chunk:
                if not buf:
                    return None
                raise ProtocolViolation("channel closed in the middle of a frame")
            buf += chunk
        data = bytes(buf[:size])
        del buf[:size]
        return data

    encode = staticmethod(runcell_wire.encode)

    def send(self, message):
        self.send_frames(self.encode(message))

    def send_frames(self, data, interruptible=True):
        """Writes whole frames (one or several, already encoded) in one go.

        interruptible=False: the caller knows SIGINT is ignored now (between cells), so no
        KeyboardInterrupt can cut the write and the two mask changes are skipped."""
        if not interruptible:
            with self._write_lock:
                self._write_all(data)
            return
        # An interrupt between two writes would leave half a frame on the channel
        # and desynchronise the host, so SIGINT waits until the frame is out.
        previous_mask = _block_sigint()
        try:
            with self._write_lock:
                self._write_all(data)
        finally:
            _sig.pthread_sigmask(_sig.SIG_SETMASK, previous_mask)

    def _write_all(self, data):
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except (BrokenPipeError, ConnectionResetError):
                raise ChannelClosed(0) from None
            except OSError as exc:
                _warn(f"protocol channel unwritable: {exc}")
                raise ChannelClosed(1) from None
            view = view[written:]


# --------------------------------------------------------------------------
# Rich display: MIME bundles for any object
# --------------------------------------------------------------------------

# The IPython display protocol: method name per MIME type.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/pdf", "_repr_pdf_"),
)
PRETTY_TYPES = (dict, list, tuple, set, frozenset)
# Builtin types have no _repr_*_ methods (their attributes cannot be added) and no library
# representation: their bundle is text/plain alone. The scalars' repr runs no user code.
SCALAR_TYPES = frozenset((int, float, complex, bool, str, bytes))
PLAIN_TYPES = SCALAR_TYPES | frozenset((bytearray, range, *PRETTY_TYPES))


def mime_bundle(obj):
    """{mime: str} for obj. Never raises for a misbehaving object: text/plain always comes back."""
    if type(obj) in PLAIN_TYPES:
        return {"text/plain": plain_text(obj)}
    data = {}
    if not isinstance(obj, type):  # a class's _repr_*_ are unbound methods, not its display
        data.update(_repr_mimebundle(obj))
        for mime, method in REPR_METHODS:
            if mime not in data:
                value = _call_repr_method(obj, method)
                if value is not None:
                    data[mime] = value
        for mime, value in _library_reprs(obj).items():
            data.setdefault(mime, value)
    bundle = normalise_bundle(data)
    if "text/plain" not in bundle:
        bundle["text/plain"] = plain_text(obj)
    return bundle


def _repr_mimebundle(obj):
    bundle = _call_repr_method(obj, "_repr_mimebundle_", include=None, exclude=None)
    return bundle if isinstance(bundle, dict) else {}


def _call_repr_method(obj, name, **kwargs):
    try:
        method = getattr(obj, name, None)
    except Exception:
        return None
    if not callable(method):
        return None
    try:
        value = method(**kwargs)
    except Exception as exc:
        _warn(f"{type(obj).__name__}.{name}() failed: {type(exc).__name__}: {exc}")
        return None
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]  # IPython allows (data, metadata)
    return value


def _library_reprs(obj):
    """Representations IPython registers for libraries that lack the _repr_*_ methods."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(obj, pandas.Series):
        html = _call_repr_method(obj.to_frame(), "_repr_html_")
        return {"text/html": html} if html is not None else {}
    figure_module = sys.modules.get("matplotlib.figure")
    if figure_module is not None and isinstance(obj, figure_module.Figure):
        try:
            png = figure_png(obj)
        except Exception as exc:
            _warn(f"could not render the figure: {type(exc).__name__}: {exc}")
            return {}
        if png is None:
            return {}
        # After the PNG: drawing it settles tick labels. The host moves the chart out of the
        # bundle into the result's `chart`.
        try:
            chart = runcell_charts.figure_chart(obj) if runcell_charts is not None else None
        except Exception:
            chart = None  # never a failed cell over its chart data
        return {"image/png": png, runcell_charts.CHART_MIME: chart} if chart else {"image/png": png}
    return {}


def figure_png(fig):
    """PNG bytes of a matplotlib figure, or None for an empty one (as IPython does)."""
    if not (fig.axes or fig.lines or fig.images or fig.texts or fig.patches or fig.artists):
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def normalise_bundle(data):
    """Every value becomes a bounded str: base64 for binary data, JSON text for JSON types."""
    bundle = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            continue
        text = _mime_string(mime, value)
        if text is None:
            continue
        limit = MAX_IMAGE if _is_binary_mime(mime) else MAX_TEXT
        if len(text) > limit:
            if mime != "text/plain":
                _warn(f"{mime} output of {len(text)} characters dropped (limit {limit})")
                continue
            text = _truncate(text, limit)
        bundle[mime] = text
    return bundle


def _is_binary_mime(mime):
    if mime.startswith("image/"):
        return mime != "image/svg+xml"
    return mime in ("application/pdf", "application/octet-stream")


def _is_json_mime(mime):
    return mime == "application/json" or mime.endswith("+json")


def _mime_string(mime, value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        if _is_binary_mime(mime):
            return base64.b64encode(value).decode("ascii")
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if _is_json_mime(mime):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            _warn(f"{mime} output is not valid JSON: {exc}")
    return None


def _truncate(text, limit):
    return text[:limit] + f"\n… [truncated: {len(text) - limit} more characters]"


def plain_text(obj):
    """repr(obj), pretty-printed for long builtin containers, bounded in size."""
    if type(obj) is int:
        text = _int_text(obj)
    else:
        try:
            text = _repr_allowing_big_ints(obj)
        except Exception as exc:
            _warn(f"repr() of {type(obj).__name__} failed: {type(exc).__name__}: {exc}")
            text = object.__repr__(obj)
        if len(text) > PRETTY_WIDTH and isinstance(obj, PRETTY_TYPES) and len(text) < 100_000:
            text = _pretty(obj, text)
    if len(text) > MAX_TEXT:
        text = _truncate(text, MAX_TEXT)
    return text


def _int_text(value):
    digits = int(abs(value).bit_length() * 0.30103) + 1
    if digits > MAX_INT_DIGITS:
        return f"<int with about {digits} decimal digits: too long to show>"
    return _repr_allowing_big_ints(value)


def _repr_allowing_big_ints(obj):
    """repr() with Python's 4300-digit int->str guard raised: results are for showing, not parsing."""
    previous = sys.get_int_max_str_digits()
    if previous == 0 or previous >= MAX_INT_DIGITS:
        return repr(obj)
    sys.set_int_max_str_digits(MAX_INT_DIGITS)
    try:
        return repr(obj)
    finally:
        sys.set_int_max_str_digits(previous)


def _pretty(obj, fallback):
    import pprint

    try:
        return pprint.pformat(obj, width=PRETTY_WIDTH, sort_dicts=False)
    except Exception:
        return fallback


# --------------------------------------------------------------------------
# Tracebacks that show the user's code and never the kernel's
# --------------------------------------------------------------------------


def register_source(filename, source):
    """Make a cell's lines available to tracebacks, inspect and warnings.

    mtime None keeps linecache.checkcache() from evicting the entry.
    """
    lines = source_lines(source)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)


def source_lines(source):
    """Lines as Python's tokenizer counts them (\\n, \\r\\n, \\r), unlike str.splitlines,
    which also splits on form feeds and other separators and would shift line numbers."""
    return io.StringIO(source, newline=None).readlines()


def is_cell_filename(filename):
    return filename.startswith("<cell-")


def format_user_traceback(exc):
    """Python's own traceback text for exc, minus the kernel's frames.

    Frames before the first cell frame (the kernel, asyncio's loop) are dropped
    too; a SyntaxError then has no frames at all and prints like Python's.
    """
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    for node in _walk_tracebacks(te):
        node.stack = _user_frames(node.stack)
    return "".join(te.format())


def _walk_tracebacks(te):
    seen = set()
    pending = [te]
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        pending.extend([node.__cause__, node.__context__])
        pending.extend(getattr(node, "exceptions", None) or ())  # exception groups


def _user_frames(stack):
    frames = [frame for frame in stack if frame.filename not in KERNEL_FILES]
    for index, frame in enumerate(frames):
        if is_cell_filename(frame.filename):
            frames = frames[index:]
            break
    return traceback.StackSummary.from_list(frames)


def _exception_value(exc):
    if isinstance(exc, SystemExit):
        return str(exc.code)
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"


# --------------------------------------------------------------------------
# Import hooks
# --------------------------------------------------------------------------


class AfterImportHook:
    """Meta-path finder that calls callback(module) right after `name` is loaded.

    It lets the kernel patch matplotlib.pyplot.show the moment pyplot is
    imported, even mid-cell, without importing matplotlib itself.
    """

    def __init__(self, name, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


class _CallbackLoader:
    """Wraps a loader; everything but exec_module goes straight to it."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as exc:
            _warn(f"could not hook {module.__name__}: {type(exc).__name__}: {exc}")


class IPythonFallback:
    """Minimal `IPython.display` for notebook-style code when IPython is not installed.

    It sits last on sys.meta_path, so a real IPython always wins.
    """

    PACKAGES = {
        "IPython": True,
        "IPython.display": False,
        "IPython.core": True,
        "IPython.core.display": False,
    }

    def __init__(self, display):
        self.display = display

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=self.PACKAGES[fullname])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.display = self.display
        if module.__name__ == "IPython":
            module.get_ipython = lambda: None  # "not inside IPython": libraries fall back to plain mode
            # Libraries that find `IPython` imported read its version (matplotlib's first
            # figure does): one recent enough that they ask no more of it than get_ipython().
            module.version_info = (8, 24, 0, "")
            module.__version__ = "8.24.0"
        elif module.__name__.endswith(".display"):
            module.clear_output = lambda wait=False: None
            for cls in (HTML, Markdown, Latex, Math, SVG, JSON, Image):
                setattr(module, cls.__name__, cls)


class _DisplayObject:
    """Base of the fallback IPython.display classes: holds text data."""

    binary = False

    def __init__(self, data=None, url=None, filename=None, metadata=None, **_ignored):
        if filename is not None:
            data = self._read(filename)
        self.data = data
        self.url = url
        self.filename = filename

    def _read(self, filename):
        if self.binary:
            with open(filename, "rb") as f:
                return f.read()
        with open(filename, encoding="utf-8") as f:
            return f.read()

    def __repr__(self):
        return f"<IPython.core.display.{type(self).__name__} object>"


class HTML(_DisplayObject):
    def _repr_html_(self):
        return self.data


class Markdown(_DisplayObject):
    def _repr_markdown_(self):
        return self.data


class Latex(_DisplayObject):
    def _repr_latex_(self):
        return self.data


class Math(_DisplayObject):
    """A formula, as IPython writes it: display-style LaTeX between dollars."""

    def _repr_latex_(self):
        return f"$\\displaystyle {self.data.strip('$')}$"


class SVG(_DisplayObject):
    def _repr_svg_(self):
        return self.data.decode("utf-8") if isinstance(self.data, bytes) else self.data


class JSON(_DisplayObject):
    def __init__(self, data=None, url=None, filename=None, **kwargs):
        super().__init__(data, url, filename, **kwargs)
        if isinstance(self.data, str):
            self.data = json.loads(self.data)

    def _repr_json_(self):
        return self.data


class Image(_DisplayObject):
    binary = True

    def __init__(self, data=None, url=None, filename=None, format=None, **kwargs):
        if isinstance(data, str) and url is None and filename is None:
            if data.startswith(("http://", "https://")):
                data, url = None, data
            else:
                data, filename = None, data
        super().__init__(data, url, filename, **kwargs)
        self.format = (format or self._guess_format()).lower().replace("jpg", "jpeg")

    def _guess_format(self):
        if isinstance(self.data, bytes) and self.data[:2] == b"\xff\xd8":
            return "jpeg"
        name = (self.filename or self.url or "").lower()
        return "jpeg" if name.endswith((".jpg", ".jpeg")) else "png"

    def _repr_png_(self):
        return self.data if self.format == "png" else None

    def _repr_jpeg_(self):
        return self.data if self.format == "jpeg" else None

    def _repr_html_(self):
        if self.data is None and self.url:
            import html

            return f'<img src="{html.escape(self.url)}"/>'
        return None


for _cls in (HTML, Markdown, Latex, Math, SVG, JSON, Image):
    _cls.__module__ = "IPython.display"
del _cls


# --------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------


class CompiledCell:
    def __init__(self, body, last_expression, show_result):
        self.body = body  # code object for every statement but a trailing expression, or None
        self.last_expression = last_expression  # 'eval' code object, or None
        self.show_result = show_result  # False when the expression ends with ';'

    def is_async(self):
        codes = (self.body, self.last_expression)
        return any(code is not None and code.co_flags & CO_COROUTINE for code in codes)


class Kernel:
    def __init__(self, channel):
        self.channel = channel
        self.pid = os.getpid()
        self.execution_count = 0
        self.current_id = None
        self.error_sent = False
        self.reset_result_counts()
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = builtins
        self.namespace = self.module.__dict__
        self.future_flags = 0
        # The environment the session started with (the sandbox's and the session's `env`):
        # a snapshot carries what cells changed in os.environ since, not the whole of it.
        self.start_environ = dict(os.environ)
        self.loop = None  # asyncio loop for top-level await, created on first use
        self.displayed_figures = set()  # ids of figures already shown in this cell

    # ---- set-up ----

    def install(self):
        """Process-wide hooks: __main__, display(), matplotlib, IPython fallback."""
        # Kept alive on purpose: the kernel's functions use its globals.
        self.kernel_module = sys.modules.get("__main__")
        # Pickle and multiprocessing find cell-defined functions via sys.modules['__main__'].
        sys.modules["__main__"] = self.module
        builtins.display = self.display
        sys.meta_path.insert(0, AfterImportHook("matplotlib.pyplot", self.patch_pyplot))
        sys.meta_path.append(IPythonFallback(self.display))
        self.install_lazy_hooks()

    def install_lazy_hooks(self):
        """Catch up with modules imported before the import hook existed."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            self.patch_pyplot(pyplot)

    def patch_pyplot(self, pyplot):
        axes = sys.modules.get("matplotlib.axes")
        if runcell_charts is not None and axes is not None:
            runcell_charts.install(axes.Axes)  # box plots' statistics, for their chart data
        if getattr(pyplot.show, "_runcell", False):
            return
        kernel = self

        def show(*args, **kwargs):
            """Show every open figure in the cell's output, then close them (runcell)."""
            kernel.show_figures()

        show._runcell = True
        pyplot.show = show

    # ---- the main loop ----

    def serve(self):
        """Handle messages until EOF. Returns the process exit code."""
        self.pid = os.getpid()  # after a zygote fork this is the child
        try:
            self.send(
                {
                    "type": "ready",
                    "language": "python",
                    "version": "%d.%d.%d" % sys.version_info[:3],
                    "pid": self.pid,
                }
            )
            while True:
                try:
                    message = self.channel.recv()
                except ProtocolViolation as exc:
                    _warn(f"malformed frame on the protocol channel: {exc}")
                    return 3
                if message is None:
                    return 0
                self.dispatch(message)
        except ChannelClosed as closed:
            return closed.exit_code

    def dispatch(self, message):
        kind = message.get("type")
        try:
            if kind == "execute":
                self.handle_execute(message)
            elif kind in ("snapshot", "restore"):
                self.handle_snapshot(kind, message)
            elif kind == "tool_result":
                pass  # the answer to a call of a cell that has ended: nobody waits for it
            else:
                self.send_protocol_error(None, f"unknown message type {kind!r}")
        except ChannelClosed:
            raise
        except BaseException as exc:  # a kernel bug must not end the kernel
            _ignore_interrupts()
            _warn("kernel error:\n" + "".join(traceback.format_exception(exc)))
            try:
                self.send(self.kernel_error_message(None, exc))
            except Exception:
                pass  # already on stderr

    def handle_execute(self, message):
        msg_id, code = message.get("id"), message.get("code")
        if not isinstance(msg_id, str):
            self.send_protocol_error(None, "execute needs a string 'id'")
        elif not isinstance(code, str):
            self.send_protocol_error(msg_id, "execute needs a string 'code'")
            self.send(
                {"type": "done", "id": msg_id, "status": "error", "execution_count": self.execution_count}
            )
        else:
            self.execute(msg_id, code, message.get("ack") is True, message.get("tools"))

    # ---- snapshots (issue 17): the namespace to a file and back ----

    def handle_snapshot(self, kind, message):
        """`snapshot` or `restore` {id, path}: answered like a cell (its report or an error,
        then `done`) but outside the execution count. Pickling and unpickling run user code
        (__reduce__, __setstate__), so they run as a cell does: interruptible, output to the
        pipes, and a kernel bug never ends the kernel."""
        msg_id, path = message.get("id"), message.get("path")
        if not isinstance(msg_id, str):
            self.send_protocol_error(None, f"{kind} needs a string 'id'")
            return
        _restore_std_fds()
        self.current_id = msg_id
        self.error_sent = False
        self.reset_result_counts()
        try:
            if not isinstance(path, str) or not path:
                self.send_protocol_error(msg_id, f"{kind} needs a string 'path'")
                status = "error"
            elif runcell_snapshot is None:
                self.send_error("SnapshotError", f"snapshots are unavailable: {_snapshot_import_error}", "")
                status = "error"
            else:
                run = self.take_snapshot if kind == "snapshot" else self.restore_snapshot
                report, error = self.guarded(lambda: run(path))
                if error is None:
                    self.send(dict(report, type="snapshotted" if kind == "snapshot" else "restored", id=msg_id))
                    status = "ok"
                elif isinstance(error, runcell_snapshot.Refused):
                    self.send({"type": "snapshot_refused", "id": msg_id, "refusal": error.refusal()})
                    status = "error"
                elif isinstance(error, KeyboardInterrupt):
                    status = self.report_error(error)
                else:
                    text = "".join(traceback.format_exception(error))
                    self.send_error("SnapshotError", f"{type(error).__name__}: {_exception_value(error)}", text)
                    status = "error"
        except ChannelClosed:
            raise
        except BaseException as exc:  # a kernel bug, or an interrupt in kernel code
            _ignore_interrupts()
            status = self.report_kernel_failure(exc)
        finally:
            self.current_id = None
        _flush_std()
        self.send({"type": "done", "id": msg_id, "status": status, "execution_count": self.execution_count})
        # The pickler's buffers and memo (the idle snapshot taken 3 s after a cell) would
        # otherwise stay in the heap as the session's own pages: ~0.5 MiB after a pandas +
        # matplotlib cell (docs/benchmarks.md).
        _release_free_memory()

    def take_snapshot(self, path):
        # What the kernel itself carries from cell to cell and the namespace does not: the
        # `from __future__` flags, and the cells' changes to os.environ (os.environ["K"] = v,
        # del, putenv through os.environ): variables set or changed, and those removed.
        environ = dict(os.environ)
        changes = {
            "set": {k: v for k, v in environ.items() if self.start_environ.get(k) != v},
            "unset": sorted(k for k in self.start_environ if k not in environ),
        }
        extra = {"future_flags": self.future_flags, "environ": changes}
        report = runcell_snapshot.save_namespace(self.module, path, extra)
        if (changes["set"] or changes["unset"]) and len(report["names"]) < runcell_snapshot.MAX_REPORT_NAMES:
            report["names"] = [*report["names"], "os.environ"]
        return report

    def restore_snapshot(self, path):
        report, extra = runcell_snapshot.load_namespace(self.module, path)
        flags = extra.get("future_flags")
        if isinstance(flags, int):
            self.future_flags |= flags & FUTURE_FLAGS
        changes = extra.get("environ")
        if isinstance(changes, dict) and self.apply_environ(changes):
            if len(report["names"]) < runcell_snapshot.MAX_REPORT_NAMES:
                report["names"] = [*report["names"], "os.environ"]
        self.install_lazy_hooks()  # a restored figure or pyplot import gets the show() patch
        return report

    def apply_environ(self, changes):
        """Puts a snapshot's os.environ changes back; whether there were any. Strings only:
        the file is the session's own, but a damaged entry must not stop the restore."""
        applied = False
        for key, value in (changes.get("set") or {}).items():
            if isinstance(key, str) and isinstance(value, str) and key and "=" not in key and "\0" not in key + value:
                os.environ[key] = value
                applied = True
        for key in changes.get("unset") or ():
            if isinstance(key, str) and key in os.environ:
                del os.environ[key]
                applied = True
        return applied

    def send_protocol_error(self, msg_id, text):
        self.send({"type": "error", "id": msg_id, "name": "ProtocolError", "value": text, "traceback": ""})

    def send(self, message):
        if message.get("type") != "error":
            self.channel.send(message)
            return
        # An error must reach the host whole: a frame over the per-result limit is not read.
        try:
            frame = self.channel.encode(message, limit=MAX_RESULT)
        except FrameTooLarge:
            for key in ("value", "traceback"):
                text = message.get(key) or ""
                if len(text) > MAX_TEXT // 8:
                    message[key] = _truncate(text, MAX_TEXT // 8)
            frame = self.channel.encode(message)
        self.channel.send_frames(frame)

    def reset_result_counts(self):
        """Displays and results of the current cell: sent, and dropped over the limits."""
        self.results_sent = 0
        self.results_bytes = 0
        self.dropped_results = 0
        self.dropped_bytes = 0

    # ---- one cell ----

    def execute(self, msg_id, code, ack=False, tools=None):
        _restore_std_fds()
        if ack:
            # Output from here on is this cell's (the host holds what came before).
            # Between cells SIGINT is ignored: nothing can cut the write.
            started = f'{{"type": "started", "id": {_json_string(msg_id)}}}'
            self.channel.send_frames(self.channel.encode(None, started), interruptible=False)
        self.execution_count += 1
        self.current_id = msg_id
        self.error_sent = False
        self.reset_result_counts()
        result_frame = b""
        if runcell_tools is not None:
            runcell_tools._begin_cell(self.channel, msg_id, tools)
        try:
            status, result_frame = self.run_cell(code)
        except ChannelClosed:
            raise
        except BaseException as exc:  # kernel bug, or an interrupt landing in kernel code
            _ignore_interrupts()
            status = self.report_kernel_failure(exc)
        finally:
            self.current_id = None
            if runcell_tools is not None:
                # Before `done`: from here the main loop is the channel's only reader.
                runcell_tools._end_cell()
        _flush_std()
        # What json.dumps makes of this message, without its per-call set-up (a tenth of a
        # `1+1` cell's time); the test suite compares the two.
        dropped = (
            f', "dropped_results": {self.dropped_results}, "dropped_bytes": {self.dropped_bytes}'
            if self.dropped_results
            else ""
        )
        done = (
            f'{{"type": "done", "id": {_json_string(msg_id)}, "status": "{status}", '
            f'"execution_count": {self.execution_count}{dropped}}}'
        )
        # The main result and `done` leave in one write: one wake-up of the host, not two.
        # SIGINT is ignored here: run_cell and report_kernel_failure end with interrupts off.
        self.channel.send_frames(result_frame + self.channel.encode(None, done), interruptible=False)
        _release_free_memory()

    def run_cell(self, source):
        """Compile, run and report one cell; returns the done status and the main result's
        frame (b"" if none), which the caller sends together with `done`."""
        filename = f"<cell-{self.execution_count}>"
        register_source(filename, source)
        self.displayed_figures.clear()
        self.install_lazy_hooks()
        try:
            cell = self.compile_cell(source, filename)
        except Exception as exc:  # SyntaxError, or ValueError/RecursionError for odd sources
            return self.report_error(exc), b""

        value, error = self.guarded(lambda: self.run_code(cell))
        self.leave_if_forked(error)
        bundle = None
        if error is None and value is not None and cell.show_result:
            if type(value) in SCALAR_TYPES:
                # Their repr runs no user code and cannot be interrupted anyway: no need to
                # switch interrupts on and off (five system calls) around it.
                bundle = {"text/plain": plain_text(value)}
            else:
                bundle, error = self.guarded(lambda: self.result_bundle(value))
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and self.figures_open(pyplot):
            # Figures still open are part of the output even when the cell failed.
            skip = value if bundle is not None else None
            _, figure_error = self.guarded(lambda: self.show_figures(skip=skip))
            if error is None:
                error = figure_error
        self.install_lazy_hooks()

        if error is not None:
            return self.report_error(error), b""
        if bundle is not None:
            return "ok", self.encode_bundle("result", bundle)
        return "ok", b""

    @staticmethod
    def figures_open(pyplot):
        """Whether pyplot holds open figures (when it holds none, show_figures has nothing
        to show or close: the usual cell skips it)."""
        try:
            return bool(pyplot.get_fignums())
        except Exception:
            return True  # let show_figures run and report what is wrong

    def compile_cell(self, source, filename):
        """Split a trailing expression off so its value can be shown, as IPython does."""
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | self.future_flags
        if "\n" not in source.rstrip() and "\r" not in source:
            # A one-line cell is often a lone expression (`df.head()`, `1+1`): compiling it
            # as one takes a third of the time of the parse-split-compile below, and when it
            # is not one, the failed attempt costs a fraction of that path.
            try:
                expression = compile(source, filename, "eval", flags, dont_inherit=True)
            except Exception:
                pass
            else:
                cell = CompiledCell(None, expression, True)
                if cell.is_async():
                    self.prepare_loop()
                return cell
        tree = compile(source, filename, "exec", flags | ast.PyCF_ONLY_AST, dont_inherit=True)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        body = compile(tree, filename, "exec", flags, dont_inherit=True)
        # `from __future__ import annotations` in one cell holds for the later ones.
        self.future_flags |= body.co_flags & FUTURE_FLAGS
        cell = CompiledCell(body, None, False)
        if last is not None:
            expression = ast.Expression(body=last.value)
            cell.last_expression = compile(
                expression, filename, "eval", flags | self.future_flags, dont_inherit=True
            )
            cell.show_result = not _ends_with_semicolon(source, last)
        if cell.is_async():
            self.prepare_loop()
        return cell

    def prepare_loop(self):
        """Import asyncio and make the loop before the cell runs, while SIGINT is ignored:
        an interrupt landing inside `import asyncio` would leave it half-initialised."""
        import asyncio

        if self.loop is None or self.loop.is_closed():
            self.loop = asyncio.new_event_loop()

    def guarded(self, function):
        """Run function with KeyboardInterrupt enabled; returns (value, exception or None)."""
        try:
            try:
                _allow_interrupts()
                return function(), None
            finally:
                _ignore_interrupts()
        except ChannelClosed:
            raise
        except BaseException as exc:
            _ignore_interrupts()  # the interrupt may have come before the finally did its work
            return None, exc

    def run_code(self, cell):
        if cell.body is not None:
            self.run_code_object(cell.body)
        if cell.last_expression is None:
            return None
        return self.run_code_object(cell.last_expression)

    def run_code_object(self, code):
        if code.co_flags & CO_COROUTINE:  # top-level await: eval() returns a coroutine
            return self.run_coroutine(eval(code, self.namespace))
        return eval(code, self.namespace)

    def run_coroutine(self, coroutine):
        """Run top-level-await code on one persistent loop, so tasks outlive their cell."""
        import asyncio  # already imported by prepare_loop

        asyncio.set_event_loop(self.loop)  # asyncio.run() in an earlier cell may have unset it
        task = self.loop.create_task(coroutine)
        try:
            return self.loop.run_until_complete(task)
        finally:
            if not task.done():  # interrupted: the cell must not resume in a later one
                task.cancel()

    def leave_if_forked(self, error):
        """A child forked by user code (os.fork) must not go on to speak the protocol."""
        if os.getpid() == self.pid:
            return
        if error is not None and not isinstance(error, SystemExit):
            _warn("forked child failed:\n" + format_user_traceback(error))
        _flush_std()
        code = (
            error.code
            if isinstance(error, SystemExit) and isinstance(error.code, int)
            else int(error is not None)
        )
        os._exit(code)

    def result_bundle(self, value):
        bundle = mime_bundle(value)
        self.note_if_figure(value)
        return bundle

    # ---- reporting ----

    def report_error(self, exc):
        """Send the error message for exc; returns the done status."""
        try:
            text = format_user_traceback(exc)
        except Exception:
            text = "".join(traceback.format_exception_only(type(exc), exc))
        self.send_error(type(exc).__name__, _exception_value(exc), text)
        return "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"

    def report_kernel_failure(self, exc):
        if isinstance(exc, KeyboardInterrupt):
            if not self.error_sent:
                self.send_error("KeyboardInterrupt", "", "KeyboardInterrupt\n")
            return "interrupted"
        _warn("kernel error:\n" + "".join(traceback.format_exception(exc)))
        if not self.error_sent:
            self.send(self.kernel_error_message(self.current_id, exc))
            self.error_sent = True
        return "error"

    def kernel_error_message(self, msg_id, exc):
        text = "".join(traceback.format_exception(exc))
        return {
            "type": "error",
            "id": msg_id,
            "name": "KernelError",
            "value": f"{type(exc).__name__}: {_exception_value(exc)}",
            "traceback": _bounded(text),
        }

    def send_error(self, name, value, text):
        _flush_std()
        self.error_sent = True
        self.send(
            {
                "type": "error",
                "id": self.current_id,
                "name": name,
                "value": _bounded(value),
                "traceback": _bounded(text),
            }
        )

    # ---- display ----

    def display(self, *objs, raw=False, **_ignored):
        """Show objects in the cell's output (IPython's display(); extra keywords are ignored)."""
        for obj in objs:
            if raw and isinstance(obj, dict):
                bundle = normalise_bundle(obj)
                bundle.setdefault("text/plain", "")
            else:
                bundle = mime_bundle(obj)
                self.note_if_figure(obj)
            self.emit_display(bundle)

    def emit_display(self, bundle):
        if os.getpid() != self.pid or self.current_id is None:
            # A forked child, or a thread outside any cell: no channel to speak on.
            print(bundle.get("text/plain", ""))
            return
        _flush_std()  # output printed before the display reaches the host first
        self.send_bundle("display", bundle)

    def send_bundle(self, kind, bundle):
        """Send a display or result (see encode_bundle)."""
        frame = self.encode_bundle(kind, bundle)
        if frame:
            self.channel.send_frames(frame)

    def encode_bundle(self, kind, bundle):
        """The frame of a display or result; one over the per-result limit (JSON escaping can
        multiply the per-type caps) falls back to its text/plain. b"" when the cell's results
        are already at their limits: it is counted in `done` instead (the host notes it)."""
        try:
            frame = self.channel.encode(None, _bundle_json(kind, self.current_id, bundle), MAX_RESULT)
        except FrameTooLarge as exc:
            _warn(f"{kind} output dropped to text/plain: {exc}")
            text = bundle.get("text/plain", "")[: MAX_TEXT // 8]
            frame = self.channel.encode({"type": kind, "id": self.current_id, "data": {"text/plain": text}})
        size = len(frame) - 4
        if self.results_sent >= MAX_RESULTS or self.results_bytes + size > MAX_RESULTS_BYTES:
            self.dropped_results += 1
            self.dropped_bytes += size
            return b""
        self.results_sent += 1
        self.results_bytes += size
        return frame

    def note_if_figure(self, obj):
        figure_module = sys.modules.get("matplotlib.figure")
        if figure_module is not None and isinstance(obj, figure_module.Figure):
            self.displayed_figures.add(id(obj))

    def show_figures(self, skip=None):
        """plt.show(): display each open pyplot figure once, then close them all."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        try:
            for number in pyplot.get_fignums():
                figure = pyplot.figure(number)
                if figure is not skip and id(figure) not in self.displayed_figures:
                    self.display(figure)
        finally:
            pyplot.close("all")
            self.displayed_figures.clear()


def _ends_with_semicolon(source, node):
    """True for `expr;`: what follows the expression on its line starts with ';'.

    ast column offsets count UTF-8 bytes, hence the encode.
    """
    line = source_lines(source)[node.end_lineno - 1]
    rest = line.encode("utf-8")[node.end_col_offset :].decode("utf-8", "replace")
    return rest.lstrip().startswith(";")


# json.dumps(s, ensure_ascii=False) for a str, without the encoder's set-up per call.
_json_string = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring


def _bundle_json(kind, msg_id, bundle):
    """json.dumps of a display or result message (the bundle maps str to str)."""
    data = ", ".join(f"{_json_string(mime)}: {_json_string(text)}" for mime, text in bundle.items())
    return f'{{"type": "{kind}", "id": {_json_string(msg_id)}, "data": {{{data}}}}}'


def _bounded(text):
    return _truncate(text, MAX_TEXT) if len(text) > MAX_TEXT else text


# --------------------------------------------------------------------------
# Process set-up
# --------------------------------------------------------------------------


def _release_free_memory():
    """Hands the heap's free pages back to the system after a cell (its reply is sent).

    A cell's temporary objects (a figure rendered to PNG, a DataFrame's intermediates) leave
    free chunks in malloc's heap that glibc keeps mapped: in a forked session each of those
    pages is a private copy, ~3 MiB after a pandas + matplotlib cell, counted in every live
    session's memory. malloc_trim(0) returns them (it takes a few microseconds when there is
    nothing to return; docs/benchmarks.md)."""
    if _malloc_trim is not None:
        try:
            _malloc_trim(0)
        except Exception:
            pass


# --------------------------------------------------------------------------
# Identical pages of sessions merged by KSM (opt-in: `serve --merge-session-pages`)
# --------------------------------------------------------------------------

# Set by the engine in the zygote's environment only, when the server merges session pages.
MERGE_ENV = "RUNCELL_ZYGOTE_MERGE_PAGES"
MADV_MERGEABLE = 12
# None until the zygote's first fork; then the bytes it marked mergeable.
_merge_marked = None


def _mark_mergeable():
    """madvise(MADV_MERGEABLE) over this process's private writable anonymous memory (the heap
    and pymalloc's arenas, holding the preloaded modules' objects). Returns the bytes marked.

    Why: what a session pays for is mostly the zygote's pages it copied on write (reference
    counts, caches and bytecode of the library code its cells ran), and sessions that ran
    similar code copied the same pages the same way: after a pandas + matplotlib cell, 19 of
    a session's 21 MiB are byte-identical to another such session's pages at the same
    addresses (docs/benchmarks.md). Forks inherit the marking, so the kernel's KSM daemon may
    merge those copies across sessions. Memory a session maps later (large arrays, new
    pymalloc arenas) is not marked."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    marked = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            name = fields[5] if len(fields) > 5 else ""
            if not fields[1].startswith("rw") or fields[1][3] != "p" or name not in ("", "[heap]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if libc.madvise(start, end - start, MADV_MERGEABLE) == 0:
                marked += end - start
    return marked


def _mark_mergeable_once():
    """os.register_at_fork's `before` hook in the zygote (PyOS_BeforeFork runs it before each
    fork): marks once, at the first fork, when everything is preloaded."""
    global _merge_marked
    if _merge_marked is not None:
        return
    _merge_marked = 0
    try:
        _merge_marked = _mark_mergeable()
    except Exception as exc:  # sessions work the same, unmerged
        _warn(f"zygote memory not marked mergeable: {type(exc).__name__}: {exc}")


if __name__ != "__main__" and os.environ.get(MERGE_ENV) == "1":
    # Imported by the zygote's preload, before the modules it preloads: the marking waits
    # for the first fork, so that it covers their memory too.
    os.register_at_fork(before=_mark_mergeable_once)


def reseed():
    """Fresh seeds for `random` and numpy's global RNG (after a zygote fork, states are shared).
    Only modules the fork holds already: one imported later seeds itself from os.urandom, and
    importing `random` here would cost every run that never uses it (~2 ms: hashlib, OpenSSL).
    """
    random = sys.modules.get("random")
    if random is not None:
        random.seed(os.urandom(32))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed(list(struct.unpack("<4I", os.urandom(16))))
        except Exception as exc:
            _warn(f"could not reseed numpy: {exc}")


def prepare_one_shot(env, kernel_dir):
    """The part of a one-shot forked from the zygote that does not depend on its program: the
    run's environment, fresh seeds, the import path without the kernel's directory. A prepared
    one-shot does it before its program is known (run_one_shot follows once it is).
    """
    os.environ.clear()
    os.environ.update(env)
    reseed()
    while kernel_dir in sys.path:
        sys.path.remove(kernel_dir)


def _fresh_main(path):
    """A `__main__` module for the script at `path`, as `python3 path` makes it: `__file__`, a
    `SourceFileLoader`, no spec and no cached bytecode."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    main.__annotations__ = {}
    return main


def warm_one_shot():
    """Runs in the zygote, before its pages are frozen, what every one-shot forked from it runs
    around its program and may run here: the environment replaced, the seeds renewed, the
    script's path resolved, a fresh `__main__` with its loader, a program compiled and executed
    (`print` into a buffer). CPython 3.11 writes into the code objects it runs (the specialising
    interpreter's counters and inline caches: a function is specialised on its eighth call, so
    the zygote calls this ten times) and into the objects they touch; done here, those writes
    land once, in pages every fork shares, instead of being copied again by each run. Measured
    through the server (release build, the light zygote): the pages a `print(1)` one-shot has
    copied by its program's first line, 2,260 -> 2,164 KiB. Not here: joining threads,
    `atexit` and the exit, which would end the zygote's own threading and exit handlers.
    """
    env = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    reseed()
    path = __file__
    os.path.dirname(os.path.realpath(path))  # what run_one_shot puts first on sys.path
    main = _fresh_main(path)
    saved = sys.stdout
    sys.stdout = io.StringIO()
    try:
        exec(compile(b"print(1)\n", path, "exec", dont_inherit=True), main.__dict__)
    finally:
        sys.stdout = saved
        main.__dict__.clear()


def run_one_shot(argv):
    """Runs argv[1] in this process as `python3 argv[1] argv[2:]` would, as `__main__`, and
    returns the exit status (0-255) for the caller to exit with; a KeyboardInterrupt ends the
    process here by SIGINT, as it ends `python3`.

    What `python3 FILE` does and this mirrors: `sys.argv` is `[FILE, ARGS...]`, `sys.path[0]`
    the file's directory, `__main__` a fresh module with `__file__`, a `SourceFileLoader` and
    no spec; an uncaught exception prints its traceback through `sys.excepthook` (without this
    runner's frame) and exits 1; `SystemExit` exits with its code (`None` 0, an int itself,
    anything else printed to stderr and 1); at the end non-daemon threads are joined, `atexit`
    runs and the standard streams are flushed (a failed stdout flush exits 120). The
    interpreter is not finalised: the process ends once the program's own objects are released
    (which closes the files it left open), so it never touches the preloaded modules' pages.
    Compiled with this module in the zygote, not in each fork (where compiling the runner
    copied ~2 ms of pages).
    """
    import atexit
    import gc

    path = argv[1]
    sys.argv = list(argv[1:])
    sys.orig_argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    main = _fresh_main(path)
    sys.modules["__main__"] = main
    status = 0
    interrupted = False
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as e:
        status = _one_shot_exit_status(e.code)
    except BaseException as e:
        # Without this runner's frame, which `python3 FILE` does not have.
        e.with_traceback(e.__traceback__.tb_next)
        sys.excepthook(type(e), e, e.__traceback__)
        interrupted = isinstance(e, KeyboardInterrupt)
        status = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as e:
        status = _one_shot_exit_status(e.code)
    main.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout and status == 0:
                status = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status & 0xFF


def _one_shot_exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _text_stream(fd, name):
    """Line-buffered, write-through UTF-8 text on fd: prints reach the host promptly."""
    raw = io.FileIO(fd, "w", closefd=False)
    raw.name = name
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


# Where the duplicates of the output pipes live: far above the descriptors code opens, so a
# cell that closes a range of low ones (or fd 1 and 2 themselves) leaves them alone.
SAVED_FD_MIN = 1000
# (fd, its duplicate) for fds 1 and 2, put back before every cell (see _restore_std_fds).
_saved_std_fds = ()


def _save_std_fds():
    global _saved_std_fds
    saved = []
    for fd in (1, 2):
        try:
            try:
                copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SAVED_FD_MIN)
            except OSError:  # a descriptor limit under SAVED_FD_MIN
                copy = os.dup(fd)
        except OSError:
            continue
        saved.append((fd, copy))
    _saved_std_fds = tuple(saved)


def _restore_std_fds():
    """Put the output pipes back on fds 1 and 2: a cell that closed them (os.close(1)) or
    pointed them elsewhere would otherwise silence every later cell until a restart.
    Two dup2 calls a cell; the pipes' duplicates never reach children (close-on-exec)."""
    for fd, copy in _saved_std_fds:
        try:
            os.dup2(copy, fd)
        except OSError:
            pass


def prepare_process():
    # No KeyboardInterrupt while idle: the host's interrupts are for running cells.
    _ignore_interrupts()
    os.set_inheritable(CHANNEL_FD, False)  # children (subprocess, os.system) never see the channel
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)  # user code reading stdin gets EOF, not the host's pipe
        os.close(devnull)
    os.environ["MPLBACKEND"] = "Agg"  # before any matplotlib import, ours or the user's
    _flush_std()
    sys.stdout = sys.__stdout__ = _text_stream(1, "<stdout>")
    sys.stderr = sys.__stderr__ = _text_stream(2, "<stderr>")
    _save_std_fds()
    # Like an interactive interpreter: no script arguments, imports from the cwd (/workspace).
    sys.argv = [""]
    script_dir = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == script_dir:
        sys.path[0] = ""
    _add_packages_dir()


def _add_packages_dir():
    """A session with a network policy installs packages into its workspace (PIP_TARGET, also
    on PYTHONPATH): a zygote-born kernel computed sys.path before that environment existed, and a
    directory that did not exist at an import is remembered as empty, so it is made and put on
    sys.path (after the cwd) now."""
    target = os.environ.get("PIP_TARGET")
    if not target:
        return
    try:
        os.makedirs(target, exist_ok=True)
    except OSError:
        return
    sys.path_importer_cache.pop(target, None)
    if target in sys.path:
        sys.path.remove(target)
    sys.path.insert(1, target)


def shutdown(kernel, code):
    """Exit without waiting for user threads, but with atexit and files flushed."""
    import atexit
    import gc

    try:
        atexit._run_exitfuncs()
        kernel.namespace.clear()  # closes (and so flushes) files the user left open
        gc.collect()
    except BaseException:
        pass
    _flush_std()
    os._exit(code)


def main():
    try:
        os.fstat(CHANNEL_FD)
    except OSError:
        sys.stderr.write("runcell kernel: fd 3 (the protocol channel) is not open\n")
        return 2
    prepare_process()
    kernel = Kernel(Channel(CHANNEL_FD))
    kernel.install()
    reseed()
    shutdown(kernel, kernel.serve())


if __name__ == "__main__":
    sys.exit(main())
