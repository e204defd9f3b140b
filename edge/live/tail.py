"""One upstream reader per (stream, scope) with live interest: the origin's tail, followed once.

Rules this module owns:

* Every batch the upstream delivers (a long-poll 200, or the SSE ``data`` events up to a
  ``control``) becomes the segment [offset, next) in the stream's log; readers are only woken.
  The batches of one read from the upstream are told to the fan-out together, once the read is
  recorded (``TailListener.batch``): when the fan-out falls behind the origin (it was writing
  while more arrived), each viewer gets what piled up in one write, not one write per batch.
* The upstream always resumes from the offset after the last batch it recorded, so no byte is read
  twice or skipped, whatever the reason it ended (the origin closing it, a reset, a restart).
  Failures back off exponentially with full jitter; a clean end reconnects at once.
* An upstream refused or broken (reset, cut short) says the origin went away, with every stream
  it held (``edge.log.trust``): what every stream of this process holds is forgotten, and its
  tails go on from their offsets (``LiveHub``), as a client reading the origin would.
* Closure ends the tail; a 404 or 410 (gone: ``Door.evidence``) purges the stream and ends
  it; so does the stream instance it follows ending (purged, or found replaced at the origin):
  a tail never carries bytes from one instance of a stream into another.
* Upstream mode: SSE where its framing is exact (JSON and base64 binary streams); a long-poll loop
  for text streams, because the reference origin writes ``data:`` + line, so a line that starts
  with a space loses it in every SSE decoder. A failed SSE request is retried as SSE; only the
  origin refusing SSE, or SSE failing again and again, moves a tail to long-poll
  (``edge.live.upstream_mode``).
* Lingers ``linger_seconds`` after the last reader leaves, so a reconnecting viewer finds it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

import aiohttp

from edge.config import Settings
from edge.instances.door import Door, InstanceChanged
from edge.instances.forgetting import Forgetter
from edge.live.upstream_mode import SseOn, SseState, after_sse_batch, after_sse_failure, sse_current
from edge.log.intake import Decision
from edge.log.segment import Segment, is_json, join_bodies
from edge.log.stream_log import LogKey, StreamInstance
from edge.log.trust import Ending, origin_went_away
from edge.metrics import Metrics
from edge.origin import BodyTooLarge, OriginClient, OriginError
from edge.protocol.headers import first_value, flag, own_request_headers
from edge.protocol.reads import is_offset_token
from edge.protocol.sse import SseDecoder
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)

BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
# Both real origins speak at least once a minute on a live answer (the reference server's SSE
# keep-alive every 30 s, long-polls end by 30 s; the production one closes SSE every 60 s), so
# two minutes of silence is a dead connection, not a quiet stream.
UPSTREAM_IDLE_SECONDS = 120.0


def is_text(content_type: str | None) -> bool:
    return content_type is not None and content_type.strip().lower().startswith("text/")


@dataclass
class Tail:
    key: LogKey
    offset: str
    credentials: tuple[tuple[str, str], ...]
    local: LocalTier
    door: Door
    forgetter: Forgetter
    ticket: Callable[[], int]
    origin: OriginClient
    settings: Settings
    metrics: Metrics
    listener: TailListener | None = None
    rng: random.Random = field(default_factory=random.Random)
    cursor: str | None = None
    closed: bool = False
    gone: bool = False
    _task: asyncio.Task[None] | None = None
    _use_sse: bool = True
    _sse: SseState = field(default_factory=SseOn)  # whether the origin lets this tail use SSE
    arrivals: dict[str, float] = field(default_factory=dict)
    batches: int = 0  # answers recorded, so a connection that delivered nothing backs off
    failing: bool = False  # the last upstream attempt failed; nothing since vouches for the tail
    instance: StreamInstance | None = None  # the stream instance this tail follows
    _started: int = 0  # ticket of the current upstream request
    # Recorded, not yet told to the listener: this upstream read's segments, and where the
    # last batch ended (its end, up_to_date, closed); None: nothing untold.
    _untold: list[Segment] = field(default_factory=list)
    _untold_end: tuple[str, bool, bool] | None = None

    # --- what readers use ---

    @property
    def finished(self) -> bool:
        return self.closed or self.gone

    # --- lifecycle ---

    def start(self) -> None:
        self.instance = self.local.instance_for(self.key.stream)
        log = self.local.log(self.key)
        content_type = log.content_type if log is not None else None
        self._use_sse = self._sse_suits(content_type)
        self._task = asyncio.ensure_future(self._run())
        self.metrics.live_tails.inc()

    def _sse_suits(self, content_type: str | None) -> bool:
        """SSE where its framing is exact: JSON and binary streams. While the content type is
        unknown, long-poll (exact for every type); the next connection may upgrade."""
        mode = self.settings.tail_mode
        return mode == "sse" or (
            mode == "auto" and content_type is not None and not is_text(content_type)
        )

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.ended(self.key)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self.metrics.live_tails.dec()
        self.door.live_ended(self.key)

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST_SECONDS
        try:
            while not self.finished:
                recorded = self.batches
                self._sse = sse_current(self._sse, now=asyncio.get_running_loop().time())
                if not self._use_sse and isinstance(self._sse, SseOn):
                    log = self.local.log(self.key)
                    self._use_sse = self._sse_suits(log.content_type if log else None)
                failed = False
                try:
                    if self._use_sse:
                        await self._sse_session()
                        reason = "closed_by_origin"
                    else:
                        await self._long_poll()
                        reason = ""
                except InstanceChanged:
                    self.gone = True
                    self._forget_untold()  # of an instance forgotten: the viewers re-check
                    if self.listener is not None:
                        self.listener.ended(self.key)
                    return
                except (OriginError, UpstreamRefused) as error:
                    self._tell()  # what was recorded before the failure
                    reason = getattr(error, "reason", "refused")
                    failed = True
                    if isinstance(error, OriginError):
                        self._ended(error.ending)
                    if isinstance(error, UpstreamRefused) and self._use_sse:
                        now = asyncio.get_running_loop().time()
                        self._sse = after_sse_failure(self._sse, error.status, now=now)
                        if not isinstance(self._sse, SseOn):
                            logger.info("SSE upstream of %s: %s; long-poll", self.key, self._sse)
                            self._use_sse = False
                            failed = False
                except Exception:  # a malformed upstream answer must not kill the tail silently
                    self._tell()
                    logger.exception("live upstream for %s failed", self.key)
                    reason, failed = "protocol", True
                if self._use_sse and self.batches > recorded:
                    self._sse = after_sse_batch(self._sse)
                if reason and not self.finished:
                    self.metrics.tail_reconnects.labels(reason=reason).inc()
                if failed:
                    self.failing = True
                if self.batches > recorded and not failed:
                    backoff = BACKOFF_FIRST_SECONDS
                elif failed or (reason and self.batches == recorded):
                    # Failed, or ended without delivering anything: back off before retrying,
                    # and stop vouching for the tail meanwhile.
                    self.door.live_ended(self.key)
                    await asyncio.sleep(self.rng.uniform(0, backoff))
                    backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
        finally:
            self.door.live_ended(self.key)

    def _ended(self, ending: Ending) -> None:
        """The upstream failed as ``ending``. If that says the origin went away, nothing held of
        it is confirmed any more: what every stream holds is forgotten (``edge.log.trust``), and
        the tails go on from their offsets. Told again on every failure: only what was learned
        since the last is forgotten again."""
        instance = self.instance
        if origin_went_away(ending) and instance is not None and self.local.current(instance):
            logger.warning("%s: the origin went away (%s)", self.key.stream, ending.value)
            self.forgetter.origin_lost()

    async def _open(self, live: str, kind: str, *extra: tuple[str, str]) -> aiohttp.ClientResponse:
        """One live request from the tail's offset (and cursor), counted by ``kind``."""
        url = f"{self.key.stream}?offset={quote(self.offset, safe='')}&live={live}"
        if self.cursor:
            url += f"&cursor={quote(self.cursor, safe='')}"
        headers = [*own_request_headers(self.credentials), *extra]
        self._started = self.ticket()
        response = await self.origin.open(
            "GET", url, headers, live=True, idle_timeout=UPSTREAM_IDLE_SECONDS
        )
        self.metrics.origin_requests.labels(kind=kind, code=str(response.status)).inc()
        return response

    def _check_status(self, response: aiohttp.ClientResponse) -> bool:
        """False when the stream is gone (and purged); raises for other refusals."""
        if response.status in (200, 204):
            return True
        instance = self.instance
        assert instance is not None  # set by start(), before the first upstream request
        decision = self.door.evidence(
            self.key, response.status, list(response.headers.items()),
            started=self._started, instance=instance, live=True,
        )  # fmt: skip
        if decision is Decision.RELAY:
            raise UpstreamRefused(response.status)
        # Gone (forgotten now), or the instance it follows was forgotten before the answer came.
        self.gone = True
        if self.listener is not None:
            self.listener.ended(self.key)
        return False

    def _record(self, end: str, body: bytes, *, up_to_date: bool, closed: bool) -> None:
        now = asyncio.get_running_loop().time()
        instance = self.instance
        assert instance is not None  # set by start(), before the first upstream request
        # Raises InstanceChanged once the instance this tail follows is forgotten.
        segment = self.door.record_live(
            self.key, self.offset, end, body, up_to_date=up_to_date, closed=closed,
            instance=instance, started=self._started,
        )  # fmt: skip
        if segment is not None:
            self.arrivals[segment.start] = now
            while len(self.arrivals) > 64:
                self.arrivals.pop(next(iter(self.arrivals)))
        start, self.offset, self.closed = self.offset, end, closed
        self.batches += 1
        self.failing = False
        if segment is not None:
            self._untold.append(segment)
        elif end != start:
            # Moved without a segment: what is untold is told first, so the segments told
            # together are always contiguous.
            self._tell()
        if segment is not None or closed or self._untold_end is not None:
            self._untold_end = (end, up_to_date, closed)

    def _tell(self) -> None:
        """Tell the listener what was recorded since it was last told, as one batch."""
        told = self._untold_end
        if told is None:
            return
        segments = tuple(self._untold)
        self._forget_untold()
        if self.listener is not None:
            end, up_to_date, closed = told
            self.listener.batch(self.key, segments, end, up_to_date=up_to_date, closed=closed)

    def _forget_untold(self) -> None:
        self._untold.clear()
        self._untold_end = None

    # --- upstream modes ---

    async def _long_poll(self) -> None:
        response = await self._open("long-poll", "long_poll")
        try:
            if not self._check_status(response):
                return
            try:
                body = await OriginClient.read_body(response, self.settings.max_segment_bytes)
            except BodyTooLarge as error:
                raise UpstreamRefused(413) from error
        finally:
            response.close()
        self.metrics.origin_bytes.inc(len(body))
        headers = list(response.headers.items())
        self._take_cursor(first_value(headers, "stream-cursor"))
        end = first_value(headers, "stream-next-offset")
        if end is None:
            raise UpstreamRefused(502)  # an answer that does not say where it ends is unusable
        closed = flag(headers, "stream-closed")
        up_to_date = flag(headers, "stream-up-to-date") or response.status == 204
        self._record(
            end, body if response.status == 200 else b"", up_to_date=up_to_date, closed=closed
        )
        self._tell()

    async def _sse_session(self) -> None:
        response = await self._open("sse", "sse", ("Accept", "text/event-stream"))
        try:
            if not self._check_status(response):
                return
            binary = first_value(list(response.headers.items()), "stream-sse-data-encoding")
            json_stream = is_json(response.headers.get("Content-Type")) or self._log_is_json()
            decoder = SseDecoder()
            pending: list[bytes] = []
            pending_bytes = 0
            async for chunk in OriginClient.body_chunks(response):
                self.metrics.origin_bytes.inc(len(chunk))
                for event in decoder.feed(chunk):
                    if event.event == "data":
                        pending.append(
                            base64.b64decode(event.data.replace("\n", ""))
                            if binary == "base64"
                            else event.data.encode()
                        )
                        pending_bytes += len(pending[-1])
                        if pending_bytes > self.settings.max_segment_bytes:
                            # A batch bigger than the edge keeps: memory stays bounded, and
                            # readers of it are relayed to the origin by the catch-up path.
                            raise UpstreamRefused(413)
                    elif event.event == "control":
                        control = json.loads(event.data)
                        if not isinstance(control, dict):
                            raise ValueError("an SSE control event that is not an object")
                        self._take_cursor(control.get("streamCursor"))
                        closed = bool(control.get("streamClosed"))
                        body = self._join(pending, json_stream)
                        pending, pending_bytes = [], 0
                        self._record(
                            str(control["streamNextOffset"]),
                            body,
                            up_to_date=bool(control.get("upToDate")) or closed,
                            closed=closed,
                        )
                        if closed:
                            self._tell()
                            return
                # This read is recorded: its batches go to the viewers together.
                self._tell()
        finally:
            response.close()

    def _take_cursor(self, cursor: object) -> None:
        """The origin's cursor goes back upstream in a URL: only a well-formed one is kept."""
        if isinstance(cursor, str) and is_offset_token(cursor):
            self.cursor = cursor

    def _log_is_json(self) -> bool:
        log = self.local.log(self.key)
        return log is not None and log.json

    def _join(self, parts: Sequence[bytes], json_stream: bool) -> bytes:
        if not json_stream:
            return b"".join(parts)
        # Each SSE data event of a JSON stream is an array; a batch is their union.
        return join_bodies(parts, json=True)


