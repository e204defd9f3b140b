"""SSE viewers: catch up from the log at their own pace, then get each new batch by direct write.

Rules this module owns:

* A viewer behind the tail is its own task: it reads the log from its offset and writes with
  flow control (it waits for its socket, nobody else does).
* A viewer at the tail hands itself to the fan-out and sleeps. When the tail has recorded a
  read's batches, the fan-out encodes them once (per cursor) as one data and one control event
  and writes the same bytes straight to the socket of every viewer at their start: no task
  wakes, no per-viewer queue, one write per viewer however many batches piled up while the
  fan-out was busy (the send, not the Python, is most of a viewer's cost). A viewer whose socket
  already holds ``--sse-buffer-bytes`` is skipped and woken instead: it lags, and catches up
  from the log.
* One ticker for all viewers sends comment heartbeats to idle ones and wakes the ones due to
  rotate, so no viewer carries a timer of its own. A viewer past its ``rotate_at`` (rotation, or
  its credential's expiry) is written nothing more: it ends at the next batch boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, assert_never

from edge.answer import Answer, Bypass
from edge.live.host import ViewerHost
from edge.log.policy import Coverage
from edge.log.segment import Segment
from edge.log.stream_log import LogKey
from edge.protocol.cursor import current_interval
from edge.protocol.http1 import chunk
from edge.protocol.sse import encode_comment, encode_retry

SSE_RETRY_MS = 1000
# One SSE batch while catching up is at most this many bytes of stream data, so a late joiner's
# first frames arrive quickly and its socket buffer stays bounded.
SSE_BATCH_BYTES = 256 * 1024
TICK_SECONDS = 1.0
HEARTBEAT = encode_comment("keep-alive")

Send = Callable[[bytes], Awaitable[None]]


class ViewerSink(Protocol):
    """The one writer of a viewer's connection (the connection protocol's ``_Connection``;
    on the full path, aiohttp's transport): the fan-out and the heartbeats write through it."""

    def send(self, data: bytes) -> None: ...

    def buffered(self) -> int:
        """Bytes given to it that the socket has not taken yet."""
        ...

    def closing(self) -> bool: ...


class Fed(enum.Enum):
    """How a viewer's feed ended."""

    ENDED = "ended"  # closed, rotated, drained, left, or the origin refused: end the response
    CUT = "cut"  # the origin is to answer this read itself, and the headers are gone: cut it


@dataclass(eq=False)
class Viewer:
    key: LogKey
    offset: str
    sink: ViewerSink
    chunked: bool
    client_cursor: str | None
    # A cursor not behind the current interval gets one jittered answer per connection (§10.1).
    fixed_cursor: str | None
    rotate_at: float | None
    last_write: float
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    skipped: bool = False  # the fan-out passed it by: its socket was full, or it was behind

    def cursor(self, interval: int) -> str:
        if self.fixed_cursor is not None and int(self.fixed_cursor) > interval:
            return self.fixed_cursor
        return str(interval)


