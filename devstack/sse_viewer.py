"""An SSE viewer that reads a Durable Streams stream as the official clients do: bytes count once
their control event names the offset after them, and a connection that ends early resumes from
the last ``streamNextOffset``. Shared by the live tests and ``loadtest.cdn``."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field

import aiohttp

from edge.protocol.sse import SseDecoder, SseEvent


@dataclass
class View:
    """What one viewer received: the bytes (text and binary streams) or items (JSON)."""

    body: bytearray = field(default_factory=bytearray)
    items: list[object] = field(default_factory=list)
    closed: bool = False
    last_event_id: str | None = None
    next_offset: str | None = None
    connections: int = 0
    # the X-Edge-Replica of the latest connection (a fleet's HAProxy names the replica serving it)
    replica: str | None = None
    # (monotonic time, total bytes) after each control event: when each byte arrived
    progress: list[tuple[float, int]] = field(default_factory=list)


async def view_sse(
    session: aiohttp.ClientSession,
    url: str,
    *,
    offset: str = "-1",
    view: View | None = None,
    headers: dict[str, str] | None = None,
    stop_after_events: int | None = None,
    read_delay: float = 0.0,
    read_size: int = 65536,
    resume: bool = True,
    deadline: float = 60.0,
    query: str = "",
) -> View:
    """Read ``url`` by SSE from ``offset`` until the stream closes. Bytes count only once their
    control event names the offset after them, as the official clients do; a connection that
    ends early is resumed from the last ``streamNextOffset`` when ``resume``. ``query`` is
    appended to each request's query (``&token=...``)."""
    view = view or View()
    give_up = time.monotonic() + deadline
    controls = 0
    while not view.closed and time.monotonic() < give_up:
        view.connections += 1
        decoder = SseDecoder()
        pending: list[str] = []
        binary = False
        try:
            async with session.get(
                f"{url}?offset={offset}&live=sse{query}", headers=headers
            ) as response:
                assert response.status == 200, response.status
                view.replica = response.headers.get("X-Edge-Replica")
                binary = response.headers.get("stream-sse-data-encoding") == "base64"
                json_stream = False
                while True:
                    chunk = await response.content.read(read_size)
                    if not chunk:
                        break
                    for event in decoder.feed(chunk):
                        if event.event == "data":
                            pending.append(event.data)
                        elif event.event == "control":
                            control = json.loads(event.data)
                            for data in pending:
                                if binary:
                                    view.body += base64.b64decode(data)
                                elif data.startswith("["):
                                    json_stream = True
                                    view.items += json.loads(data)
                                else:
                                    view.body += data.encode()
                            pending.clear()
                            offset = view.next_offset = control["streamNextOffset"]
                            view.last_event_id = event.id
                            size = len(view.items) if json_stream else len(view.body)
                            view.progress.append((time.monotonic(), size))
                            controls += 1
                            if control.get("streamClosed"):
                                view.closed = True
                    if view.closed:
                        return view
                    if stop_after_events is not None and controls >= stop_after_events:
                        return view
                    if read_delay:
                        await asyncio.sleep(read_delay)
        except (aiohttp.ClientError, TimeoutError):
            pass
        if not resume:
            return view
        await asyncio.sleep(0.05)
    return view


async def sse_events(
    response: aiohttp.ClientResponse, decoder: SseDecoder, count: int | None = None
) -> list[SseEvent]:
    """An SSE answer's events, decoded by ``decoder`` (a reader may go on with the same one),
    to the answer's end or the first ``count``."""
    events: list[SseEvent] = []
    async for chunk in response.content.iter_any():
        events.extend(decoder.feed(chunk))
        if count is not None and len(events) >= count:
            break
    return events


def arrival_lags(view: View, sent_at: list[float], part_size: int) -> list[float]:
    """For a stream written as equal parts of ``part_size`` bytes, the ``i``-th sent at
    ``sent_at[i]``: how long after its send each part had reached ``view`` (when the control
    event that completed it arrived)."""
    lags = []
    progress = iter(view.progress)
    at, size = 0.0, 0
    for index, sent in enumerate(sent_at):
        while size < (index + 1) * part_size:
            at, size = next(progress)
        lags.append(at - sent)
    return lags
