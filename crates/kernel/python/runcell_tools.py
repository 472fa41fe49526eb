"""runcell_tools: tools that code in the sandbox calls, answered outside it (issue 22).

Client tools are the ones the execute request declared (``tools: [{name, description,
input_schema}]``)::

    from runcell_tools import lookup
    row = lookup(id=3)                                   # a plain call: waits for the answer
    rows = await asyncio.gather(*(lookup(id=i) for i in range(10)))   # concurrent

A tool called where an asyncio loop runs in the calling thread (async code, a cell with
top-level ``await``) returns an awaitable instead of waiting; elsewhere it returns the value.
Arguments are checked against the tool's ``input_schema`` here, before anything leaves the
sandbox (TypeError / ValueError naming the field). A failed call raises ToolError (or one of
its subclasses below) with the message the answer carried.

The wire (one Unix socket to the host, fd 3, shared with the kernel, see runcell_wire.py):
the calling thread sends ``{"type": "tool_call", "id": <cell>, "call": <n>, "name", "input"}``
and waits; a reader thread started at the cell's first call takes the host's
``{"type": "tool_result", "call": <n>, "output" | "error"}`` frames off the channel and wakes
the caller. The kernel stops the reader before the cell's ``done``, so between cells only the
kernel's main loop reads the channel; calls still waiting then fail with ToolCancelled.

For layers built on top (runcell_tools.mcp, the MCP helper's): ``_call(name, input)`` (sync,
thread-safe), ``_acall(name, input)`` (an awaitable), ``_make_function(name, spec)`` (a
function with a signature and docstring from a tool spec) and ``_tools()`` (this cell's
declared tools). Stdlib only.
"""

import json
import os
import select
import signal
import sys
import threading

__all__ = ["ToolError", "ToolTimeout", "ToolRefused", "ToolTooLarge", "ToolCancelled"]
# Submodules (runcell_tools.mcp) may be generated into this namespace by an import hook.
__path__ = []

# The largest arguments a call may send, as JSON (the host checks the same bound).
MAX_INPUT_BYTES = 1024 * 1024


class ToolError(Exception):
    """A tool call failed: the tool's own error, or runcell's refusal (see the subclasses)."""

    kind = "error"

    def __init__(self, message, tool=None):
        super().__init__(message)
        self.tool = tool


class ToolTimeout(ToolError, TimeoutError):
    """No answer came within the call's time limit."""

    kind = "timeout"


class ToolRefused(ToolError, PermissionError):
    """runcell refused the call: a tool not declared for this execution, or over the bounds
    on pending calls or calls per second."""

    kind = "refused"


class ToolTooLarge(ToolError, ValueError):
    """The arguments or the answer were over the size bound (1 MiB each)."""

    kind = "too_large"


class ToolCancelled(ToolError):
    """The cell ended, or was interrupted, before the answer came."""

    kind = "cancelled"


_ERRORS = {cls.kind: cls for cls in (ToolError, ToolTimeout, ToolRefused, ToolTooLarge, ToolCancelled)}

# ---------------------------------------------------------------------------
# The bridge: one cell's calls
# ---------------------------------------------------------------------------

_lock = threading.Lock()
_channel = None  # the kernel's Channel while a cell runs
_cell_id = None
_declared = {}  # name -> spec, this cell's client tools
_pending = {}  # call number -> concurrent.futures.Future
_next_call = 0
_reader = None  # the reader thread, while calls wait
_wake_r, _wake_w = -1, -1  # wakes the reader when the cell ends


def _begin_cell(channel, cell_id, tools):
    """Called by the kernel before a cell runs, with the tools its execute declared."""
    global _channel, _cell_id, _declared, _wake_r, _wake_w
    declared = {}
    for spec in tools if isinstance(tools, list) else ():
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            declared[spec["name"]] = spec
    with _lock:
        if _wake_r < 0:
            _wake_r, _wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        _channel, _cell_id, _declared = channel, cell_id, declared


def _end_cell():
    """Called by the kernel after the cell, before its `done`: stops the reader (so the
    kernel's main loop is the channel's only reader again) and fails the calls still waiting."""
    global _channel, _cell_id, _reader, _declared
    with _lock:
        reader, _reader = _reader, None
        waiting = list(_pending.values())
        _pending.clear()
        _channel, _cell_id, _declared = None, None, {}
        if reader is not None:
            try:
                os.write(_wake_w, b"x")
            except OSError:
                pass
    if reader is not None:
        reader.join()
        try:
            while os.read(_wake_r, 64):
                pass
        except OSError:
            pass
    for future in waiting:
        if not future.done():
            future.set_exception(ToolCancelled("the cell ended before the tool answered"))


