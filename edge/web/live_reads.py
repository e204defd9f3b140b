"""The handlers of live reads (long-polls and SSE viewers): parse, ask the live hub, answer.

Rules this module owns:

* A live read starts where the hub says (``LiveHub.start``: ``offset=now`` is the tail, a
  further ``Last-Event-ID`` wins). A read the cache does not answer (``Bypass``) is relayed as
  the client sent it; an origin failure before the answer began is answered as one.
* A long-poll whose released answer was written straight to its socket (``AlreadyWritten``) is
  only completed here.
* An SSE response is ``text/event-stream`` that no cache keeps (``no-store``) and no proxy
  buffers or alters (``no-transform``, ``X-Accel-Buffering: no``), with the origin's CORS
  headers first, as the origin sends them. What one viewer holds is bounded by
  ``--sse-buffer-bytes``, in this process and in the kernel.
* A viewer ends at ``--sse-max-seconds`` or when its credential expires, whichever is first,
  cleanly at a batch boundary. Once its headers are written a failure can only cut the
  connection: the client resumes by offset.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import assert_never

from aiohttp import web

from edge.answer import Answer, Bypass
from edge.live.polls import AlreadyWritten, Framing, Socket
from edge.live.viewers import Fed, Viewer
from edge.log.stream_log import LogKey, StreamLog
from edge.origin import BodyTooLarge, OriginError
from edge.protocol.reads import Classified, Read
from edge.web.asked import Asked, origin_failed, to_response
from edge.web.catchup_reads import relay_bypass
from edge.web.connection_tracker import CONNECTIONS
from edge.web.fast_sse import bound_buffers, sse_head_headers
from edge.web.keys import CORS, HUB, METRICS, SETTINGS
from edge.web.proxy import ClientGone, EdgeStreamResponse, OriginCors
from edge.web.wire import AlreadyWrittenResponse


def credential_left(asked: Asked) -> float | None:
    """How long a live read may still run on the credential the gate admitted it with."""
    if asked.expires_at is None:
        return None
    return max(0.0, asked.expires_at - time.time())


async def start_offset(
    request: web.Request, asked: Asked, key: LogKey, offset: str, last_event_id: str | None
) -> str | Answer | Bypass:
    """Where this live read starts (``LiveHub.start``)."""
    return await request.app[HUB].start(key, offset, last_event_id, asked.credentials)


def live_read(classified: Classified) -> tuple[Read, str]:
    read = classified.read
    assert read is not None
    assert read.offset is not None
    return read, read.offset


async def serve_long_poll(
    request: web.Request, asked: Asked, classified: Classified
) -> web.StreamResponse:
    read, offset = live_read(classified)
    key = LogKey(stream=read.stream, scope=read.scope)
    try:
        start = await start_offset(request, asked, key, offset, None)
        if isinstance(start, str):
            outcome = await request.app[HUB].long_poll(
                key,
                start,
                read.cursor,
                asked.credentials,
                max_seconds=credential_left(asked),
                socket=socket_of(request, asked),
            )
        else:
            outcome = start
    except OriginError as error:
        return origin_failed(request, asked, error)
    match outcome:
        case Bypass():
            # A backlog bigger than the edge keeps in one piece (or an answer that is not the
            # cache's to give): the origin answers it directly.
            return await relay_bypass(request, classified.kind, outcome)
        case AlreadyWritten():
            return AlreadyWrittenResponse(outcome)  # released with its group: on the wire already
        case Answer():
            return to_response(request, asked, outcome)
        case _:
            assert_never(outcome)


def socket_of(request: web.Request, asked: Asked) -> Socket | None:
    """Where a released long-poll's answer may be written directly, framed as aiohttp would."""
    transport = request.transport
    if transport is None:
        return None
    sink = request.app[CONNECTIONS].sink_of(transport)
    if sink is None:
        return None  # not the stream listener's (a test server's): its handler writes it
    http10 = asked.version < (1, 1)
    framing = Framing(
        version=(1, 1),  # an HTTP/1.0 read too (``edge.web.proxy.answer_http10_as_http11``)
        keep_alive=request.keep_alive and not http10,
        reader_only=asked.reader_only,
        origin=asked.origin,
        close_delimited=http10,
    )
    return Socket(sink=sink, framing=framing)


