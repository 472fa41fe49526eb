"""Mistral's official Python SDK (mistralai) against runcell's /mistral prefix, as an
application written for Mistral's code interpreter agents uses it: only server_url and
api_key change.

Usage: mistral_client.py SCENARIO BASE_URL API_KEY [ARG]

Each scenario reads the replies through the SDK's typed models, asserts what they must
show, then prints one JSON object of what it saw.
"""

import json
import sys

import mistralai
from mistralai.client import Mistral
from mistralai.client.errors import HTTPValidationError, MistralError
from mistralai.client.models import (
    ConversationResponse,
    MessageOutputEntry,
    TextChunk,
    ToolExecutionEntry,
    ToolFileChunk,
)

MODEL = "mistral-medium-2505"
TOOLS = [{"type": "code_interpreter"}]


def coding_agent(c):
    return c.beta.agents.create(
        model=MODEL,
        name="Coding Agent",
        description="Agent used to execute code using the interpreter tool.",
        instructions="Use the code interpreter tool when you have to run code.",
        tools=TOOLS,
        completion_args={"temperature": 0.3, "top_p": 0.95},
    )


def executions(resp):
    assert isinstance(resp, ConversationResponse), resp
    return [o for o in resp.outputs if isinstance(o, ToolExecutionEntry)]


def messages(resp):
    return [o for o in resp.outputs if isinstance(o, MessageOutputEntry)]


def text_of(entry):
    if isinstance(entry.content, str):
        return entry.content
    return "".join(c.text for c in entry.content if isinstance(c, TextChunk))


def error_of(call):
    try:
        call()
    except HTTPValidationError as e:
        return {"status": e.status_code, "class": "HTTPValidationError", "loc": list(e.data.detail[0].loc)}
    except MistralError as e:
        return {"status": e.status_code, "class": type(e).__name__, "body": json.loads(e.body)}
    raise AssertionError("the call did not fail")


def fibonacci(c, _):
    """The seed: an agent with the code interpreter, a conversation, a follow-up."""
    agent = coding_agent(c)
    resp = c.beta.conversations.start(agent_id=agent.id, inputs="Run a fibonacci function for the first 20 values.")
    run = executions(resp)[0]
    follow = c.beta.conversations.append(conversation_id=resp.conversation_id, inputs="Now sum them")
    history = c.beta.conversations.get_history(conversation_id=resp.conversation_id)
    conv = c.beta.conversations.get(conversation_id=resp.conversation_id)
    return {
        "agent": [agent.id, agent.name, agent.tools[0].type],
        "types": [o.type for o in resp.outputs],
        "name": run.name,
        "code": run.info["code"],
        "code_output": run.info["code_output"],
        "arguments": json.loads(run.arguments),
        "answer": text_of(messages(resp)[-1]),
        "usage": [resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens],
        "follow_output": executions(follow)[0].info["code_output"],
        "follow_answer": text_of(messages(follow)[-1]),
        "same": follow.conversation_id == resp.conversation_id,
        "history": [e.type for e in history.entries],
        "conversation": [conv.id, getattr(conv, "agent_id", None)],
        "sdk": mistralai.__version__ if hasattr(mistralai, "__version__") else None,
    }


def linear(c, _):
    """A conversation from a model and its tools, streamed."""
    events = list(
        c.beta.conversations.start_stream(
            model=MODEL,
            tools=TOOLS,
            instructions="Solve with numpy.",
            inputs="Solve the linear system x + y + z = 6, 2y + 5z = -4, 2x + 5y - z = 27",
        )
    )
    kinds = [e.event for e in events]
    started = events[0].data
    done = [e.data for e in events if e.event == "tool.execution.done"]
    deltas = [e.data.content for e in events if e.event == "message.output.delta"]
    history = c.beta.conversations.get_history(conversation_id=started.conversation_id)
    return {
        "events": kinds,
        "code_output": done[0].info["code_output"],
        "answer": "".join(d for d in deltas if isinstance(d, str)),
        "usage": events[-1].data.usage.total_tokens,
        "history": [e.type for e in history.entries],
    }


def chart(c, _):
    """A figure is a tool_file chunk, downloaded through the Files API."""
    agent = coding_agent(c)
    resp = c.beta.conversations.start(agent_id=agent.id, inputs="Draw a bar chart of sales per region")
    msg = messages(resp)[-1]
    files = [ch for ch in msg.content if isinstance(ch, ToolFileChunk)]
    assert files, msg
    data = c.files.download(file_id=files[0].file_id).read()
    return {
        "chunks": [ch.type for ch in msg.content],
        "tool": files[0].tool,
        "file_name": files[0].file_name,
        "png": data[:8] == b"\x89PNG\r\n\x1a\n",
        "answer": text_of(msg),
    }


def errors(c, other):
    out = {
        "tool": error_of(lambda: c.beta.agents.create(model=MODEL, name="x", tools=[{"type": "web_search"}])),
        "agent": error_of(lambda: c.beta.conversations.start(agent_id="ag_nosuch", inputs="hi")),
        "conversation": error_of(lambda: c.beta.conversations.append(conversation_id="conv_nosuch", inputs="hi")),
    }
    if other:
        out["other_tenant"] = error_of(lambda: c.beta.conversations.append(conversation_id=other, inputs="hi"))
    return out


def started(c, _):
    resp = c.beta.conversations.start(model=MODEL, tools=TOOLS, inputs="Calculate 6 times 7")
    return {"id": resp.conversation_id}


def approval(c, _):
    """Each cell waits until the test's reviewer answers it at /v1/approvals; the request asks
    with the SDK's per-call http_headers."""
    resp = c.beta.conversations.start(
        model=MODEL,
        tools=TOOLS,
        inputs="Review each cell",
        http_headers={"runcell-approval": "always"},
    )
    runs = executions(resp)
    return {
        "codes": [r.info["code"] for r in runs],
        "outputs": [r.info["code_output"] for r in runs],
        "answer": text_of(messages(resp)[-1]),
    }


SCENARIOS = {f.__name__: f for f in [fibonacci, linear, chart, errors, started, approval]}

if __name__ == "__main__":
    scenario, base, key = sys.argv[1:4]
    arg = sys.argv[4] if len(sys.argv) > 4 else None
    c = Mistral(api_key=key, server_url=base)
    print(json.dumps(SCENARIOS[scenario](c, arg)))
