"""Live reads: long-polls and SSE viewers, every one a cursor into the shared stream log.

Rules this module owns (PROTOCOL.md §5.7, §5.8, §10; DESIGN.md):

* A live reader first makes sure the edge knows the log from its offset to the tail (the
  catch-up machinery, collapsed), then follows the stream's single upstream ``Tail``.
* Readers hold no queue: each one reads the log from its own offset at its own pace and waits on
  the tail only when it has caught up. A slow socket slows only its own reader, which lags and
  catches up from the log (or, past what the edge retains, from the origin, collapsed).
* SSE frames for a batch are encoded once and the same bytes are written to every viewer that
  reads that batch with the same cursor; each batch is one ``data`` event followed by its
  ``control`` event, both with ``id: <offset after the batch>``. Encoded frames are kept in the
  local tier's one budget, keyed by the content digest of their segments, and forgotten with
  their stream: a stream deleted and recreated can never be read through an old frame.
* When a stream is forgotten (deleted, purged, found replaced at the origin), its tails stop and
  its viewers and waiting long-polls end: none of them may carry one instance's bytes into
  another. Clients resume by offset against whatever the stream is now.
* Long-polls at the tail wait on the tail and end in 200 with the new bytes, or 204 at the
  timeout; a closed stream at its tail answers 204 with ``Stream-Closed`` at once. Those
  waiting together are answered together (``edge.live.polls``): one ``settle`` per group.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import Callable, Sequence
from enum import Enum

from edge.answer import Answer, relayable
from edge.catchup import CatchupCache, RelayInstead
from edge.config import Settings
from edge.live.polls import LongPollFanout, Socket, Written
from edge.live.tail import Tail, TailRegistry
from edge.live.viewers import SseFanout, chunk
from edge.log.policy import Coverage, answer_headers, cover, etag
from edge.log.segment import Segment, content_digest, media_type, stitch
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.protocol.cursor import current_interval, cursor_class, response_cursor
from edge.protocol.offsets import is_offset_token
from edge.protocol.sse import encode_event


def sse_encoding(content_type: str | None) -> str:
    """How data events carry bytes: ``text`` for text/* and JSON, else ``base64`` (§5.8)."""
    ct = media_type(content_type)
    return "text" if ct.startswith("text/") or ct == "application/json" else "base64"


class Pending(Enum):
    """Why a long-poll has no answer yet: it waits (WAIT), must fetch the gap to the tail
    (GAP), or its stream is gone (GONE). The last two wake a group's waiters to do it each."""

    WAIT = "wait"
    GAP = "gap"
    GONE = "gone"

    @property
    def wakes(self) -> bool:
        return self is not Pending.WAIT


class LiveHub:
    def __init__(
        self,
        settings: Settings,
        cache: CatchupCache,
        origin: OriginClient,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.metrics = metrics
        self.fanout = SseFanout(self)
        self.polls = LongPollFanout(self)
        self.tails = TailRegistry(cache, origin, settings, metrics, listener=self)
        self.draining = asyncio.Event()
        self.clock = clock
        self.rng = rng or random.Random()
        self.viewers = 0
        cache.streams.forgotten.append(self._stream_forgotten)

    async def close(self) -> None:
        await self.tails.close()
        await self.fanout.close()

    def start_draining(self) -> None:
        self.draining.set()
        self.fanout.wake_all()
        self.polls.wake_all()

    def _stream_forgotten(self, stream: str) -> None:
        """Every tail, viewer and long-poll of ``stream`` ends (see the module rules)."""
        for tail in self.tails.all():
            if tail.key.stream == stream:
                tail.gone = True
                self.fanout.ended(tail.key)
                self.polls.ended(tail.key)

    # --- the tails' listener: SSE viewers first, then long-polls ---

    def batch(
        self, key: LogKey, segment: Segment | None, end: str, *, up_to_date: bool, closed: bool
    ) -> None:
        self.fanout.batch(key, segment, end, up_to_date=up_to_date, closed=closed)
        self.polls.batch(key)

    def ended(self, key: LogKey) -> None:
        self.fanout.ended(key)
        self.polls.ended(key)

    # --- shared steps ---

    async def known_from(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Answer | None:
        """Make the log known from ``offset`` on; the origin's refusal if it refuses."""
        resolved = await self.cache.resolve(key, offset, credentials)
        resolved.release()  # live readers are served from the log, not from this fill's bytes
        fill = resolved.fill
        if fill is not None and fill.relay and fill.status == 200:
            # Past the tail, not storable, or from an instance just replaced: the origin answers
            # this live read itself.
            raise RelayInstead("the origin's answer is for this request only")
        error = resolved.error
        if error is None:
            return None
        return Answer(
            result="live",
            status=error.status,
            headers=relayable(error.headers),
            body=error.body,
            cache_status=f"edge; fwd=uri-miss; fwd-status={error.status}",
        )

    async def tail_now(self, key: LogKey, credentials: Sequence[tuple[str, str]]) -> str | Answer:
        """The tail offset for ``offset=now``: the live upstream's word if there is one, else the
        origin's (``offset=now`` answers are never cached)."""
        log_ = self.cache.local.log(key)
        if log_ is not None and log_.tail is not None and log_.tail.authoritative:
            return log_.tail.offset
        status, headers, body = await self.cache.probe_now(key, credentials)
        next_offset = {n.lower(): v for n, v in headers}.get("stream-next-offset")
        if status != 200 or next_offset is None or not is_offset_token(next_offset):
            return Answer(
                result="live",
                status=status,
                headers=relayable(headers),
                body=body,
                cache_status=f"edge; fwd=bypass; fwd-status={status}",
            )
        return next_offset

    def fixed_cursor(self, client_cursor: str | None) -> str | None:
        """For an SSE connection whose cursor is not behind: its one jittered answer."""
        if client_cursor is None:
            return None
        answer = self._cursor(client_cursor)
        return answer if answer != str(current_interval(self.clock())) else None

    def _cursor(self, client_cursor: str | None) -> str:
        return response_cursor(client_cursor, now=self.clock(), rng=self.rng)

    def tail_offset(self, key: LogKey) -> str | None:
        log_ = self.cache.local.log(key)
        return log_.tail.offset if log_ is not None and log_.tail is not None else None

    # --- long-poll ---

    async def long_poll(
        self,
        key: LogKey,
        offset: str,
        client_cursor: str | None,
        credentials: Sequence[tuple[str, str]],
        *,
        max_seconds: float | None = None,
        socket: Socket | None = None,
    ) -> Answer | Written:
        """Answer a long-poll from the log, or wait at the tail with every other long-poll there
        (``edge.live.polls``); with ``socket``, a released answer may be written directly.
        ``max_seconds``: the wait ends sooner (a reader's credential expires then)."""
        refused = await self.known_from(key, offset, credentials)
        if refused is not None:
            return refused
        start = self.tail_offset(key) or offset
        wait = self.settings.long_poll_timeout_seconds
        if max_seconds is not None:
            wait = min(wait, max_seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        cursor = cursor_class(client_cursor)
        waited = False
        fetched = False
        async with self.tails.watching(key, start, credentials) as tail:
            while True:
                outcome = self.settle(
                    key, tail, offset, cursor=self._cursor(client_cursor), waited=waited,
                    expired=loop.time() >= deadline, fetched=fetched,
                )  # fmt: skip
                fetched = False
                if isinstance(outcome, Answer):
                    return outcome
                if outcome is Pending.GONE:
                    # Deleted or replaced while waiting: the origin says what the stream is now.
                    raise RelayInstead("the stream this long-poll waited on is gone")
                if outcome is Pending.GAP:
                    # The offset is not where the edge's chain ends: fetch the gap, collapsed.
                    refused = await self.known_from(key, offset, credentials)
                    if refused is not None:
                        return refused
                    fetched = not cover(self.cache.local.get, key, offset, max_bytes=1).segments
                    continue
                released = await self.polls.wait(key, tail, offset, cursor, deadline, socket)
                waited = True
                if released is not None:
                    return released

    def settle(
        self,
        key: LogKey,
        tail: Tail,
        offset: str,
        *,
        cursor: str,
        waited: bool,
        expired: bool,
        fetched: bool = False,
    ) -> Answer | Pending:
        """What a long-poll at ``offset`` gets now: its answer, or what it must do first. The
        one decision for a single long-poll and for a group released together (whose members
        then differ only by ``cursor``). ``fetched``: the gap before the tail was just fetched
        and did not reach ``offset``, so wait for the tail rather than fetch again."""
        coverage = cover(
            self.cache.local.get, key, offset, max_bytes=self.settings.max_response_bytes
        )
        log_ = self.cache.local.log(key)
        if coverage.segments and log_ is not None:
            return self._long_poll_data(key, log_, offset, coverage, cursor, waited)
        if tail.gone or log_ is None:
            return Pending.GONE
        fact = log_.tail
        at_tail = fact is not None and fact.offset == offset
        if at_tail and fact is not None and fact.closed:
            return self._long_poll_empty(log_, offset, cursor, closed=True)
        if not at_tail and not fetched:
            return Pending.GAP
        if expired or self.draining.is_set():
            if tail.failing and not self.draining.is_set():
                # "Nothing new" would be a guess: the edge cannot reach the origin.
                return Answer(
                    status=502,
                    headers=[("Content-Type", "text/plain")],
                    body=b"origin unavailable: the live upstream is failing\n",
                    cache_status="edge; fwd=request; detail=upstream-failing",
                    result="live",
                )
            return self._long_poll_empty(log_, offset, cursor, closed=False)
        return Pending.WAIT

    def _long_poll_data(
        self,
        key: LogKey,
        log_: StreamLog,
        offset: str,
        coverage: Coverage,
        cursor: str,
        waited: bool,
    ) -> Answer:
        end = coverage.end
        at_tail = log_.tail is not None and log_.tail.offset == end and not coverage.capped
        closed = at_tail and log_.tail is not None and log_.tail.closed
        headers = answer_headers(
            log_,
            next_offset=end,
            up_to_date=at_tail,
            closed=closed,
            tag=etag(
                key.stream,
                offset,
                end,
                digest=content_digest(coverage.segments, log_.content_type),
                closed=closed,
                encoding=None,
            ),
            control=self.cache.reuse_for(log_, immutable=closed or not at_tail).cache_control,
            cursor=None if closed else cursor,
            varies_by_encoding=False,  # long-poll answers are never compressed here
        )
        return Answer(
            result="live",
            status=200,
            headers=headers,
            body=stitch(coverage.segments, json=log_.json),
            cache_status="edge; hit; detail=waited" if waited else "edge; hit",
        )

    def _long_poll_empty(
        self, log_: StreamLog, offset: str, cursor: str, *, closed: bool
    ) -> Answer:
        headers = list(log_.header_template)
        headers += [("Stream-Next-Offset", offset), ("Stream-Up-To-Date", "true")]
        if closed:
            headers.append(("Stream-Closed", "true"))
        else:
            headers.append(("Stream-Cursor", cursor))
        # Never store "nothing new" (PROTOCOL-NOTES trap 1).
        headers.append(("Cache-Control", "no-store"))
        return Answer(
            status=204, headers=headers, body=b"", cache_status="edge; hit", result="live"
        )

    # --- SSE ---

    def frames(
        self,
        key: LogKey,
        log_: StreamLog,
        coverage: Coverage,
        *,
        up_to_date: bool,
        closed: bool,
        cursor: str,
        chunked: bool,
    ) -> bytes:
        """The data + control events for ``coverage``, encoded once per (range, state, cursor),
        and, for direct writes to a chunked response, framed as one HTTP chunk."""
        start = coverage.segments[0].start if coverage.segments else coverage.end
        digest = content_digest(coverage.segments, log_.content_type)
        name = ("sse", start, coverage.end, digest, up_to_date, closed, cursor, chunked)
        cached = self.cache.local.derived(key, name)
        if cached is not None:
            return cached
        frame = b""
        end = coverage.end
        if coverage.segments:
            body = stitch(coverage.segments, json=log_.json)
            if sse_encoding(log_.content_type) == "base64":
                payload = base64.b64encode(body).decode()
            else:
                payload = body.decode("utf-8", errors="replace")
            frame += encode_event("data", payload, event_id=end)
        control: dict[str, object] = {"streamNextOffset": end}
        if closed:
            control["streamClosed"] = True
        else:
            control["streamCursor"] = cursor
            if up_to_date:
                control["upToDate"] = True
        frame += encode_event("control", json.dumps(control, separators=(",", ":")), event_id=end)
        if chunked:
            frame = chunk(frame)
        self.cache.local.put_derived(key, name, frame, log_.instance)
        return frame


__all__ = ["LiveHub", "OriginClient", "Pending", "Socket", "Written", "sse_encoding"]
