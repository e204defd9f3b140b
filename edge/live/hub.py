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
  another. Clients resume by offset against whatever the stream is now. When only what is held
  of it is in doubt (the origin went away: ``edge.log.trust``), that is forgotten and the tails
  go on from their offsets, as a client of the origin would; a fresh reader asks the origin.
* Long-polls at the tail wait on the tail and end in 200 with the new bytes, or 204 at the
  timeout; a closed stream at its tail answers 204 with ``Stream-Closed`` at once. Those
  waiting together are answered together (``edge.live.polls``): one ``settle`` per group.

What each answer and frame holds is ``edge.live.answers``'s (pure); this module decides which
one a reader gets and when, and keeps the frames it encodes.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import assert_never

from edge.answer import Answer, Bypass, Why
from edge.catchup import CatchupCache
from edge.config import Settings
from edge.fills import Chained, Fills
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.live.answers import (
    Pending,
    long_poll_data,
    long_poll_empty,
    origin_refusal,
    sse_frames,
    upstream_failing,
)
from edge.live.polls import AlreadyWritten, Encode, LongPollFanout, Socket
from edge.live.tail import Tail, TailRegistry
from edge.live.viewers import SseFanout
from edge.log.policy import Coverage, cover
from edge.log.segment import Segment, content_digest
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics
from edge.origin import BodyTooLarge, OriginClient
from edge.protocol.cursor import current_interval, cursor_class, response_cursor
from edge.protocol.reads import PUBLIC_SCOPE, is_offset_token
from edge.store.local import LocalTier