def _tools():
    """This cell's declared client tools: {name: spec}."""
    with _lock:
        return dict(_declared)


def _send_call(name, input):
    """Sends one call; returns the future its answer resolves."""
    global _next_call, _reader
    import concurrent.futures

    if not isinstance(name, str) or not name:
        raise TypeError("a tool name is a non-empty string")
    try:
        text = json.dumps(input, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}(): the arguments are not JSON: {exc}") from None
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_INPUT_BYTES:
        raise ToolTooLarge(
            f"{name}(): the arguments are {size} bytes as JSON, over the {MAX_INPUT_BYTES}-byte limit",
            name,
        )
    future = concurrent.futures.Future()
    _flush_std()  # what the code printed before the call reaches the host first
    with _lock:
        channel, cell_id = _channel, _cell_id
        if channel is None:
            raise ToolCancelled(f"{name}(): tools can be called only while a cell runs", name)
        _next_call += 1
        number = _next_call
        _pending[number] = future
        body = (
            f'{{"type": "tool_call", "id": {json.dumps(cell_id)}, "call": {number}, '
            f'"name": {json.dumps(name, ensure_ascii=False)}, "input": {text}}}'
        )
        if _reader is None:
            _reader = threading.Thread(target=_read_answers, args=(channel,), name="runcell-tools", daemon=True)
            _reader.start()
    try:
        channel.send_frames(channel.encode(None, body))
    except BaseException:
        with _lock:
            _pending.pop(number, None)
        raise
    future.runcell_tool = name
    return future


def _call(name, input):
    """Calls tool `name` with `input` (a JSON value) and waits for its answer (thread-safe)."""
    future = _send_call(name, input)
    try:
        return future.result()
    except ToolError as exc:
        # Raised here, in the caller's frames, not in concurrent.futures'.
        raise exc.with_traceback(None) from None


def _acall(name, input):
    """`_call` as an awaitable for the running asyncio loop (sent at once)."""
    import asyncio

    return asyncio.wrap_future(_send_call(name, input))


def _read_answers(channel):
    """The reader thread: takes `tool_result` frames off the channel until the cell ends."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT,))  # interrupts are the main thread's
    except (OSError, ValueError):
        pass
    import runcell_wire

    poll = select.poll()
    poll.register(channel.fd, select.POLLIN)
    poll.register(_wake_r, select.POLLIN)
    buf = channel._buffer  # shared with the kernel's reads between cells

    at_start = [True]

    def read_exact(size):
        start, at_start[0] = at_start[0], False
        while len(buf) < size:
            if not buf and start:
                # Between frames: the end of the cell may stop us here (never inside one).
                ready = dict(poll.poll())
                if _wake_r in ready:
                    raise _Woken
                if channel.fd not in ready:
                    continue
            try:
                chunk = os.read(channel.fd, max(size - len(buf), 64 * 1024))
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                raise _Woken  # the host went away: the kernel's main loop finds out
            buf.extend(chunk)
        data = bytes(buf[:size])
        del buf[:size]
        return data

    while True:
        at_start[0] = True
        try:
            message = runcell_wire.read_message(read_exact)
        except _Woken:
            return
        except Exception as exc:
            sys.stderr.write(f"runcell: tool answers unreadable: {exc}\n")
            return
        if message is None or message.get("type") != "tool_result":
            continue  # the host sends nothing else while a cell runs
        with _lock:
            future = _pending.pop(message.get("call"), None)
        if future is None or future.done():
            continue  # a call the cell stopped waiting for
        error = message.get("error")
        if error is not None:
            tool = getattr(future, "runcell_tool", None)
            if isinstance(error, dict):
                cls = _ERRORS.get(error.get("kind"), ToolError)
                text = error.get("message")
            else:
                cls, text = ToolError, error
            if not isinstance(text, str):
                text = json.dumps(text, ensure_ascii=False)
            future.set_exception(cls(text, tool))
        else:
            future.set_result(message.get("output"))


class _Woken(Exception):
    pass


def _flush_std():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _after_fork():
    """In a forked child: the zygote's sessions fork before any cell; a child of user code
    (os.fork in a cell) must not speak on its parent's channel, so it has none."""
    global _reader, _channel, _cell_id, _wake_r, _wake_w, _lock
    _lock = threading.Lock()
    _reader = None
    _channel, _cell_id = None, None
    _pending.clear()
    _wake_r, _wake_w = -1, -1


