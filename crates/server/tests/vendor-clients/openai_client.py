"""OpenAI's official Python SDK against runcell's /openai/v1 prefix, as an application written
for OpenAI's hosted code interpreter uses it: only base_url and api_key change.

Usage: openai_client.py SCENARIO BASE_URL API_KEY

Responses are validated strictly against the SDK's typed models, each scenario asserts what
the SDK's types must show, then prints one JSON object of what it saw.
"""

import json
import sys

import openai
from openai import OpenAI
from openai.types.responses import ResponseCodeInterpreterToolCall, ResponseOutputMessage
from openai.types.responses.response_output_text import AnnotationContainerFileCitation

MODEL = "gpt-4.1"
AUTO = [{"type": "code_interpreter", "container": {"type": "auto"}}]


def client(base, key):
    return OpenAI(base_url=base, api_key=key, max_retries=0, _strict_response_validation=True)


def calls(resp):
    out = [o for o in resp.output if isinstance(o, ResponseCodeInterpreterToolCall)]
    assert out, resp
    return out


def logs(call):
    return "".join(o.logs for o in call.outputs or [] if o.type == "logs")


def fibonacci(c):
    first = c.responses.create(model=MODEL, tools=AUTO, input="Calculate the first 10 Fibonacci numbers")
    assert first.status == "completed", first
    call = calls(first)[0]
    assert call.status == "completed" and call.container_id.startswith("cntr_"), call
    follow = c.responses.create(
        model=MODEL, tools=AUTO, input="Now the 30th one", previous_response_id=first.id
    )
    again = c.responses.retrieve(first.id)
    return {
        "answer": first.output_text,
        "code": call.code,
        "logs": logs(call),
        "container": call.container_id,
        "usage": [first.usage.input_tokens, first.usage.output_tokens, first.usage.total_tokens],
        "follow_answer": follow.output_text,
        "follow_container": calls(follow)[0].container_id,
        "follow_previous": follow.previous_response_id,
        "retrieved": [again.id, again.output_text],
        "sdk": openai.__version__,
    }


def chart(c):
    resp = c.responses.create(model=MODEL, tools=AUTO, input="Draw a bar chart of sales per region")
    call = calls(resp)[0]
    messages = [o for o in resp.output if isinstance(o, ResponseOutputMessage)]
    text = messages[-1].content[0]
    cites = [a for a in text.annotations if isinstance(a, AnnotationContainerFileCitation)]
    assert cites, text
    files = []
    for a in cites:
        data = c.containers.files.content.retrieve(a.file_id, container_id=a.container_id).read()
        meta = c.containers.files.retrieve(a.file_id, container_id=a.container_id)
        files.append(
            {
                "file_id": a.file_id,
                "filename": a.filename,
                "cited": text.text[a.start_index : a.end_index],
                "png": data[:8] == b"\x89PNG\r\n\x1a\n",
                "bytes": len(data),
                "meta": [meta.path, meta.bytes, meta.source],
            }
        )
    return {
        "answer": text.text,
        "files": files,
        "container": call.container_id,
        "images": [o.type for o in call.outputs or []],
    }


def containers(c):
    csv = "month,sales\nJan,1200\nFeb,1350\nMar,980\nApr,1610\nMay,1475\nJun,1720\n"
    uploaded = c.files.create(file=("extra.txt", b"from the files api\n"), purpose="user_data")
    box = c.containers.create(
        name="analysis",
        expires_after={"anchor": "last_active_at", "minutes": 5},
        file_ids=[uploaded.id],
    )
    f = c.containers.files.create(box.id, file=("sales.csv", csv.encode()))
    by_id = c.containers.files.create(box.id, file_id=uploaded.id)
    resp = c.responses.create(
        model=MODEL,
        tools=[{"type": "code_interpreter", "container": box.id}],
        input="Compute summary statistics of the monthly sales",
    )
    call = calls(resp)[0]
    listed = [x.path for x in c.containers.files.list(box.id)]
    content = c.containers.files.content.retrieve(f.id, container_id=box.id).read().decode()
    boxes = [x.id for x in c.containers.list()]
    c.containers.files.delete(f.id, container_id=box.id)
    after_delete = [x.path for x in c.containers.files.list(box.id)]
    gone = c.containers.delete(box.id)
    try:
        c.containers.retrieve(box.id)
        retrieved = None
    except openai.NotFoundError as e:
        retrieved = [e.status_code, e.body.get("code") if isinstance(e.body, dict) else None]
    return {
        "container": [box.id, box.name, box.status, box.expires_after.minutes, box.object],
        "file": [f.path, f.bytes, f.source, f.object],
        "by_id": [by_id.path, by_id.bytes],
        "answer": resp.output_text,
        "logs": logs(call),
        "call_container": call.container_id,
        "listed": sorted(listed),
        "content": content,
        "boxes": boxes,
        "after_delete": sorted(after_delete),
        "deleted": gone is not None,
        "retrieved": retrieved,
    }


