"""Immutable segments of a stream and how they join (DESIGN.md "the one idea").

Rules this module owns:

* An origin answer "offset X → Stream-Next-Offset Y with these bytes" is the segment [X, Y). Its
  bytes never change, even if it reached the tail of an open stream, so it is cached by value.
* **A segment moves forward and holds something**: its end is strictly after its start and it
  carries at least one message. ``Segment`` refuses anything else, so no chain of segments can
  revisit an offset, and an answer that breaks this (the reference origin answers a read *past*
  its tail with its real, smaller tail; an empty answer) is relayed, never stored.
  ``answer_segment`` is the one door from an origin answer to a segment. One empty segment is
  a fact worth keeping: ``-1`` → the first offset of an empty stream (where a stream starts never
  changes within its instance), so readers at ``-1`` can wait at the tail.
* Segments join only end-to-start: [X, Y) + [Y, Z) = [X, Z). Offsets are opaque, so a segment is
  never split; a read that starts inside one is a different key.
* JSON streams answer catch-up reads with one JSON array, so their segments join as arrays:
  ``[a,b]`` + ``[c]`` → ``[a,b,c]``; other content types join by concatenation.
* Every segment carries a digest of its bytes, made once: validators (ETags) and derived caches
  (SSE frames) are keyed by content, so bytes of a deleted stream can never match a new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from edge.protocol.reads import START, is_offset_token

DIGEST_BYTES = 8


class InvalidSegment(ValueError):
    """A segment that would not move forward, or holds nothing."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    start: str
    end: str
    body: bytes
    digest: bytes = field(default=b"", compare=False)

    def __post_init__(self) -> None:
        if not (self.start == START or is_offset_token(self.start)):
            raise InvalidSegment(f"bad start offset {self.start!r}")
        if not is_offset_token(self.end) or not self.end > self.start:
            raise InvalidSegment(f"segment [{self.start!r}, {self.end!r}) does not move forward")
        if not self.body and self.start != START:
            raise InvalidSegment("an empty answer is not a segment")
        if not self.digest:
            object.__setattr__(
                self, "digest", hashlib.blake2b(self.body, digest_size=DIGEST_BYTES).digest()
            )

    @property
    def size(self) -> int:
        return len(self.body)


def media_type(content_type: str | None) -> str:
    """``application/json; charset=utf-8`` → ``application/json``; ``""`` when absent."""
    return (content_type or "").split(";")[0].strip().lower()


def streams_content_type(content_type: str | None) -> str:
    """A stream's Content-Type as an origin answers it, compared as a whole: the origin keeps
    the one the stream was created with, parameters and all (``text/plain; charset=iso-8859-1``
    is another stream than ``text/plain``: the same bytes mean other characters). Case and
    spaces aside, which no origin is held to."""
    return "".join((content_type or "").split()).lower()


def is_json(content_type: str | None) -> bool:
    return media_type(content_type) == "application/json"


def _array_items(body: bytes) -> bytes:
    """The inside of a JSON array body, without brackets; raises ValueError if not an array."""
    stripped = body.strip()
    if not (stripped.startswith(b"[") and stripped.endswith(b"]")):
        raise ValueError("JSON segment is not an array")
    return stripped[1:-1].strip()


def is_json_array(body: bytes) -> bool:
    stripped = body.strip()
    return stripped.startswith(b"[") and stripped.endswith(b"]")


def holds_messages(body: bytes, *, json: bool) -> bool:
    """Does an answer body carry at least one message (``[]`` and ``b""`` do not)?"""
    return bool(_array_items(body)) if json else bool(body)


def answer_segment(start: str, end: str | None, body: bytes, *, json: bool) -> Segment | None:
    """The segment an origin answer "``start`` → ``end`` with ``body``" is, or None when it is
    not one (backward, empty, malformed): such an answer is true for its one request only."""
    if end is None or not is_offset_token(end) or not end > start:
        return None
    if json and not is_json_array(body):
        return None
    if start != START and not holds_messages(body, json=json):
        return None
    return Segment(start=start, end=end, body=body)


def join_bodies(bodies: Sequence[bytes], *, json: bool) -> bytes:
    """The body of one answer made of ``bodies`` in order (JSON arrays merge into one)."""
    if not json:
        return b"".join(bodies)
    items = [_array_items(body) for body in bodies]
    return b"[" + b",".join(item for item in items if item) + b"]"


def stitch(segments: Sequence[Segment], *, json: bool) -> bytes:
    """The body of the answer covering ``segments`` (already in end-to-start order)."""
    if len(segments) == 1 and not json:
        return segments[0].body
    return join_bodies([segment.body for segment in segments], json=json)


def content_digest(segments: Sequence[Segment], content_type: str | None = None) -> str:
    """A short validator of a representation: the bytes ``segments`` hold (from their digests,
    no rehash) and the content type they are served as, so an empty JSON answer (``[]``) and an
    empty text answer never share a tag either."""
    combined = hashlib.blake2b((content_type or "").encode(), digest_size=DIGEST_BYTES)
    for segment in segments:
        combined.update(segment.digest)
    return combined.hexdigest()
