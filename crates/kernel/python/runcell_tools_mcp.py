"""`runcell_tools.mcp`: the operator's MCP servers as Python modules (issue 22, docs/tools.md).

`from runcell_tools.mcp import github` asks the host, through the tool bridge, for the tools of
the server the operator named `github` (only if this session's tenant may use it) and builds a
module whose functions are those tools: keyword-only parameters typed from each tool's input
schema (`inspect.signature`, `help()`), the tool's description as the docstring, arguments
checked against the schema before the call leaves the sandbox. Nothing is written into the
sandbox and nothing is asked of the host until a module is imported: a session that never uses
MCP pays nothing.

A tool's result comes back already converted by the host (crates/server/src/mcp_servers/
convert.rs): structured content as the Python value, text as `str`, images, audio and binary
resources as `bytes`. A tool that reports an error (`isError`) raises `runcell_tools.ToolError`
with its text; a refusal, a time-out or an oversized payload the bridge's `ToolRefused`,
`ToolTimeout`, `ToolTooLarge`.

Tool names that are not Python identifiers are mapped (`python_name`): every character outside
ASCII letters, digits and `_` becomes `_` (`search-issues` -> `search_issues`, `repo.list` ->
`repo_list`), a name starting with a digit gets `tool_` in front, a Python keyword gets `_`
after it (`import` -> `import_`), and a name already taken gets `_2`, `_3`... in the order the
server lists its tools. Parameter names are mapped the same way. Each function keeps the
original name in `mcp_tool_name`; the module's `tools` maps Python names to tool names.

Stdlib only; `inspect` and `typing` are imported when the first module is built.
"""

import base64
import keyword
import re
import sys
import types

PACKAGE = "runcell_tools.mcp"


# ---- names -------------------------------------------------------------------------------


def python_name(name, taken=()):
    """The Python identifier for an MCP tool or parameter name (the rules are in the module's
    docstring); `taken` holds names already given in the same namespace."""
    mapped = re.sub(r"[^A-Za-z0-9_]", "_", name) or "tool"
    if mapped[0].isdigit():
        mapped = "tool_" + mapped
    if keyword.iskeyword(mapped) or keyword.issoftkeyword(mapped):
        mapped += "_"
    # A dunder would replace the module's own attributes (`__doc__`, `__getattr__`).
    if mapped.startswith("__"):
        mapped = "tool" + mapped
    base, n = mapped, 2
    while mapped in taken:
        mapped = f"{base}_{n}"
        n += 1
    return mapped


# ---- schemas -----------------------------------------------------------------------------

_SIMPLE = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "null": type(None),
}


def annotation(schema):
    """A Python annotation for a JSON Schema (what `inspect.signature` shows): `str`, `int`,
    `list[str]`, `Literal['a', 'b']`, `Optional[int]`, a `Union`, or `Any` for what it cannot
    say."""
    import typing

    if not isinstance(schema, dict):
        return typing.Any
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        try:
            return typing.Literal[tuple(schema["enum"])]
        except TypeError:  # unhashable values (objects in an enum)
            return typing.Any
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list) and schema[combinator]:
            options = tuple(annotation(s) for s in schema[combinator])
            return typing.Union[options] if len(options) > 1 else options[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        options = tuple(annotation(dict(schema, type=k)) for k in kind)
        if not options:
            return typing.Any
        return typing.Union[options] if len(options) > 1 else options[0]
    if kind == "array":
        items = schema.get("items")
        return list[annotation(items)] if isinstance(items, dict) else list
    return _SIMPLE.get(kind, typing.Any)


def _type_ok(kind, value):
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, (list, tuple))
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True  # a type this checker does not know: the server decides


