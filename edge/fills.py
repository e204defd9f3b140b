"""The catch-up fills: what the origin is asked for a read's missing bytes, single-flight, and
what one fill brought back (``Fill``) and a read resolved to (``Resolution``).

Every origin answer a fill brings back enters through the one door the live tails use too
(``Door.take_in``): the pure core (``edge.log.intake``) decides what it means (store it, relay
it to its one client, a new instance, a stream gone) and the door carries it out after deciding.

Rules this module owns:

* Identical origin fetches in flight are one (``Fills.fetch``: keyed by stream, scope, offset,
  the instance they were planned under and the tail their reader knew): a reader joins only a
  fill whose answer is what its own would have been (none that left before a write through the
  edge marked the tail stale); a reader that finds another's fill in flight
  waits at most ``--fill-wait`` for it, then its own read is relayed (``Bypass(FILL_OVERDUE)``),
  never queued behind a trickle.
* A fill that outlives ``--fill-deadline`` (stretched as its bytes arrive,
  ``fill_deadline_seconds``) is abandoned: its upstream closed, its buffer given back, nothing
  stored; its own reader is answered 504 (``OriginTimeout``), a reader that waited on it is
  relayed.
* A fill's bytes are read within ``--max-segment-bytes`` and the fill budget; the readers
  sharing one fetch each take their own share (``Hold``) of its bytes.
* ``offset=now`` (``Fills.probe_now``) is asked of the origin every time, never stored: what it
  says of the stream (gone, its tail, its content type) is learned, its body relayed.

* A fill's answer either joins the stream's chain (``Chained``: a forward segment of the current
  instance, with where it ends, ``Reach``, and whether the local tier kept it) or does not
  (``Unchained``: true for its own request only, or fetched under an instance forgotten
  meanwhile, so the read starts again). Nothing in between.
* A fill that outlived ``--fill-deadline`` is ``Abandoned``: nothing of it was stored.
* A reader's share of a fill's bytes (``Hold``) is given back once, by ``Resolution.release``
  or by whoever writes its answer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import assert_never
from urllib.parse import quote

from edge.answer import Answer, Bypass, Result, Why, relayable
from edge.coalesce import Joined, Led, Overdue, SingleFlight
from edge.config import Settings
from edge.fill_budget import FillBudget, FillDeadline, Hold, read_body
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.log.intake import Arrival, Decision, header_template
from edge.log.policy import Fetch, Hit
from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamInstance, TailFact
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginTimeout
from edge.protocol.headers import first_value, not_to_be_kept, own_request_headers
from edge.protocol.reads import is_offset_token
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Abandoned:
    """A fill that outlived ``--fill-deadline``: its upstream is closed, its share of the fill
    budget given back, and nothing of it was stored."""

    deadline_seconds: float


class Reach(enum.Enum):
    """Where a fill's answer ends, as the origin said."""

    BEHIND = "behind"  # more of the stream follows
    TAIL = "tail"  # at the tail (``Stream-Up-To-Date``)
    CLOSED = "closed"  # at the tail, and the stream is closed

    def __init__(self, value: str) -> None:
        # Plain attributes, set once per member: the readers of a fill ask them on every answer.
        self.up_to_date = value != "behind"
        self.closed = value == "closed"

    @staticmethod
    def of(*, up_to_date: bool, closed: bool) -> Reach:
        if not up_to_date:
            return Reach.BEHIND
        return Reach.CLOSED if closed else Reach.TAIL


@dataclass(frozen=True, kw_only=True, slots=True)
class Chained:
    """A fill's answer that is a forward segment of the current instance: it joins the chain."""

    segment: Segment | None
    next_offset: str
    reach: Reach
    kept: bool  # the segment is in the local tier (not refused for room)


class Unchained(enum.Enum):
    """A fill's answer that joins no chain."""

    FOR_THIS_REQUEST = "for this request"  # a refusal, past the tail, no-store: relayed verbatim
    STALE = "stale"  # fetched under a stream instance that was forgotten meanwhile: read again


