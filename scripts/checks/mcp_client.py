"""Drive Rakazo's MCP endpoint with the ecosystem's MCP client (the `mcp` package).

Usage: mcp_client.py URL TOKEN
Prints one JSON object: the tool names, the shell result and the observe result.
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def content_of(result):
    d = result.model_dump(by_alias=True, mode="json")
    for c in d.get("content", []):
        if c.get("type") == "image":
            c["data"] = len(c.get("data") or "")
    return {"isError": d.get("isError"), "content": d.get("content"), "structured": d.get("structuredContent")}


async def main(url, token):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(url, http_client=client) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            shell = await session.call_tool("shell", {"command": "echo hello from mcp"})
            observe = await session.call_tool("computer_observe", {})
            again = await session.call_tool("computer_observe", {})
    print(json.dumps({
        "tools": sorted(t.name for t in tools.tools),
        "shell": content_of(shell),
        "observe": content_of(observe),
        "observe_again": content_of(again),
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
