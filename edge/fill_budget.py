"""The bytes origin answers may hold while the edge reads them and writes them on.

Rules this module owns:

* All fills together hold at most ``--fill-buffer-bytes``: while an origin answer is read, and
  until every answer made of it is written to its client (``Hold``), since an evicted segment
  still lives while a slow client reads it.
* A fill that keeps moving is not a trickle: past its ``--fill-deadline`` it earns one more
  second for every ``FILL_MIN_BYTES_PER_SECOND`` it has received (``fill_deadline_seconds``),
  so a large body read on a busy edge ends while a trickle is cut at the base; the total stays
  bounded, as one fill holds at most ``--max-segment-bytes``.
* One fill holds at most ``--max-segment-bytes``. Past either bound the body is not buffered
  (``BodyTooLarge``): the web layer relays the client's own request instead.
"""

from __future__ import annotations

import asyncio

import aiohttp

from edge.memory import TRIMMER
from edge.origin import BodyTooLarge, OriginClient

# The slowest an origin answer may arrive and still earn time past --fill-deadline (Apache's
# mod_reqtimeout MinRate, for the same reason): a 40 MB body read beside a hundred others on a
# busy edge moves at hundreds of KiB/s; the trickle that made the deadline needed is 5 B/s.
FILL_MIN_BYTES_PER_SECOND = 64 * 1024


def fill_deadline_seconds(base_seconds: float, received_bytes: int) -> float:
    """Seconds a fill may take in all, from its start, having received ``received_bytes``."""
    return base_seconds + received_bytes / FILL_MIN_BYTES_PER_SECOND


class FillDeadline:
    """One fill's ``--fill-deadline`` (``base_seconds``), begun at ``begun`` on the event loop's
    clock and stretched by ``read_body`` as the fill's bytes arrive."""

    def __init__(self, base_seconds: float) -> None:
        self.base_seconds = base_seconds
        self.begun = asyncio.get_running_loop().time()
        self.timeout = asyncio.timeout_at(self.begun + base_seconds)

    def earned(self, received_bytes: int) -> None:
        self.timeout.reschedule(
            self.begun + fill_deadline_seconds(self.base_seconds, received_bytes)
        )


class FillBudget:
    """Bytes all fills together may hold (``--fill-buffer-bytes``): while reading origin answers,
    and until the answers made of them are written to their clients (``Hold``), since an evicted
    segment still lives while a slow client reads it."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


class Hold:
    """A fill's share of the budget, kept while anyone still writes its bytes to a client."""

    # After the fetch ends, how long its own share waits for the readers it was collapsed with
    # to take theirs (they resume within microseconds; a reader that left takes none).
    FLIGHT_GRACE_SECONDS = 1.0

    def __init__(self, budget: FillBudget, size: int) -> None:
        self._budget = budget
        self._size = size
        self._refs = 1  # the fetch's own, until its readers have taken theirs

    def acquire(self) -> Hold:
        self._refs += 1
        return self

    def release(self) -> None:
        self._refs -= 1
        if self._refs == 0 and self._size:
            self._budget.give_back(self._size)
            self._size = 0

    def release_flight(self) -> None:
        asyncio.get_running_loop().call_later(self.FLIGHT_GRACE_SECONDS, self.release)


async def read_body(
    upstream: aiohttp.ClientResponse,
    limit: int,
    budget: FillBudget,
    deadline: FillDeadline | None = None,
) -> tuple[bytes, Hold]:
    """The whole body, within ``limit`` (``--max-segment-bytes``) and ``budget``; past
    either, BodyTooLarge (the web layer relays instead of buffering). The body's share of
    the budget is the returned ``Hold``'s until every answer made of it is written.
    ``deadline`` earns its time from the bytes taken so far, after each chunk."""
    declared = upstream.content_length
    if declared is not None and (declared > limit or declared > budget.limit - budget.used):
        raise BodyTooLarge(f"{upstream.url.path}: {declared} bytes is over the fill budget")
    # One growing buffer, not a list of 64 KiB chunks: a large body then lives in one
    # mapping that is returned whole, instead of fragmenting the heap (edge/memory.py).
    buffer = bytearray()
    taken = 0
    try:
        async for chunk in OriginClient.body_chunks(upstream):
            if taken + len(chunk) > limit or not budget.take(len(chunk)):
                raise BodyTooLarge(f"{upstream.url.path}: over the fill budget")
            taken += len(chunk)
            buffer += chunk
            if deadline is not None:
                deadline.earned(taken)
        return bytes(buffer), Hold(budget, taken)
    except BaseException:
        budget.give_back(taken)
        raise
    finally:
        del buffer
        TRIMMER.passed(taken)
