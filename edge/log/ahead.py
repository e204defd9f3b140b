"""Refresh-ahead: an at-tail answer's tail renewed before its freshness window ends, not after.

An at-tail answer of an open stream is given from what the edge holds while the tail it ends at
was observed within ``--tail-freshness`` (``edge.log.policy.at_tail_holds``). When the window
ends, the next reader waits on an origin fill, and every reader arriving meanwhile with it. So a
read given such an answer late in the window starts one refill of the tail in the background,
while the answer it holds is still given as fresh; the refill's answer enters through the one
door as any fill's does, and renews the observation (or moves the tail).

Rules this module owns:

* **Only in the last tenth** (``REFRESH_FRACTION``) of the window, counted from the tail's
  observation: earlier, a refill would only ask the origin more often than the window says; at
  or past its end the answer is no longer given, and the read fills as it always did.
* **Only a tail the edge observed.** A tail followed by a live upstream (authoritative) is moved
  by that upstream, and a closed tail never moves: neither is refreshed.
* **One refill per stream log at once** (``Refreshing``): whatever the number of readers in the
  last tenth, at most one refill of a log is in flight; its end frees the log again.
* Nothing here changes what is served: the answer is given, or not, by ``at_tail_holds`` alone;
  a refill only renews what that rule reads.

Pure: the clock is an argument.
"""

from __future__ import annotations

import enum
from typing import assert_never

from edge.log.stream_log import LogKey, TailFact

# The share of the freshness window, at its end, in which a read starts a refill: long enough
# for a loopback or same-region origin to answer before the window ends (100 ms of the default
# 1 s), short enough that a steadily read tail costs the origin about one read per window.
REFRESH_FRACTION = 0.1


class Refresh(enum.Enum):
    """What an at-tail answer given now asks of the tail it ends at (a ``Hit``'s ``refresh``)."""

    NONE = "none"  # early in its window, followed live, closed, or no at-tail answer at all
    DUE = "due"  # the last tenth of its window: one background refill renews it


def due_after(freshness_seconds: float) -> float:
    """How long after its observation a tail's refresh may start: a read earlier than that is
    never due (the cheap test the hit path makes first)."""
    return freshness_seconds * (1 - REFRESH_FRACTION)


def refresh_of(tail: TailFact, *, now: float, freshness_seconds: float) -> Refresh:
    """Is a read at ``now``, given an at-tail answer that ends at ``tail``, in the last tenth of
    the tail's freshness window (and the tail one the edge observed, open)?"""
    if tail.authoritative or tail.closed:
        return Refresh.NONE
    age = now - tail.observed_at
    if due_after(freshness_seconds) <= age < freshness_seconds:
        return Refresh.DUE
    return Refresh.NONE


class Refreshing:
    """The stream logs with a refill in flight: the one decision of whether a read starts one."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: set[LogKey] = set()

    def start(self, key: LogKey, refresh: Refresh) -> bool:
        """Does a read of ``key``'s log whose answer asks ``refresh`` start a refill? If so it
        is counted running until ``ended``."""
        match refresh:
            case Refresh.NONE:
                return False
            case Refresh.DUE:
                if key in self._running:
                    return False
                self._running.add(key)
                return True
            case _:
                assert_never(refresh)

    def ended(self, key: LogKey) -> None:
        self._running.discard(key)

    def running(self, key: LogKey) -> bool:
        return key in self._running

    def __len__(self) -> int:
        return len(self._running)
