"""Anthropic's official Python SDK against runcell's /anthropic prefix, as an application
written for Anthropic's hosted code execution tool uses it: only base_url and api_key change.

Usage: anthropic_client.py SCENARIO BASE_URL API_KEY

Responses are validated strictly against the SDK's typed models (a block of the wrong shape
raises), and each scenario asserts what the SDK's types must show, then prints one JSON object
of what it saw for the Rust test to check against the numbers the code really computed.
"""

import json
import sys

import anthropic
from anthropic import Anthropic
from anthropic.types import (
    BashCodeExecutionOutputBlock,
    BashCodeExecutionResultBlock,
    BashCodeExecutionToolResultBlock,
    CodeExecutionOutputBlock,
    CodeExecutionResultBlock,
    CodeExecutionToolResultBlock,
    ServerToolUseBlock,
    TextBlock,
    ToolUseBlock,
)
from anthropic.types.code_execution_tool_result_error_object import CodeExecutionToolResultErrorObject
from anthropic.types.text_editor_code_execution_create_result_block import (
    TextEditorCodeExecutionCreateResultBlock,
)
from anthropic.types.text_editor_code_execution_str_replace_result_block import (
    TextEditorCodeExecutionStrReplaceResultBlock,
)
from anthropic.types.text_editor_code_execution_tool_result_block import (
    TextEditorCodeExecutionToolResultBlock,
)
from anthropic.types.text_editor_code_execution_tool_result_error_object import (
    TextEditorCodeExecutionToolResultErrorObject,
)
from anthropic.types.text_editor_code_execution_view_result_block import (
    TextEditorCodeExecutionViewResultBlock,
)

MODEL = "claude-sonnet-5-5"
V2025 = [{"type": "code_execution_20250825", "name": "code_execution"}]
V2026 = [{"type": "code_execution_20260120", "name": "code_execution"}]
V202605 = [{"type": "code_execution_20260521", "name": "code_execution"}]


def client(base, key):
    # Strict: every response must parse into the SDK's models. No retries: an error is final.
    return Anthropic(base_url=base, api_key=key, max_retries=0, _strict_response_validation=True)


def text_of(msg):
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def of_type(msg, cls):
    return [b for b in msg.content if isinstance(b, cls)]


def fibonacci(c):
    msg = c.messages.create(
        model=MODEL,
        max_tokens=1024,
        tools=V2025,
        messages=[{"role": "user", "content": "Calculate the first 10 Fibonacci numbers"}],
    )
    assert msg.stop_reason == "end_turn", msg
    uses = of_type(msg, ServerToolUseBlock)
    results = of_type(msg, BashCodeExecutionToolResultBlock)
    assert len(uses) == 1 and len(results) == 1, msg
    assert results[0].tool_use_id == uses[0].id
    assert isinstance(results[0].content, BashCodeExecutionResultBlock), results[0]
    assert msg.container is not None and msg.container.id.startswith("container_")
    # The conversation goes on in the same container: the earlier blocks are sent back.
    follow = c.messages.create(
        model=MODEL,
        max_tokens=1024,
        tools=V2025,
        container=msg.container.id,
        messages=[
            {"role": "user", "content": "Calculate the first 10 Fibonacci numbers"},
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": "Now the 30th one"},
        ],
    )
    assert follow.container.id == msg.container.id
    follow_results = of_type(follow, BashCodeExecutionToolResultBlock)
    return {
        "answer": text_of(msg),
        "tool": uses[0].name,
        "command": uses[0].input.get("command"),
        "stdout": results[0].content.stdout,
        "return_code": results[0].content.return_code,
        "container": msg.container.id,
        "expires_at": msg.container.expires_at.isoformat(),
        "usage": [msg.usage.input_tokens, msg.usage.output_tokens],
        "model": msg.model,
        "follow_answer": text_of(follow),
        "follow_stdout": follow_results[0].content.stdout,
    }


def sales(c):
    csv = "month,sales\nJan,1200\nFeb,1350\nMar,980\nApr,1610\nMay,1475\nJun,1720\n"
    f = c.files.upload(file=("sales.csv", csv.encode(), "text/csv"))
    assert f.type == "file" and f.filename == "sales.csv" and f.size_bytes == len(csv), f
    msg = c.messages.create(
        model=MODEL,
        max_tokens=1024,
        tools=V2026,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compute summary statistics of the monthly sales"},
                    {"type": "container_upload", "file_id": f.id},
                ],
            }
        ],
    )
    results = of_type(msg, CodeExecutionToolResultBlock)
    assert len(results) == 1, msg
    assert isinstance(results[0].content, CodeExecutionResultBlock), results[0]
    return {
        "answer": text_of(msg),
        "stdout": results[0].content.stdout,
        "return_code": results[0].content.return_code,
        "container": msg.container.id,
    }


