"""An agent backend for resume routes (their tests and ``make demo ARGS=--resume``): the official
MCP SDK's streamable-HTTP server (stateless, no event store: on its own, a dropped call is lost)
with one slow tool. ``devstack.processes.start_mcp_upstream`` starts it.

    python devstack/mcp_upstream.py PORT SEEN_FILE [--stateful]   (PORT 0: any port)

``--stateful``: the SDK's sessions in memory (``Mcp-Session-Id``), so a session's requests
must reach this one process (a stateful upstream behind a balancer).

``count(n, delay, tag="")`` reports progress n times, ``delay`` seconds apart (each message
``"step i"``, with `` of <tag>`` when tagged), and returns ``"counted n"`` (``"counted n for
<tag>"``): a tag lets concurrent callers tell their own messages from another's.

Every request the server receives is recorded as one JSON line in SEEN_FILE (method, path,
query, ``Last-Event-ID``, ``Authorization``), so a test can prove what reached it. It prints
one JSON line, ``{"url": ".../mcp"}``, once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("slow-counter")
SEEN_FILE = [""]
# A backend that sends a byte that is not UTF-8 in one event, then the final message.
INVALID_UTF8 = (
    b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"message":"\xff"}}\n\n'
    b'data: {"jsonrpc":"2.0","id":42,"result":{}}\n\n'
)
# A backend that is not the SDK: its own ids, a priming event, and no final message.
ENDS_EARLY = (
    b"id: up-0\nretry: 500\ndata:\n\n"
    b"id: up-1\nevent: message\n"
    b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}\n\n'
)


@server.tool()
async def count(n: int, delay: float, ctx: Context, tag: str = "") -> str:
    _record(SEEN_FILE[0], {"tool": "count", "n": str(n), "tag": tag})
    of = f" of {tag}" if tag else ""
    for step in range(1, n + 1):
        await asyncio.sleep(delay)
        await ctx.report_progress(step, n, f"step {step}{of}")
    return f"counted {n} for {tag}" if tag else f"counted {n}"


def _record(seen_file: str, line: dict[str, str | None]) -> None:
    with open(seen_file, "a") as seen:
        seen.write(json.dumps(line) + "\n")


def recording(app: Any, seen_file: str) -> Any:
    async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
            line = {
                "method": scope["method"],
                "path": scope["path"],
                "query": scope["query_string"].decode(),
                "last_event_id": headers.get("last-event-id"),
                "authorization": headers.get("authorization"),
            }
            _record(seen_file, line)
        if scope["type"] == "http" and scope["path"].startswith("/raw"):
            await raw(scope, receive, send)
            return
        await app(scope, receive, send)

    return recorded


async def raw(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/raw/ends-early``: an SSE answer with the backend's own ids that ends before its final
    message; ``/raw/json``: a JSON answer; ``/raw/slow?tag=T``: 20 events 50 ms apart with the
    backend's own ids, then the final message (``id`` 42), recording ``{"slow": T, "end":
    "finished"}`` or ``"disconnected"`` (the client left first); ``/raw/paced``: see
    ``paced``; ``/raw/hang``: see ``hang``; ``/raw/invalid-utf8``: a byte that is not UTF-8 in
    an event, then the final message; ``/raw/deep``: an event of JSON nested 100,000 deep, then
    the final message."""
    while (await receive()).get("more_body"):
        pass
    query = dict(parse_qsl(scope["query_string"].decode()))
    if scope["path"] == "/raw/slow":
        await slow(query.get("tag", ""), query.get("hold"), receive, send)
        return
    if scope["path"] == "/raw/paced":
        await paced(query, send)
        return
    if scope["path"] == "/raw/hang":
        await hang(query.get("tag", ""), receive)
        return
    if scope["path"] == "/raw/endless-line":
        await endless_line(query.get("tag", ""), receive, send)
        return
    if scope["path"] == "/raw/deep":
        head = [(b"content-type", b"text/event-stream")]
        body = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n" + INVALID_UTF8[-45:]
    elif scope["path"] == "/raw/invalid-utf8":
        head = [(b"content-type", b"text/event-stream")]
        body = INVALID_UTF8
    elif scope["path"] == "/raw/json":
        head = [(b"content-type", b"application/json")]
        body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    else:
        head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        body = ENDS_EARLY
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def slow(tag: str, hold: str | None, receive: Any, send: Any) -> None:
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def events() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": head})
        for step in range(1, 21):
            progress = {"jsonrpc": "2.0", "method": "notifications/progress"}
            progress["params"] = {"progress": step}  # type: ignore[assignment]
            frame = f"id: up-{step}\ndata: {json.dumps(progress)}\n\n"
            await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            await asyncio.sleep(0.05)
            while step == 2 and hold and not os.path.exists(hold):  # noqa: ASYNC110, ASYNC240 (a local file)
                await asyncio.sleep(0.02)
        final = 'data: {"jsonrpc":"2.0","id":42,"result":{}}\n\n'
        await send({"type": "http.response.body", "body": final.encode()})

    async def disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming = asyncio.ensure_future(events())
    leaving = asyncio.ensure_future(disconnect())
    done, _ = await asyncio.wait({streaming, leaving}, return_when=asyncio.FIRST_COMPLETED)
    # Once the answer is whole, uvicorn reports a disconnect at once: whole is finished.
    end = "finished" if streaming in done and streaming.exception() is None else "disconnected"
    for task in (streaming, leaving):
        task.cancel()
    _record(SEEN_FILE[0], {"slow": tag, "end": end})