@dataclass(frozen=True, kw_only=True, slots=True)
class Fill:
    """What one origin fetch at ``offset`` returned, shared by every collapsed waiter, and what
    it is to the stream's chain (``joins``)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    joins: Chained | Unchained
    hold: Hold | None = None

    def relayed(
        self, *, delta: bool, private: bool, cache_status: str, result: Result
    ) -> Answer | Bypass:
        """This fill's answer to its one reader, when it joins no chain (``Unchained``): true
        for this request only (a refusal, a read past the tail, what the origin forbade
        storing), so no cache downstream keeps it either. A 200 to a delta's request is not
        the client's answer: the client's own read goes to the origin."""
        if self.status == 200 and delta:
            return Bypass(
                why=Why.NOT_CACHEABLE, reason="the origin's answer to the delta cannot be joined"
            )
        headers = relayable(self.headers)
        if self.status == 200:
            # The origin's validator does not tell stream instances apart; the edge will not
            # hand out a tag it cannot honour.
            headers = [(n, v) for n, v in headers if n.lower() != "etag"]
        return Answer(
            status=self.status, headers=not_to_be_kept(headers, private=private), body=self.body,
            cache_status=cache_status, result=result if self.status != 200 else Result.BYPASS,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolution:
    plan: Hit | Fetch
    shared_hit: bool
    fill: Fill | None  # the origin's answer, when the plan was a Fetch
    collapsed: bool

    def release(self) -> None:
        """This reader is done with the fill's bytes (its answer is written, or not needed)."""
        if self.fill is not None and self.fill.hold is not None:
            self.fill.hold.release()

    @property
    def error(self) -> Fill | None:
        """The origin's refusal (404, 400, ...), if that is how the read ended."""
        if self.fill is not None and self.fill.status != 200:
            return self.fill
        return None


# A fill in flight: stream and scope, offset, the instance it was planned under, and the tail
# its reader knew (``StreamLog.tail`` when it asked; None: none known).
FlightKey = tuple[LogKey, str, StreamInstance, TailFact | None]