class TailListener(Protocol):
    """Told of the batches of each upstream read once they are recorded (the SSE fan-out):
    ``segments`` are contiguous and end at ``end`` (none: the stream closed, or only its state
    changed); ``up_to_date`` and ``closed`` are the last batch's."""

    def batch(
        self,
        key: LogKey,
        segments: tuple[Segment, ...],
        end: str,
        *,
        up_to_date: bool,
        closed: bool,
    ) -> None: ...

    def ended(self, key: LogKey) -> None: ...


class UpstreamRefused(Exception):
    reason = "refused"

    def __init__(self, status: int) -> None:
        super().__init__(f"origin answered {status}")
        self.status = status


class TailRegistry:
    """The tails of this edge: started on first interest, stopped after lingering unwatched."""

    def __init__(
        self,
        local: LocalTier,
        door: Door,
        forgetter: Forgetter,
        ticket: Callable[[], int],
        origin: OriginClient,
        settings: Settings,
        metrics: Metrics,
        *,
        listener: TailListener | None = None,
    ) -> None:
        self._listener = listener
        self._local = local
        self._door = door
        self._forgetter = forgetter
        self._ticket = ticket
        self._origin = origin
        self._settings = settings
        self._metrics = metrics
        self._tails: dict[LogKey, Tail] = {}
        self._interest: dict[LogKey, int] = {}
        self._lingering: dict[LogKey, asyncio.TimerHandle] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def get(self, key: LogKey) -> Tail | None:
        return self._tails.get(key)

    def all(self) -> list[Tail]:
        return list(self._tails.values())

    @contextlib.asynccontextmanager
    async def watching(
        self, key: LogKey, start_offset: str, credentials: Sequence[tuple[str, str]]
    ) -> AsyncIterator[Tail]:
        tail = self._tails.get(key)
        if tail is None or tail.finished:
            if tail is not None:
                self._stop_later(tail)  # it ended (closure, deletion): release it properly
            tail = Tail(
                key=key,
                offset=start_offset,
                credentials=tuple(credentials),
                local=self._local,
                door=self._door,
                forgetter=self._forgetter,
                ticket=self._ticket,
                origin=self._origin,
                settings=self._settings,
                metrics=self._metrics,
                listener=self._listener,
            )
            log = self._local.log(key)
            if log is not None and log.tail is not None and log.tail.closed:
                tail.closed = True  # nothing will ever arrive: no upstream for a closed stream
            else:
                tail.start()
            self._tails[key] = tail
        self.watch(key)
        try:
            yield tail
        finally:
            self.unwatch(key, tail)

    def running(self, key: LogKey) -> Tail | None:
        """``key``'s tail if it runs (not finished, gone or failing): the connection protocol's
        long-polls park only on such a tail, holding it by ``watch`` until ``unwatch``."""
        tail = self._tails.get(key)
        if tail is None or tail.finished or tail.gone or tail.failing:
            return None
        return tail

    def watch(self, key: LogKey) -> None:
        """One watcher of ``key``'s tail more: it does not linger out meanwhile."""
        self._interest[key] = self._interest.get(key, 0) + 1
        handle = self._lingering.pop(key, None)
        if handle is not None:
            handle.cancel()

    def unwatch(self, key: LogKey, tail: Tail) -> None:
        """One watcher of ``key`` less; the last one leaves its tail lingering."""
        self._interest[key] -= 1
        if self._interest[key] == 0:
            del self._interest[key]
            loop = asyncio.get_running_loop()
            self._lingering[key] = loop.call_later(
                self._settings.tail_linger_seconds, self._retire, key, tail
            )

    def _retire(self, key: LogKey, tail: Tail) -> None:
        self._lingering.pop(key, None)
        if key in self._interest or self._tails.get(key) is not tail:
            return
        del self._tails[key]
        self._stop_later(tail)

    def _stop_later(self, tail: Tail) -> None:
        task = asyncio.ensure_future(tail.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        for handle in self._lingering.values():
            handle.cancel()
        self._lingering.clear()
        tails, self._tails = list(self._tails.values()), {}
        await asyncio.gather(*(tail.stop() for tail in tails), *self._stopping)
