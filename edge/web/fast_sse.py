"""SSE reads served by the stream listener's own connection protocol, without aiohttp.

Rules this module owns:

* An SSE head is the connection's on the same terms as a long-poll (``edge.web.fast_polls``):
  a plain read of a stream (by the path the origin routes to), the CORS answer for its
  ``Origin`` known, with ``--auth`` once the gate allowed it and as that admission is served
  (``LiveTargets.admitted``); a ``Last-Event-ID`` further on than the URL's offset is where it
  starts (``LiveHub.start``'s rule: an EventSource reconnecting to its URL resumes exactly). When
  the log answers from its offset without a wait (a generation confirmed within
  ``GENERATION_CHECK_SECONDS`` with Redis, the cache's plan a ``Hit``; ``now`` while a live
  upstream vouches for the tail, ``LiveHub.start``'s own rule), its head and feed begin at once.
  Otherwise a task of the connection's first runs the full path's own steps
  (``LiveHub.start``, ``LiveHub.known_from``): then the feed, or the origin's refusal written
  as the full path writes it; a bypass or an origin failure is handed on (``HandOn``), nothing
  having been written, to the connection's own relay (``edge.web.own_relay``).
* The answer is the full path's, byte for byte: the same headers (``sse_head_headers``), framed
  in chunks as aiohttp frames a ``StreamResponse`` to HTTP/1.1 (to an HTTP/1.0 reader, to the
  close: ``Framing.close_delimited``), then the same feed
  (``SseFanout.serve``), with flow control: a write waits while the connection's transport is
  above its high-water mark (``--sse-buffer-bytes``, as the full path bounds it).
* The feed ends as the full path's does, at ``--sse-max-seconds`` or when the gate's
  credential expires, whichever is first: ``Fed.ENDED`` ends the body (its last chunk) and the
  connection reads its next request; ``Fed.CUT`` and an origin failure cut the connection (the
  client resumes by offset); a client that leaves ends the feed.
* A viewer past ``--max-viewers`` is answered 503 as a long-poll is (``FastPolls.refusal``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Callable
from typing import Protocol, assert_never

from multidict import CIMultiDict

from edge.answer import Answer, Bypass
from edge.auth.gate import RequestAdmission
from edge.config import Settings
from edge.live.answers import sse_encoding
from edge.live.hub import LiveHub
from edge.live.polls import Encode
from edge.live.viewers import Fed, Viewer, ViewerSink
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics
from edge.origin import BodyTooLarge, OriginError
from edge.protocol.http1 import LAST_CHUNK, RequestHead, chunk, date_line, serialise, trailer
from edge.protocol.paths import MEMO_ENTRIES
from edge.protocol.reads import NOW, START, RequestKind, is_offset_token
from edge.web.fast_polls import (
    HANDED_OFF,
    Done,
    Ending,
    HandedOff,
    HandOn,
    LiveTarget,
    LiveTargets,
    LogsNow,
    seconds_left,
    written,
)
from edge.web.proxy import OriginCors, mark_vary
from edge.web.wire import VIA

logger = logging.getLogger(__name__)

SSE = "sse"


def sse_head_headers(log: StreamLog, cors: OriginCors, origin: str | None) -> CIMultiDict[str]:
    """The headers of an SSE answer (both the full path's and the connection's own)."""
    return _sse_headers(cors.grant(origin), cors.varies, log.header_template, log.content_type)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def sse_head_start(
    grant: tuple[tuple[str, str], ...],
    varies: bool,
    template: tuple[tuple[str, str], ...],
    content_type: str | None,
    chunked: bool,
) -> bytes:
    """An SSE answer's status line and headers as the connection writes them (``chunked``, or
    to the close), ``Date`` and ``Connection`` aside: a pure function of what the headers are
    made of, so made once per kind of answer (every viewer of a stream opens with the same),
    not per open. ValueError: headers no HTTP/1.1 head can carry."""
    headers = _sse_headers(grant, varies, template, content_type)
    return serialise(200, list(headers.items()), 0, chunked=chunked, close_delimited=not chunked)


def _sse_headers(
    grant: tuple[tuple[str, str], ...],
    varies: bool,
    template: tuple[tuple[str, str], ...],
    content_type: str | None,
) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict(grant)  # first, as the origin sends
    headers.extend(template)
    mark_vary(headers, varies)
    headers["Content-Type"] = "text/event-stream"
    # No cache keeps it (no-store), and no proxy buffers or alters it (PROTOCOL-NOTES trap 4).
    headers["Cache-Control"] = "no-cache, no-store, no-transform"
    headers["X-Accel-Buffering"] = "no"
    if sse_encoding(content_type) == "base64":
        headers["stream-sse-data-encoding"] = "base64"
    headers["Cache-Status"] = "edge; hit; detail=live"
    headers["Via"] = VIA
    return headers


def bound_buffers(transport: asyncio.Transport, limit_bytes: int) -> None:
    """Bound what one viewer can hold, in this process and in the kernel; past it the viewer's
    writes wait and it lags, reading the log at its own pace."""
    transport.set_write_buffer_limits(high=limit_bytes)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit_bytes)


class SseConnection(ViewerSink, Protocol):
    """What the feed asks of its connection (``edge.web.connection_protocol``), its one
    writer: the feed, the fan-out and the heartbeats all write through it."""

    def lead(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Streaming:
    """The connection's own SSE answer runs in ``task``; ``ended`` is told how it ended."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task


