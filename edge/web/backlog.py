"""How much of the stream listener's backlog one pass of the event loop accepts (issue 29: libuv
accepts one connection per pass, so under a few thousand long-polls a second newcomers waited in
the kernel's queue, 600 and more of them, for tens of seconds).

Rules this module owns:

* A readable listener is drained in the pass that finds it readable: accepted until the kernel's
  queue is empty (``EMPTY``), up to ``ACCEPTS_PER_PASS``, so one pass does bounded work and what
  is left is taken in the next one (the listener stays readable).
* Never more in one pass than the connection table has room for (``room``: its
  ``max_connections`` plus ``at_cap``, less the connections holding descriptors) once the
  connections accepted in earlier passes and not yet in the table (``handing``: a hand-over
  takes a pass or two) have theirs, and never fewer than one: at the cap a newcomer is still
  accepted, one a pass, for the table to admit, evict for, or refuse with its 503, at the pace
  it always was, and the process's descriptors stay within the cap (``edge.web.descriptors``).
* After each attempt (``after_accept``): a connection accepted, or one its client abandoned while
  it was queued (``ABORTED``), counts against the pass and the next is tried; an empty queue ends
  the pass; the process out of descriptors ends it too and rests the listener for
  ``REST_SECONDS`` (``REST``), leaving newcomers queued rather than failing every pass.

Pure: counts in, a decision out (``edge.web.accept_loop`` does the accepting).
"""

from __future__ import annotations

from enum import Enum
from typing import assert_never

# About a millisecond or two of accepting and handing over on one core: enough for a herd of
# viewers to be taken in a few passes, little enough that the connections already open are not
# kept waiting by it.
ACCEPTS_PER_PASS = 128
# How long a listener rests when the process is out of descriptors: some close meanwhile.
REST_SECONDS = 0.1


class Accept(Enum):
    """What one ``accept`` on the listening socket gave."""

    ACCEPTED = "accepted"
    ABORTED = "aborted"  # the client left while queued (ECONNABORTED and the like)
    EMPTY = "empty"  # EAGAIN: nothing left in the kernel's queue
    NO_DESCRIPTORS = "no_descriptors"  # EMFILE, ENFILE, ENOBUFS, ENOMEM


class Next(Enum):
    """What the listener does after an attempt."""

    ACCEPT = "accept"  # try the next one in this pass
    WAIT = "wait"  # the pass is over: wait until the listener is readable
    REST = "rest"  # the pass is over, and the listener is not watched for ``REST_SECONDS``


def accepts_this_pass(*, room: int, handing: int = 0, per_pass: int = ACCEPTS_PER_PASS) -> int:
    """How many connections one readable pass may accept at most, the table having ``room``
    for that many more and ``handing`` accepted ones still on their way to it."""
    return max(1, min(per_pass, room - handing))


def after_accept(outcome: Accept, *, attempts: int, limit: int) -> Next:
    """The step after ``attempts`` attempts this pass (this one included), ``limit`` of them
    allowed (``accepts_this_pass``)."""
    match outcome:
        case Accept.ACCEPTED | Accept.ABORTED:
            return Next.ACCEPT if attempts < limit else Next.WAIT
        case Accept.EMPTY:
            return Next.WAIT
        case Accept.NO_DESCRIPTORS:
            return Next.REST
        case _:
            assert_never(outcome)
