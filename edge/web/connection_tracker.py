"""The asyncio adapter of ``edge.web.connection_table``: one tracker per stream listener feeds
the table what happens to its connections and carries out what the table decides.

Rules this module owns:

* The request hook: a head is complete when aiohttp hands the request to the application, and
  the request is over when its handler returns. ``ConnectionTracker.middleware`` reports both,
  as ``tracker.request_started(request.transport)`` and ``tracker.request_finished(transport)``;
  ``edge.server`` installs it as the stream application's outermost middleware. With the fast
  path on, the middleware writes aiohttp's answer itself and then tells the connection
  (``request_done``), so the connection knows when its next head may be answered. It tells the
  connection too when a request starts (``request_started``) and is classified
  (``request_classified``): a half-closed client's connection decides on both.
* Deadlines are enforced by one sweep per listener, every quarter of the shortest timeout (kept
  between 50 ms and 1 s); a transport that fails to close does not stop the sweep. A request
  whose body is past its deadline is answered 408 by its connection (``body_timed_out``: if
  nothing of an answer was written) before the close.
* The kind hook: the application tells the tracker what each request is once it has classified
  it (``request_kind``: a live reader or a short request) and when a live one ends
  (``live_ended``); the table decides, the tracker closes whom it evicts and says which
  requests are refused, and the application answers those (503, ``Retry-After``, CORS).
* A connection refused at the cap reads its 503 before the close: up to
  ``MAX_LINGERING_REFUSALS`` at once are half-closed and aborted ``REFUSAL_LINGER_SECONDS``
  later (the connection discards what the client sends meanwhile, reading only its request
  line, to count the refusal by kind); beyond that, or without a half-close, it is closed at
  once.
* An operator is warned when a cap is hit, at most once a minute per kind (evicting,
  refusing, turning viewers away).
* At stop, the listener is closed first, then every connection closes once answered, and
  the answers connections give themselves are waited for up to ``--drain-seconds`` (then cut)
  before the application closes what they use (``stop``).
* Counters (evicted, refused, header, keep-alive and body timeouts, refusals by request kind and
  reason) are plain attributes, read at scrape time.

The connections themselves are ``edge.web.connection_protocol``'s; the tracker knows them only
as ``TrackedConnection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol, assert_never, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from edge.live.polls import Sink
from edge.metrics import ListenerStats
from edge.protocol.reads import RequestKind
from edge.web.connection_table import ConnectionTable, Limits, Phase, Refusal
from edge.web.fast_catchup import FastCatchup
from edge.web.fast_polls import FastPolls
from edge.web.fast_sse import FastSse
from edge.web.fastpath import FastPath
from edge.web.own_gate import OwnGate
from edge.web.own_relay import OwnRelay

logger = logging.getLogger(__name__)

# A refused newcomer reads its 503 before the close: lingering refusals half-close and discard
# what the client sent, for at most this long and this many at once (beyond: close at once).
REFUSAL_LINGER_SECONDS = 1.0
MAX_LINGERING_REFUSALS = 256
REFUSAL_BODY = b"edge is at --max-connections; retry shortly\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(REFUSAL_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"\r\n" + REFUSAL_BODY
)
# How often an operator is told the cap is being hit.
CAP_WARNING_INTERVAL_SECONDS = 60.0
LIVE_KINDS = frozenset({RequestKind.SSE, RequestKind.LONG_POLL})
# The kind of a refusal whose request line never arrived.
UNKNOWN_KIND = "unknown"


class TrackedConnection(Protocol):
    """What the tracker asks of an admitted connection (``edge.web.connection_protocol``)."""

    def request_started(self, request: web.BaseRequest) -> None: ...

    def request_classified(self) -> None: ...

    def request_done(self, *, completed: bool) -> None: ...

    def close_if_idle(self) -> None: ...

    def answering_on_its_own(self) -> bool:
        """Is an answer of the connection's own (a feed, a catch-up, a parked long-poll) in
        progress? Such answers use the origin client: the stop waits for them first."""
        ...

    def body_timed_out(self) -> None: ...

    def send(self, data: bytes) -> None: ...

    def closing(self) -> bool: ...


def _flushing(transport: asyncio.Transport) -> bool:
    return transport.get_write_buffer_size() > 0


class ConnectionTracker:
    """The asyncio side: one per listener. Counters are plain attributes (read at scrape time)."""

    def __init__(
        self,
        limits: Limits,
        *,
        fast: FastPath | None = None,
        polls: FastPolls | None = None,
        sse: FastSse | None = None,
        catchup: FastCatchup | None = None,
        gate: OwnGate | None = None,
        relay: OwnRelay | None = None,
        drain_seconds: float = 0.0,
    ) -> None:
        self.table: ConnectionTable[asyncio.Transport] = ConnectionTable(limits)
        self.evicted = 0
        self.refused = 0
        # Refusals by (request kind, reason): a flood shows as viewers turned away, and a
        # refused write is never silent (edge_refusals_total, alert EdgeWritesRefused).
        self.refusals: dict[tuple[str, str], int] = {}
        self.header_timeouts = 0
        self.keepalive_timeouts = 0
        self.body_timeouts = 0
        self._lingering = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._warned_at: dict[str, float] = {}
        # The stored hits the connections answer themselves (handed in by edge.web.wiring).
        self.fast = fast
        # The long-polls they serve themselves (``edge.web.fast_polls``).
        self.polls = polls
        self.sse = sse  # and SSE reads (``edge.web.fast_sse``)
        self.catchup = catchup  # and catch-up reads stored hits do not answer
        self.gate = gate  # with --auth: the gate's decision before each (``edge.web.own_gate``)
        self.relay = relay  # and reads the cache relays (``edge.web.own_relay``)
        self._connections: dict[asyncio.Transport, TrackedConnection] = {}
        self._drain_seconds = drain_seconds  # how long answers in progress have at stop
        self.middleware: Middleware = self._make_middleware()

    @property
    def open(self) -> int:
        return len(self.table)

    @property
    def held(self) -> int:
        """Admitted connections whose descriptors are not yet released: those the table has
        let go of (expired, evicted) count until their close completes."""
        return len(self._connections)

    def stats(self) -> ListenerStats:
        limits = self.table.limits
        return ListenerStats(
            open=self.open,
            limit=limits.max_connections,
            live=self.table.live,
            live_limit=limits.live_cap,
            closed={
                "header_timeout": self.header_timeouts,
                "keepalive_timeout": self.keepalive_timeouts,
                "body_timeout": self.body_timeouts,
                "evicted": self.evicted,
                "refused": self.refused,
            },
            refusals=dict(self.refusals),
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def start(self) -> None:
        limits = self.table.limits
        timeouts = [limits.header_timeout_seconds, limits.keepalive_timeout_seconds]
        if limits.body_timeout_seconds is not None:
            timeouts.append(limits.body_timeout_seconds)
        tick = min(timeouts) / 4
        self._sweeper = self.loop.create_task(self._sweep(min(max(tick, 0.05), 1.0)))

    async def stop(self) -> None:
        """Close every connection once what it was sent is answered, waiting up to
        ``--drain-seconds`` for the answers the connections give themselves: aiohttp's
        shutdown waits only for its own handlers, and what the application closes next (the
        origin client) would fail an answer still running with an error instead of its end.
        What is still running then is cut (its reader resumes by offset elsewhere)."""
        for connection in list(self._connections.values()):
            connection.close_if_idle()
        deadline = self.loop.time() + self._drain_seconds
        while self.loop.time() < deadline and any(  # noqa: ASYNC110 (no one event says it)
            connection.answering_on_its_own() for connection in self._connections.values()
        ):
            # Drained answers end on their own within a pass or two (the hub woke them); a
            # poll is all a stop needs, and it is bounded.
            await asyncio.sleep(0.02)
        for transport, connection in list(self._connections.items()):
            if connection.answering_on_its_own():
                transport.abort()  # its task is cancelled by the close, before the origin's
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    # -- the request hook ------------------------------------------------------------------

    def request_started(self, transport: asyncio.BaseTransport) -> None:
        self.table.request_started(cast(asyncio.Transport, transport))

    def request_finished(self, transport: asyncio.BaseTransport) -> None:
        self.table.request_finished(cast(asyncio.Transport, transport), self.loop.time())

    def answered(self, transport: asyncio.Transport) -> None:
        """A request the connection answered itself, start to end (once per hit: the loop
        is read without the property once it is known)."""
        loop = self._loop or self.loop
        evict = self.table.answered(transport, loop.time(), flushing=_flushing)
        if evict is not None:
            self._evict(evict)

    def _make_middleware(self) -> Middleware:
        @web.middleware
        async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            if transport is None:  # the client already left
                return await handler(request)
            self.request_started(transport)
            connection = self._connections.get(transport)
            if connection is not None:
                connection.request_started(request)
            completed = False
            try:
                response = await handler(request)
                if self.fast is not None and self.fast.enabled:
                    # Written here rather than after the middleware (aiohttp then finds it
                    # done), so the connection knows when the next head may be answered.
                    with contextlib.suppress(ConnectionError):
                        await response.prepare(request)
                        await response.write_eof()
                        completed = True
                return response
            finally:
                self.request_finished(transport)
                connection = self._connections.get(transport)
                if connection is not None:
                    connection.request_done(completed=completed)

        return track_requests

    # -- called by the connections (edge.web.connection_protocol) --------------------------

    def connected(self, transport: asyncio.Transport, connection: TrackedConnection) -> bool:
        admission = self.table.admit(transport, self.loop.time(), flushing=_flushing)
        if admission.admitted:
            self._connections[transport] = connection
        if admission.evict is not None:
            self._evict(admission.evict)
        elif not admission.admitted:
            self._warn_at_cap("every connection is busy: answering 503")
        return admission.admitted

    def _evict(self, transport: asyncio.Transport) -> None:
        self.evicted += 1
        self._warn_at_cap("evicting the longest-idle connection")
        transport.close()

    def request_kind(self, transport: asyncio.BaseTransport, kind: RequestKind) -> Refusal | None:
        """The application classified the request in progress on ``transport``: None when it
        may go on, else why it is refused (the application answers it 503)."""
        key = cast(asyncio.Transport, transport)
        admission = self.table.request_kind(key, live=kind in LIVE_KINDS, flushing=_flushing)
        if admission.evict is not None:
            self._evict(admission.evict)
        connection = self._connections.get(key)
        if connection is not None:
            connection.request_classified()  # a half-closed client's live reader is gone
        if admission.refusal is not None:
            self.count_refusal(kind.value, admission.refusal)
            self._warn_once_a_minute(
                "viewers",
                "stream listener at its live-reader cap (%d viewers, --max-viewers): "
                "answering new viewers 503",
                self.table.limits.live_cap,
            )
        return admission.refusal

    def sink_of(self, transport: asyncio.BaseTransport) -> Sink | None:
        """The one writer of ``transport``'s connection (None: not one of this listener's)."""
        return self._connections.get(cast(asyncio.Transport, transport))

    def is_live(self, transport: asyncio.BaseTransport) -> bool:
        return self.table.is_live(cast(asyncio.Transport, transport))

    def live_ended(self, transport: asyncio.BaseTransport) -> None:
        self.table.live_ended(cast(asyncio.Transport, transport))

    def count_refusal(self, kind: str, reason: Refusal) -> None:
        key = (kind, reason.value)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def bytes_received(self, transport: asyncio.Transport) -> None:
        self.table.bytes_received(transport, self.loop.time())

    def body_started(self, transport: asyncio.Transport) -> None:
        self.table.body_started(transport, self.loop.time())

    def body_received(self, transport: asyncio.Transport, size: int) -> None:
        self.table.body_received(transport, size)

    def body_ended(self, transport: asyncio.Transport) -> None:
        self.table.body_ended(transport)

    def closed(self, transport: asyncio.Transport) -> None:
        self.table.forget(transport)
        self._connections.pop(transport, None)

    def refuse(self, transport: asyncio.Transport) -> asyncio.TimerHandle | None:
        """A connection past the limit, its ``REFUSAL`` written by itself: ended (lingering,
        to read its request line for the count, when few linger already)."""
        self.refused += 1
        if self._lingering < MAX_LINGERING_REFUSALS and transport.can_write_eof():
            self._lingering += 1
            transport.write_eof()
            return self.loop.call_later(REFUSAL_LINGER_SECONDS, transport.abort)
        transport.close()
        return None

    def refusal_ended(self, linger: asyncio.TimerHandle | None, kind: RequestKind | None) -> None:
        """A connection refused at the cap is gone; ``kind``: what its request line asked for
        (None: it never arrived)."""
        self.count_refusal(UNKNOWN_KIND if kind is None else kind.value, Refusal.CONNECTIONS)
        if linger is not None:
            linger.cancel()
            self._lingering -= 1

    def _warn_at_cap(self, what: str) -> None:
        cap = self.table.limits.max_connections
        self._warn_once_a_minute(what, "stream listener at --max-connections (%d): %s", cap, what)

    def _warn_once_a_minute(self, what: str, message: str, *args: object) -> None:
        now = self.loop.time()
        if now - self._warned_at.get(what, float("-inf")) >= CAP_WARNING_INTERVAL_SECONDS:
            self._warned_at[what] = now
            logger.warning(message, *args)

    async def _sweep(self, tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            for expiry in self.table.expire(self.loop.time(), flushing=_flushing):
                phase = expiry.phase
                connection = None
                match phase:
                    case Phase.HEAD:
                        self.header_timeouts += 1
                    case Phase.IDLE:
                        self.keepalive_timeouts += 1
                    case Phase.BUSY:
                        self.body_timeouts += 1
                        connection = self._connections.get(expiry.key)
                    case _:
                        assert_never(phase)
                try:
                    if connection is not None:
                        connection.body_timed_out()  # a 408 if it can, then the close
                    expiry.key.close()
                except Exception:  # one odd transport must not end every deadline after it
                    logger.exception("closing an expired connection failed")


# Where the stream application keeps its listener's tracker (the kind hook, and metrics at
# scrape time).
CONNECTIONS = web.AppKey("connections", ConnectionTracker)
