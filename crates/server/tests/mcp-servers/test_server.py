"""An MCP server for runcell's tests (crates/server/tests/mcp_servers.rs), written with the
official MCP Python SDK pinned by tests/mcp-clients/requirements.txt. Over stdio by default;
`--http PORT_FILE` serves streamable HTTP at http://127.0.0.1:PORT/mcp instead (a port of its
own, written to PORT_FILE once it listens)."""

import os
import socket
import sys
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("runcell-test", instructions="Tools for runcell's tests.")

# Eight bytes of a PNG signature and a marker: what matters is that the bytes come back as sent.
PICTURE = b"\x89PNG\r\n\x1a\nrunc\x00\xffell"


class Issues(BaseModel):
    total: int
    titles: list[str]
    query: str


@server.tool(description="Search the issues of a repository.")
def search_issues(
    query: Annotated[str, Field(description="GitHub search syntax")],
    per_page: Annotated[int, Field(ge=1, le=100)] = 30,
    state: Literal["open", "closed"] = "open",
) -> Issues:
    titles = [f"{state} issue {i} for {query}" for i in range(per_page)]
    return Issues(total=per_page, titles=titles, query=query)


@server.tool(name="make-chart", description="A picture, as image content.")
def make_chart() -> Image:
    return Image(data=PICTURE, format="png")


@server.tool(description="Always fails with the reason given.")
def fail(reason: str) -> str:
    raise ToolError(f"failed on purpose: {reason}")


@server.tool(description="Echoes its text back as text content.", structured_output=False)
def echo(text: str) -> str:
    return text


@server.tool(description="A text of `size` characters.", structured_output=False)
def big(size: int) -> str:
    return "x" * size


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Ends the server's process in the middle of the call.")
def die() -> str:
    sys.stdout.flush()
    os._exit(3)


def serve_http(port_file):
    import anyio
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.rename(tmp, port_file)
    anyio.run(lambda: http.serve(sockets=[sock]))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(sys.argv[2])
    else:
        server.run("stdio")
