"""A circuit breaker for the shared tier, with the clock passed in.

closed ──(``failure_threshold`` failures in a row)──▶ open ──(``cooldown_seconds``)──▶ half-open
half-open lets one probe through: success closes the circuit, failure opens it again.
While open, callers skip the tier entirely, so a dead Redis costs nothing per request.
"""

from __future__ import annotations

import enum


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, *, failure_threshold: int = 3, cooldown_seconds: float = 5.0) -> None:
        self._threshold = failure_threshold
        self._cooldown = cooldown_seconds
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self.state = BreakerState.CLOSED

    def allow(self, now: float) -> bool:
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now - self._opened_at >= self._cooldown:
            self.state = BreakerState.HALF_OPEN
            self._probing = False
        if self.state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> None:
        self._failures = 0
        self._probing = False
        self.state = BreakerState.CLOSED

    def failure(self, now: float) -> None:
        self._failures += 1
        self._probing = False
        if self.state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self.state = BreakerState.OPEN
            self._opened_at = now
