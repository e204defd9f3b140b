"""The state machine of the stream listener's client connections: their phases, deadlines, the
cap and who is admitted at it, so that idle or half-sent connections cannot use up the
process's file descriptors (and take ``/healthz`` down with them), and a flood of viewers cannot
silence the writers of what they watch.

Rules this module owns:

* A client connection is in one phase: HEAD (no complete request head yet: just connected, or
  the first byte of its next request has arrived), BUSY (a request is being handled) or IDLE
  (keep-alive, between requests).
* HEAD lasts at most ``header_timeout`` from the connect or from that first byte; IDLE at most
  ``keepalive_timeout`` from the end of the last request; then the connection is closed. BUSY
  has no deadline here (SSE, long-polls and relays are bounded by their own settings) but for
  a request body still arriving: it must be whole by ``body_deadline`` (``body_timeout`` from
  the start of the request, plus a second for every ``BODY_MIN_BYTES_PER_SECOND`` received:
  mod_reqtimeout's ``body=…,MinRate=…``), so a body that trickles cannot hold its slot for
  ever; past it the connection is closed (``Expiry`` with phase BUSY).
* At most ``max_connections`` are open, and ``at_cap`` more while every one of them is busy: a
  newcomer past ``max_connections`` is admitted without evicting anyone, and its request's
  kind decides (``request_kind``), so a writer is told from a viewer before anyone is cut.
  Only at ``max_connections + at_cap`` does a newcomer evict at once, and when nothing can be
  evicted it is refused (the tracker answers it a plain 503: there is no room to read it).
* A request whose kind is known (``request_kind``, or a hit answered at once: ``answered``)
  while more than ``max_connections`` are open evicts the keep-alive connection idle the
  longest (IDLE, not HEAD: a head may be on its way), so idle keep-alive connections go first.
  At ``max_connections + at_cap`` a newcomer evicts the connection that left BUSY the longest
  ago, HEAD or IDLE, so a flood of idle or half-sent connections evicts its own oldest.
  Eviction never takes a BUSY connection: a live reader is never cut to make room, and a short
  request past the cap is held by the ``at_cap`` descriptors (``edge.web.descriptors``
  budgets them).
* At most ``max_live`` requests in progress are live readers (SSE viewers, long-polls); one
  past it is refused (the application answers 503 with ``Retry-After`` and CORS). The budget
  keeps ``max_live`` below ``max_connections``, so live readers never take the short
  requests' reserve. A live request ends with ``live_ended``, its connection leaving BUSY, or
  being forgotten.
* Neither a deadline nor an eviction cuts a response short: a connection that still holds bytes
  to send (``flushing``) is never chosen, and its deadline is renewed instead.

Pure: plain values, the clock an argument, no I/O; keys are whatever identifies a connection
(``edge.web.connection_tracker``, its adapter, uses the transport).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# A request body earns a second more of ``body_timeout`` for every this many bytes it delivers:
# a slow but honest upload keeps going, a trickle of a byte now and then does not.
BODY_MIN_BYTES_PER_SECOND = 1024


def body_deadline(started: float, timeout_seconds: float, received_bytes: int) -> float:
    """When a request body begun at ``started`` must be whole, having delivered
    ``received_bytes`` so far."""
    return started + timeout_seconds + received_bytes / BODY_MIN_BYTES_PER_SECOND


class Phase(Enum):
    HEAD = "head"
    BUSY = "busy"
    IDLE = "idle"


# A member read through its Enum class costs a Python call (CPython 3.11's ``EnumType``); the
# per-hit steps read these module names instead.
_HEAD, _IDLE = Phase.HEAD, Phase.IDLE


class Refusal(Enum):
    """Why a newcomer or a request was turned away (``edge_refusals_total{reason}``)."""

    VIEWERS = "viewers"  # a live reader past max_live
    CONNECTIONS = "connections"  # past max_connections + at_cap, every connection busy


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    header_timeout_seconds: float
    keepalive_timeout_seconds: float
    max_connections: int
    # Live readers at most; None: as many as there are connections.
    max_live: int | None = None
    # Connections past max_connections whose heads are read while every one under it is busy.
    at_cap: int = 0
    # Seconds a request body may take before it earns more (``body_deadline``); None: no end.
    body_timeout_seconds: float | None = None

    @property
    def live_cap(self) -> int:
        return self.max_connections if self.max_live is None else self.max_live


@dataclass(frozen=True, kw_only=True, slots=True)
class ConnectionAdmission(Generic[K]):
    """Whether a connection (or a request turning live) gets a place in the table; the
    credential check of its requests is ``edge.auth.gate.RequestAdmission``'s."""

    admitted: bool
    evict: K | None = None  # close this one: it made room
    refusal: Refusal | None = None  # why, when not admitted


