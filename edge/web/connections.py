"""Bounds on the stream listener's client connections, so that idle or half-sent connections
cannot use up the process's file descriptors (and take ``/healthz`` down with them).

Rules this module owns:

* A client connection is in one phase: HEAD (no complete request head yet: just connected, or
  the first byte of its next request has arrived), BUSY (a request is being handled) or IDLE
  (keep-alive, between requests).
* HEAD lasts at most ``header_timeout`` from the connect or from that first byte; IDLE at most
  ``keepalive_timeout`` from the end of the last request; then the connection is closed. BUSY
  has no deadline here: SSE, long-polls and relays are bounded by their own settings.
* At most ``max_connections`` are open. A newcomer at the cap evicts the connection that left
  BUSY the longest ago, so a flood of idle or half-sent connections evicts its own oldest and a
  normal reader still gets in; when every connection is busy the newcomer gets a minimal 503
  with ``Retry-After`` and ``Connection: close``.
* Neither a deadline nor an eviction cuts a response short: a connection whose transport still
  holds bytes to send is never chosen, and its deadline is renewed instead.

``ConnectionTable`` is that state machine: plain values, the clock an argument, no I/O. The rest
is the asyncio adapter, on aiohttp's public API plus the attributes ``BaseSite`` leaves to its
subclasses (``_runner``, ``_backlog``, ``_server``; tests/integration/test_bounds.py pins them):

* ``BoundedSite`` is an aiohttp site whose ``loop.create_server`` gets a factory wrapping
  ``runner.server`` (aiohttp's ``web.Server`` protocol factory) in ``_Connection``, a thin
  delegating protocol that reports connects, received bytes and closes to the tracker.
* The request hook: a head is complete when aiohttp hands the request to the application, and
  the request is over when its handler returns. ``ConnectionTracker.middleware`` reports both,
  as ``tracker.request_started(request.transport)`` and ``tracker.request_finished(transport)``;
  ``edge.server`` installs it as the stream application's outermost middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from edge.protocol.http1 import MAX_HEAD_BYTES, Handoff, HeadParser
from edge.web.fastpath import FastPath

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# Descriptors kept back before halving the open-file limit (stdio, log files, the listeners,
# Redis, the readiness probe's session, the event loop's own).
RESERVED_DESCRIPTORS = 64
# Without a limit (RLIM_INFINITY), this is what "half the limit" means.
UNLIMITED_DESCRIPTORS = 1 << 20

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
# Bytes a connection may send while aiohttp answers its previous request; past it, aiohttp
# takes the connection for good (it queues pipelined requests itself).
MAX_WAITING_BYTES = 64 * 1024
# How often an operator is told the cap is being hit.
CAP_WARNING_INTERVAL_SECONDS = 60.0


def default_max_connections(open_file_limit: int) -> int:
    """Half the descriptors left after a small reserve: each client connection may hold one
    origin connection at a time (a relayed request or a cache fill), so the other half covers
    those, and the reserve covers Redis, the admin listener and the rest."""
    if open_file_limit < 0:  # RLIM_INFINITY
        open_file_limit = UNLIMITED_DESCRIPTORS
    return max(1, (open_file_limit - RESERVED_DESCRIPTORS) // 2)


class Phase(Enum):
    HEAD = "head"
    BUSY = "busy"
    IDLE = "idle"


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    header_timeout_seconds: float
    keepalive_timeout_seconds: float
    max_connections: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Admission(Generic[K]):
    admitted: bool
    evict: K | None = None  # close this one: it made room


@dataclass(frozen=True, kw_only=True, slots=True)
class Expiry(Generic[K]):
    key: K
    phase: Phase  # HEAD: the header deadline passed; IDLE: the keep-alive timeout


def _never(_: object) -> bool:
    return False


class ConnectionTable(Generic[K]):
    """Phases, deadlines and the eviction order of open connections. ``flushing(key)`` says
    whether a connection still has response bytes to send; such a one is never cut."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._phase: dict[K, Phase] = {}
        self._requests: dict[K, int] = {}  # BUSY connections: requests in progress
        # Deadlines of HEAD and IDLE connections. One timeout per phase and a monotonic clock
        # make each queue's deadlines grow in insertion order: expiry looks only at the front.
        self._deadlines: dict[Phase, OrderedDict[K, float]] = {
            Phase.HEAD: OrderedDict(),
            Phase.IDLE: OrderedDict(),
        }
        # Connections not BUSY, the longest out of BUSY (or since connect) first.
        self._idle_order: OrderedDict[K, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._phase)

    def phase(self, key: K) -> Phase | None:
        return self._phase.get(key)

    def deadline(self, key: K) -> float | None:
        phase = self._phase.get(key)
        if phase is None or phase is Phase.BUSY:
            return None
        return self._deadlines[phase][key]

    def _timeout(self, phase: Phase) -> float:
        if phase is Phase.HEAD:
            return self.limits.header_timeout_seconds
        return self.limits.keepalive_timeout_seconds

    def _wait(self, key: K, phase: Phase, now: float) -> None:
        self._phase[key] = phase
        self._deadlines[phase][key] = now + self._timeout(phase)

    def admit(self, key: K, now: float, *, flushing: Callable[[K], bool] = _never) -> Admission[K]:
        """A new connection: admitted (maybe evicting another) or refused."""
        evict: K | None = None
        if len(self._phase) >= self.limits.max_connections:
            evict = next((k for k in self._idle_order if not flushing(k)), None)
            if evict is None:
                return Admission(admitted=False)
            self.forget(evict)
        self._wait(key, Phase.HEAD, now)
        self._idle_order[key] = None
        return Admission(admitted=True, evict=evict)

    def bytes_received(self, key: K, now: float) -> None:
        """The first byte of a next request starts its header deadline; an idle connection keeps
        its place in the eviction order (it has been out of BUSY as long as it has)."""
        if self._phase.get(key) is Phase.IDLE:
            del self._deadlines[Phase.IDLE][key]
            self._wait(key, Phase.HEAD, now)

    def request_started(self, key: K) -> None:
        phase = self._phase.get(key)
        if phase is None:
            return
        if phase is not Phase.BUSY:
            del self._deadlines[phase][key]
            del self._idle_order[key]
            self._phase[key] = Phase.BUSY
        self._requests[key] = self._requests.get(key, 0) + 1

    def request_finished(self, key: K, now: float) -> None:
        if self._phase.get(key) is not Phase.BUSY:
            return
        left = self._requests[key] - 1
        if left:
            self._requests[key] = left
            return
        del self._requests[key]
        self._wait(key, Phase.IDLE, now)
        self._idle_order[key] = None

    def answered(self, key: K, now: float) -> None:
        """A request the connection answered at once: ``request_started`` then
        ``request_finished`` in one step (the fast path's, per hit)."""
        phase = self._phase.get(key)
        if phase is None or phase is Phase.BUSY:
            return
        del self._deadlines[phase][key]
        self._wait(key, Phase.IDLE, now)
        self._idle_order.move_to_end(key)

    def forget(self, key: K) -> bool:
        """The connection is closed (or being closed by us); False if it was not known."""
        phase = self._phase.pop(key, None)
        if phase is None:
            return False
        if phase is Phase.BUSY:
            del self._requests[key]
        else:
            del self._deadlines[phase][key]
            del self._idle_order[key]
        return True

    def expire(self, now: float, *, flushing: Callable[[K], bool] = _never) -> list[Expiry[K]]:
        """Forget and return the connections past their deadline, for the caller to close."""
        expired: list[Expiry[K]] = []
        for phase, queue in self._deadlines.items():
            while queue:
                key, deadline = next(iter(queue.items()))
                if deadline > now:
                    break
                if flushing(key):
                    # Still sending a response: its clock starts again (to the back of the queue,
                    # where now + timeout belongs).
                    del queue[key]
                    queue[key] = now + self._timeout(phase)
                    continue
                self.forget(key)
                expired.append(Expiry(key=key, phase=phase))
        return expired


