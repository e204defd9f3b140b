"""Refresh-ahead: an at-tail answer renewed before its freshness window ends, not after.

An at-tail answer of an open stream is given from what the edge holds while the tail it ends at
was observed within ``--tail-freshness`` (``edge.log.policy.at_tail_holds``). When the window
ends, the next reader would wait on an origin fill, and every reader arriving meanwhile with it.
So a read given such an answer late in the window starts one refill of the tail in the
background, while the answer it holds is still given as fresh; the refill's answer enters
through the one door as any fill's does, and renews the observation (or moves the tail).

Rules this module owns:

* **Only in the last tenth** (``REFRESH_FRACTION``) of the window, counted from the tail's
  observation: earlier, a refill would only ask the origin more often than the window says;
  at or past its end the answer is no longer given, and the read fills as it always did.
* **Only a tail the edge observed.** A tail followed by a live upstream (authoritative) is kept
  fresh by that upstream, and a closed tail never moves: neither is refreshed.
* **One refresh per stream log at once** (``Refreshing``): whatever the number of readers in
  the last tenth, at most one refill of a log is in flight; its end frees the log again.
* Nothing here changes what is served: the answer is given, or not, by ``at_tail_holds``
  alone; a refill only renews what that rule reads.

Pure: the clock is an argument.
"""

from __future__ import annotations

from edge.log.stream_log import LogKey, TailFact

# The share of the freshness window, at its end, in which a read starts a refill: long enough
# for a loopback or same-region origin to answer before the window ends (100 ms of the default
# 1 s), short enough that a steadily read tail costs the origin about one read per window.
REFRESH_FRACTION = 0.1


def due_after(freshness_seconds: float) -> float:
    """How long after its observation a tail's refresh may start: a read earlier than that is
    never due (a cheap test the hit path makes first, before ``Refreshing.start``)."""
    return freshness_seconds * (1 - REFRESH_FRACTION)


def refresh_due(tail: TailFact, *, now: float, freshness_seconds: float) -> bool:
    """Is a read at ``now``, given an at-tail answer that ends at ``tail``, in the last tenth of
    the tail's freshness window (and the tail one the edge observed, not one followed live)?"""
    if tail.authoritative or tail.closed:
        return False
    age = now - tail.observed_at
    return due_after(freshness_seconds) <= age < freshness_seconds


class Refreshing:
    """The stream logs with a refresh in flight: the one decision of whether a read starts one."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: set[LogKey] = set()

    def start(self, key: LogKey, tail: TailFact, *, now: float, freshness_seconds: float) -> bool:
        """Does a read of ``key``'s log at ``now``, given an at-tail answer that ends at
        ``tail``, start a refresh? If so it is counted running until ``ended``."""
        if not refresh_due(tail, now=now, freshness_seconds=freshness_seconds):
            return False
        if key in self._running:
            return False
        self._running.add(key)
        return True

    def ended(self, key: LogKey) -> None:
        self._running.discard(key)

    def running(self, key: LogKey) -> bool:
        return key in self._running

    def __len__(self) -> int:
        return len(self._running)
