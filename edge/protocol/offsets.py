"""Offsets as values: which strings may be offsets, and the sentinels (PROTOCOL.md §8).

Rules this module owns:

* Offsets are opaque to the edge but lexicographically sortable, so the edge compares them as
  strings and never parses them.
* An offset from the origin (``Stream-Next-Offset``, an SSE ``streamNextOffset``) or from a client
  (``offset=``, ``Last-Event-ID``) is checked here before it reaches a cache key, an ETag, an SSE
  ``id:`` line or a log line: 1 to ``MAX_OFFSET_CHARS`` visible ASCII characters, none of which
  can end a header, a frame or a quoted tag (no whitespace, controls, ``"``, ``,`` or ``\\``).
* ``-1`` (the start) and ``now`` (the tail) are sentinels a client may send; the origin never
  issues them as a position.
"""

from __future__ import annotations

import re

START = "-1"
NOW = "now"
MAX_OFFSET_CHARS = 256

_TOKEN = re.compile(r"[!#-+\--\[\]-~]{1,%d}" % MAX_OFFSET_CHARS)  # noqa: UP031


def is_offset_token(value: str | None) -> bool:
    """Could ``value`` be a position the origin issued?"""
    return value is not None and value not in (START, NOW) and _TOKEN.fullmatch(value) is not None


def is_client_offset(value: str | None) -> bool:
    """May a client start a read here (a position, ``-1`` or ``now``)?"""
    return value is not None and (value in (START, NOW) or _TOKEN.fullmatch(value) is not None)
