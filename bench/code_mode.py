#!/usr/bin/env python3
"""Code mode vs. one tool call per model round trip (issue 22, docs/tools.md): what runcell
sends the model for "look up records 1..N with an MCP tool and report the total amount".

Usage: bench/code_mode.py [BINARY=target/debug/runcell] [N=20]
  RUNTIMES    installed runtimes, linked into the bench's data dir (default
              target/tmp/runcell-test-runtimes/runtimes, what the tests install)
  MCP_PYTHON  a Python with the pinned MCP SDK (default: the tests' venv under target/, made
              here from crates/server/tests/mcp-clients/requirements.txt when missing)

No real model is reachable here: the model is a scripted stand-in for an OpenAI-compatible
Chat Completions API (127.0.0.1, this script), so what is measured is what runcell *sends*
and what the script answers, not what a model would decide. The MCP server is real
(crates/cli/tests/fixtures/records_mcp_server.py, over stdio, started by `runcell ask
--mcp-server`), and so are the sandbox and the cells. Two runs of `runcell ask`, side by side:

  per-call  the model asks for one record per reply: each reply is a `python` cell calling
            `records.get_record(id=i)` once and printing the record, whose output goes back
            into the conversation (what a direct tool call costs: a round trip, and the result
            in the context); after N of them it adds the amounts it was shown.
  code      the model writes one cell that loops over the tool and prints the total; the
            records stay in the sandbox.

Both final answers must equal the sum recomputed here from the fixture's formula. Counted per
run: model calls; request bytes (every request body runcell POSTed, JSON, whole: the system
prompt, the tool definitions and the conversation so far are resent on every call); the
conversation's message text in the last request; completion bytes (what the stand-in
answered: the assistant's text and tool-call arguments); cells run; wall time. "tokens≈" is
bytes / 4, a rough rule for English and code, not a tokenizer's count.
"""
import hashlib, http.server, json, os, re, shutil, subprocess, sys, tempfile, threading, time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/debug/runcell")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
runtimes = os.environ.get("RUNTIMES", os.path.join(root, "target/tmp/runcell-test-runtimes/runtimes"))
server_py = os.path.join(root, "crates/cli/tests/fixtures/records_mcp_server.py")
requirements = os.path.join(root, "crates/server/tests/mcp-clients/requirements.txt")


def amount_cents(i):  # records_mcp_server.py's record(i).amount_cents
    return (i * 7919) % 10_000 + 100


def mcp_python():
    if os.environ.get("MCP_PYTHON"):
        return os.environ["MCP_PYTHON"]
    pin = open(requirements).read().strip()
    key = re.sub(r"[^A-Za-z0-9.]", "-", pin)[:80]
    venv = os.path.join(root, "target", f"mcp-sdk-{key}", "venv")
    if not os.path.exists(os.path.join(venv, "bin/python")):
        venv = os.path.join(root, "target/tmp/bench-mcp-sdk/venv")
        if not os.path.exists(os.path.join(venv, "bin/python")):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            subprocess.run([os.path.join(venv, "bin/python"), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", "-r", requirements], check=True)
    return os.path.join(venv, "bin/python")


def call(code):
    return {"role": "assistant", "content": None, "tool_calls": [{
        # A fixed-width id from the code (str hash() changes per process: bytes would too).
        "id": "call_" + hashlib.sha256(code.encode()).hexdigest()[:8], "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})}}]}


def text(t):
    return {"role": "assistant", "content": t}


def completion_bytes(message):
    out = len((message.get("content") or "").encode())
    for c in message.get("tool_calls") or ():
        out += len(c["function"]["arguments"].encode())
    return out


def per_call(step, messages):
    if step < n:
        return call(f"from runcell_tools.mcp import records\nprint(records.get_record(id={step + 1}))")
    # The model adds what it was shown: every record is in its context.
    seen = [int(m) for t in messages if t["role"] == "tool"
            for m in re.findall(r"'amount_cents': (\d+)", t["content"] or "")]
    return text(f"The {len(seen)} records add up to {sum(seen)} cents.")


def code(step, messages):
    if step == 0:
        return call("from runcell_tools.mcp import records\ntotal = 0\n"
                    f"for i in range(1, {n + 1}):\n    total += records.get_record(id=i)['amount_cents']\n"
                    "print(f'TOTAL={total}')")
    printed = [t["content"] for t in messages if t["role"] == "tool"][-1]
    total = re.search(r"TOTAL=(\d+)", printed).group(1)
    return text(f"The {n} records add up to {total} cents.")


def stand_in(script, seen):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers["content-length"]))
            body = json.loads(raw)
            message = script(len(seen), body["messages"])
            seen.append({"request_bytes": len(raw), "body": body,
                         "completion_bytes": completion_bytes(message)})
            reply = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "choices": [{
                "index": 0, "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def run(name, script, python):
    seen = []
    httpd = stand_in(script, seen)
    data = tempfile.mkdtemp(prefix="runcell-bench-code-mode-", dir=os.path.join(root, "target/tmp"))
    os.symlink(runtimes, os.path.join(data, "runtimes"))
    env = dict(os.environ, RUNCELL_DATA_DIR=data, OPENAI_API_KEY="bench", NO_COLOR="1")
    t0 = time.monotonic()
    out = subprocess.run(
        [binary, "ask", f"Look up records 1 to {n} and report the total amount.",
         "--provider", "openai", "--model", "scripted", "--base-url",
         f"http://127.0.0.1:{httpd.server_address[1]}/v1", "--max-steps", str(n + 2),
         "--mcp-server", f"records='{python}' '{server_py}'", "--out", os.path.join(data, "out")],
        env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    httpd.shutdown()
    shutil.rmtree(data, ignore_errors=True)
    if out.returncode != 0:
        sys.exit(f"{name}: runcell ask failed ({out.returncode}):\n{out.stderr}")
    want = f"The {n} records add up to {sum(amount_cents(i) for i in range(1, n + 1))} cents."
    if out.stdout.strip() != want:
        sys.exit(f"{name}: answer {out.stdout.strip()!r}, expected {want!r}")
    last = seen[-1]["body"]["messages"]
    return {
        "model calls": len(seen),
        "request bytes": sum(s["request_bytes"] for s in seen),
        "last request bytes": seen[-1]["request_bytes"],
        "conversation text": sum(len((m.get("content") or "").encode()) for m in last[1:]),
        "completion bytes": sum(s["completion_bytes"] for s in seen),
        "cells": sum(1 for m in last if m["role"] == "tool"),
        "wall s": round(wall, 2),
    }


def main():
    python = mcp_python()
    results = {"per-call": run("per-call", per_call, python), "code": run("code", code, python)}
    a, b = results["per-call"], results["code"]
    print(f"task: look up {n} records with an MCP tool (records.get_record), report the total")
    print(f"{'':22}{'per-call':>12}{'code mode':>12}{'ratio':>9}")
    for k in a:
        ratio = a[k] / b[k] if b[k] else float("inf")
        print(f"{k:22}{a[k]:>12}{b[k]:>12}{ratio:>8.1f}x")
    for k in ("request bytes", "completion bytes"):
        print(f"{k.split()[0]} tokens≈ (bytes/4): per-call {a[k] // 4}, code mode {b[k] // 4}")


if __name__ == "__main__":
    main()