class Fills:
    """The origin asked for what a catch-up read is missing: one fetch per offset and instance
    in flight, its answer taken in through the door."""

    def __init__(
        self,
        settings: Settings,
        origin: OriginClient,
        metrics: Metrics,
        *,
        local: LocalTier,
        door: Door,
        forgetter: Forgetter,
        ticket: Callable[[], int],
        fill_budget: FillBudget,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._origin = origin
        self._metrics = metrics
        self._local = local
        self._door = door
        self._forgetter = forgetter
        self._ticket = ticket
        self._fill_budget = fill_budget
        self._clock = clock
        self._flights: SingleFlight[FlightKey, Fill | Abandoned] = SingleFlight()

    async def fetch(
        self,
        key: LogKey,
        fetch: Fetch,
        credentials: Sequence[tuple[str, str]],
        instance: StreamInstance,
    ) -> tuple[Fill, bool] | Bypass:
        """The fill this reader answers from (led or joined, with this reader's share of its
        bytes taken) and whether it shared another reader's; a ``Bypass`` when it did not end
        in time for a reader that waited on it."""
        # What this reader knows of the tail is part of what it asks: a fill that left before a
        # write through the edge marked the tail stale (or a refill before a fill moved it) is
        # not the answer this reader's own request would get, so it is not joined.
        log = self._local.log(key)
        known = log.tail if log is not None else None
        flight = await self._flights.join(
            (key, fetch.offset, instance, known),
            lambda: self._fill(key, fetch, credentials, instance),
            wait_seconds=self._settings.fill_wait_seconds,
        )
        outcome = self._outcome(key, flight)
        if isinstance(outcome, Bypass):
            return outcome
        fill = outcome[0]
        if fill.hold is not None:
            fill.hold.acquire()  # this reader's share, released by whoever writes its answer
        return outcome

    def _outcome(
        self, key: LogKey, flight: Led[Fill | Abandoned] | Joined[Fill | Abandoned] | Overdue
    ) -> tuple[Fill, bool] | Bypass:
        """The fill this reader answers from, and whether it shared another reader's; a fill
        that did not end in time ends this read here (504 to its own reader, a relay to one
        that waited on it)."""
        match flight:
            case Led():
                shared = False
            case Joined():
                shared = True
            case Overdue(waited_seconds=waited):
                return Bypass(
                    why=Why.FILL_OVERDUE,
                    reason=f"the fill this read waited on took over {waited:g} s",
                )
            case _:
                assert_never(flight)
        outcome = flight.value
        match outcome:
            case Fill() as fill:
                if shared:
                    self._metrics.collapsed_requests.labels(kind="catchup").inc()
                return fill, shared
            case Abandoned() if shared:
                return Bypass(
                    why=Why.FILL_OVERDUE, reason="the fill this read waited on was abandoned"
                )
            case Abandoned() as abandoned:
                raise OriginTimeout(
                    f"{key.stream}: the fill passed --fill-deadline "
                    f"({abandoned.deadline_seconds:g} s) and was abandoned"
                )
            case _:
                assert_never(outcome)

    async def probe_now(
        self, key: LogKey, credentials: Sequence[tuple[str, str]]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The origin's answer to ``offset=now`` (never cached; it touches the origin)."""
        headers = own_request_headers(credentials)
        asked_at = self._clock()  # the origin renews a sliding TTL after this (``Arrival``)
        instance = self._local.instance_for(key.stream)
        started = self._ticket()
        upstream = await self._origin.open("GET", f"{key.stream}?offset=now", headers, live=False)
        try:
            self._metrics.origin_requests.labels(kind="catchup", code=str(upstream.status)).inc()
            body, hold = await read_body(
                upstream, self._settings.max_segment_bytes, self._fill_budget
            )
            hold.release()  # a few bytes, read now and done with
        finally:
            upstream.close()
        response_headers = list(upstream.headers.items())
        next_offset = first_value(response_headers, "stream-next-offset")
        decision = self._door.evidence(
            key, upstream.status, response_headers, started=started, instance=instance
        )
        if decision is Decision.GONE:
            await self._forgetter.settled(key.stream)
        elif upstream.status == 200 and is_offset_token(next_offset):
            instance = self._local.instance_for(key.stream)
            instance.touched_origin(asked_at)
            log = self._local.log_for(key)
            if log.content_type is None:
                log.content_type = first_value(response_headers, "content-type")
                log.header_template = self._local.template(header_template(response_headers))
        return upstream.status, response_headers, body

    async def _fill(
        self,
        key: LogKey,
        fetch: Fetch,
        credentials: Sequence[tuple[str, str]],
        instance: StreamInstance,
    ) -> Fill | Abandoned:
        headers = own_request_headers(credentials)
        started = self._ticket()
        asked_at = self._clock()
        deadline = FillDeadline(self._settings.fill_deadline_seconds)
        try:
            async with deadline.timeout:
                upstream = await self._origin.open(
                    "GET", f"{key.stream}?offset={quote(fetch.offset, safe='')}", headers,
                    live=False,
                )  # fmt: skip
                try:
                    code = str(upstream.status)
                    self._metrics.origin_requests.labels(kind="catchup", code=code).inc()
                    body, hold = await read_body(
                        upstream, self._settings.max_segment_bytes, self._fill_budget, deadline
                    )
                finally:
                    # Closing (not releasing) drops a connection whose body was cut short.
                    upstream.close()
        except TimeoutError:
            if not deadline.timeout.expired():
                raise
            # read_body gave back what it held; nothing reached the log.
            waited = asyncio.get_running_loop().time() - deadline.begun
            logger.warning(
                "fill of %s at %s abandoned after %g s", key.stream, fetch.offset, waited
            )
            return Abandoned(deadline_seconds=waited)
        self._metrics.origin_bytes.inc(len(body))
        response_headers = tuple(upstream.headers.items())
        hold.release_flight()  # the readers sharing this fetch take their own shares
        fill = self._record(
            key, fetch, upstream.status, response_headers, body,
            instance=instance, started=started, credentials=credentials, asked_at=asked_at,
        )  # fmt: skip
        return replace(fill, hold=hold)

    def _record(
        self,
        key: LogKey,
        fetch: Fetch,
        status: int,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        instance: StreamInstance,
        started: int,
        credentials: Sequence[tuple[str, str]],
        asked_at: float,
    ) -> Fill:
        """Learn from one origin answer, through the one door (``Door.take_in``); its request
        left at ``asked_at``."""
        arrival = Arrival.of_fill(
            fetch.offset, status, headers, body,
            started=started, received=self._ticket(), now=self._clock(), asked_at=asked_at,
        )  # fmt: skip
        taken = self._door.take_in(key, instance, arrival, credentials)
        if taken.decision is Decision.STORE:
            assert arrival.end is not None
            reach = Reach.of(up_to_date=arrival.up_to_date, closed=arrival.closed)
            chained = Chained(
                segment=taken.segment, next_offset=arrival.end, reach=reach, kept=taken.stored
            )
            return Fill(status=status, headers=headers, body=body, joins=chained)
        # Fetched under an instance that is gone, or revealing that the one it was fetched
        # under is: the answer is not of the instance it was asked for; the read starts again.
        stale = taken.decision in (Decision.STALE, Decision.NEW_INSTANCE)
        joins = Unchained.STALE if stale else Unchained.FOR_THIS_REQUEST
        return Fill(status=status, headers=headers, body=body, joins=joins)
