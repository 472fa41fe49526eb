"""Google's official Gen AI SDK (google-genai) against runcell's /gemini prefix, as an
application written for Gemini's hosted code execution uses it: only base_url and api_key
change.

Usage: gemini_client.py SCENARIO BASE_URL API_KEY [ARG]

Each scenario reads the replies through the SDK's typed models, asserts what they must
show, then prints one JSON object of what it saw.
"""

import json
import sys

from google import genai
from google.genai import types

MODEL = "gemini-2.5-flash"
CODE = [types.Tool(code_execution=types.ToolCodeExecution())]


def client(base, key, version=None):
    opts = types.HttpOptions(base_url=base, api_version=version) if version else types.HttpOptions(base_url=base)
    return genai.Client(api_key=key, http_options=opts)


def parts_of(resp):
    parts = resp.candidates[0].content.parts
    assert all(isinstance(p, types.Part) for p in parts), parts
    return parts


def kinds(parts):
    out = []
    for p in parts:
        if p.executable_code is not None:
            out.append("executable_code")
        elif p.code_execution_result is not None:
            out.append("code_execution_result")
        elif p.inline_data is not None:
            out.append("inline_data")
        elif p.text is not None:
            out.append("text")
    return out


def error_of(call):
    try:
        call()
    except Exception as e:  # both of the SDK's error families
        code = getattr(e, "code", None) or getattr(e, "status_code", None)
        body = getattr(e, "body", None)
        if isinstance(body, (bytes, str)):
            body = json.loads(body)
        status = getattr(e, "status", None)
        if not isinstance(status, str) and isinstance(body, dict):
            status = body.get("error", {}).get("status")
        return {"code": code, "status": status, "class": type(e).__name__}
    raise AssertionError("the call did not fail")


def fibonacci(c, _):
    """The Interactions API, as the seed uses it, then a follow-up in the same chain."""
    first = c.interactions.create(
        model="gemini-3-flash-preview",
        input="Calculate the first 20 Fibonacci numbers",
        tools=[{"type": "code_execution"}],
    )
    assert first.status == "completed", first
    calls = [s for s in first.steps if s.type == "code_execution_call"]
    results = [s for s in first.steps if s.type == "code_execution_result"]
    assert calls and results and results[0].call_id == calls[0].id, first.steps
    follow = c.interactions.create(
        model="gemini-3-flash-preview",
        input="Now sum them",
        tools=[{"type": "code_execution"}],
        previous_interaction_id=first.id,
    )
    again = c.interactions.get(first.id)
    return {
        "steps": [s.type for s in first.steps],
        "code": calls[0].arguments.code,
        "language": calls[0].arguments.language,
        "result": results[0].result,
        "is_error": results[0].is_error,
        "answer": first.output_text,
        "usage": [first.usage.total_input_tokens, first.usage.total_output_tokens, first.usage.total_tokens],
        "follow_answer": follow.output_text,
        "follow_previous": follow.previous_interaction_id,
        "retrieved": [again.id, again.output_text],
        "sdk": genai.__version__,
    }


def sales(c, _):
    """generateContent with the code execution tool, then a chat whose second turn uses what
    the first computed (the same session)."""
    prompt = (
        "Monthly sales were Jan 120, Feb 135, Mar 128, Apr 160, May 172, Jun 155. "
        "Compute the mean, median and standard deviation of the monthly sales"
    )
    resp = c.models.generate_content(
        model=MODEL, contents=prompt, config=types.GenerateContentConfig(tools=CODE)
    )
    parts = parts_of(resp)
    chat = c.chats.create(model=MODEL, config=types.GenerateContentConfig(tools=CODE))
    chat.send_message(prompt)
    second = chat.send_message("Which months were above the mean?")
    return {
        "kinds": kinds(parts),
        "code": resp.executable_code,
        "outcome": parts[1].code_execution_result.outcome.value,
        "output": resp.code_execution_result,
        "answer": resp.text,
        "finish": resp.candidates[0].finish_reason.value,
        "usage": [resp.usage_metadata.prompt_token_count, resp.usage_metadata.total_token_count],
        "follow_kinds": kinds(parts_of(second)),
        "follow_output": second.code_execution_result,
        "follow_answer": second.text,
    }


def sales_file(c, _):
    """Code execution with file input: a CSV sent inline, read by the code."""
    csv = b"month,sales\nJan,120\nFeb,135\nMar,128\nApr,160\nMay,172\nJun,155\n"
    resp = c.models.generate_content(
        model=MODEL,
        contents=[
            "Compute the mean, median and standard deviation of the monthly sales in this file",
            types.Part.from_bytes(data=csv, mime_type="text/csv"),
        ],
        config=types.GenerateContentConfig(tools=CODE),
    )
    return {"code": resp.executable_code, "output": resp.code_execution_result, "answer": resp.text}


def chart(c, version):
    """A bar chart comes back as an inline PNG part; under /v1beta when asked."""
    c = client(c._base, c._key, version or None)
    resp = c.models.generate_content(
        model=MODEL,
        contents="Draw a bar chart of sales per region",
        config=types.GenerateContentConfig(tools=CODE),
    )
    parts = parts_of(resp)
    images = [p.inline_data for p in parts if p.inline_data is not None]
    assert images, parts
    return {
        "kinds": kinds(parts),
        "mime": images[0].mime_type,
        "png": images[0].data[:8] == b"\x89PNG\r\n\x1a\n",
        "bytes": len(images[0].data),
        "answer": resp.text,
    }