@dataclass(frozen=True, kw_only=True, slots=True)
class Expiry(Generic[K]):
    key: K
    # HEAD: the header deadline passed; IDLE: the keep-alive timeout; BUSY: a request body
    # arrived slower than its ``body_deadline`` allows.
    phase: Phase


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
        # Two attributes, not a dict by phase: an Enum's hash is a Python call, and a hit
        # touches these twice.
        self._head_deadlines: OrderedDict[K, float] = OrderedDict()
        self._idle_deadlines: OrderedDict[K, float] = OrderedDict()
        self._keepalive_seconds = limits.keepalive_timeout_seconds
        # Connections not BUSY, the longest out of BUSY (or since connect) first.
        self._idle_order: OrderedDict[K, None] = OrderedDict()
        # Connections whose request in progress is a live reader.
        self._live: set[K] = set()
        # BUSY connections whose request body is still arriving: (started, bytes received).
        self._bodies: dict[K, tuple[float, int]] = {}

    def __len__(self) -> int:
        return len(self._phase)

    def phase(self, key: K) -> Phase | None:
        return self._phase.get(key)

    def deadline(self, key: K) -> float | None:
        phase = self._phase.get(key)
        if phase is None or phase is Phase.BUSY:
            return None
        return self._queue(phase)[key]

    def _queue(self, phase: Phase) -> OrderedDict[K, float]:
        return self._head_deadlines if phase is _HEAD else self._idle_deadlines

    def _timeout(self, phase: Phase) -> float:
        if phase is Phase.HEAD:
            return self.limits.header_timeout_seconds
        return self.limits.keepalive_timeout_seconds

    def _wait(self, key: K, phase: Phase, now: float) -> None:
        self._phase[key] = phase
        self._queue(phase)[key] = now + self._timeout(phase)

    def admit(
        self, key: K, now: float, *, flushing: Callable[[K], bool] = _never
    ) -> ConnectionAdmission[K]:
        """A new connection: admitted (maybe evicting another) or refused. Past
        ``max_connections`` it is admitted as it is, while ``at_cap`` allows: its request's
        kind decides who makes room (``request_kind``)."""
        limits = self.limits
        evict: K | None = None
        if len(self._phase) >= limits.max_connections + limits.at_cap:
            evict = self._longest_idle(flushing)
            if evict is None:
                return ConnectionAdmission(admitted=False, refusal=Refusal.CONNECTIONS)
            self.forget(evict)
        self._wait(key, Phase.HEAD, now)
        self._idle_order[key] = None
        return ConnectionAdmission(admitted=True, evict=evict)

    def _longest_idle(self, flushing: Callable[[K], bool]) -> K | None:
        return next((k for k in self._idle_order if not flushing(k)), None)

    def request_kind(
        self, key: K, *, live: bool, flushing: Callable[[K], bool] = _never
    ) -> ConnectionAdmission[K]:
        """The request in progress on ``key`` is a live reader or a short request: admitted
        (evicting the keep-alive connection idle the longest while more than
        ``max_connections`` are open) or, a live reader past ``max_live``, refused. A key the
        table does not hold (a server without the connection hook) is counted as a live
        reader all the same."""
        if live:
            if key in self._live:
                return ConnectionAdmission(admitted=True)
            if len(self._live) >= self.limits.live_cap:
                return ConnectionAdmission(admitted=False, refusal=Refusal.VIEWERS)
            self._live.add(key)
        return ConnectionAdmission(admitted=True, evict=self._idle_past_cap(flushing))

    def live_ended(self, key: K) -> None:
        self._live.discard(key)

    def live_room(self) -> bool:
        """Would a live reader be admitted now (``request_kind``'s own test)? A live read
        answered at once is admitted and ended in one step (``answered``)."""
        return len(self._live) < self.limits.live_cap

    @property
    def live(self) -> int:
        return len(self._live)

    def is_live(self, key: K) -> bool:
        return key in self._live

    def bytes_received(self, key: K, now: float) -> None:
        """The first byte of a next request starts its header deadline; an idle connection keeps
        its place in the eviction order (it has been out of BUSY as long as it has)."""
        if self._phase.get(key) is _IDLE:
            del self._idle_deadlines[key]
            self._wait(key, _HEAD, now)

    def body_started(self, key: K, now: float) -> None:
        """The request in progress on ``key`` has a body not yet whole: its deadline runs."""
        if self.limits.body_timeout_seconds is not None and self._phase.get(key) is Phase.BUSY:
            self._bodies[key] = (now, 0)

    def body_received(self, key: K, size: int) -> None:
        body = self._bodies.get(key)
        if body is not None:
            self._bodies[key] = (body[0], body[1] + size)

    def body_ended(self, key: K) -> None:
        """The body is whole (or the request over): no deadline of its own any more."""
        self._bodies.pop(key, None)

    def body_deadline(self, key: K) -> float | None:
        body = self._bodies.get(key)
        timeout = self.limits.body_timeout_seconds
        if body is None or timeout is None:
            return None
        return body_deadline(body[0], timeout, body[1])

    def request_started(self, key: K) -> None:
        phase = self._phase.get(key)
        if phase is None:
            return
        if phase is not Phase.BUSY:
            del self._queue(phase)[key]
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
        self._live.discard(key)
        self._bodies.pop(key, None)
        self._wait(key, Phase.IDLE, now)
        self._idle_order[key] = None

    def answered(self, key: K, now: float, *, flushing: Callable[[K], bool] = _never) -> K | None:
        """A request the connection answered at once: ``request_started``, ``request_kind``
        (a short request) and ``request_finished`` in one step (the fast path's, per hit).
        From IDLE it is also the head's ``bytes_received``: a head answered in the pass it
        arrived in needs no step of its own. Returns the connection it evicted, if any."""
        phase = self._phase.get(key)
        idle = self._idle_deadlines
        if phase is _IDLE:
            del idle[key]
        elif phase is _HEAD:
            del self._head_deadlines[key]
        else:
            return None
        # Inlined (``_wait``, ``_idle_past_cap``): it runs once per hit.
        evict = (
            self._idle_past_cap(flushing)
            if len(self._phase) > self.limits.max_connections
            else None
        )
        self._phase[key] = _IDLE
        idle[key] = now + self._keepalive_seconds
        self._idle_order.move_to_end(key)
        return evict

    def _idle_past_cap(self, flushing: Callable[[K], bool]) -> K | None:
        """While more than ``max_connections`` are open, forget and return the keep-alive
        connection idle the longest (the IDLE queue's order is the order they went idle)."""
        if len(self._phase) <= self.limits.max_connections:
            return None
        evict = next((k for k in self._idle_deadlines if not flushing(k)), None)
        if evict is not None:
            self.forget(evict)
        return evict

    def forget(self, key: K) -> bool:
        """The connection is closed (or being closed by us); False if it was not known."""
        self._live.discard(key)
        self._bodies.pop(key, None)
        phase = self._phase.pop(key, None)
        if phase is None:
            return False
        if phase is Phase.BUSY:
            del self._requests[key]
        else:
            del self._queue(phase)[key]
            del self._idle_order[key]
        return True

    def expire(self, now: float, *, flushing: Callable[[K], bool] = _never) -> list[Expiry[K]]:
        """Forget and return the connections past their deadline, for the caller to close."""
        expired: list[Expiry[K]] = []
        for phase, queue in (
            (Phase.HEAD, self._head_deadlines),
            (Phase.IDLE, self._idle_deadlines),
        ):
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
        # Each body earns its own deadline, so no queue keeps them in order: a scan, bounded by
        # the open connections, once a sweep.
        timeout = self.limits.body_timeout_seconds
        late = [
            key
            for key, (started, received) in self._bodies.items()
            if timeout is not None and body_deadline(started, timeout, received) <= now
        ]
        for key in late:
            if flushing(key):
                self._bodies[key] = (now, 0)  # sending an answer: its clock starts again
                continue
            self.forget(key)
            expired.append(Expiry(key=key, phase=Phase.BUSY))
        return expired
