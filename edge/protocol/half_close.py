"""What a client connection does once its client has half-closed: sent its last byte
(``shutdown(SHUT_WR)``, as ``nc -N``, some proxies and HTTP/1.0-style clients do) and waits for
its answers.

Rules this module owns:

* A half-close ends the client's sending, not its answers. Every complete request it sent
  before is answered, in order, and the connection is closed after the last answer (RFC 9112
  9.6: a server closes after the last response it will send). The reference origin does the
  same for a read, a HEAD and a write; a write may already be applied, and a client that gets
  no answer retries it (doubling it, without producer headers).
* A live reader (an SSE viewer, a long-poll) in hand at the half-close is taken as gone, and
  its connection closed, as the reference origin does. TCP cannot tell a half-close from a
  client that closed and left (both are one FIN, and after it there is nothing to read, so a
  reset would show only at the next write: a heartbeat, a release, a timeout up to
  ``--long-poll-timeout`` later), and a live reader that left must free its slot
  (``--max-viewers``), its upstream and its tail at once. A short request's answer comes soon
  whichever it was.
* A request cut short by the half-close (a head or a body that can never arrive whole) is not
  answered: nothing it holds can be, so the connection closes once the answers before it are
  written (they flush before the close).
* ``after_half_close`` decides from what the connection holds and is asked again whenever that
  changes (a request starts or is classified, an answer is written), so the close comes exactly
  after the last answer, never on a timer.

Pure: plain values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, kw_only=True, slots=True)
class Holding:
    """What a half-closed connection holds."""

    answering: bool  # a request is in hand: its answer is not written yet
    queued: bool  # complete requests wait behind it (or for the connection to serve them)
    cut_short: bool  # the request in hand has a body that can never arrive whole
    live: bool  # the request in hand is a live reader (SSE, long-poll)


class AfterHalfClose(Enum):
    CLOSE = "close"  # nothing left to answer, or a live reader: close now (writes flush first)
    AFTER_ANSWER = "after_answer"  # the request in hand is the last: close after its answer
    WAIT = "wait"  # more requests to answer: decide again when the next one starts


def after_half_close(holding: Holding) -> AfterHalfClose:
    if holding.cut_short or holding.live:
        return AfterHalfClose.CLOSE
    if holding.queued:
        return AfterHalfClose.WAIT
    if holding.answering:
        return AfterHalfClose.AFTER_ANSWER
    return AfterHalfClose.CLOSE
