"""The MCP Python SDK's default client (`mcp.Client`, as its README shows it) against runcell.

Usage: sdk_client.py URL            (streamable HTTP)
       sdk_client.py -- CMD ARGS... (stdio: runs CMD and talks over its stdin/stdout)

Runs a few calls that only work if state persists between them and prints one JSON object:
the negotiated protocol version, and each call's text, error flag and structuredContent.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters

CALLS = [
    ("python", {"code": "secret = 6*7"}),
    ("python", {"code": "secret + 1"}),
    ("bash", {"command": "echo kept > note.txt"}),
    ("text_editor", {"command": "view", "path": "note.txt"}),
]


async def main() -> None:
    if sys.argv[1] == "--":
        target = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:])
    else:
        target = sys.argv[1]
    out = {"calls": []}
    async with Client(target) as client:
        out["protocol_version"] = str(getattr(client, "protocol_version", None))
        for name, args in CALLS:
            r = await client.call_tool(name, args)
            out["calls"].append(
                {
                    "tool": name,
                    "is_error": bool(r.is_error),
                    "text": "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text"),
                    "structured": r.structured_content,
                }
            )
    print(json.dumps(out))


asyncio.run(main())