os.register_at_fork(after_in_child=_after_fork)

# ---------------------------------------------------------------------------
# Tool functions from their specs
# ---------------------------------------------------------------------------

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _is_type(value, kind):
    if kind not in _JSON_TYPES:
        return True  # an unknown type name is not ours to refuse
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES[kind])


def _type_name(value):
    return {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null",
            list: "array", tuple: "array", dict: "object"}.get(type(value), type(value).__name__)


def validate(schema, value, where):
    """Checks `value` against the JSON Schema subset tools use (type, properties, required,
    enum, const, items, additionalProperties, minimum/maximum and their exclusive forms,
    minLength/maxLength, minItems/maxItems); other keywords are ignored. Raises TypeError for
    a wrong type, a missing or unexpected field, ValueError for a value out of bounds; the
    message names the field (`where`)."""
    if not isinstance(schema, dict):
        return
    kinds = schema.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, list) and kinds and not any(_is_type(value, k) for k in kinds):
        raise TypeError(f"{where} must be {' or '.join(map(str, kinds))}, not {_type_name(value)}")
    if "enum" in schema and isinstance(schema["enum"], list) and not any(
        _same(value, option) for option in schema["enum"]
    ):
        options = ", ".join(json.dumps(o, ensure_ascii=False) for o in schema["enum"])
        raise ValueError(f"{where} must be one of {options}, not {json.dumps(value, ensure_ascii=False, default=repr)}")
    if "const" in schema and not _same(value, schema["const"]):
        raise ValueError(f"{where} must be {json.dumps(schema['const'], ensure_ascii=False)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok, word in (
            ("minimum", lambda v, b: v >= b, "≥"),
            ("maximum", lambda v, b: v <= b, "≤"),
            ("exclusiveMinimum", lambda v, b: v > b, ">"),
            ("exclusiveMaximum", lambda v, b: v < b, "<"),
        ):
            bound = schema.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and not ok(value, bound):
                raise ValueError(f"{where} must be {word} {bound}, got {value}")
    if isinstance(value, str):
        _check_length(schema, len(value), where, "minLength", "maxLength", "characters")
    if isinstance(value, (list, tuple)):
        _check_length(schema, len(value), where, "minItems", "maxItems", "items")
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                validate(items, item, f"{where}[{index}]")
    if isinstance(value, dict):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        for name in required if isinstance(required, list) else ():
            if name not in value:
                raise TypeError(f"{where} is missing the required field {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if not isinstance(name, str):
                raise TypeError(f"{where} has a non-string key {name!r}")
            if name in properties:
                validate(properties[name], item, f"{where}.{name}" if where != "arguments" else repr(name))
            elif extra is False:
                raise TypeError(f"{where} has an unexpected field {name!r}")
            elif isinstance(extra, dict):
                validate(extra, item, f"{where}.{name}")


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _check_length(schema, length, where, low, high, unit):
    lo, hi = schema.get(low), schema.get(high)
    if isinstance(lo, int) and not isinstance(lo, bool) and length < lo:
        raise ValueError(f"{where} must have at least {lo} {unit}, has {length}")
    if isinstance(hi, int) and not isinstance(hi, bool) and length > hi:
        raise ValueError(f"{where} must have at most {hi} {unit}, has {length}")


class _Call:
    """A call made where an asyncio loop runs: awaitable (``await``, ``asyncio.gather``), and,
    used as a value without ``await`` (``lookup(id=1)["price"]``), the answer itself, waited
    for then. ``await`` it for the plain value (json.dumps, isinstance)."""

    __slots__ = ("_name", "_future")

    def __init__(self, name, future):
        self._name = name
        self._future = future

    def __await__(self):
        import asyncio

        try:
            return (yield from asyncio.wrap_future(self._future).__await__())
        except ToolError as exc:
            raise exc.with_traceback(None) from None

    def _value(self):
        try:
            return self._future.result()
        except ToolError as exc:
            raise exc.with_traceback(None) from None

    def __getattr__(self, attr):
        return getattr(self._value(), attr)

    def __repr__(self):
        return repr(self._value())

    def __str__(self):
        return str(self._value())

    def __format__(self, spec):
        return format(self._value(), spec)

    def __bool__(self):
        return bool(self._value())

    def __len__(self):
        return len(self._value())

    def __iter__(self):
        return iter(self._value())

    def __contains__(self, item):
        return item in self._value()

    def __getitem__(self, key):
        return self._value()[key]

    def __eq__(self, other):
        return self._value() == other

    def __ne__(self, other):
        return self._value() != other

    # By identity, as a future's: asyncio.gather keeps its awaitables in a dict.
    __hash__ = object.__hash__

    def __lt__(self, other):
        return self._value() < other

    def __le__(self, other):
        return self._value() <= other

    def __gt__(self, other):
        return self._value() > other

    def __ge__(self, other):
        return self._value() >= other

    def __int__(self):
        return int(self._value())

    def __float__(self):
        return float(self._value())

    def __index__(self):
        return self._value().__index__()

    def __add__(self, other):
        return self._value() + other

    def __radd__(self, other):
        return other + self._value()

    def __sub__(self, other):
        return self._value() - other

    def __rsub__(self, other):
        return other - self._value()

    def __mul__(self, other):
        return self._value() * other

    def __rmul__(self, other):
        return other * self._value()

    def __truediv__(self, other):
        return self._value() / other

    def __rtruediv__(self, other):
        return other / self._value()


def _in_running_loop():
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _make_function(name, spec, check_declared=False):
    """A Python function for the tool `name` described by `spec` ({description,
    input_schema}): keyword (or positional, in the schema's property order) arguments make the
    input object, checked against the schema; a plain call waits and returns the answer, a call
    inside a running asyncio loop returns an awaitable. `check_declared`: refuse the call (here,
    before it leaves) unless this cell declared a tool of that name (client tools)."""
    import inspect

    schema = spec.get("input_schema") if isinstance(spec, dict) else None
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    order = list(properties)
    required = set(schema.get("required") or ()) if isinstance(schema.get("required"), list) else set()
    func_name = name.rsplit(".", 1)[-1] if name.rsplit(".", 1)[-1].isidentifier() else "tool"

    def tool(*args, **kwargs):
        if check_declared and name not in _tools():
            raise ToolRefused(f"{name}() is not a tool declared for this execution", name)
        if len(args) > len(order):
            raise TypeError(f"{name}() takes {len(order)} positional arguments but {len(args)} were given")
        arguments = {}
        for key, value in zip(order, args):
            arguments[key] = value
        for key, value in kwargs.items():
            if key in arguments:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            arguments[key] = value
        try:
            validate(schema, arguments, "arguments")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}(): {exc}") from None
        if _in_running_loop():
            return _Call(name, _send_call(name, arguments))
        return _call(name, arguments)

    tool.__name__ = tool.__qualname__ = func_name
    tool.__module__ = "runcell_tools"
    description = spec.get("description") if isinstance(spec, dict) else None
    doc = description if isinstance(description, str) else ""
    lines = []
    for key in order:
        prop = properties[key] if isinstance(properties[key], dict) else {}
        text = prop.get("description") if isinstance(prop.get("description"), str) else ""
        kind = prop.get("type") if isinstance(prop.get("type"), str) else "any"
        lines.append(f"    {key} ({kind}{'' if key in required else ', optional'}){': ' + text if text else ''}")
    if lines:
        doc = f"{doc}\n\nArguments:\n" + "\n".join(lines)
    tool.__doc__ = doc
    try:
        names = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
        params = []
        for key in order:
            if not key.isidentifier():
                raise ValueError(key)
            prop = properties[key] if isinstance(properties[key], dict) else {}
            annotation = names.get(prop.get("type"), inspect.Parameter.empty)
            default = inspect.Parameter.empty if key in required else None
            params.append(inspect.Parameter(key, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=default, annotation=annotation))
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
        tool.__signature__ = inspect.Signature(params)
    except ValueError:
        pass  # property names that are not identifiers: (*args, **kwargs) it stays
    return tool


def __getattr__(name):
    """`from runcell_tools import lookup`: the declared client tool `lookup` of this cell."""
    if name.startswith("__"):
        raise AttributeError(name)
    spec = _tools().get(name)
    if spec is None:
        declared = ", ".join(sorted(_tools())) or "none"
        raise AttributeError(f"runcell_tools has no tool {name!r} (declared for this execution: {declared})")
    return _make_function(name, spec, check_declared=True)


def __dir__():
    return sorted(set(globals()) | set(_tools()))


# The operator's MCP servers as `runcell_tools.mcp.<server>` (issue 22), from the module beside
# this one; nothing is asked of the host until one is imported.
try:
    import runcell_tools_mcp as _mcp_modules
except ImportError:  # a kernel copied without it: no MCP modules
    pass
else:
    _mcp_modules.install(_mcp_modules.BridgeHost(sys.modules[__name__]), sys.modules[__name__])