def chart(c):
    msg = c.messages.create(
        model=MODEL,
        max_tokens=1024,
        tools=V2025,
        messages=[{"role": "user", "content": "Draw a bar chart of sales per region"}],
    )
    results = of_type(msg, BashCodeExecutionToolResultBlock)
    assert isinstance(results[0].content, BashCodeExecutionResultBlock), results[0]
    outputs = results[0].content.content
    assert outputs and all(isinstance(o, BashCodeExecutionOutputBlock) for o in outputs), outputs
    files = []
    for o in outputs:
        meta = c.files.retrieve_metadata(o.file_id)
        data = c.files.download(o.file_id).read()
        files.append(
            {
                "id": o.file_id,
                "filename": meta.filename,
                "mime_type": meta.mime_type,
                "size_bytes": meta.size_bytes,
                "downloaded": len(data),
                "png": data[:8] == b"\x89PNG\r\n\x1a\n",
            }
        )
    return {"answer": text_of(msg), "files": files, "stdout": results[0].content.stdout}


def palindrome(c):
    msg = c.messages.create(
        model=MODEL,
        max_tokens=2048,
        tools=V2025,
        messages=[{"role": "user", "content": "Write a palindrome check and test it on racecar and Madam"}],
    )
    editor = of_type(msg, TextEditorCodeExecutionToolResultBlock)
    bash = of_type(msg, BashCodeExecutionToolResultBlock)
    kinds = [type(b.content).__name__ for b in editor]
    create = [b.content for b in editor if isinstance(b.content, TextEditorCodeExecutionCreateResultBlock)]
    replace = [b.content for b in editor if isinstance(b.content, TextEditorCodeExecutionStrReplaceResultBlock)]
    view = [b.content for b in editor if isinstance(b.content, TextEditorCodeExecutionViewResultBlock)]
    errors = [b.content for b in editor if isinstance(b.content, TextEditorCodeExecutionToolResultErrorObject)]
    assert create and replace and view and errors, kinds
    return {
        "answer": text_of(msg),
        "kinds": kinds,
        "is_file_update": create[0].is_file_update,
        "replace_lines": replace[0].lines,
        "replace_start": replace[0].old_start,
        "view": view[0].content,
        "view_total_lines": view[0].total_lines,
        "error_code": errors[0].error_code,
        "runs": [b.content.stdout for b in bash],
    }


