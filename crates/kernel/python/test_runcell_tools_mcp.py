"""Tests of runcell_tools_mcp (the MCP servers as modules), stdlib unittest, with a fake host in
place of the bridge. Run by crates/kernel/tests/python_kernel.rs (`python3 THIS_FILE`)."""

import base64
import inspect
import io
import os
import pydoc
import sys
import typing
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runcell_tools_mcp as m  # noqa: E402

SEARCH = {
    "name": "search-issues",
    "description": "Search the issues of a repository.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "per_page": {"type": "integer", "minimum": 1, "maximum": 100, "default": 30},
            "query": {"type": "string", "description": "GitHub search syntax"},
            "state": {"type": "string", "enum": ["open", "closed"]},
            "labels": {"type": "array", "items": {"type": "string"}},
            "from": {"type": ["string", "null"]},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"total": {"type": "integer"}, "items": {"type": "array"}},
    },
}


class FakeHost:
    def __init__(self, listings):
        self.listings = listings
        self.calls = []
        self.answer = {"structured": {"total": 2, "items": []}}

    def servers(self):
        return list(self.listings)

    def list_tools(self, server):
        if server not in self.listings:
            raise ModuleNotFoundError(
                f"no MCP server {server!r} for this session", name=f"runcell_tools.mcp.{server}"
            )
        return self.listings[server]

    def call_tool(self, server, tool, arguments):
        self.calls.append((server, tool, arguments))
        return self.answer


class Names(unittest.TestCase):
    def test_mapping(self):
        self.assertEqual(m.python_name("search_issues"), "search_issues")
        self.assertEqual(m.python_name("search-issues"), "search_issues")
        self.assertEqual(m.python_name("repo.list"), "repo_list")
        self.assertEqual(m.python_name("2fa"), "tool_2fa")
        self.assertEqual(m.python_name("import"), "import_")
        self.assertEqual(m.python_name("match"), "match_")
        self.assertEqual(m.python_name("__init__"), "tool__init__")
        self.assertEqual(m.python_name("a-b", {"a_b"}), "a_b_2")
        self.assertEqual(m.python_name("a.b", {"a_b", "a_b_2"}), "a_b_3")
        self.assertEqual(m.python_name(""), "tool")
        self.assertEqual(m.python_name("über"), "_ber")


class Annotations(unittest.TestCase):
    def test_types(self):
        self.assertIs(m.annotation({"type": "string"}), str)
        self.assertIs(m.annotation({"type": "integer"}), int)
        self.assertIs(m.annotation({"type": "number"}), float)
        self.assertEqual(m.annotation({"type": "array", "items": {"type": "string"}}), list[str])
        self.assertEqual(m.annotation({"type": ["string", "null"]}), typing.Optional[str])
        self.assertEqual(m.annotation({"enum": ["a", "b"]}), typing.Literal["a", "b"])
        self.assertIs(m.annotation({}), typing.Any)


class Checks(unittest.TestCase):
    def test_refusals_name_the_field(self):
        schema = SEARCH["inputSchema"]["properties"]
        with self.assertRaisesRegex(TypeError, "q must be string, not int"):
            m.check(schema["query"], 3, "q")
        with self.assertRaisesRegex(ValueError, "n must be at most 100"):
            m.check(schema["per_page"], 101, "n")
        with self.assertRaisesRegex(TypeError, "n must be integer, not bool"):
            m.check(schema["per_page"], True, "n")
        with self.assertRaisesRegex(ValueError, r"s must be one of \['open', 'closed'\]"):
            m.check(schema["state"], "merged", "s")
        with self.assertRaisesRegex(TypeError, r"l\[1\] must be string"):
            m.check(schema["labels"], ["a", 2], "l")
        with self.assertRaisesRegex(TypeError, "missing the required field 'query'"):
            m.check(SEARCH["inputSchema"], {}, "args")
        with self.assertRaisesRegex(TypeError, "unexpected field 'x'"):
            m.check(SEARCH["inputSchema"], {"query": "a", "x": 1}, "args")

    def test_accepts_what_fits(self):
        m.check(SEARCH["inputSchema"], {"query": "a", "per_page": 5, "labels": ["x"]}, "args")
        m.check({"type": "integer"}, 2.0, "whole float")
        m.check({"type": "string", "format": "unknown-keyword"}, "x", "unknown keywords")