async def serve_sse(
    request: web.Request, asked: Asked, classified: Classified
) -> web.StreamResponse:
    read, offset = live_read(classified)
    hub = request.app[HUB]
    key = LogKey(stream=read.stream, scope=read.scope)
    try:
        joined = await start_offset(request, asked, key, offset, read.last_event_id)
        if isinstance(joined, str):
            refused = await hub.known_from(key, joined, asked.credentials)
            joined = joined if refused is None else refused
    except OriginError as error:
        return origin_failed(request, asked, error)
    match joined:
        case str():
            start = joined
        case Bypass():
            return await relay_bypass(request, classified.kind, joined)
        case Answer():
            return to_response(request, asked, joined)
        case _:
            assert_never(joined)
    response = EdgeStreamResponse(status=200)
    sse_headers(response, hub.known_log(key), request.app[CORS], asked.origin)
    try:
        await response.prepare(request)
    except ConnectionResetError as gone:
        raise ClientGone from gone
    transport = request.transport
    assert transport is not None
    bound_buffers(transport, request.app[SETTINGS].sse_buffer_bytes)
    viewer = viewer_of(request, asked, read, key, start, transport)
    await feed(request, response, viewer, asked.credentials)
    return response


def sse_headers(
    response: web.StreamResponse, log: StreamLog, cors: OriginCors, origin: str | None
) -> None:
    response.headers.extend(sse_head_headers(log, cors, origin))


class TransportSink:
    """The full path's viewer writes to aiohttp's transport of its answer (aiohttp's
    connection, not the edge's, is its one writer there: after the head, the body is the
    fan-out's)."""

    __slots__ = ("_transport",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def send(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

    def buffered(self) -> int:
        return self._transport.get_write_buffer_size()

    def closing(self) -> bool:
        return self._transport.is_closing()


def viewer_of(
    request: web.Request,
    asked: Asked,
    read: Read,
    key: LogKey,
    offset: str,
    transport: asyncio.Transport,
) -> Viewer:
    settings, hub = request.app[SETTINGS], request.app[HUB]
    now = asyncio.get_running_loop().time()
    ends = [now + settings.sse_max_seconds] if settings.sse_max_seconds else []
    left = credential_left(asked)
    if left is not None:
        ends.append(now + left)  # ended cleanly when its token expires
    return Viewer(
        key=key,
        offset=offset,
        sink=TransportSink(transport),
        # aiohttp frames HTTP/1.1 bodies without a length as chunks; direct writes must too.
        # (``asked``'s version: the request's reads 1.1 once the answer's head is written.)
        chunked=asked.version >= (1, 1),
        client_cursor=read.cursor,
        fixed_cursor=hub.fixed_cursor(read.cursor),
        rotate_at=min(ends) if ends else None,
        last_write=now,
    )


def _cut(request: web.Request) -> None:
    """The answer's headers are gone: the connection is cut, and the client resumes by offset."""
    if request.transport is not None:
        request.transport.abort()


async def feed(
    request: web.Request,
    response: web.StreamResponse,
    viewer: Viewer,
    credentials: Sequence[tuple[str, str]],
) -> None:
    """Feed the viewer until it ends; a feed cut short (the origin is to answer the read, or
    failed) cuts the connection: its headers are gone, and the client resumes by offset."""
    metrics, hub = request.app[METRICS], request.app[HUB]

    async def write(frame: bytes) -> None:
        await response.write(frame)
        metrics.served_bytes.inc(len(frame))

    metrics.sse_viewers.inc()
    try:
        served = await hub.fanout.serve(viewer, credentials, write)
        match served:
            case Fed.ENDED:
                await response.write_eof()
            case Fed.CUT:
                _cut(request)
            case _:
                assert_never(served)
    except ConnectionError:
        pass  # the viewer left; it resumes by offset wherever it reconnects
    except (OriginError, BodyTooLarge) as error:
        if isinstance(error, OriginError):
            metrics.origin_errors.labels(reason=error.reason).inc()
        _cut(request)
    finally:
        metrics.sse_viewers.dec()
