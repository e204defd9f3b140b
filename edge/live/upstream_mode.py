"""Whether a tail may follow its origin over SSE: until the origin refuses SSE, not until it fails.

Rules this module owns:

* A failed SSE request is retried as SSE, with the tail's backoff: one 500, a reset or a restart
  says nothing about SSE, and long-poll costs the origin a request per batch (SSE one connection).
* The origin refusing the mode itself (``REFUSING``: 400, 405, 406, 415, 501 — it cannot or will
  not serve this request as SSE; 413, a batch past ``--max-segment-bytes``) moves the tail to
  long-poll for its life.
* ``SSE_ATTEMPTS`` failures in a row that the origin answered with a status (a lost connection
  is no evidence: long-poll would lose it too) move the tail to long-poll for
  ``SSE_REST_SECONDS``: a path that never streams (a proxy that buffers, a broken SSE handler)
  must not stop the tail, and a long-poll is exact for every stream. Afterwards SSE is tried
  again, and one more failure sends it back to rest.
* A batch delivered over SSE clears the count.

Pure: statuses and the loop's clock in, states out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

# 400: the request as SSE is refused (the reference origin refuses nothing else we send: the
# offset and cursor are the origin's own); 405/406/415/501: not served as an event stream.
REFUSING = frozenset({400, 405, 406, 413, 415, 501})
# Three answered failures in a row, each after the tail's backoff (0.1, 0.2, 0.4 s at most at
# first): long enough that one restart's 502/503 does not count, short enough that a reader
# behind an SSE path that never works waits about a second for long-poll.
SSE_ATTEMPTS = 3
SSE_REST_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SseOn:
    """SSE is used; ``failures``: answered SSE failures since the last batch."""

    failures: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class SseRefused:
    """The origin refused SSE for this stream (``status``): long-poll for the tail's life."""

    status: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SseResting:
    """SSE failed ``SSE_ATTEMPTS`` times in a row: long-poll until ``until`` (loop time)."""

    until: float


SseState = SseOn | SseRefused | SseResting


def after_sse_failure(state: SseState, status: int | None, *, now: float) -> SseState:
    """The state after an SSE request failed: with ``status`` (None: no answer at all)."""
    match state:
        case SseOn() if status is None:
            return state  # no answer: the origin is unreachable, whichever way it is asked
        case SseOn() if status in REFUSING:
            return SseRefused(status=status)
        case SseOn(failures=failures) if failures + 1 >= SSE_ATTEMPTS:
            return SseResting(until=now + SSE_REST_SECONDS)
        case SseOn(failures=failures):
            return SseOn(failures=failures + 1)
        case SseRefused() | SseResting():
            return state  # not using SSE: nothing to learn
        case _:
            assert_never(state)


def after_sse_batch(state: SseState) -> SseState:
    """An SSE connection delivered a batch: it works."""
    return SseOn() if isinstance(state, SseOn) else state


def sse_current(state: SseState, *, now: float) -> SseState:
    """``state`` as of ``now``: a rest that is over lets SSE be tried once more (one failure
    sends it back)."""
    if isinstance(state, SseResting) and now >= state.until:
        return SseOn(failures=SSE_ATTEMPTS - 1)
    return state


__all__ = [
    "REFUSING",
    "SSE_ATTEMPTS",
    "SSE_REST_SECONDS",
    "SseOn",
    "SseRefused",
    "SseResting",
    "SseState",
    "after_sse_batch",
    "after_sse_failure",
    "sse_current",
]
