"""Stream-Cursor generation (PROTOCOL.md §10.1), with the clock and randomness passed in.

Rules this module owns:

* A cursor is the number of 20-second intervals since 2024-10-09T00:00:00Z, so every edge and
  origin hands out the same value within an interval, and CDN collapsing keys line up.
* A response cursor is never the client's own cursor echoed back (ElectricSQL #1837): when the
  client's cursor is not behind the current interval, the answer jumps ahead by a random
  1-3600 s worth of intervals, so the next request has a new cache key.
* Clients whose cursors are in the same ``answer_class`` may share one answer: one jump drawn
  for all of them is as valid as one each (the production origin jumps a fixed 90 intervals),
  and their next requests then share a cache key.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

CURSOR_EPOCH = datetime(2024, 10, 9, tzinfo=UTC).timestamp()
CURSOR_INTERVAL_SECONDS = 20
MIN_JITTER_SECONDS = 1
MAX_JITTER_SECONDS = 3600


def current_interval(now: float) -> int:
    return math.floor((now - CURSOR_EPOCH) / CURSOR_INTERVAL_SECONDS)


def cursor_class(client_cursor: str | None) -> int | None:
    """What of a client's cursor decides the answer's: its value, or None when it is absent or
    malformed (those are answered with the current interval, like a cursor behind it)."""
    if not client_cursor:
        return None
    try:
        return int(client_cursor)
    except ValueError:
        return None


def answer_class(client: int | None, *, current: int) -> int | None:
    """Clients whose answers follow the same rule: None for every one behind the current
    interval (or without a cursor), which all get the interval; else the cursor itself."""
    return None if client is None or client < current else client


def next_cursor(client: int | None, *, current: int, rng: random.Random) -> str:
    if client is None or client < current:
        return str(current)
    jitter_seconds = rng.randint(MIN_JITTER_SECONDS, MAX_JITTER_SECONDS)
    return str(client + max(1, math.ceil(jitter_seconds / CURSOR_INTERVAL_SECONDS)))


def response_cursor(client_cursor: str | None, *, now: float, rng: random.Random) -> str:
    return next_cursor(cursor_class(client_cursor), current=current_interval(now), rng=rng)
