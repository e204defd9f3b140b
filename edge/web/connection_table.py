"""The state machine of the stream listener's client connections: their phases, deadlines and
the cap, so that idle or half-sent connections cannot use up the process's file descriptors (and
take ``/healthz`` down with them).

Rules this module owns:

* A client connection is in one phase: HEAD (no complete request head yet: just connected, or
  the first byte of its next request has arrived), BUSY (a request is being handled) or IDLE
  (keep-alive, between requests).
* HEAD lasts at most ``header_timeout`` from the connect or from that first byte; IDLE at most
  ``keepalive_timeout`` from the end of the last request; then the connection is closed. BUSY
  has no deadline here: SSE, long-polls and relays are bounded by their own settings.
* At most ``max_connections`` are open. A newcomer at the cap evicts the connection that left
  BUSY the longest ago, so a flood of idle or half-sent connections evicts its own oldest and a
  normal reader still gets in; when every connection is busy the newcomer is refused (the
  tracker answers it 503).
* Neither a deadline nor an eviction cuts a response short: a connection that still holds bytes
  to send (``flushing``) is never chosen, and its deadline is renewed instead.
* Without ``--max-connections``, the cap is half the descriptors left after a small reserve
  (``default_max_connections``).

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

# Descriptors kept back before halving the open-file limit (stdio, log files, the listeners,
# Redis, the readiness probe's session, the event loop's own).
RESERVED_DESCRIPTORS = 64
# Without a limit (RLIM_INFINITY), this is what "half the limit" means.
UNLIMITED_DESCRIPTORS = 1 << 20


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