class SseFanout:
    def __init__(self, hub: ViewerHost) -> None:
        self._hub = hub
        self._at_tail: dict[LogKey, set[Viewer]] = {}
        self._ticker: asyncio.Task[None] | None = None

    # --- the fan-out (called by tails) ---

    def batch(
        self,
        key: LogKey,
        segments: tuple[Segment, ...],
        end: str,
        *,
        up_to_date: bool,
        closed: bool,
    ) -> None:
        """Write the batches a tail just recorded (``segments``, contiguous, up to ``end``) to
        every viewer at their start, in one write each."""
        viewers = self._at_tail.get(key)
        if not viewers or (not segments and not closed):
            return
        hub = self._hub
        log = hub.stream_log(key)
        if log is None:
            return
        start = segments[0].start if segments else end
        coverage = Coverage(segments=segments, end=end, capped=False)
        loop = asyncio.get_running_loop()
        now = loop.time()
        interval = current_interval(hub.clock())
        current = str(interval)
        limit = hub.settings.sse_buffer_bytes
        written = 0
        size = 0
        frames: dict[tuple[str, bool], bytes] = {}  # the batch, encoded once per cursor/framing
        leaving: list[Viewer] = []
        for viewer in list(viewers):
            sink = viewer.sink
            rotate_at = viewer.rotate_at
            if (
                viewer.offset != start
                or sink.buffered() >= limit
                or sink.closing()
                or (rotate_at is not None and now >= rotate_at)
            ):
                leaving.append(viewer)  # the rare case, sorted out below
                continue
            # Most viewers carry the current interval's cursor (no fixed one of their own).
            cursor = current if viewer.fixed_cursor is None else viewer.cursor(interval)
            variant = (cursor, viewer.chunked)
            frame = frames.get(variant)
            if frame is None:
                frame = frames[variant] = hub.frames(
                    key, log, coverage, up_to_date=up_to_date, closed=closed,
                    cursor=cursor, chunked=viewer.chunked,
                )  # fmt: skip
            sink.send(frame)
            size += len(frame)
            written += 1
            viewer.offset = end
            viewer.last_write = now
            if closed:
                viewers.discard(viewer)
                viewer.finished = True
                viewer.woken.set()
        for viewer in leaving:
            viewers.discard(viewer)
            rotate_at = viewer.rotate_at
            if not viewer.sink.closing() and (rotate_at is None or now < rotate_at):
                # Behind, or its socket holds --sse-buffer-bytes: its own task catches up from
                # the log. (Closing, or due to end: rotation, an expiring credential.)
                viewer.skipped = True
            viewer.woken.set()
        if written:
            metrics = hub.metrics
            metrics.sse_events_sent.inc(written * (2 if segments else 1))
            metrics.served_bytes.inc(size)
            tail = hub.tails.get(key)
            arrived = tail.arrivals.get(start) if tail is not None else None
            if arrived is not None:
                # The last viewer's delay for the batch that waited longest: the fan-out's
                # worst case.
                metrics.delivery_latency.observe(loop.time() - arrived)

    def ended(self, key: LogKey) -> None:
        """The tail stopped or the stream vanished: every viewer at the tail re-checks."""
        for viewer in self._at_tail.pop(key, set()):
            viewer.woken.set()

    def wake_all(self) -> None:
        for viewers in list(self._at_tail.values()):
            for viewer in viewers:
                viewer.woken.set()

    # --- heartbeats and rotation ---

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        heartbeat = self._hub.settings.sse_heartbeat_seconds
        while self._at_tail:
            await asyncio.sleep(min(TICK_SECONDS, heartbeat))
            now = asyncio.get_running_loop().time()
            for viewers in list(self._at_tail.values()):
                for viewer in list(viewers):
                    if viewer.rotate_at is not None and now >= viewer.rotate_at:
                        viewers.discard(viewer)
                        viewer.woken.set()
                    elif now - viewer.last_write >= heartbeat and not viewer.sink.closing():
                        viewer.sink.send(chunk(HEARTBEAT) if viewer.chunked else HEARTBEAT)
                        viewer.last_write = now

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    # --- one viewer ---

    async def serve(
        self, viewer: Viewer, credentials: Sequence[tuple[str, str]], write: Send
    ) -> Fed:
        """Feed ``viewer`` until the stream closes, the connection rotates, the edge drains or
        the client leaves (``write`` raises)."""
        hub = self._hub
        key = viewer.key
        loop = asyncio.get_running_loop()
        await write(encode_retry(SSE_RETRY_MS))
        start = hub.tail_offset(key) or viewer.offset
        lagging = False
        async with hub.tails.watching(key, start, credentials) as tail:
            try:
                while not viewer.finished:
                    log = hub.stream_log(key)
                    if log is None or tail.gone:
                        return Fed.ENDED
                    coverage = hub.cover(key, viewer.offset, max_bytes=SSE_BATCH_BYTES)
                    fact = log.tail
                    at_tail = fact is not None and fact.offset == coverage.end
                    closed = at_tail and fact is not None and fact.closed
                    if viewer.rotate_at is not None and loop.time() >= viewer.rotate_at:
                        return Fed.ENDED  # at a batch boundary; the client resumes by offset
                    if coverage.segments or closed:
                        if (not at_tail or coverage.capped) and not lagging:
                            hub.metrics.viewers_lagging.inc()
                            lagging = True
                        frame = hub.frames(
                            key, log, coverage,
                            up_to_date=at_tail and not coverage.capped, closed=closed,
                            cursor=viewer.cursor(current_interval(hub.clock())), chunked=False,
                        )  # fmt: skip
                        await write(frame)
                        hub.metrics.sse_events_sent.inc(2 if coverage.segments else 1)
                        viewer.offset = coverage.end
                        viewer.last_write = loop.time()
                        if closed:
                            return Fed.ENDED
                        continue
                    if lagging:
                        hub.metrics.viewers_lagging.dec()
                        lagging = False
                    if hub.draining.is_set():
                        return Fed.ENDED
                    if viewer.rotate_at is not None and loop.time() >= viewer.rotate_at:
                        return Fed.ENDED
                    if not at_tail:
                        # A gap between the viewer and the tail (evicted, or never seen here).
                        match await hub.known_from(key, viewer.offset, credentials):
                            case None:
                                pass
                            case Answer():
                                return Fed.ENDED  # the origin refused: the client asks it
                            case Bypass():
                                return Fed.CUT
                            case _ as never:
                                assert_never(never)
                        if hub.cover(key, viewer.offset, max_bytes=1).segments:
                            continue
                        await asyncio.sleep(TICK_SECONDS)  # the tail has yet to reach it
                        continue
                    await self._wait_at_tail(viewer)
                    if viewer.skipped and not lagging:
                        hub.metrics.viewers_lagging.inc()
                        lagging = True
                    viewer.skipped = False
            finally:
                self._at_tail.get(key, set()).discard(viewer)
                if lagging:
                    hub.metrics.viewers_lagging.dec()
        return Fed.ENDED

    async def _wait_at_tail(self, viewer: Viewer) -> None:
        viewer.woken.clear()
        self._at_tail.setdefault(viewer.key, set()).add(viewer)
        self._ensure_ticker()
        try:
            await viewer.woken.wait()
        finally:
            viewers = self._at_tail.get(viewer.key)
            if viewers is not None:
                viewers.discard(viewer)
                if not viewers:
                    del self._at_tail[viewer.key]