def check(schema, value, where):
    """Raise TypeError (wrong type) or ValueError (wrong value) naming `where` when `value`
    does not fit `schema`: type, enum, const, properties, required, additionalProperties,
    items, minItems/maxItems, minLength/maxLength, minimum/maximum, exclusive ones, anyOf and
    oneOf (as "one of these fits"). Other keywords are left to the server."""
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_type_ok(k, value) for k in kinds):
            raise TypeError(
                f"{where} must be {' or '.join(map(str, kinds))}, not {type(value).__name__}"
            )
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        raise ValueError(f"{where} must be one of {schema['enum']!r}, not {value!r}")
    if "const" in schema and value != schema["const"]:
        raise ValueError(f"{where} must be {schema['const']!r}, not {value!r}")
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            for option in options:
                try:
                    check(option, value, where)
                    break
                except (TypeError, ValueError):
                    continue
            else:
                raise TypeError(f"{where} fits none of the schemas its {combinator} allows")
    if isinstance(value, str):
        if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
            raise ValueError(f"{where} must be at least {schema['minLength']} characters")
        if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
            raise ValueError(f"{where} must be at most {schema['maxLength']} characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok, word in (
            ("minimum", lambda v, b: v >= b, "at least"),
            ("maximum", lambda v, b: v <= b, "at most"),
            ("exclusiveMinimum", lambda v, b: v > b, "more than"),
            ("exclusiveMaximum", lambda v, b: v < b, "less than"),
        ):
            bound = schema.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool):
                if not ok(value, bound):
                    raise ValueError(f"{where} must be {word} {bound}, not {value!r}")
    if isinstance(value, (list, tuple)):
        if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
            raise ValueError(f"{where} must have at least {schema['minItems']} items")
        if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
            raise ValueError(f"{where} must have at most {schema['maxItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                check(schema["items"], item, f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name in schema.get("required") or ():
            if name not in value:
                raise TypeError(f"{where} is missing the required field {name!r}")
        for name, item in value.items():
            if name in props:
                check(props[name], item, f"{where}[{name!r}]")
            elif schema.get("additionalProperties") is False:
                raise TypeError(f"{where} has an unexpected field {name!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                check(schema["additionalProperties"], item, f"{where}[{name!r}]")


# ---- results -----------------------------------------------------------------------------


def _item(item):
    if "text" in item:
        return item["text"]
    if "bytes" in item:
        return base64.b64decode(item["bytes"])
    return item.get("value", item)


def decode(envelope):
    """The Python value of a tool's result as the host sends it (convert.rs): `structured`
    as is; `content` items as str (text) or bytes (images, audio, blobs), one item alone, none
    as None, several as a list; a resource link or an unknown kind as its dict."""
    if "structured" in envelope:
        return envelope["structured"]
    items = [_item(i) for i in envelope.get("content", ())]
    if not items:
        return None
    return items[0] if len(items) == 1 else items


# ---- modules -----------------------------------------------------------------------------


def _doc(server, tool, params, returns):
    lines = []
    description = (tool.get("description") or "").strip()
    if description:
        lines += [description, ""]
    if params:
        lines.append("Parameters:")
        for py, name, schema, required in params:
            kind = _describe_type(schema)
            head = f"    {py} ({kind}{', required' if required else ''})"
            if py != name:
                head += f" [MCP name {name!r}]"
            text = (schema.get("description") or "").strip() if isinstance(schema, dict) else ""
            lines.append(head + (f": {text}" if text else ""))
            if isinstance(schema, dict) and "default" in schema:
                lines.append(f"        Default: {schema['default']!r}.")
        lines.append("")
    if returns:
        lines += ["Returns:", f"    {returns}", ""]
    lines.append(f"MCP tool {tool['name']!r} of the server {server!r}, called through runcell.")
    return "\n".join(lines)


def _describe_type(schema):
    import inspect

    return inspect.formatannotation(annotation(schema)).replace("typing.", "")


def build_function(server, tool, call, taken=()):
    """The Python function for one MCP tool (`tool`: name, description, inputSchema,
    outputSchema as the server listed it). `call(server, tool_name, arguments)` sends the call
    and returns the host's envelope, or raises."""
    import inspect

    schema = tool.get("inputSchema") if isinstance(tool.get("inputSchema"), dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or ())
    params, to_mcp, used = [], {}, set()
    # Required first, in the schema's order, then the optional ones: what a reader expects.
    for name in sorted(props, key=lambda n: n not in required):
        py = python_name(name, used)
        used.add(py)
        to_mcp[py] = name
        params.append((py, name, props[name], name in required))
    signature = inspect.Signature(
        [
            inspect.Parameter(
                py,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=annotation(sub),
                **(
                    {}
                    if req
                    else {"default": sub.get("default") if isinstance(sub, dict) else None}
                ),
            )
            for py, _name, sub, req in params
        ],
        return_annotation=_returns(tool),
    )
    tool_name = tool["name"]
    py_name = python_name(tool_name, taken)
    nullable = {
        py: isinstance(sub, dict) and _type_ok_any(sub, None) for py, _n, sub, _r in params
    }

    def function(*args, **kwargs):
        if args:
            raise TypeError(
                f"{server}.{py_name}() takes keyword arguments only ({len(args)} positional given)"
            )
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{server}.{py_name}(): {e}") from None
        arguments = {}
        for py, value in bound.arguments.items():
            name = to_mcp[py]
            # `x=None` for an optional parameter that cannot be null means "not given": the
            # signature shows None as its default.
            if value is None and name not in required and not nullable[py]:
                continue
            check(props[name], value, f"{server}.{py_name}() argument {py!r}")
            arguments[name] = value
        return decode(call(server, tool_name, arguments))

    function.__name__ = py_name
    function.__qualname__ = py_name
    function.__module__ = f"{PACKAGE}.{server}"
    function.__signature__ = signature
    function.__doc__ = _doc(server, tool, params, _describe_returns(tool))
    function.mcp_tool_name = tool_name
    function.mcp_input_schema = schema
    return function


def _type_ok_any(schema, value):
    kind = schema.get("type")
    if kind is None:
        return True
    return any(_type_ok(k, value) for k in (kind if isinstance(kind, list) else [kind]))


def _returns(tool):
    import typing

    out = tool.get("outputSchema")
    return annotation(out) if isinstance(out, dict) else typing.Any


def _describe_returns(tool):
    out = tool.get("outputSchema")
    if not isinstance(out, dict):
        return ""
    props = out.get("properties") if isinstance(out.get("properties"), dict) else {}
    if not props:
        return _describe_type(out)
    fields = ", ".join(f"{k}: {_describe_type(v)}" for k, v in props.items())
    return f"{_describe_type(out)} with {fields}"


def build_module(server, listing, call, module=None):
    """The module `runcell_tools.mcp.<server>` from the host's listing (`{"tools": [...],
    "instructions"?}`), its functions calling through `call`; `module` is filled in place (an
    import's, or a reload's: the previous tools go) when given."""
    if module is None:
        module = types.ModuleType(f"{PACKAGE}.{server}")
    for old in getattr(module, "tools", {}) or {}:
        module.__dict__.pop(old, None)
    tools, taken = {}, {"tools"}
    for tool in listing.get("tools", ()):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        function = build_function(server, tool, call, taken)
        taken.add(function.__name__)
        tools[function.__name__] = tool["name"]
        setattr(module, function.__name__, function)
    module.tools = tools
    module.__all__ = sorted(tools)
    lines = [f"The tools of the MCP server {server!r}, configured by runcell's operator."]
    if listing.get("instructions"):
        lines += ["", str(listing["instructions"]).strip()]
    lines += ["", "Functions: " + (", ".join(module.__all__) or "(none)") + "."]
    module.__doc__ = "\n".join(lines)
    return module


# ---- the import hook ---------------------------------------------------------------------


class _Finder:
    """Finds `runcell_tools.mcp.<server>` (a meta path finder: nothing is on disk). A server
    this session may not use is a ModuleNotFoundError saying why, raised here so the reason is
    not replaced by Python's "No module named"."""

    def __init__(self, host):
        self.host = host

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        prefix = PACKAGE + "."
        if not fullname.startswith(prefix):
            return None
        server = fullname[len(prefix):]
        if "." in server:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(self.host, server))


class _Loader:
    def __init__(self, host, server):
        self.host, self.server = host, server

    def create_module(self, spec):
        return None  # the default module; filled in by exec_module

    def exec_module(self, module):
        # Here, not in create_module: `importlib.reload` runs only this, and so asks again.
        listing = self.host.list_tools(self.server)
        build_module(self.server, listing, self.host.call_tool, module)


def package(host):
    """The module `runcell_tools.mcp` over `host` (an object with `servers()`, `list_tools
    (server)` raising ModuleNotFoundError when the session may not use it, and `call_tool
    (server, tool, arguments)` returning the envelope), and its finder, for the bridge to put
    in `sys.modules` and `sys.meta_path`."""
    mcp = types.ModuleType(PACKAGE)
    mcp.__doc__ = (
        "The operator's MCP servers this session may use, as modules: "
        "`from runcell_tools.mcp import NAME`. `servers()` lists them."
    )
    mcp.__path__ = []  # a package: its submodules come from the finder
    mcp.python_name = python_name

    def servers():
        """The names of the MCP servers this session may import, in name order."""
        return sorted(host.servers())

    mcp.servers = servers

    def __getattr__(name):
        if name.startswith("_"):
            raise AttributeError(name)
        import importlib

        return importlib.import_module(f"{PACKAGE}.{name}")

    def __dir__():
        return sorted(set(mcp.__dict__) | set(host.servers()))

    mcp.__getattr__ = __getattr__
    mcp.__dir__ = __dir__
    return mcp, _Finder(host)


class BridgeHost:
    """The host as the tool bridge reaches it (`runcell_tools`, the bridge's module): `mcp.*`
    lists the servers, `mcp.<server>` a server's tools, `mcp.<server>.<tool>` calls one
    (crates/server/src/mcp_servers/dispatch.rs)."""

    def __init__(self, tools):
        self.tools = tools

    def servers(self):
        try:
            return list(self.tools._call("mcp.*", {}).get("servers", ()))
        except self.tools.ToolRefused:
            return []  # no MCP server is configured for this session at all

    def list_tools(self, server):
        name = f"{PACKAGE}.{server}"
        try:
            return self.tools._call(f"mcp.{server}", {})
        except self.tools.ToolRefused as e:
            raise ModuleNotFoundError(f"{name}: {e}", name=name) from None
        except self.tools.ToolError as e:
            raise ImportError(f"cannot import {name}: {e}", name=name) from None

    def call_tool(self, server, tool, arguments):
        return self.tools._call(f"mcp.{server}.{tool}", arguments)


def install(host, parent=None):
    """Register `runcell_tools.mcp` (as `parent.mcp` too when given) and its finder; once."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    mcp, finder = package(host)
    sys.modules[PACKAGE] = mcp
    sys.meta_path.append(finder)
    if parent is not None:
        parent.mcp = mcp
    return mcp
