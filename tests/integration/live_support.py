"""What live tests share: an SSE viewer that resumes like a real client (``devstack.sse_viewer``),
a writer, a slow phone."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp

from devstack.sse_viewer import View, view_sse
from edge.protocol.sse import SseDecoder

__all__ = ["View", "append_all", "dechunk", "slow_phone", "view_sse"]


async def append_all(
    session: aiohttp.ClientSession,
    url: str,
    parts: list[bytes],
    *,
    content_type: str = "text/plain",
    rate_per_second: float = 50.0,
    close: bool = True,
    producer: str = "writer",
    headers: dict[str, str] | None = None,
) -> None:
    """Append ``parts`` at a steady rate with an idempotent producer, retrying through outages
    (a retry of an append that landed is answered 204 and not applied twice), then close."""
    started = time.monotonic()
    extra = headers or {}
    for seq, part in enumerate(parts):
        request_headers = {
            **extra,
            "Content-Type": content_type,
            "Producer-Id": producer,
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        for _ in range(200):
            try:
                async with session.post(url, data=part, headers=request_headers) as response:
                    if response.status in (200, 204):
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"append {seq} never succeeded")
        await asyncio.sleep(max(0.0, started + (seq + 1) / rate_per_second - time.monotonic()))
    if close:
        for _ in range(200):
            try:
                async with session.post(
                    url, headers={**extra, "Stream-Closed": "true"}
                ) as response:
                    if response.status in (200, 204, 409):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError("close never succeeded")


def dechunk(raw: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked message, as far as it got (a cut-off read is fine)."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body = bytearray()
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    return bytes(body)


async def slow_phone(url: str, path: str, *, seconds: float, read_every: float) -> bytes:
    """An SSE viewer on a bad link: a small kernel buffer and a reader that takes 4 KiB at a
    time, so the edge really feels it lag (aiohttp's client would buffer everything in user
    space). Returns the stream bytes it had decoded when ``seconds`` ran out."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(f"GET {path}?offset=-1&live=sse HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    raw = bytearray()
    give_up = time.monotonic() + seconds
    try:
        while time.monotonic() < give_up:
            chunk = await reader.read(4096)
            if not chunk:
                break
            raw += chunk
            await asyncio.sleep(read_every)
    finally:
        writer.close()
    decoder = SseDecoder()
    text = bytearray()
    pending: list[str] = []
    for event in decoder.feed(dechunk(bytes(raw))):
        if event.event == "data":
            pending.append(event.data)
        elif event.event == "control":
            text += "".join(pending).encode()
            pending.clear()
    return bytes(text)