def palindrome(c, _):
    """Streamed (`alt=sse`): the first check fails on "Madam", the model retries."""
    chunks = list(
        c.models.generate_content_stream(
            model=MODEL,
            contents="Write a palindrome check and test it on 'racecar', 'Madam' and 'hello'",
            config=types.GenerateContentConfig(tools=CODE),
        )
    )
    parts = [p for ch in chunks for p in (ch.candidates[0].content.parts or [])]
    outcomes = [p.code_execution_result.outcome.value for p in parts if p.code_execution_result]
    outputs = [p.code_execution_result.output for p in parts if p.code_execution_result]
    return {
        "chunks": len(chunks),
        "kinds": kinds(parts),
        "outcomes": outcomes,
        "outputs": outputs,
        "answer": "".join(p.text for p in parts if p.text),
        "finish": chunks[-1].candidates[0].finish_reason.value,
    }


def linear(c, _):
    """A streamed interaction (`stream=True`), then a follow-up in its chain."""
    events = list(
        c.interactions.create(
            model="gemini-3-flash-preview",
            input="Solve the linear system x + y + z = 6, 2y + 5z = -4, 2x + 5y - z = 27",
            tools=[{"type": "code_execution"}],
            stream=True,
        )
    )
    kinds = [e.event_type for e in events]
    starts = [e.step.type for e in events if e.event_type == "step.start"]
    text = "".join(e.delta.text for e in events if e.event_type == "step.delta" and e.delta.type == "text")
    done = events[-1].interaction
    result = [s for s in done.steps if s.type == "code_execution_result"][0]
    follow = c.interactions.create(
        model="gemini-3-flash-preview",
        input="Check it",
        tools=[{"type": "code_execution"}],
        previous_interaction_id=done.id,
    )
    return {
        "events": kinds,
        "starts": starts,
        "text": text,
        "status": done.status,
        "result": result.result,
        "follow_answer": follow.output_text,
    }


def outcomes(c, prompt):
    """One generateContent call: each run's outcome and output, and the answer."""
    resp = c.models.generate_content(model=MODEL, contents=prompt, config=types.GenerateContentConfig(tools=CODE))
    parts = parts_of(resp)
    return {
        "outcomes": [p.code_execution_result.outcome.value for p in parts if p.code_execution_result],
        "outputs": [p.code_execution_result.output for p in parts if p.code_execution_result],
        "answer": resp.text,
    }


def errors(c, other):
    """Gemini's error envelope for bad requests, through the SDK's own errors."""
    out = {}
    out["tool"] = error_of(
        lambda: c.models.generate_content(
            model=MODEL,
            contents="hi",
            config=types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())]),
        )
    )
    out["interaction_tool"] = error_of(
        lambda: c.interactions.create(model=MODEL, input="hi", tools=[{"type": "google_search"}])
    )
    out["previous"] = error_of(
        lambda: c.interactions.create(
            model=MODEL, input="hi", tools=[{"type": "code_execution"}], previous_interaction_id="int_nosuch"
        )
    )
    if other:
        out["other_tenant"] = error_of(lambda: c.interactions.get(other))
    return out


def wrong_key(c, _):
    return {
        "generate": error_of(lambda: c.models.generate_content(model=MODEL, contents="hi")),
        "interaction": error_of(lambda: c.interactions.create(model=MODEL, input="hi")),
    }


def started(c, _):
    """An interaction to look up with another key."""
    i = c.interactions.create(model=MODEL, input="Calculate 6 times 7", tools=[{"type": "code_execution"}])
    return {"id": i.id}


def approval(c, how):
    """Each cell waits until the test's reviewer answers it at /v1/approvals; the request asks
    through the SDK's per-request http_options: a header (`header`) or a body field (`body`)."""
    if how == "header":
        opts = types.HttpOptions(headers={"runcell-approval": "always"})
    else:
        opts = types.HttpOptions(extra_body={"approval": "always"})
    resp = c.models.generate_content(
        model=MODEL,
        contents="Review each cell",
        config=types.GenerateContentConfig(tools=CODE, http_options=opts),
    )
    parts = parts_of(resp)
    return {
        "codes": [p.executable_code.code for p in parts if p.executable_code is not None],
        "results": [
            [p.code_execution_result.outcome.value, p.code_execution_result.output]
            for p in parts
            if p.code_execution_result is not None
        ],
        "answer": "".join(p.text for p in parts if p.text is not None),
    }


SCENARIOS = {f.__name__: f for f in [fibonacci, sales, sales_file, chart, palindrome, linear, outcomes, errors, wrong_key, started, approval]}

if __name__ == "__main__":
    scenario, base, key = sys.argv[1:4]
    arg = sys.argv[4] if len(sys.argv) > 4 else None
    c = client(base, key)
    c._base, c._key = base, key
    print(json.dumps(SCENARIOS[scenario](c, arg)))