def _flushing(transport: asyncio.Transport) -> bool:
    return transport.get_write_buffer_size() > 0


class ConnectionTracker:
    """The asyncio side: one per listener. Counters are plain attributes (read at scrape time)."""

    def __init__(self, limits: Limits) -> None:
        self.table: ConnectionTable[asyncio.Transport] = ConnectionTable(limits)
        self.evicted = 0
        self.refused = 0
        self.header_timeouts = 0
        self.keepalive_timeouts = 0
        self._lingering = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._warned_at: dict[str, float] = {}
        # Set by edge.server: the stored hits the connections answer themselves.
        self.fast: FastPath | None = None
        self._connections: dict[asyncio.Transport, _Connection] = {}
        self.middleware: Middleware = self._make_middleware()

    @property
    def open(self) -> int:
        return len(self.table)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def start(self) -> None:
        limits = self.table.limits
        tick = min(limits.header_timeout_seconds, limits.keepalive_timeout_seconds) / 4
        self._sweeper = self.loop.create_task(self._sweep(min(max(tick, 0.05), 1.0)))

    async def stop(self) -> None:
        for connection in list(self._connections.values()):
            connection.close_if_idle()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    def protocol_factory(self, handler_factory: web.Server) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, handler_factory)

    # -- the request hook ------------------------------------------------------------------

    def request_started(self, transport: asyncio.BaseTransport) -> None:
        self.table.request_started(cast(asyncio.Transport, transport))

    def request_finished(self, transport: asyncio.BaseTransport) -> None:
        self.table.request_finished(cast(asyncio.Transport, transport), self.loop.time())

    def answered(self, transport: asyncio.Transport) -> None:
        """A request the connection answered itself, start to end."""
        self.table.answered(transport, self.loop.time())

    def _make_middleware(self) -> Middleware:
        @web.middleware
        async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            if transport is None:  # the client already left
                return await handler(request)
            self.request_started(transport)
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

    # -- called by _Connection ---------------------------------------------------------------

    def connected(self, transport: asyncio.Transport, connection: _Connection) -> bool:
        admission = self.table.admit(transport, self.loop.time(), flushing=_flushing)
        if admission.admitted:
            self._connections[transport] = connection
        if admission.evict is not None:
            self.evicted += 1
            self._warn_at_cap("evicting the longest-idle connection")
            admission.evict.close()
        elif not admission.admitted:
            self._warn_at_cap("every connection is busy: answering 503")
        return admission.admitted

    def bytes_received(self, transport: asyncio.Transport) -> None:
        self.table.bytes_received(transport, self.loop.time())

    def closed(self, transport: asyncio.Transport) -> None:
        self.table.forget(transport)
        self._connections.pop(transport, None)

    def refuse(self, transport: asyncio.Transport) -> asyncio.TimerHandle | None:
        self.refused += 1
        transport.write(REFUSAL)
        if self._lingering < MAX_LINGERING_REFUSALS and transport.can_write_eof():
            self._lingering += 1
            transport.write_eof()
            return self.loop.call_later(REFUSAL_LINGER_SECONDS, transport.abort)
        transport.close()
        return None

    def refusal_ended(self, linger: asyncio.TimerHandle | None) -> None:
        if linger is not None:
            linger.cancel()
            self._lingering -= 1

    def _warn_at_cap(self, what: str) -> None:
        now = self.loop.time()
        if now - self._warned_at.get(what, float("-inf")) >= CAP_WARNING_INTERVAL_SECONDS:
            self._warned_at[what] = now
            log.warning(
                "stream listener at --max-connections (%d): %s",
                self.table.limits.max_connections,
                what,
            )

    async def _sweep(self, tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            for expiry in self.table.expire(self.loop.time(), flushing=_flushing):
                if expiry.phase is Phase.HEAD:
                    self.header_timeouts += 1
                else:
                    self.keepalive_timeouts += 1
                try:
                    expiry.key.close()
                except Exception:  # one odd transport must not end every deadline after it
                    log.exception("closing an expired connection failed")


# Where the stream application keeps its listener's tracker (for metrics at scrape time).
CONNECTIONS = web.AppKey("connections", ConnectionTracker)


class _Mode(Enum):
    FAST = "fast"  # the next head is read here; stored hits are answered here
    WAITING = "waiting"  # aiohttp answers one request; later bytes wait here until it is done
    DELEGATED = "delegated"  # every byte is aiohttp's, for the rest of the connection
    CLOSED = "closed"  # answered with Connection: close; nothing more is read
    REFUSED = "refused"  # at --max-connections: what it sends is discarded


class _Connection(asyncio.Protocol):
    """Delegates to aiohttp's protocol for the connection, telling the tracker what happens, and
    answers stored hits itself (``edge.web.fastpath``) while aiohttp has nothing in hand.

    Order is kept by construction: a head the fast path cannot answer goes to aiohttp alone
    (``WAITING``), and nothing after it is read until aiohttp's answer is written
    (``request_done``, from the tracker's middleware). A head with a body or an ``Expect``
    (whose 417 aiohttp writes without the middleware), one llhttp refuses, or a backlog past
    ``MAX_WAITING_BYTES`` hands the connection to aiohttp for good. aiohttp's
    protocol is only made when the first request needs it.
    """

    __slots__ = (
        "_buffer",
        "_fast",
        "_handler_factory",
        "_inner",
        "_linger",
        "_mode",
        "_parser",
        "_paused",
        "_tracker",
        "_transport",
    )

    def __init__(self, tracker: ConnectionTracker, handler_factory: web.Server) -> None:
        self._tracker = tracker
        self._handler_factory = handler_factory
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._linger: asyncio.TimerHandle | None = None
        fast = tracker.fast
        self._fast = fast if fast is not None and fast.enabled else None
        self._mode = _Mode.FAST if self._fast is not None else _Mode.DELEGATED
        self._parser: HeadParser | None = None
        self._buffer = bytearray()
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if not self._tracker.connected(self._transport, self):
            self._mode = _Mode.REFUSED
            self._linger = self._tracker.refuse(self._transport)
            return
        if self._mode is _Mode.DELEGATED:
            self._ensure_inner()

    def _ensure_inner(self) -> asyncio.Protocol:
        if self._inner is None:
            self._inner = self._handler_factory()
            self._inner.connection_made(self._transport)  # type: ignore[arg-type]
        return self._inner

    def data_received(self, data: bytes) -> None:
        mode = self._mode
        if mode is _Mode.REFUSED or mode is _Mode.CLOSED:
            return
        assert self._transport is not None
        self._tracker.bytes_received(self._transport)
        if mode is _Mode.DELEGATED:
            self._ensure_inner().data_received(data)
            return
        self._buffer += data
        if mode is _Mode.WAITING:
            if len(self._buffer) > MAX_WAITING_BYTES:
                self._delegate()
            return
        self._serve_safely()

    def _serve_safely(self) -> None:
        try:
            self._serve()
        except Exception:
            # A fault of the fast path must not cost the client its answer: the head it was
            # reading is still buffered, and aiohttp answers it and everything after.
            log.exception("fast path failed; the connection takes the full path")
            self._delegate()

    def _serve(self) -> None:
        """Answer the complete heads in the buffer, in order, until one is aiohttp's."""
        fast, buffer, transport = self._fast, self._buffer, self._transport
        assert fast is not None
        assert transport is not None
        while self._mode is _Mode.FAST and buffer and not self._paused:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._delegate()  # aiohttp refuses it (431) as it always has
                return
            head = bytes(buffer[: end + 4])
            if self._parser is None:
                self._parser = fast.parser()
            parsed = self._parser.parse(head)
            if isinstance(parsed, Handoff) and not parsed.once:
                self._delegate()
                return
            answer = None if isinstance(parsed, Handoff) else fast.answer(parsed)
            del buffer[: end + 4]
            if answer is None or isinstance(parsed, Handoff):
                # This one request is aiohttp's; the next head waits for its answer.
                self._mode = _Mode.WAITING
                self._ensure_inner().data_received(head)
                return
            self._tracker.answered(transport)
            if len(answer) == 1:
                transport.write(answer[0])
            else:
                transport.writelines(answer)
            if not parsed.keep_alive:
                self._mode = _Mode.CLOSED  # the close flushes the answer first
                buffer.clear()
                transport.close()
                return

    def _delegate(self) -> None:
        """Everything from here on is aiohttp's, starting with what is buffered."""
        self._mode = _Mode.DELEGATED
        pending, self._buffer = bytes(self._buffer), bytearray()
        inner = self._ensure_inner()
        if pending:
            inner.data_received(pending)

    def request_done(self, *, completed: bool) -> None:
        """aiohttp has written its answer to the request it was given (``completed``), or its
        handler failed and aiohttp writes an answer of its own after this: then it keeps the
        connection, so that answer and every later one stay in order."""
        if self._mode is not _Mode.WAITING:
            return
        if not completed:
            self._delegate()
            return
        self._mode = _Mode.FAST
        if self._buffer:
            self._tracker.loop.call_soon(self._resume)

    def _resume(self) -> None:
        transport = self._transport
        if self._mode is _Mode.FAST and transport is not None and not transport.is_closing():
            self._serve_safely()

    def close_if_idle(self) -> None:
        """At shutdown: a connection aiohttp never saw is closed here (its buffer flushes)."""
        if self._inner is None and self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return None  # nothing in hand: close it now (its answers are flushed first)
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        assert self._transport is not None
        if self._mode is _Mode.REFUSED:
            self._tracker.refusal_ended(self._linger)
            return
        self._tracker.closed(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._mode is _Mode.FAST and self._transport is not None:
            # A client that pipelines faster than it reads waits here, not in our memory.
            self._paused = True
            self._transport.pause_reading()
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
            if self._buffer:
                self._tracker.loop.call_soon(self._resume)
        if self._inner is not None:
            self._inner.resume_writing()


class BoundedSite(web.BaseSite):
    """A TCP site whose connections a ``ConnectionTracker`` bounds."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        tracker: ConnectionTracker,
        *,
        backlog: int,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port  # edge.workers: every worker binds the same port
        self.tracker = tracker

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # BaseSite.stop closes it and runner.addresses reads it (tests/integration/test_bounds.py
        # pins both).
        self._server = await loop.create_server(
            self.tracker.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,
        )
        self.tracker.start()

    async def stop(self) -> None:
        await self.tracker.stop()
        await super().stop()