async def endless_line(tag: str, receive: Any, send: Any) -> None:
    """``/raw/endless-line?tag=T``: one progress event, then a ``data:`` line that never ends
    (64 KiB every 10 ms, for at most ~17 minutes); records ``{"endless": T, "end":
    "disconnected"}`` once the reader's connection is gone."""
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    first = b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}'

    async def endless() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": head})
        body = first + b"\n\ndata: "
        await send({"type": "http.response.body", "body": body, "more_body": True})
        for _ in range(100_000):
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            await asyncio.sleep(0.01)

    sending = asyncio.ensure_future(endless())
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    finally:
        sending.cancel()
        _record(SEEN_FILE[0], {"endless": tag, "end": "disconnected"})


async def hang(tag: str, receive: Any) -> None:
    """``/raw/hang?tag=T``: never sends its response headers; records ``{"hang": T, "end":
    "disconnected"}`` once the request's connection is gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
    _record(SEEN_FILE[0], {"hang": tag, "end": "disconnected"})


async def paced(query: dict[str, str], send: Any) -> None:
    """``/raw/paced?n=N&every=S&silent=Q&at=K&size=B&tag=T``: the headers, then ``N`` progress
    notifications ``S`` seconds apart (each's data padded to about ``B`` bytes), with nothing
    at all for ``Q`` seconds after the ``K``-th (0: right after the headers), then the final
    message (``id`` 42); ``{"paced": T, "end": "finished"}`` is recorded once it is all sent.
    A slow backend (a trickle, a long silence), or a fast one (``every=0``)."""
    n, every = int(query.get("n", "3")), float(query.get("every", "0"))
    silent, size = float(query.get("silent", "0")), int(query.get("size", "0"))
    silent_at = int(query.get("at", "0"))
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": b"", "more_body": True})
    for step in range(1, n + 1):
        if step == silent_at + 1:
            await asyncio.sleep(silent)
        if step > 1 and every:
            await asyncio.sleep(every)
        params: dict[str, Any] = {"progress": step}
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        params["message"] = "x" * max(0, size - len(json.dumps(progress)) - 15)
        frame = f"id: up-{step}\ndata: {json.dumps(progress)}\n\n"
        await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
    final = 'data: {"jsonrpc":"2.0","id":42,"result":{}}\n\n'
    await send({"type": "http.response.body", "body": final.encode()})
    _record(SEEN_FILE[0], {"paced": query.get("tag", ""), "end": "finished"})


async def main(port: int, seen_file: str, *, stateful: bool) -> None:
    SEEN_FILE[0] = seen_file
    app = server.streamable_http_app(stateless_http=not stateful)
    config = uvicorn.Config(
        recording(app, seen_file), host="127.0.0.1", port=port, log_level="warning",
        lifespan="on",
    )  # fmt: skip
    served = uvicorn.Server(config)
    task = asyncio.create_task(served.serve())
    while not served.started:  # noqa: ASYNC110 (uvicorn sets a flag, it has no event)
        await asyncio.sleep(0.05)
    port = served.servers[0].sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}/mcp"}), flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], stateful="--stateful" in sys.argv[3:]))