class LiveHub:
    """``encode``: how the web layer frames a released long-poll's answer for a direct write
    (``edge.live.polls``); None: no direct writes."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        origin: OriginClient,
        *,
        catchup: CatchupCache,
        fills: Fills,
        local: LocalTier,
        door: Door,
        forgetter: Forgetter,
        ticket: Callable[[], int],
        encode: Encode | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._catchup = catchup
        self._fills = fills
        self._local = local
        self.fanout = SseFanout(self)
        self.polls = LongPollFanout(self, encode=encode)
        self.tails = TailRegistry(
            local, door, forgetter, ticket, origin, settings, metrics, listener=self
        )
        self.draining = asyncio.Event()
        self.clock = clock
        self.rng = rng or random.Random()
        # The hub hears of every forgetting from the one it is handed: a forgotten stream's
        # tails and readers end (or, in doubt, follow the instance begun in its place).
        forgetter.on_forgotten_here.append(self._stream_forgotten)
        forgetter.on_unconfirmed.append(self._stream_unconfirmed)

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

    def _stream_unconfirmed(self, stream: str) -> None:
        """What was held of ``stream`` is forgotten but its followers stay (the origin went
        away: ``edge.log.trust``): its tails go on from their offsets into the instance begun
        in its place, and readers read what they record, or ask the origin for the rest."""
        instance = self._local.instance_for(stream)
        for tail in self.tails.all():
            if tail.key.stream == stream and not tail.finished:
                tail.instance = instance
                self._local.log_for(tail.key).followed_from(tail.offset)

    # --- the tails' listener: SSE viewers first, then long-polls ---

    def batch(
        self,
        key: LogKey,
        segments: tuple[Segment, ...],
        end: str,
        *,
        up_to_date: bool,
        closed: bool,
    ) -> None:
        self.fanout.batch(key, segments, end, up_to_date=up_to_date, closed=closed)
        self.polls.batch(key)

    def ended(self, key: LogKey) -> None:
        self.fanout.ended(key)
        self.polls.ended(key)

    # --- shared steps ---

    async def known_from(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Answer | Bypass | None:
        """Make the log known from ``offset`` on; the origin's refusal if it refuses, a
        ``Bypass`` if the origin is to answer this read itself."""
        resolved = await self._catchup.resolve(key, offset, credentials)
        if isinstance(resolved, Bypass):
            return resolved
        fill = resolved.fill
        if fill is None:
            return None  # answered from the logs: known from ``offset`` on
        resolved.release()  # live readers are served from the log, not from this fill's bytes
        if not isinstance(fill.joins, Chained) and fill.status == 200:
            # Past the tail, not storable, or from an instance just replaced: the origin answers
            # this live read itself.
            return Bypass(
                why=Why.NOT_CACHEABLE, reason="the origin's answer is for this request only"
            )
        error = resolved.error
        if error is None:
            return None
        return origin_refusal(
            error.status, error.headers, error.body, forwarded="uri-miss",
            private=key.scope != PUBLIC_SCOPE,
        )  # fmt: skip

    async def start(
        self,
        key: LogKey,
        offset: str,
        last_event_id: str | None,
        credentials: Sequence[tuple[str, str]],
    ) -> str | Answer | Bypass:
        """Where a live read starts: ``now`` is the tail; a ``Last-Event-ID`` further on than the
        URL wins, so a browser EventSource reconnecting to its original URL resumes exactly
        (even one opened at ``offset=now``: its Last-Event-ID is where it left off, not the
        tail now)."""
        if offset == "now" and last_event_id and last_event_id != "now":
            return last_event_id
        if offset == "now":
            resolved = await self.tail_now(key, credentials)
            if not isinstance(resolved, str):
                return resolved
            offset = resolved
        if last_event_id and last_event_id != "now" and last_event_id > offset:
            offset = last_event_id
        return offset

    async def tail_now(
        self, key: LogKey, credentials: Sequence[tuple[str, str]]
    ) -> str | Answer | Bypass:
        """The tail offset for ``offset=now``: the live upstream's word if there is one, else the
        origin's (``offset=now`` answers are never cached)."""
        log = self._local.log(key)
        if log is not None and log.tail is not None and log.tail.authoritative:
            return log.tail.offset
        try:
            status, headers, body = await self._fills.probe_now(key, credentials)
        except BodyTooLarge as uncacheable:
            return Bypass(why=Why.TOO_LARGE, reason=str(uncacheable))
        next_offset = {n.lower(): v for n, v in headers}.get("stream-next-offset")
        if status != 200 or next_offset is None or not is_offset_token(next_offset):
            return origin_refusal(
                status, headers, body, forwarded="bypass", private=key.scope != PUBLIC_SCOPE
            )
        return next_offset

    def fixed_cursor(self, client_cursor: str | None) -> str | None:
        """For an SSE connection whose cursor is not behind: its one jittered answer."""
        if client_cursor is None:
            return None
        answer = self.cursor_for(client_cursor)
        return answer if answer != str(current_interval(self.clock())) else None

    def cursor_for(self, client_cursor: str | None) -> str:
        """The ``Stream-Cursor`` of an answer to a reader whose cursor was ``client_cursor``."""
        return response_cursor(client_cursor, now=self.clock(), rng=self.rng)

    def tail_offset(self, key: LogKey) -> str | None:
        log = self._local.log(key)
        return log.tail.offset if log is not None and log.tail is not None else None

    def stream_log(self, key: LogKey) -> StreamLog | None:
        return self._local.log(key)

    def known_log(self, key: LogKey) -> StreamLog:
        """The log a viewer joining now reads (made if the edge holds nothing of it yet)."""
        return self._local.log_for(key)

    def cover(self, key: LogKey, offset: str, *, max_bytes: int) -> Coverage:
        return cover(self._local.get, key, offset, max_bytes=max_bytes)

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
    ) -> Answer | AlreadyWritten | Bypass:
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
                    key, tail, offset, cursor=self.cursor_for(client_cursor), waited=waited,
                    expired=loop.time() >= deadline, fetched=fetched,
                )  # fmt: skip
                fetched = False
                match outcome:
                    case Answer():
                        return outcome
                    case Pending.GONE:
                        # Deleted or replaced while waiting: the origin says what the stream is
                        # now.
                        return Bypass(
                            why=Why.NOT_CACHEABLE,
                            reason="the stream this long-poll waited on is gone",
                        )
                    case Pending.GAP:
                        # The offset is not where the edge's chain ends: fetch the gap,
                        # collapsed.
                        refused = await self.known_from(key, offset, credentials)
                        if refused is not None:
                            return refused
                        fetched = not self.cover(key, offset, max_bytes=1).segments
                    case Pending.WAIT:
                        released = await self.polls.wait(
                            key, tail, offset, cursor, deadline, socket
                        )
                        waited = True
                        if released is not None:
                            return released
                    case _:
                        assert_never(outcome)

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
        coverage: Coverage | None = None,
    ) -> Answer | Pending:
        """What a long-poll at ``offset`` gets now: its answer, or what it must do first. The
        one decision for a single long-poll and for a group released together (whose members
        then differ only by ``cursor``). ``fetched``: the gap before the tail was just fetched
        and did not reach ``offset``, so wait for the tail rather than fetch again.
        ``coverage``: the log's from ``offset`` now, if the caller has it (the catch-up plan's)."""
        if coverage is None:
            coverage = self.cover(key, offset, max_bytes=self.settings.max_response_bytes)
        log = self._local.log(key)
        if coverage.segments and log is not None:
            return long_poll_data(
                log, offset, coverage, cursor=cursor, waited=waited,
                reuse_for=functools.partial(self._catchup.reuse_for, log),
                age_of=self._catchup.age_of,
            )  # fmt: skip
        if tail.gone or log is None:
            return Pending.GONE
        fact = log.tail
        at_tail = fact is not None and fact.offset == offset
        if at_tail and fact is not None and fact.closed:
            return long_poll_empty(log, offset, cursor=cursor, closed=True)
        if not at_tail and not fetched:
            return Pending.GAP
        if expired or self.draining.is_set():
            if tail.failing and not self.draining.is_set():
                # "Nothing new" would be a guess: the edge cannot reach the origin.
                return upstream_failing()
            return long_poll_empty(log, offset, cursor=cursor, closed=False)
        return Pending.WAIT

    # --- SSE ---

    def frames(
        self,
        key: LogKey,
        log: StreamLog,
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
        digest = content_digest(coverage.segments, log.content_type)
        name = ("sse", start, coverage.end, digest, up_to_date, closed, cursor, chunked)
        cached = self._local.derived(key, name)
        if cached is not None:
            return cached
        frame = sse_frames(
            log, coverage, up_to_date=up_to_date, closed=closed, cursor=cursor, chunked=chunked
        )
        self._local.put_derived(key, name, frame, log.instance)
        return frame


__all__ = ["AlreadyWritten", "LiveHub", "OriginClient", "Pending", "Socket"]
