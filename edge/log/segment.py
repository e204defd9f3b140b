"""Immutable segments of a stream and how they join (DESIGN.md "the one idea").

Rules this module owns:

* An origin answer "offset X → Stream-Next-Offset Y with these bytes" is the segment [X, Y). Its
  bytes never change, even if it reached the tail of an open stream, so it is cached by value.
* Segments join only end-to-start: [X, Y) + [Y, Z) = [X, Z). Offsets are opaque, so a segment is
  never split; a read that starts inside one is a different key.
* A segment may be empty and still useful: ``-1`` → the first real offset of an empty stream.
* JSON streams answer catch-up reads with one JSON array, so their segments join as arrays:
  ``[a,b]`` + ``[]`` + ``[c]`` → ``[a,b,c]``; other content types join by concatenation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    start: str
    end: str
    body: bytes

    @property
    def size(self) -> int:
        return len(self.body)


def is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.split(";")[0].strip().lower() == "application/json"


def _array_items(body: bytes) -> bytes:
    """The inside of a JSON array body, without brackets; raises ValueError if not an array."""
    stripped = body.strip()
    if not (stripped.startswith(b"[") and stripped.endswith(b"]")):
        raise ValueError("JSON segment is not an array")
    return stripped[1:-1].strip()


def stitch(segments: Sequence[Segment], *, json: bool) -> bytes:
    """The body of the answer covering ``segments`` (already in end-to-start order)."""
    if not json:
        return b"".join(segment.body for segment in segments)
    items = [_array_items(segment.body) for segment in segments]
    return b"[" + b",".join(item for item in items if item) + b"]"
