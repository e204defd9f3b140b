"""Catch-up reads answered from the stream logs, asking the origin only for what is missing.

The async pump around ``edge.log.policy``: plan (synchronously, so no other task can interleave:
the event loop is the lock), then do I/O (shared tier, origin) and record what came back, then
build the answer. Identical origin fetches in flight are single-flight.

It also watches the requests it does not answer itself (writes, HEAD, errors), because those tell
it when a stream moved, ended, or vanished.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from cachetools import LRUCache

from edge.coalesce import SingleFlight
from edge.config import Settings
from edge.log.policy import (
    Coverage,
    Fetch,
    Hit,
    accepts_gzip,
    answer_headers,
    cache_control,
    etag,
    if_none_match_hits,
    plan_catchup,
)
from edge.log.segment import Segment, is_json, stitch
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import HOP_BY_HOP, first_value, flag, own_request_headers
from edge.protocol.lifetimes import parse_expires_at, parse_ttl_seconds
from edge.protocol.reads import PUBLIC_SCOPE, Read, auth_scope
from edge.store.local import LocalTier
from edge.store.shared import SharedTier

log = logging.getLogger(__name__)

COMPRESS_MIN_BYTES = 1024
# Pulling a long chain from the shared tier is one round trip per segment; past this many the
# origin is asked instead.
MAX_SHARED_PULLS = 256
MAX_KNOWN_LIFETIMES = 100_000

# Headers that describe one answer, not the stream: never replayed from the template.
PER_ANSWER = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "date",
        "etag",
        "cache-control",
        "vary",
        "via",
        "age",
        "expires",
        "last-modified",
        "location",
        "cache-status",
        "stream-next-offset",
        "stream-up-to-date",
        "stream-closed",
        "stream-cursor",
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    cache_status: str
    result: str  # hit | delta | miss for edge_cache_requests_total; live for live answers


@dataclass(frozen=True, kw_only=True, slots=True)
class Fill:
    """What one origin fetch at ``offset`` returned, shared by every collapsed waiter."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    segment: Segment | None
    next_offset: str | None
    up_to_date: bool
    closed: bool
    stored: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolution:
    plan: Hit | Fetch
    shared_hit: bool
    fill: Fill | None  # the origin's answer, when the plan was a Fetch
    collapsed: bool

    @property
    def error(self) -> Fill | None:
        """The origin's refusal (404, 400, ...), if that is how the read ended."""
        if self.fill is not None and (self.fill.status != 200 or self.fill.next_offset is None):
            return self.fill
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Lifetime:
    ttl_seconds: float | None
    expires_at: float | None


def relayable(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP]


def header_template(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (n, v) for n, v in headers if n.lower() not in PER_ANSWER and n.lower() not in HOP_BY_HOP
    )