class Results(unittest.TestCase):
    def test_decode(self):
        self.assertEqual(m.decode({"structured": {"a": [1, 2]}}), {"a": [1, 2]})
        self.assertIsNone(m.decode({"structured": None}))
        self.assertEqual(m.decode({"content": [{"text": "hi"}]}), "hi")
        png = b"\x89PNG\r\n\x1a\n"
        b64 = base64.b64encode(png).decode()
        self.assertEqual(m.decode({"content": [{"bytes": b64, "mime": "image/png"}]}), png)
        self.assertEqual(m.decode({"content": [{"text": "a"}, {"bytes": b64}]}), ["a", png])
        self.assertIsNone(m.decode({"content": []}))
        self.assertEqual(m.decode({"content": [{"value": {"uri": "file:///x"}}]}), {"uri": "file:///x"})


class Modules(unittest.TestCase):
    def setUp(self):
        self.host = FakeHost({"github": {"tools": [SEARCH, {"name": "search_issues"}]}})
        self.mod = m.build_module("github", self.host.listings["github"], self.host.call_tool)

    def test_signature_and_help(self):
        f = self.mod.search_issues
        self.assertEqual(f.mcp_tool_name, "search-issues")
        sig = inspect.signature(f)
        self.assertEqual(list(sig.parameters), ["query", "per_page", "state", "labels", "from_"])
        self.assertIs(sig.parameters["query"].annotation, str)
        self.assertIs(sig.parameters["query"].default, inspect.Parameter.empty)
        self.assertEqual(sig.parameters["per_page"].default, 30)
        self.assertIs(sig.parameters["per_page"].kind, inspect.Parameter.KEYWORD_ONLY)
        self.assertEqual(sig.parameters["labels"].annotation, list[str])
        self.assertIs(sig.return_annotation, dict)
        text = pydoc.render_doc(f, renderer=pydoc.plaintext)
        self.assertIn("search_issues(*, query: str, per_page: int = 30", text)
        self.assertIn("Search the issues of a repository.", text)
        self.assertIn("query (str, required): GitHub search syntax", text)
        self.assertIn("from_ (Optional[str]) [MCP name 'from']", text)
        self.assertIn("state (Literal['open', 'closed'])", text)
        # The second tool's name maps to the one already taken.
        self.assertEqual(self.mod.tools, {"search_issues": "search-issues", "search_issues_2": "search_issues"})

    def test_call_sends_the_mcp_names_and_decodes(self):
        out = self.mod.search_issues(query="is:open", from_="x", per_page=None)
        self.assertEqual(out, {"total": 2, "items": []})
        self.assertEqual(self.host.calls, [("github", "search-issues", {"query": "is:open", "from": "x"})])

    def test_bad_arguments_never_leave(self):
        with self.assertRaisesRegex(TypeError, "missing a required argument: 'query'"):
            self.mod.search_issues()
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'nope'"):
            self.mod.search_issues(query="a", nope=1)
        with self.assertRaisesRegex(TypeError, r"takes keyword arguments only \(1 positional given\)"):
            self.mod.search_issues("a")
        with self.assertRaisesRegex(ValueError, "argument 'per_page' must be at least 1"):
            self.mod.search_issues(query="a", per_page=0)
        self.assertEqual(self.host.calls, [])


class ImportHook(unittest.TestCase):
    def test_import_and_refusal(self):
        host = FakeHost({"github": {"tools": [SEARCH]}})
        parent = type(sys)("runcell_tools")
        parent.__path__ = []
        sys.modules["runcell_tools"] = parent
        try:
            mcp = m.install(host, parent)
            from runcell_tools.mcp import github  # noqa: PLC0415

            self.assertIs(github, sys.modules["runcell_tools.mcp.github"])
            self.assertEqual(github.__all__, ["search_issues"])
            self.assertEqual(mcp.servers(), ["github"])
            self.assertIn("github", dir(mcp))
            with self.assertRaises(ModuleNotFoundError) as e:
                from runcell_tools.mcp import slack  # noqa: F401, PLC0415
            self.assertIn("no MCP server 'slack' for this session", str(e.exception))
            with self.assertRaises(ModuleNotFoundError):
                import runcell_tools.mcp.slack  # noqa: F401, PLC0415
            self.assertFalse(hasattr(mcp, "_private"))
            # A reload asks again: a tool the server dropped goes, a new one comes.
            host.listings["github"] = {"tools": [{"name": "new-tool"}]}
            import importlib  # noqa: PLC0415

            importlib.reload(github)
            self.assertEqual(github.__all__, ["new_tool"])
            self.assertFalse(hasattr(github, "search_issues"))
        finally:
            for name in [n for n in sys.modules if n.startswith("runcell_tools")]:
                del sys.modules[name]
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, m._Finder)]


if __name__ == "__main__":
    unittest.main(verbosity=2)
