"""What the shared tier stores, and under which names: pure, no Redis (``edge.store.shared`` does
the I/O).

Rules this module owns:

* **Key names.** Every key of a stream starts with ``KEY_PREFIX`` and carries the stream's hash
  tag (``{<digest of the path>}``), so a stream's keys live in one slot of a cluster; segment
  and closure keys carry the scope, so a credential's values are never visible to another.
* **Values name their generation.** A segment (``encode``) and a closure (``encode_closed``)
  are stamped with the generation they were shared under; the tier serves one only when its
  stamp equals the generation read with it.
* **Decoding is the one check of what Redis gives.** ``decode``, ``decode_closed`` and
  ``decode_generation`` accept only values of the shape this edge writes (keys, types, offsets,
  a printable content type of at most ``MAX_CONTENT_TYPE_CHARS``, a finite time) and raise
  ``BadValue`` for anything else, an older format included: a miss, never a wrong answer.
* A generation key's absent value names no generation (``decode_generation`` returns None): it
  confirms nothing.
* A forgetting's message on ``PURGE_CHANNEL`` is ``"<generation> <stream path>"``
  (``encode_purge``/``parse_purge``); anything else is ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass

from edge.log.segment import InvalidSegment, Segment
from edge.log.stream_log import LogKey
from edge.protocol.reads import is_offset_token

KEY_PREFIX = "edge:v2"
PURGE_CHANNEL = f"{KEY_PREFIX}:purge"
MAX_CONTENT_TYPE_CHARS = 256


class BadValue(ValueError):
    """A shared-tier value that is not one this edge wrote for this key."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedSegment:
    segment: Segment
    content_type: str | None
    # When (wall clock, seconds) the replica that shared it had it from the origin: the stream
    # had gone past its start then (``edge.log.stream_log.judge_shared``).
    seen_at: float
    # The origin's answer said the stream open with its tail at the segment's end.
    open_tail: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedClosure:
    """A replica saw the stream closed at ``end``: the content type of the instance it saw
    closed, and when (wall clock, seconds) the closing answer reached it. A generation names
    no instance recreated behind every replica's back, so the closure names its own: what a
    replica holds of another instance (another type, or heard open there since) is not closed
    by it (``edge.log.stream_log.judge_shared``)."""

    end: str
    content_type: str | None
    seen_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Lookup:
    """One round trip's answer: the stream's generation now, and the value if it is current."""

    generation: str
    value: SharedSegment | None


def _stream_tag(stream: str) -> str:
    return "{" + hashlib.sha256(stream.encode()).hexdigest()[:24] + "}"


def segment_key(key: LogKey, start: str) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(key.stream)}:seg:{key.scope}:{start}"


def closed_key(key: LogKey) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(key.stream)}:closed:{key.scope}"


def generation_key(stream: str) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(stream)}:gen"


def index_key(stream: str) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(stream)}:keys"


def encode(
    segment: Segment,
    content_type: str | None,
    generation: str,
    *,
    seen_at: float,
    open_tail: bool = False,
) -> bytes:
    header = json.dumps(
        {
            "start": segment.start, "end": segment.end, "ct": content_type, "gen": generation,
            "at": seen_at, "tail": open_tail,
        }
    )  # fmt: skip
    return header.encode() + b"\n" + segment.body


def decode(blob: object, *, start: str) -> tuple[SharedSegment, str]:
    """The segment at ``start`` and its generation stamp; raises BadValue for anything else."""
    if not isinstance(blob, bytes):
        raise BadValue("not bytes")
    header, newline, body = blob.partition(b"\n")
    if not newline:
        raise BadValue("no header line")
    try:
        meta = json.loads(header)
    except ValueError as error:
        raise BadValue("header is not JSON") from error
    if not isinstance(meta, dict) or set(meta) != {"start", "end", "ct", "gen", "at", "tail"}:
        raise BadValue("header is not ours")  # the older format (no "at") too: a miss
    content_type, generation = meta["ct"], meta["gen"]
    if meta["start"] != start or not isinstance(generation, str):
        raise BadValue("stored under another key")
    if not _content_type_ok(content_type):
        raise BadValue("bad content type")
    if not isinstance(meta["end"], str):
        raise BadValue("bad end")
    seen_at, open_tail = _seen_at(meta["at"]), meta["tail"]
    if not isinstance(open_tail, bool):
        raise BadValue("bad tail")
    try:
        segment = Segment(start=start, end=meta["end"], body=body)
    except InvalidSegment as error:
        raise BadValue(str(error)) from error
    found = SharedSegment(
        segment=segment, content_type=content_type, seen_at=seen_at, open_tail=open_tail
    )
    return found, generation


def encode_closed(closure: SharedClosure, generation: str) -> bytes:
    return json.dumps(
        {"end": closure.end, "gen": generation, "ct": closure.content_type, "at": closure.seen_at}
    ).encode()


def decode_closed(blob: object) -> tuple[SharedClosure, str]:
    """A shared closure and its generation stamp; raises BadValue for anything else (a value
    of the older format, which named no instance, too: a miss, never a wrong closure)."""
    if not isinstance(blob, bytes):
        raise BadValue("not bytes")
    try:
        meta = json.loads(blob)
    except ValueError as error:
        raise BadValue("not JSON") from error
    if not isinstance(meta, dict) or set(meta) != {"end", "gen", "ct", "at"}:
        raise BadValue("not ours")
    end, generation, content_type, seen_at = meta["end"], meta["gen"], meta["ct"], meta["at"]
    if not isinstance(end, str) or not is_offset_token(end) or not isinstance(generation, str):
        raise BadValue("bad closure")
    if not _content_type_ok(content_type):
        raise BadValue("bad content type")
    closure = SharedClosure(end=end, content_type=content_type, seen_at=_seen_at(seen_at))
    return closure, generation


def _seen_at(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadValue("bad time")
    return float(value)


def _content_type_ok(content_type: object) -> bool:
    return content_type is None or (
        isinstance(content_type, str)
        and len(content_type) <= MAX_CONTENT_TYPE_CHARS
        and content_type.isprintable()
    )


def decode_generation(blob: object) -> str | None:
    """The generation a generation key's value names; None for an absent key, which names
    none: it was lost (or never written), so it confirms nothing (the caller mints one)."""
    if blob is None:
        return None
    if isinstance(blob, bytes) and blob.isascii() and 0 < len(blob) <= 64:
        return blob.decode()
    raise BadValue("bad generation")


def encode_purge(stream: str, generation: str) -> bytes:
    return f"{generation} {stream}".encode()


def parse_purge(data: object) -> tuple[str, str] | None:
    """A purge message, ``"<generation> <stream path>"``, as (stream, generation)."""
    if not isinstance(data, bytes):
        return None
    generation, _, stream = data.decode(errors="replace").partition(" ")
    if not generation or not stream.startswith("/"):
        return None
    return stream, generation


def new_generation() -> str:
    return secrets.token_hex(8)