def linear(c):
    """The linear system, streamed: the SDK's stream helper accumulates the events."""
    with c.messages.stream(
        model=MODEL,
        max_tokens=1024,
        tools=V202605,
        messages=[{"role": "user", "content": "Solve 2x + y = 5 and x - y = 1"}],
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    results = of_type(final, CodeExecutionToolResultBlock)
    assert isinstance(results[0].content, CodeExecutionResultBlock), results[0]
    uses = of_type(final, ServerToolUseBlock)
    # The raw events, as `stream=True` yields them.
    raw = [
        e.type
        for e in c.messages.create(
            model=MODEL,
            max_tokens=1024,
            tools=V202605,
            stream=True,
            messages=[{"role": "user", "content": "Solve 2x + y = 5 and x - y = 1"}],
        )
    ]
    return {
        "answer": text_of(final),
        "stdout": results[0].content.stdout,
        "code": uses[0].input.get("code"),
        "events": events,
        "raw_events": raw,
        "stop_reason": final.stop_reason,
        "container": final.container.id if final.container else None,
    }


def state(c):
    first = c.messages.create(
        model=MODEL, max_tokens=512, tools=V2026,
        messages=[{"role": "user", "content": "Set x to 42"}],
    )
    again = c.messages.create(
        model=MODEL, max_tokens=512, tools=V2026, container=first.container.id,
        messages=[{"role": "user", "content": "Use x"}],
    )
    # The object form of `container` names it too.
    object_form = c.messages.create(
        model=MODEL, max_tokens=512, tools=V2026, container={"id": first.container.id},
        messages=[{"role": "user", "content": "Use x"}],
    )
    fresh = c.messages.create(
        model=MODEL, max_tokens=512, tools=V2026,
        messages=[{"role": "user", "content": "Use x"}],
    )
    out = lambda m: of_type(m, CodeExecutionToolResultBlock)[0].content
    return {
        "containers": [m.container.id for m in (first, again, object_form, fresh)],
        "again": [out(again).stdout, out(again).return_code],
        "object_form": out(object_form).stdout,
        "fresh": [out(fresh).stderr, out(fresh).return_code],
    }


def tool_use(c):
    """A tool the client runs itself: the reply stops for it, and the result goes back."""
    tools = V2026 + [
        {
            "name": "record_result",
            "description": "Record a result in the client's database",
            "input_schema": {"type": "object", "properties": {"value": {"type": "number"}}},
        }
    ]
    ask = [{"role": "user", "content": "Compute 6*7 and record it"}]
    first = c.messages.create(model=MODEL, max_tokens=512, tools=tools, messages=ask)
    assert first.stop_reason == "tool_use", first
    call = of_type(first, ToolUseBlock)[0]
    done = c.messages.create(
        model=MODEL,
        max_tokens=512,
        tools=tools,
        container=first.container.id,
        messages=ask
        + [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "recorded as #7"}]},
        ],
    )
    return {
        "call": [call.name, call.input],
        "computed": of_type(first, CodeExecutionToolResultBlock)[0].content.stdout,
        "answer": text_of(done),
        "stop_reason": done.stop_reason,
    }


def files(c):
    f = c.files.upload(file=("notes.txt", b"hello files\n", "text/plain"))
    g = c.beta.files.upload(file=("more.txt", b"beta\n", "text/plain"))
    listed = [x.id for x in c.files.list()]
    beta_listed = [x.id for x in c.beta.files.list()]
    # Pages of one file each, followed by the SDK's own paging.
    paged = [x.id for x in c.files.list(limit=1)]
    meta = c.files.retrieve_metadata(f.id)
    body = c.files.download(f.id).read()
    deleted = c.files.delete(f.id)
    try:
        c.files.retrieve_metadata(f.id)
        gone = None
    except anthropic.NotFoundError as e:
        gone = [e.status_code, e.body["error"]["type"]]
    c.beta.files.delete(g.id)
    return {
        "uploaded": [f.id, g.id],
        "listed": listed,
        "beta_listed": beta_listed,
        "paged": paged,
        "meta": [meta.filename, meta.mime_type, meta.size_bytes, meta.downloadable],
        "body": body.decode(),
        "deleted": [deleted.id, deleted.type],
        "gone": gone,
        "after": [x.id for x in c.files.list()],
    }