def palindrome(c):
    resp = c.responses.create(
        model=MODEL, tools=AUTO, input="Write a palindrome check and test it on racecar and Madam"
    )
    return {"answer": resp.output_text, "runs": [logs(x) for x in calls(resp)], "codes": [x.code for x in calls(resp)]}


def linear(c):
    ask = "Solve 2x + y = 5 and x - y = 1"
    with c.responses.stream(model=MODEL, tools=AUTO, input=ask) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    raw = [e.type for e in c.responses.create(model=MODEL, tools=AUTO, input=ask, stream=True)]
    return {
        "answer": final.output_text,
        "logs": logs(calls(final)[0]),
        "events": events,
        "raw_events": raw,
        "status": final.status,
    }


def function_tool(c):
    tools = AUTO + [
        {
            "type": "function",
            "name": "record_result",
            "description": "Record a result",
            "parameters": {"type": "object", "properties": {"value": {"type": "number"}}},
        }
    ]
    first = c.responses.create(model=MODEL, tools=tools, input="Compute 6*7 and record it")
    fc = [o for o in first.output if o.type == "function_call"][0]
    done = c.responses.create(
        model=MODEL,
        tools=tools,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "recorded as #7"}],
    )
    return {"call": [fc.name, json.loads(fc.arguments)], "answer": done.output_text}


def errors(c):
    out = {}

    def expect(name, call):
        try:
            call()
            out[name] = None
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            out[name] = {
                "class": type(e).__name__,
                "status": e.status_code,
                "type": body.get("type"),
                "param": body.get("param"),
                "code": body.get("code"),
                "message": body.get("message"),
            }

    expect("unknown_tool", lambda: c.responses.create(
        model=MODEL, input="hi", tools=[{"type": "web_search_preview"}]))
    expect("bad_container", lambda: c.responses.create(
        model=MODEL, input="hi", tools=[{"type": "code_interpreter", "container": "cntr_nosuchthing"}]))
    expect("bad_previous", lambda: c.responses.create(
        model=MODEL, input="hi", previous_response_id="resp_nosuchthing"))
    expect("no_container", lambda: c.containers.retrieve("cntr_nosuchthing"))
    expect("no_file", lambda: c.containers.create(name="x", file_ids=["file_missing"]))
    expect("bad_memory", lambda: c.containers.create(name="x", memory_limit="3g"))
    expect("unknown_route", lambda: c.get("/nothing/here", cast_to=object))
    box = c.containers.create(name="big")
    big = b"\0" * ((100 << 20) + 1)
    expect("too_large", lambda: c.containers.files.create(box.id, file=("big.bin", big)))
    c.containers.delete(box.id)
    return out


def wrong_key(c):
    try:
        c.containers.list()
        return {}
    except openai.AuthenticationError as e:
        return {"status": e.status_code, "code": e.body.get("code") if isinstance(e.body, dict) else None}


def approval(c, how="body"):
    """Each cell waits until the test's reviewer answers it at /v1/approvals. `how` says how
    the request asks: `body` (extra_body), `header` (extra_headers), `key` (nothing: the key's
    default), each optionally `-stream` (the SDK's stream helper)."""
    kwargs = {}
    if how.startswith("body"):
        kwargs["extra_body"] = {"approval": "always"}
    elif how.startswith("header"):
        kwargs["extra_headers"] = {"runcell-approval": "always"}
    events = []
    if how.endswith("-stream"):
        with c.responses.stream(model=MODEL, tools=AUTO, input="Review each cell", **kwargs) as stream:
            events = [e.type for e in stream]
            resp = stream.get_final_response()
    else:
        resp = c.responses.create(model=MODEL, tools=AUTO, input="Review each cell", **kwargs)
    cs = calls(resp)
    return {
        "answer": resp.output_text,
        "status": resp.status,
        "codes": [x.code for x in cs],
        "logs": [logs(x) for x in cs],
        "statuses": [x.status for x in cs],
        "container": cs[0].container_id,
        "events": sorted(set(events)),
        "id": resp.id,
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
            c.responses.create(model=MODEL, tools=AUTO, input="Review each cell", **extra)
            out[name] = "no error"
        except openai.APIStatusError as e:
            out[name] = [e.status_code, e.body.get("type"), e.body.get("param"), e.body.get("message")]
    return out


SCENARIOS = {f.__name__: f for f in [fibonacci, chart, containers, palindrome, linear, function_tool, errors, wrong_key, approval, approval_refused]}

if __name__ == "__main__":
    scenario, base, key = sys.argv[1:4]
    report = SCENARIOS[scenario](client(base, key), *sys.argv[4:])
    report["sdk"] = openai.__version__
    print(json.dumps(report))