class Refused:
    """Past --max-viewers: the connection answered 503 and closes."""


REFUSED = Refused()
SseStep = Streaming | Refused | HandedOff
Ended = Done


class FastSse:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        hub: LiveHub,
        logs: LogsNow,
        cors: OriginCors,
        targets: LiveTargets,
        encode: Encode,
        *,
        gated: bool,
        clock: Callable[[], float],
    ) -> None:
        self.enabled = settings.fast_path
        self._gated = gated
        self._settings = settings
        self._metrics = metrics
        self._hub = hub
        self._logs = logs
        self._cors = cors
        self._targets = targets
        self._encode = encode
        self._clock = clock

    def serve(
        self,
        head: RequestHead,
        raw: bytes,
        connection: SseConnection,
        transport: asyncio.Transport,
        ended: Ended,
        admit: Callable[[str | None], bool],
        admission: RequestAdmission | None = None,
    ) -> SseStep:
        """Serve the SSE ``head`` (``raw``: its bytes; see the module rules). ``admit`` is
        asked, with the head's ``Origin``, once the read is known to be the connection's and
        before anything is written: False, it was refused (and answered) at --max-viewers.
        With ``--auth``, ``admission`` is the gate's yes to it (None: the full path's)."""
        if admission is None:
            target = None if self._gated else self._targets.of(head, SSE)
        else:
            target = self._targets.admitted(head, SSE, admission)
        if target is None:
            return HANDED_OFF
        expires_at = admission.expires_at if admission is not None else None
        key, offset, _, framing, credentials = target
        if self._cors.unknown_for(framing.origin):
            return HANDED_OFF  # relayed: the origin's answer teaches the edge its CORS headers
        resume = head.last_event_id
        if resume and resume != NOW and (offset == NOW or resume > offset):
            offset = resume  # ``LiveHub.start``'s rule: a resume point further on wins
        log = self._logs.log(key, self._clock())
        start = self._known_start(log, key, offset)
        if start is None or log is None:
            if not admit(framing.origin):
                return REFUSED
            task = asyncio.get_running_loop().create_task(
                self._later(target, resume, raw, connection, transport, ended, expires_at)
            )
            return Streaming(task)
        viewer = self._open(log, target, start, connection, transport, admit, expires_at)
        if not isinstance(viewer, Viewer):
            return viewer
        task = asyncio.get_running_loop().create_task(
            self._run(viewer, credentials, connection, framing.keep_alive, ended)
        )
        return Streaming(task)

    def _known_start(self, log: StreamLog | None, key: LogKey, offset: str) -> str | None:
        """Where a read at ``offset`` starts, when ``log`` (``LogsNow.log``'s) answers it from
        there without a wait (a fill, a probe of the tail); None: it must wait."""
        if log is None:
            return None
        if offset == NOW:
            fact = log.tail
            if fact is None or not fact.authoritative:
                return None  # the origin says where the tail is
            offset = fact.offset
        elif offset != START and not is_offset_token(offset):
            return None
        if self._logs.hit(key, offset) is None:
            return None  # a fill first
        return offset

    def _open(
        self,
        log: StreamLog,
        target: LiveTarget,
        offset: str,
        connection: SseConnection,
        transport: asyncio.Transport,
        admit: Callable[[str | None], bool],
        expires_at: float | None,
    ) -> Viewer | Refused | HandedOff:
        """The answer's viewer, once admitted, its head leading the connection's next send
        (the feed's first frame, ``retry:``: one send, not two)."""
        key, _, client_cursor, framing, _ = target
        cors = self._cors
        chunked = not framing.close_delimited  # an HTTP/1.0 reader's: written to the close
        try:
            start = sse_head_start(
                cors.grant(framing.origin),
                cors.varies,
                log.header_template,
                log.content_type,
                chunked,
            )
        except ValueError:
            return HANDED_OFF  # aiohttp turns it into the error it always did
        if not admit(framing.origin):
            return REFUSED
        bound_buffers(transport, self._settings.sse_buffer_bytes)
        now = asyncio.get_running_loop().time()
        settings = self._settings
        ends = [now + settings.sse_max_seconds] if settings.sse_max_seconds else []
        left = seconds_left(expires_at, self._clock())
        if left is not None:
            ends.append(now + left)  # ended cleanly when its credential expires
        viewer = Viewer(
            key=key,
            offset=offset,
            sink=connection,
            chunked=chunked,
            client_cursor=client_cursor,
            fixed_cursor=self._hub.fixed_cursor(client_cursor),
            rotate_at=min(ends) if ends else None,
            last_write=now,
        )
        connection.lead(start + date_line(int(self._clock())) + trailer((1, 1), framing.keep_alive))
        return viewer

    async def _later(
        self,
        target: LiveTarget,
        resume: str | None,
        raw: bytes,
        connection: SseConnection,
        transport: asyncio.Transport,
        ended: Ended,
        expires_at: float | None,
    ) -> None:
        """An SSE read that waits first, as the full path's does (``LiveHub.start``,
        ``LiveHub.known_from``): then its feed; the origin's refusal written as the full path
        writes it; a bypass or an origin failure the full path's, nothing written."""
        key, offset, _, framing, credentials = target
        hub = self._hub
        outcome: Ending | HandOn = HandOn(raw)
        try:
            try:
                joined = await hub.start(key, offset, resume, credentials)
                if isinstance(joined, str):
                    refused = await hub.known_from(key, joined, credentials)
                    joined = joined if refused is None else refused
            except OriginError as error:
                outcome = HandOn(raw, error)
                return
            match joined:
                case str():
                    pass
                case Bypass():
                    outcome = HandOn(raw, joined)
                    return
                case Answer():
                    try:
                        data = self._encode(joined, framing)
                    except ValueError:
                        outcome = HandOn(raw, joined)  # headers only aiohttp rewrites
                        return
                    connection.send(data)
                    self._metrics.served_bytes.inc(len(joined.body))
                    self._metrics.request_count(RequestKind.SSE, joined.status).inc()
                    outcome = written(framing.keep_alive)
                    return
                case _:
                    assert_never(joined)
            viewer = self._open(
                hub.known_log(key),
                target,
                joined,
                connection,
                transport,
                lambda _: True,
                expires_at,
            )
            if not isinstance(viewer, Viewer):
                return  # not serialisable: the full path's
            outcome = Ending.CUT
            outcome = await self._feed(viewer, credentials, connection, framing.keep_alive)
        except Exception:
            logger.exception("an SSE read failed; its connection is cut")
            outcome = Ending.CUT
        finally:
            ended(outcome)

    async def _run(
        self,
        viewer: Viewer,
        credentials: tuple[tuple[str, str], ...],
        connection: SseConnection,
        keep_alive: bool,
        ended: Ended,
    ) -> None:
        ending = Ending.CUT
        try:
            ending = await self._feed(viewer, credentials, connection, keep_alive)
        finally:
            ended(ending)

    async def _feed(
        self,
        viewer: Viewer,
        credentials: tuple[tuple[str, str], ...],
        connection: SseConnection,
        keep_alive: bool,
    ) -> Ending:
        """Feed ``viewer`` (``SseFanout.serve``, whose first write, before any wait, carries
        the answer's head) and say how its answer ended."""
        metrics = self._metrics
        chunked = viewer.chunked

        async def write(frame: bytes) -> None:
            connection.send(chunk(frame) if chunked else frame)
            metrics.served_bytes.inc(len(frame))
            await connection.drain()

        metrics.sse_viewers.inc()
        open_reads = metrics.open_requests(RequestKind.SSE)
        open_reads.inc()
        began = asyncio.get_running_loop().time()
        gone = False
        try:
            served = await self._hub.fanout.serve(viewer, credentials, write)
            match served:
                case Fed.ENDED:
                    if chunked:
                        connection.send(LAST_CHUNK)
                    return written(keep_alive)
                case Fed.CUT:
                    return Ending.CUT
                case _:
                    assert_never(served)
        except ConnectionError:
            gone = True
            return Ending.CUT  # the viewer left; it resumes by offset wherever it reconnects
        except asyncio.CancelledError:
            gone = True  # its connection was lost
            raise
        except (OriginError, BodyTooLarge) as error:
            if isinstance(error, OriginError):
                metrics.origin_errors.labels(reason=error.reason).inc()
            return Ending.CUT
        except Exception:
            logger.exception("an SSE feed failed; its connection is cut")
            return Ending.CUT
        finally:
            metrics.sse_viewers.dec()
            open_reads.dec()
            # Counted as the full path counts an SSE answer (its 200, or a client gone).
            if gone:
                metrics.client_gone(RequestKind.SSE).inc()
            else:
                metrics.request_count(RequestKind.SSE, 200).inc()
            metrics.duration(RequestKind.SSE).observe(asyncio.get_running_loop().time() - began)