def errors(c):
    out = {}

    def expect(name, call):
        try:
            call()
            out[name] = None
        except anthropic.APIStatusError as e:
            out[name] = {
                "class": type(e).__name__,
                "status": e.status_code,
                "type": e.type,
                "message": e.api_message,
                "request_id": e.request_id,
                "envelope": e.body.get("type") if isinstance(e.body, dict) else None,
            }

    ask = [{"role": "user", "content": "hi"}]
    expect("unknown_tool", lambda: c.messages.create(
        model=MODEL, max_tokens=64, messages=ask,
        tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    expect("bad_container", lambda: c.messages.create(
        model=MODEL, max_tokens=64, messages=ask, tools=V2025, container="container_nosuchthing"))
    expect("malformed_container", lambda: c.messages.create(
        model=MODEL, max_tokens=64, messages=ask, tools=V2025, container="../../etc"))
    expect("missing_max_tokens", lambda: c.post(
        "/v1/messages", cast_to=object, body={"model": MODEL, "messages": ask}))
    expect("bad_role", lambda: c.post(
        "/v1/messages", cast_to=object,
        body={"model": MODEL, "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}))
    expect("no_such_file", lambda: c.files.retrieve_metadata("file_nosuchfile"))
    expect("no_such_upload", lambda: c.messages.create(
        model=MODEL, max_tokens=64, tools=V2025,
        messages=[{"role": "user", "content": [{"type": "container_upload", "file_id": "file_missing"}]}]))
    expect("unknown_route", lambda: c.get("/v1/nothing/here", cast_to=object))
    big = b"\0" * ((100 << 20) + 1)
    expect("too_large", lambda: c.files.upload(file=("big.bin", big, "application/octet-stream")))
    return out


def wrong_key(c):
    out = {}
    try:
        c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    except anthropic.AuthenticationError as e:
        out["messages"] = [e.status_code, e.type, e.api_message]
    try:
        c.files.list()
    except anthropic.AuthenticationError as e:
        out["files"] = [e.status_code, e.type]
    return out


def approval(c, how="body"):
    """Each cell waits until the test's reviewer answers it at /v1/approvals. `how` says how
    the request asks: `body` (extra_body), `header` (extra_headers), `key` (nothing: the key's
    default), each optionally `-stream` (the SDK's stream helper)."""
    kwargs = {}
    if how.startswith("body"):
        kwargs["extra_body"] = {"approval": "always"}
    elif how.startswith("header"):
        kwargs["extra_headers"] = {"runcell-approval": "always"}
    args = dict(
        model=MODEL,
        max_tokens=1024,
        tools=V2026,
        messages=[{"role": "user", "content": "Review each cell"}],
        **kwargs,
    )
    events = []
    if how.endswith("-stream"):
        with c.messages.stream(**args) as stream:
            events = [e.type for e in stream]
            msg = stream.get_final_message()
    else:
        msg = c.messages.create(**args)
    uses = of_type(msg, ServerToolUseBlock)
    results = of_type(msg, CodeExecutionToolResultBlock)
    assert len(uses) == len(results), msg
    for u, r in zip(uses, results):
        assert r.tool_use_id == u.id, msg
        assert isinstance(r.content, CodeExecutionResultBlock), r
    return {
        "answer": text_of(msg),
        "codes": [u.input.get("code") for u in uses],
        "stdout": [r.content.stdout for r in results],
        "stderr": [r.content.stderr for r in results],
        "return_codes": [r.content.return_code for r in results],
        "events": sorted(set(events)),
        "stop_reason": msg.stop_reason,
        "container": msg.container.id if msg.container else None,
    }


def approval_refused(c, *_):
    """What the SDK raises when a request's `approval` is refused: a word it does not know,
    and `never` on a key whose default is `always` (a floor)."""
    out = {}
    for name, extra in [
        ("bad_word", {"extra_body": {"approval": "sometimes"}}),
        ("bad_header", {"extra_headers": {"runcell-approval": "yes"}}),
        ("lowered", {"extra_body": {"approval": "never"}}),
        ("lowered_header", {"extra_headers": {"runcell-approval": "never"}}),
    ]:
        try:
            c.messages.create(
                model=MODEL, max_tokens=64, tools=V2026,
                messages=[{"role": "user", "content": "Review each cell"}], **extra,
            )
            out[name] = "no error"
        except anthropic.APIStatusError as e:
            out[name] = [e.status_code, e.body["error"]["type"], e.body["error"]["message"]]
    return out


# Programmatic tool calling: the client's records, which only the client holds.
RECORDS = {
    1: {"name": "Ada Lovelace", "balance": 120},
    2: {"name": "Grace Hopper", "balance": 340},
    3: {"name": "Alan Turing", "balance": 75},
    4: {"name": "Edsger Dijkstra", "balance": 410},
    5: {"name": "Barbara Liskov", "balance": 555},
}
LOOKUP = {
    "name": "lookup",
    "description": "A customer record by id, as JSON",
    "input_schema": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1}},
        "required": ["id"],
    },
    "allowed_callers": ["code_execution_20260120"],
}
NOTIFY = {
    "name": "notify",
    "description": "Send the user a notification",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "allowed_callers": ["direct"],
}
PTC_TOOLS = V2026 + [LOOKUP, NOTIFY]


def ptc_create(c, stream, **kw):
    if stream != "stream":
        return c.messages.create(model=MODEL, max_tokens=1024, tools=PTC_TOOLS, **kw)
    with c.messages.stream(model=MODEL, max_tokens=1024, tools=PTC_TOOLS, **kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert "message_stop" in events, events
    return final


def answer(call, fail=None):
    """The client's own tool: a record, or a failure for the ids in `fail`."""
    if fail and call.input["id"] in fail:
        return {"type": "tool_result", "tool_use_id": call.id, "content": f"record {call.input['id']} is locked", "is_error": True}
    rec = RECORDS.get(call.input["id"])
    return {"type": "tool_result", "tool_use_id": call.id, "content": json.dumps(rec)}


def ptc_run(c, task, stream=None, fail=None, follow_up=None):
    """Answers the code's calls until the turn ends: what each reply held."""
    messages = [{"role": "user", "content": task}]
    msg = ptc_create(c, stream, messages=messages)
    container = msg.container.id
    code_use = of_type(msg, ServerToolUseBlock)
    rounds = []
    replies = [[b.model_dump(exclude_none=True) for b in msg.content] + [{"stop_reason": msg.stop_reason}]]
    while msg.stop_reason == "tool_use":
        calls = of_type(msg, ToolUseBlock)
        assert calls, msg
        for call in calls:
            # The code's calls name the code that made them.
            assert call.caller is not None and call.caller.type == "code_execution_20260120", call
            assert call.caller.tool_id == code_use[0].id, (call, code_use)
        rounds.append([[call.name, call.input] for call in calls])
        messages = messages + [
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": [answer(call, fail) for call in calls]},
        ]
        msg = ptc_create(c, stream, messages=messages, container=container)
        replies.append([b.model_dump(exclude_none=True) for b in msg.content] + [{"stop_reason": msg.stop_reason}])
        assert msg.container.id == container, msg.container
        # Later replies go on with the same code: no new server_tool_use while it runs.
        if msg.stop_reason == "tool_use":
            assert not of_type(msg, ServerToolUseBlock), msg
    results = of_type(msg, CodeExecutionToolResultBlock)
    assert len(results) == 1 and results[0].tool_use_id == code_use[0].id, msg
    assert isinstance(results[0].content, CodeExecutionResultBlock), results[0]
    follow = None
    if follow_up:
        # The whole exchange sent back with a new question: the conversation goes on.
        again = ptc_create(c, stream, container=container, messages=messages + [
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": follow_up},
        ])
        follow = [again.stop_reason, text_of(again)]
    return {
        "follow": follow,
        "rounds": rounds,
        "code": code_use[0].input.get("code"),
        "stdout": results[0].content.stdout,
        "stderr": results[0].content.stderr,
        "return_code": results[0].content.return_code,
        "answer": text_of(msg),
        "stop_reason": msg.stop_reason,
        "container": container,
        "requests": len(rounds) + 1,
        "replies": replies,
    }


def ptc_loop(c, stream=None):
    return ptc_run(c, "Sum the balances of customers 1 to 5", stream, follow_up="What was the total?")


def ptc_gather(c):
    return ptc_run(c, "Name customers 1 to 3 at once")


def ptc_error(c):
    return ptc_run(c, "Look up customer 4", fail={4})


def ptc_undeclared(c):
    return ptc_run(c, "Notify from code")


def ptc_refusals(c):
    """Answers that are not answers: refused in Anthropic's envelope, and nothing changes."""
    out = {}
    ask = [{"role": "user", "content": "Sum the balances of customers 1 to 5"}]
    first = c.messages.create(model=MODEL, max_tokens=1024, tools=PTC_TOOLS, messages=ask)
    other = c.messages.create(model=MODEL, max_tokens=1024, tools=PTC_TOOLS, messages=ask)
    assert first.stop_reason == "tool_use" and other.stop_reason == "tool_use"
    call = of_type(first, ToolUseBlock)[0]
    other_call = of_type(other, ToolUseBlock)[0]

    def attempt(name, content, container, result):
        try:
            c.messages.create(
                model=MODEL, max_tokens=1024, tools=PTC_TOOLS, container=container,
                messages=ask + [{"role": "assistant", "content": content}, {"role": "user", "content": [result]}],
            )
            out[name] = "no error"
        except anthropic.APIStatusError as e:
            out[name] = [e.status_code, e.body["error"]["type"], e.body["error"]["message"]]

    dumped = [b.model_dump(exclude_none=True) for b in first.content]
    # A tool_use id nobody made, in a message that claims the code made it.
    forged = [dict(b, id="toolu_" + "0" * 32) if b["type"] == "tool_use" else b for b in dumped]
    attempt("forged", forged, first.container.id, {"type": "tool_result", "tool_use_id": "toolu_" + "0" * 32, "content": "{}"})
    # A result for an id the previous message does not hold.
    attempt("unexpected", first.content, first.container.id, {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "{}"})
    # The other conversation's real call, answered in this container.
    theirs = [dict(b, id=other_call.id) if b["type"] == "tool_use" else b for b in dumped]
    attempt("other_container", theirs, first.container.id, {"type": "tool_result", "tool_use_id": other_call.id, "content": "{}"})
    # Without the container the call came from.
    attempt("no_container", first.content, None, answer(call))
    # Nothing changed: the real answer still continues the code.
    go_on = c.messages.create(
        model=MODEL, max_tokens=1024, tools=PTC_TOOLS, container=first.container.id,
        messages=ask + [{"role": "assistant", "content": first.content}, {"role": "user", "content": [answer(call)]}],
    )
    out["after"] = [go_on.stop_reason, [b.input for b in of_type(go_on, ToolUseBlock)]]
    return out


def ptc_timeout(c, key):
    """Nobody answers in time: the call raises in the code, and a late answer is refused."""
    import time
    import urllib.request

    ask = [{"role": "user", "content": "Look up customer 1 in a hurry"}]
    first = c.messages.create(
        model=MODEL, max_tokens=1024, tools=PTC_TOOLS, messages=ask, extra_body={"tool_timeout_s": 0.5},
    )
    assert first.stop_reason == "tool_use", first
    call = of_type(first, ToolUseBlock)[0]
    code = of_type(first, ServerToolUseBlock)[0].input["code"]
    # Wait (for as long as it takes) until the cell has ended: runcell's own API lists it.
    native = str(c.base_url).rstrip("/").removesuffix("/anthropic")
    session = first.container.id.replace("container_", "ses_")
    cell = None
    for _ in range(1200):
        req = urllib.request.Request(
            f"{native}/v1/executions?session_id={session}", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(req) as r:
            listed = json.load(r)["executions"]
        cell = next((e for e in listed if e["code"] == code and e["status"] != "waiting"), None)
        if cell:
            break
        time.sleep(0.1)
    assert cell, "the cell never ended"
    try:
        c.messages.create(
            model=MODEL, max_tokens=1024, tools=PTC_TOOLS, container=first.container.id,
            messages=ask + [{"role": "assistant", "content": first.content}, {"role": "user", "content": [answer(call)]}],
        )
        late = "no error"
    except anthropic.APIStatusError as e:
        late = [e.status_code, e.body["error"]["type"], e.body["error"]["message"]]
    try:
        c.messages.create(
            model=MODEL, max_tokens=1024, tools=PTC_TOOLS, messages=ask, extra_body={"tool_timeout_s": 0},
        )
        zero = "no error"
    except anthropic.APIStatusError as e:
        zero = [e.status_code, e.body["error"]["message"]]
    return {"stdout": cell["stdout"], "tool_calls": cell["tool_calls"], "late": late, "zero": zero}


def ptc_mixed(c):
    """One reply with a call of the code and a call of the model: both answered at once."""
    ask = [{"role": "user", "content": "Balance of customer 3, and tell me when you start"}]
    first = c.messages.create(model=MODEL, max_tokens=1024, tools=PTC_TOOLS, messages=ask)
    assert first.stop_reason == "tool_use", first
    calls = of_type(first, ToolUseBlock)
    kinds = [[b.type, getattr(b, "name", None), b.caller.type if getattr(b, "caller", None) else None] for b in first.content]
    results = [
        answer(call) if call.name == "lookup" else {"type": "tool_result", "tool_use_id": call.id, "content": "notified"}
        for call in calls
    ]
    done = c.messages.create(
        model=MODEL, max_tokens=1024, tools=PTC_TOOLS, container=first.container.id,
        messages=ask + [{"role": "assistant", "content": first.content}, {"role": "user", "content": results}],
    )
    out = of_type(done, CodeExecutionToolResultBlock)
    return {"first": kinds, "stdout": out[0].content.stdout if out else None, "answer": text_of(done), "stop_reason": done.stop_reason}


SCENARIOS = {f.__name__: f for f in [fibonacci, sales, chart, palindrome, linear, state, tool_use, files, errors, wrong_key, approval, approval_refused, ptc_loop, ptc_gather, ptc_error, ptc_undeclared, ptc_refusals, ptc_timeout, ptc_mixed]}

if __name__ == "__main__":
    scenario, base, key = sys.argv[1:4]
    report = SCENARIOS[scenario](client(base, key), *sys.argv[4:])
    report["sdk"] = anthropic.__version__
    print(json.dumps(report))
