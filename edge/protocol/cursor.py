"""Stream-Cursor generation (PROTOCOL.md §10.1), with the clock and randomness passed in.

Rules this module owns:

* A cursor is the number of 20-second intervals since 2024-10-09T00:00:00Z, so every edge and
  origin hands out the same value within an interval, and CDN collapsing keys line up.
* A response cursor is never the client's own cursor echoed back (ElectricSQL #1837): when the
  client's cursor is not behind the current interval, the answer jumps ahead by a random
  1-3600 s worth of intervals, so the next request has a new cache key.
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


def response_cursor(client_cursor: str | None, *, now: float, rng: random.Random) -> str:
    current = current_interval(now)
    if not client_cursor:
        return str(current)
    try:
        client = int(client_cursor)
    except ValueError:
        return str(current)
    if client < current:
        return str(current)
    jitter_seconds = rng.randint(MIN_JITTER_SECONDS, MAX_JITTER_SECONDS)
    return str(client + max(1, math.ceil(jitter_seconds / CURSOR_INTERVAL_SECONDS)))