class CatchupCache:
    def __init__(
        self,
        settings: Settings,
        origin: OriginClient,
        metrics: Metrics,
        *,
        shared: SharedTier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._origin = origin
        self._metrics = metrics
        self._shared = shared
        self._clock = clock
        self.local = LocalTier(settings.cache_bytes, on_evict=metrics.cache_evictions.inc)
        self._flights: SingleFlight[tuple[LogKey, str], Fill] = SingleFlight()
        self._lifetimes: LRUCache[str, Lifetime] = LRUCache(maxsize=MAX_KNOWN_LIFETIMES)
        # stream -> the highest Stream-Next-Offset a write through this edge returned, for logs
        # created after the write by a fetch that started before it.
        self._floors: LRUCache[str, str] = LRUCache(maxsize=MAX_KNOWN_LIFETIMES)
        self._background: set[asyncio.Task[None]] = set()
        metrics.cache_bytes.set_function(lambda: self.local.bytes_used)
        metrics.cache_segments.set_function(lambda: self.local.segment_count)

    @property
    def shared_state(self) -> str:
        if self._shared is None:
            return "disabled"
        return "up" if self._shared.up else "down"

    # --- reads ---

    def _plan(self, key: LogKey, offset: str) -> Hit | Fetch:
        return plan_catchup(
            self.local.log(key),
            self.local.get,
            key,
            offset,
            now=self._clock(),
            freshness_seconds=self._settings.tail_freshness_seconds,
            max_bytes=self._settings.max_response_bytes,
        )

    async def resolve(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Resolution:
        """Find the answer for a read at ``offset``: from the local tier, the shared tier, or
        (single-flight) the origin, which is asked only from where the edge's chain ends."""
        plan = self._plan(key, offset)
        shared_hit = False
        pulls = 0
        while isinstance(plan, Fetch) and self._shared is not None and pulls < MAX_SHARED_PULLS:
            if not await self._pull_shared(key, plan.offset):
                if await self._pull_shared_closure(key, plan.offset):
                    plan = self._plan(key, offset)
                break
            shared_hit = True
            pulls += 1
            plan = self._plan(key, offset)
        if isinstance(plan, Hit):
            return Resolution(plan=plan, shared_hit=shared_hit, fill=None, collapsed=False)
        fetch = plan
        fill, collapsed = await self._flights.run(
            (key, fetch.offset), lambda: self._fill(key, fetch.offset, credentials)
        )
        if collapsed:
            self._metrics.collapsed_requests.labels(kind="catchup").inc()
        return Resolution(plan=fetch, shared_hit=shared_hit, fill=fill, collapsed=collapsed)

    async def read(
        self,
        read: Read,
        *,
        credentials: Sequence[tuple[str, str]],
        if_none_match: str | None,
        accept_encoding: str | None,
    ) -> Answer:
        key = LogKey(stream=read.stream, scope=read.scope)
        # An absent offset means the start (§5.6); an empty one is the origin's to refuse.
        offset = "-1" if read.offset is None else read.offset
        resolved = await self.resolve(key, offset, credentials)
        plan, fill = resolved.plan, resolved.fill
        if isinstance(plan, Hit):
            log_ = self.local.log(key)
            assert log_ is not None
            status = "edge; hit; detail=shared" if resolved.shared_hit else "edge; hit"
            return self._answer(
                read, log_, offset, plan.coverage.segments, plan.coverage.end,
                up_to_date=plan.up_to_date, closed=plan.closed,
                if_none_match=if_none_match, accept_encoding=accept_encoding,
                cache_status=status, result="hit",
            )  # fmt: skip
        assert fill is not None
        result = "delta" if plan.is_delta else "miss"
        forward = "partial" if plan.is_delta else "uri-miss"
        detail = "; collapsed" if resolved.collapsed else ("; stored" if fill.stored else "")
        cache_status = f"edge; fwd={forward}; fwd-status={fill.status}{detail}"
        if fill.status != 200 or fill.next_offset is None:
            return Answer(
                status=fill.status, headers=relayable(fill.headers), body=fill.body,
                cache_status=cache_status, result=result,
            )  # fmt: skip
        log_ = self._log_for(key)
        if log_.content_type is None:  # evicted or purged while the fetch was in flight
            log_.content_type = first_value(fill.headers, "content-type")
            log_.header_template = header_template(fill.headers)
        segments = self._joined(plan.prefix, fill.segment)
        return self._answer(
            read, log_, offset, segments, fill.next_offset,
            up_to_date=fill.up_to_date, closed=fill.closed,
            if_none_match=if_none_match, accept_encoding=accept_encoding,
            cache_status=cache_status, result=result,
        )  # fmt: skip

    @staticmethod
    def _joined(prefix: Coverage, segment: Segment | None) -> tuple[Segment, ...]:
        return (*prefix.segments, segment) if segment is not None else prefix.segments

    def _answer(
        self,
        read: Read,
        log_: StreamLog,
        start: str,
        segments: Sequence[Segment],
        end: str,
        *,
        up_to_date: bool,
        closed: bool,
        if_none_match: str | None,
        accept_encoding: str | None,
        cache_status: str,
        result: str,
    ) -> Answer:
        body = stitch(segments, json=log_.json)
        final = closed and up_to_date
        compress = len(body) >= COMPRESS_MIN_BYTES and accepts_gzip(accept_encoding)
        tag = etag(read.stream, start, end, closed=final, encoding="gzip" if compress else None)
        control = cache_control(
            scope=read.scope,
            immutable=final or not up_to_date,
            freshness_seconds=self._settings.tail_freshness_seconds,
        )
        headers = answer_headers(
            log_, next_offset=end, up_to_date=up_to_date, closed=final, tag=tag, control=control
        )
        if if_none_match_hits(if_none_match, tag):
            return Answer(
                status=304, headers=headers, body=b"", cache_status=cache_status, result=result
            )
        if compress:
            body = gzip.compress(body, compresslevel=5)
            headers.append(("Content-Encoding", "gzip"))
        return Answer(
            status=200, headers=headers, body=body, cache_status=cache_status, result=result
        )

    async def _pull_shared(self, key: LogKey, start: str) -> bool:
        """Copy the shared tier's segment at ``start`` into the local tier; False if none."""
        assert self._shared is not None
        found = await self._shared.get(key, start)
        if found is None:
            return False
        log_ = self._log_for(key)
        self._learn_lifetime(log_)
        if log_.content_type is None:
            log_.content_type = found.content_type
        return self.local.put(key, found.segment)

    async def _pull_shared_closure(self, key: LogKey, end: str) -> bool:
        """Did another replica see the stream closed exactly where the edge's chain ends?"""
        assert self._shared is not None
        log_ = self.local.log(key)
        if log_ is None or (log_.tail is not None and log_.tail.closed):
            return False
        if await self._shared.get_closed(key) != end:
            return False
        log_.observe_tail(end, closed=True, now=self._clock())
        return True

    async def probe_now(
        self, key: LogKey, credentials: Sequence[tuple[str, str]]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The origin's answer to ``offset=now`` (never cached; it touches the origin)."""
        headers = own_request_headers(credentials)
        upstream = await self._origin.open("GET", f"{key.stream}?offset=now", headers, live=False)
        try:
            self._metrics.origin_requests.labels(kind="catchup", code=str(upstream.status)).inc()
            body = await upstream.read()
        finally:
            upstream.close()
        response_headers = list(upstream.headers.items())
        if upstream.status in (404, 410):
            self.stream_gone(key)
        elif upstream.status == 200:
            log_ = self._log_for(key)
            log_.touched_origin(self._clock())
            if log_.content_type is None:
                log_.content_type = first_value(response_headers, "content-type")
                log_.header_template = header_template(response_headers)
        return upstream.status, response_headers, body

    async def _fill(self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]) -> Fill:
        headers = own_request_headers(credentials)
        upstream = await self._origin.open(
            "GET", f"{key.stream}?offset={quote(offset, safe='')}", headers, live=False
        )
        try:
            self._metrics.origin_requests.labels(kind="catchup", code=str(upstream.status)).inc()
            # Past --max-segment-bytes this raises BodyTooLarge: the web layer relays instead.
            body = await OriginClient.read_body(upstream, self._settings.max_segment_bytes)
        finally:
            upstream.close()
        self._metrics.origin_bytes.inc(len(body))
        response_headers = tuple(upstream.headers.items())
        return self._record(key, offset, upstream.status, response_headers, body)

    def _record(
        self,
        key: LogKey,
        offset: str,
        status: int,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
    ) -> Fill:
        """Learn from one origin answer: store its segment and what it says about the tail."""
        now = self._clock()
        next_offset = first_value(headers, "stream-next-offset")
        up_to_date = flag(headers, "stream-up-to-date")
        closed = flag(headers, "stream-closed")
        unusable = Fill(
            status=status, headers=headers, body=body, segment=None, next_offset=None,
            up_to_date=False, closed=False, stored=False,
        )  # fmt: skip
        if status in (404, 410):
            self.stream_gone(key)
            return unusable
        encoding = (first_value(headers, "content-encoding") or "identity").lower()
        if status != 200 or next_offset is None or encoding != "identity":
            return unusable
        content_type = first_value(headers, "content-type")
        segment = Segment(start=offset, end=next_offset, body=body)
        if is_json(content_type) and not _is_json_array(body):
            return unusable
        log_ = self._log_for(key)
        self._learn_lifetime(log_)
        log_.content_type = content_type
        log_.header_template = header_template(headers)
        log_.touched_origin(now)
        stored = False
        if next_offset != offset:
            stored = self.local.put(key, segment)
            if stored and self._shared is not None:
                self._shared.put(key, segment, content_type)
        if up_to_date:
            log_.observe_tail(next_offset, closed=closed, now=now)
            if closed and self._shared is not None:
                self._shared.put_closed(key, next_offset)
        return Fill(
            status=status, headers=headers, body=body,
            segment=segment if next_offset != offset else None, next_offset=next_offset,
            up_to_date=up_to_date, closed=closed, stored=stored,
        )  # fmt: skip

    # --- what live upstreams tell the cache ---

    def record_live(
        self,
        key: LogKey,
        start: str,
        end: str,
        body: bytes,
        *,
        up_to_date: bool,
        closed: bool,
    ) -> Segment | None:
        """A batch a live upstream delivered: [start, end). While the upstream runs, what it
        says about the tail is authoritative. Returns the stored segment, if any."""
        now = self._clock()
        log_ = self._log_for(key)
        log_.touched_origin(now)
        segment = None
        if end != start:
            segment = Segment(start=start, end=end, body=body)
            if self.local.put(key, segment) and self._shared is not None:
                self._shared.put(key, segment, log_.content_type)
        if up_to_date or closed:
            log_.observe_tail(end, closed=closed, now=now, authoritative=True)
            if closed and self._shared is not None:
                self._shared.put_closed(key, end)
        return segment

    def live_ended(self, key: LogKey) -> None:
        """The live upstream stopped: its last word on the tail is now only as of its time."""
        log_ = self.local.log(key)
        if log_ is not None:
            log_.lose_authority(self._clock())

    # --- what pass-through traffic tells the cache ---

    def _log_for(self, key: LogKey) -> StreamLog:
        log_ = self.local.log_for(key)
        floor = self._floors.get(key.stream)
        if floor is not None and (log_.floor is None or floor > log_.floor):
            log_.floor = floor
        return log_

    def _learn_lifetime(self, log_: StreamLog) -> None:
        lifetime = self._lifetimes.get(log_.key.stream)
        if lifetime is not None:
            log_.ttl_seconds = lifetime.ttl_seconds
            log_.expires_at = lifetime.expires_at

    def _remember_lifetime(self, stream: str, headers: Sequence[tuple[str, str]]) -> None:
        ttl = parse_ttl_seconds(first_value(headers, "stream-ttl"))
        expires_at = parse_expires_at(first_value(headers, "stream-expires-at"))
        if ttl is None and expires_at is None:
            return
        self._lifetimes[stream] = Lifetime(ttl_seconds=ttl, expires_at=expires_at)
        for log_ in self.local.logs_of(stream):
            self._learn_lifetime(log_)

    def observe(
        self,
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
    ) -> None:
        """Called for every answer the origin gave to a request the cache did not serve."""
        method = method.upper()
        if status in (404, 410) and method in ("GET", "HEAD"):
            self.stream_gone(LogKey(stream=stream, scope=auth_scope(request_headers)))
        elif method == "DELETE" and status < 400:
            self.purge(stream)
        elif method in ("PUT", "POST"):
            # Any write may have moved the tail (even a failed one may have raced one that did).
            floor = first_value(response_headers, "stream-next-offset") if status < 300 else None
            if floor is not None:
                known = self._floors.get(stream)
                self._floors[stream] = floor if known is None or floor > known else known
            for log_ in self.local.logs_of(stream):
                log_.mark_stale(floor)
            if method == "PUT" and status in (200, 201):
                self._remember_lifetime(stream, request_headers)
        elif method == "HEAD" and status == 200:
            self._remember_lifetime(stream, response_headers)

    def stream_gone(self, key: LogKey) -> None:
        """The origin said 404/410 to a request in ``key.scope``. Without credentials that is the
        stream's fate for everyone; with them it may only mean "not for you" (an origin may hide
        what a token cannot read), so only that scope forgets, and nobody can empty the cache
        for others by sending a bad token."""
        if key.scope == PUBLIC_SCOPE:
            self.purge(key.stream)
        else:
            self.local.purge_scope(key)

    def forget_locally(self, stream: str) -> int:
        """Forget ``stream`` in every scope on this replica (another replica purged it)."""
        self._lifetimes.pop(stream, None)
        self._floors.pop(stream, None)
        return self.local.purge(stream)

    def purge(self, stream: str) -> int:
        """Forget ``stream`` in every scope, here, in the shared tier and (through it) on every
        other replica; the shared part happens in the background."""
        dropped = self.forget_locally(stream)
        if self._shared is not None:
            task = asyncio.ensure_future(self._shared.purge(stream))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return dropped

    async def close(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)


def _is_json_array(body: bytes) -> bool:
    stripped = body.strip()
    return stripped.startswith(b"[") and stripped.endswith(b"]")


__all__ = ["Answer", "CatchupCache", "OriginError"]
