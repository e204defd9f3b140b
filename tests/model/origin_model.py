"""A pure model of the reference origin (npm ``@durable-streams/server``, in-memory store).

Source: ``deploy/origin/node_modules/@durable-streams/server/dist/index.js`` (``StreamStore`` and
``DurableStreamTestServer``): ``handleRead`` (catch-up reads only: no ``live``), ``handleCreate``,
``handleAppend`` (no idempotent producers), ``handleDelete``, ``StreamStore.read``,
``appendToStream``, ``formatResponse``/``formatJsonMessages`` and ``processJsonAppend``.

What it reproduces, byte for byte where the edge can see it:

* Offsets are ``%016d_%016d`` (read sequence, byte position); a stream starts at
  ``0000000000000000_0000000000000000`` and every append moves the byte position by
  ``5 + len(stored bytes)``. A JSON append stores each array element ``JSON.stringify``-ed and
  followed by ``,``. Recreating a path restarts at zero: a new instance reuses the old offsets.
* A read at ``-1`` (or with no offset) returns every message; at any other offset, the messages
  whose offset is *string-greater* than it (so ``0_0`` is past every padded offset, and
  ``00000000000000000_0`` is before the start). The answer is always up to date (this store has no
  size limit): ``Stream-Next-Offset`` is the tail, also for a read past the tail (empty body, a
  *smaller* offset than the one asked), ``Stream-Up-To-Date: true``, ``Stream-Closed: true`` when
  the stream is closed. JSON streams answer one array.
* 404 ``Stream not found`` for a missing stream (checked before the offset), 400 for an empty,
  repeated or malformed ``offset`` (``^(-1|now|\\d+_\\d+)$``), ``offset=now`` (200, ``no-store``),
  the ETag ``"<base64 path>:<offset as sent or -1>:<next>[:c]"`` and a 304 on an exact
  ``If-None-Match``.

* Forks (``StreamStore.create`` with ``forkedFrom``, ``readForkedMessages``): ``PUT`` with
  ``Stream-Forked-From`` (and ``Stream-Fork-Offset``, a message boundary of the source's, or
  its tail when absent) makes a stream that reads the source's messages up to the fork offset,
  at their offsets, then its own; its content type is the source's (another is a 409). A
  source that is missing is a 404, a soft-deleted one a 409, an offset past its tail a 400.
  Since those bytes never change, a fork keeps a copy of them (``Instance.forked_from`` names
  the source, which counts its forks).
* Soft deletes: deleting a stream that has forks marks it ``soft_deleted``: 410 ``Stream is
  gone`` to ``GET``, ``HEAD``, ``POST`` (an append or a close) and ``DELETE``, 409 to a ``PUT``
  at its path; once its last fork is deleted it is deleted for good (``deleteWithCascade``).
* ``restart()``: the in-memory store loses every stream (a restarted origin).

Not modelled: live reads (long-poll, SSE), TTL/expiry, fork sub-offsets and fork offsets that
are not message boundaries, producers, ``Stream-Seq``, compression (the edge always asks for
identity), fault injection.

Time is integer milliseconds (no float drift); every mutation of a path appends a ``Version`` to
that path's history, so a test can ask what the origin would have answered at any moment.
Message ids are test bookkeeping: the tests write unique ``{"i":N}`` items (JSON) or ``<N>``
tokens (text) and the model remembers which ids each message carries.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl

OFFSET_ZERO = "0000000000000000_0000000000000000"
FRAME_OVERHEAD = 5
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain"
DEFAULT_TYPE = "application/octet-stream"

# handleRead: /^(-1|now|\d+_\d+)$/ (JavaScript \d is ASCII only).
_VALID_READ_OFFSET = re.compile(r"-1|now|[0-9]+_[0-9]+")
_VALID_CONTENT_TYPE = re.compile(r"[\w-]+/[\w-]+", re.ASCII)
_TEXT_ID = re.compile(rb"<([0-9]+)>")

# Set on every answer by handleRequest before routing.
GLOBAL_HEADERS: tuple[tuple[str, str], ...] = (
    ("access-control-allow-origin", "*"),
    ("access-control-allow-methods", "GET, POST, PUT, DELETE, HEAD, OPTIONS"),
    (
        "access-control-allow-headers",
        "content-type, authorization, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, "
        "Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, "
        "Stream-Fork-Sub-Offset",
    ),
    (
        "access-control-expose-headers",
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Producer-Epoch, "
        "Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, etag, content-type, "
        "content-encoding, vary",
    ),
    ("x-content-type-options", "nosniff"),
    ("cross-origin-resource-policy", "cross-origin"),
)


def valid_read_offset(offset: str | None) -> bool:
    """Would ``handleRead`` accept this ``offset`` parameter (None: absent)?"""
    return offset is None or _VALID_READ_OFFSET.fullmatch(offset) is not None


def format_offset(read_seq: int, byte_offset: int) -> str:
    """``String(n).padStart(16, "0")`` twice, joined by ``_`` (never truncates)."""
    return f"{read_seq:016d}_{byte_offset:016d}"


def parse_offset(offset: str) -> tuple[int, int]:
    seq, _, position = offset.partition("_")
    return int(seq), int(position)


def normalize_content_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";")[0].strip().lower()


def is_json_type(content_type: str | None) -> bool:
    return normalize_content_type(content_type) == JSON_TYPE


def js_stringify(value: object) -> str:
    """``JSON.stringify`` for the values the tests write (objects of small integers)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Message:
    data: bytes  # as stored: JSON items each followed by ","; other types as sent
    offset: str  # the offset after this message
    ids: tuple[int, ...]  # test bookkeeping: the unique ids it carries


@dataclass(frozen=True, slots=True)
class Instance:
    """One life of a stream path, from its creation to its deletion."""

    path: str
    generation: int  # test bookkeeping: the n-th creation of any stream in this model
    content_type: str
    messages: tuple[Message, ...] = ()
    closed: bool = False
    forked_from: str | None = None  # the source's path, for a fork
    fork_offset: str | None = None
    soft_deleted: bool = False  # deleted while it has forks: 410 to everything

    @property
    def json(self) -> bool:
        return is_json_type(self.content_type)

    @property
    def current_offset(self) -> str:
        return self.messages[-1].offset if self.messages else (self.fork_offset or OFFSET_ZERO)

    @property
    def positions(self) -> tuple[str, ...]:
        """Every offset this instance has issued as a tail: the start and each message end."""
        return (OFFSET_ZERO, *(message.offset for message in self.messages))

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(i for message in self.messages for i in message.ids)

    def read(self, offset: str | None) -> tuple[Message, ...]:
        """``StreamStore.read``: all messages for ``-1``, else those string-greater than it."""
        if not offset or offset == "-1":
            return self.messages
        for index, message in enumerate(self.messages):
            if message.offset > offset:
                return self.messages[index:]
        return ()

    def format(self, messages: Sequence[Message]) -> bytes:
        """``formatResponse``: one JSON array, or the stored bytes concatenated."""
        if not self.json:
            return b"".join(message.data for message in messages)
        items: list[str] = []
        for message in messages:
            fragment = message.data.decode().rstrip()
            fragment = fragment.removesuffix(",")
            items.extend(js_stringify(value) for value in json.loads(f"[{fragment}]"))
        return f"[{','.join(items)}]".encode()

    def appended(self, data: bytes, ids: tuple[int, ...]) -> Instance:
        """``appendToStream`` with already processed ``data``."""
        read_seq, position = parse_offset(self.current_offset)
        offset = format_offset(read_seq, position + FRAME_OVERHEAD + len(data))
        return replace(self, messages=(*self.messages, Message(data=data, offset=offset, ids=ids)))


class BadAppend(ValueError):
    """What ``processJsonAppend`` throws (the origin answers 400)."""


def process_append(
    content_type: str, body: bytes, *, initial: bool
) -> tuple[bytes, tuple[int, ...]]:
    """The bytes the store keeps for an append body, and the test ids they carry."""
    if not is_json_type(content_type):
        return body, tuple(int(n) for n in _TEXT_ID.findall(body))
    try:
        parsed = json.loads(body.decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise BadAppend("Invalid JSON") from error
    values = parsed if isinstance(parsed, list) else [parsed]
    if not values:
        if initial:
            return b"", ()
        raise BadAppend("Empty arrays are not allowed")
    data = "".join(js_stringify(value) + "," for value in values).encode()
    return data, tuple(_json_id(value) for value in values)


def _json_id(value: object) -> int:
    if isinstance(value, dict) and isinstance(value.get("i"), int):
        return int(value["i"])
    return -1


def message_ids(content_type: str | None, body: bytes) -> list[int] | None:
    """The ids in an answer body (in order), or None if it is not a well-formed answer of that
    content type made of the tests' items."""
    if is_json_type(content_type):
        try:
            parsed = json.loads(body.decode())
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(parsed, list):
            return None
        ids = [_json_id(value) for value in parsed]
        return None if -1 in ids else ids
    ids = [int(n) for n in _TEXT_ID.findall(body)]
    if b"".join(b"<%d>" % n for n in ids) != body:
        return None
    return ids


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((v for n, v in self.headers if n.lower() == wanted), None)


def _respond(status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> Response:
    return Response(
        status=status,
        headers=(*GLOBAL_HEADERS, *headers, ("content-length", str(len(body)))),
        body=body,
    )


def _text(status: int, body: str, *extra: tuple[str, str]) -> Response:
    return _respond(status, (("content-type", "text/plain"), *extra), body.encode())


def stream_etag(path: str, start: str, end: str, *, closed: bool) -> str:
    encoded = base64.b64encode(path.encode()).decode()
    return f'"{encoded}:{start}:{end}{":c" if closed else ""}"'


def read_response(
    path: str,
    instance: Instance | None,
    query: Sequence[tuple[str, str]],
    *,
    if_none_match: str | None = None,
) -> Response:
    """``handleRead`` for a catch-up read (no ``live``) of ``instance`` (None: no such stream)."""
    if instance is None:
        return _text(404, "Stream not found")
    if instance.soft_deleted:
        return _text(410, "Stream is gone")
    offsets = [value for name, value in query if name == "offset"]
    offset = offsets[0] if offsets else None
    if any(name == "live" for name, _ in query):
        raise NotImplementedError("the model answers catch-up reads only")
    if offset is not None:
        if offset == "":
            return _text(400, "Empty offset parameter")
        if len(offsets) > 1:
            return _text(400, "Multiple offset parameters not allowed")
        if not _VALID_READ_OFFSET.fullmatch(offset):
            return _text(400, "Invalid offset format")
    if offset == "now":
        headers = [("Stream-Next-Offset", instance.current_offset), ("Stream-Up-To-Date", "true")]
        headers.append(("cache-control", "no-store"))
        headers.append(("content-type", instance.content_type))
        if instance.closed:
            headers.append(("Stream-Closed", "true"))
        return _respond(200, headers, b"[]" if JSON_TYPE in instance.content_type else b"")
    messages = instance.read(offset)
    next_offset = messages[-1].offset if messages else instance.current_offset
    headers = [("content-type", instance.content_type), ("Stream-Next-Offset", next_offset)]
    headers.append(("Stream-Up-To-Date", "true"))
    at_tail = next_offset == instance.current_offset
    closed = instance.closed and at_tail
    if closed:
        headers.append(("Stream-Closed", "true"))
    tag = stream_etag(path, offset if offset is not None else "-1", next_offset, closed=closed)
    headers.append(("etag", tag))
    if if_none_match is not None and if_none_match == tag:
        return Response(status=304, headers=(*GLOBAL_HEADERS, ("etag", tag)))
    return _respond(200, headers, instance.format(messages))


@dataclass(frozen=True, slots=True)
class Version:
    """One state of a path: current from ``since_ms`` until the next version's ``since_ms``."""

    index: int
    since_ms: int
    instance: Instance | None


class OriginModel:
    """The reference origin's state and HTTP behaviour, with the history of every path."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._history: dict[str, list[Version]] = {}
        self._generations = 0

    # --- state and history ---

    def history(self, path: str) -> list[Version]:
        return self._history.setdefault(path, [Version(index=0, since_ms=0, instance=None)])

    def current(self, path: str) -> Instance | None:
        return self.history(path)[-1].instance

    def version_index(self, path: str) -> int:
        return self.history(path)[-1].index

    def until_ms(self, path: str, index: int) -> int | None:
        """When version ``index`` stopped being current (None: it still is)."""
        history = self.history(path)
        return history[index + 1].since_ms if index + 1 < len(history) else None

    def issued_offsets(self, path: str) -> list[str]:
        """Every position any instance of ``path`` ever had, oldest first, without repeats."""
        seen: dict[str, None] = {}
        for version in self.history(path):
            if version.instance is not None:
                seen.update(dict.fromkeys(version.instance.positions))
        return list(seen)

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def _set(self, path: str, instance: Instance | None) -> None:
        history = self.history(path)
        history.append(Version(index=len(history), since_ms=self.now_ms, instance=instance))

    def forks_of(self, path: str) -> list[str]:
        """The paths whose current stream is a fork of ``path`` (its ``refCount``)."""
        return [
            fork
            for fork, history in self._history.items()
            if history[-1].instance is not None and history[-1].instance.forked_from == path
        ]

    def restart(self) -> None:
        """The origin restarts: its in-memory store has lost every stream."""
        for path in list(self._history):
            if self.current(path) is not None:
                self._set(path, None)

    # --- HTTP ---

    def handle(
        self,
        method: str,
        path: str,
        query_string: str = "",
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Response:
        method = method.upper()
        query = parse_qsl(query_string, keep_blank_values=True)
        if method == "GET":
            inm = next((v for n, v in headers if n.lower() == "if-none-match"), None)
            return read_response(path, self.current(path), query, if_none_match=inm)
        if method == "PUT":
            return self._create(path, headers, body)
        if method == "POST":
            return self._append(path, headers, body)
        if method == "DELETE":
            return self._delete(path)
        if method == "HEAD":
            return self._head(path)
        return _text(405, "Method not allowed")

    def _create(self, path: str, headers: Sequence[tuple[str, str]], body: bytes) -> Response:
        source = _header(headers, "stream-forked-from")
        if source is not None:
            return self._fork(path, source, headers)
        existing = self.current(path)
        if existing is not None and (existing.soft_deleted or existing.forked_from is not None):
            # A fork's configuration names its source: a PUT without one is another.
            return _text(409, "Stream already exists with different configuration")
        content_type = _header(headers, "content-type")
        if (
            not content_type
            or not content_type.strip()
            or not _VALID_CONTENT_TYPE.match(content_type)
        ):
            content_type = DEFAULT_TYPE
        closed = _header(headers, "stream-closed") == "true"
        existing = self.current(path)
        if existing is not None:
            same_type = (normalize_content_type(content_type) or DEFAULT_TYPE) == (
                normalize_content_type(existing.content_type) or DEFAULT_TYPE
            )
            if not (same_type and closed == existing.closed):
                return _text(409, "Stream already exists with different configuration")
            stream = existing
        else:
            self._generations += 1
            stream = Instance(path=path, generation=self._generations, content_type=content_type)
            if body:
                try:
                    data, ids = process_append(content_type, body, initial=True)
                except BadAppend as error:
                    return _text(400, str(error))
                if data:
                    stream = stream.appended(data, ids)
            stream = replace(stream, closed=closed)
            self._set(path, stream)
        answer = [("content-type", stream.content_type)]
        answer.append(("Stream-Next-Offset", stream.current_offset))
        if existing is None:
            answer.append(("location", f"http://origin.invalid{path}"))
        if stream.closed:
            answer.append(("Stream-Closed", "true"))
        return _respond(201 if existing is None else 200, answer)

    def _fork(self, path: str, source_path: str, headers: Sequence[tuple[str, str]]) -> Response:
        """``handleCreate`` with ``Stream-Forked-From`` (no sub-offset, no body)."""
        asked_offset = _header(headers, "stream-fork-offset")
        if asked_offset is not None and not re.fullmatch(r"[0-9]+_[0-9]+", asked_offset):
            return _text(400, "Invalid Stream-Fork-Offset format")
        content_type = _header(headers, "content-type")
        if (
            not content_type
            or not content_type.strip()
            or not _VALID_CONTENT_TYPE.match(content_type)
        ):
            content_type = None
        closed = _header(headers, "stream-closed") == "true"
        existing = self.current(path)
        if existing is not None:
            if existing.soft_deleted:
                return _text(
                    409,
                    "stream was deleted but still has active forks — path cannot be reused "
                    "until all forks are removed",
                )
            same = (
                existing.forked_from == source_path
                and asked_offset in (None, existing.fork_offset)
                and (normalize_content_type(content_type) or DEFAULT_TYPE)
                == (normalize_content_type(existing.content_type) or DEFAULT_TYPE)
                and closed == existing.closed
            )
            if not same:
                return _text(409, "Stream already exists with different configuration")
            return self._created(existing, new=False)
        source = self.current(source_path)
        if source is None:
            return _text(404, "Source stream not found")
        if source.soft_deleted:
            return _text(409, "source stream was deleted but still has active forks")
        if content_type is not None and normalize_content_type(
            content_type
        ) != normalize_content_type(source.content_type):
            return _text(409, "Content type mismatch with source stream")
        fork_offset = source.current_offset if asked_offset is None else asked_offset
        if fork_offset < OFFSET_ZERO or source.current_offset < fork_offset:
            return _text(400, "Fork offset beyond source stream length")
        self._generations += 1
        stream = Instance(
            path=path,
            generation=self._generations,
            content_type=content_type or source.content_type,
            messages=tuple(m for m in source.messages if m.offset <= fork_offset),
            closed=closed,
            forked_from=source_path,
            fork_offset=fork_offset,
        )
        self._set(path, stream)
        return self._created(stream, new=True)

    def _created(self, stream: Instance, *, new: bool) -> Response:
        answer = [("content-type", stream.content_type)]
        answer.append(("Stream-Next-Offset", stream.current_offset))
        if new:
            answer.append(("location", f"http://origin.invalid{stream.path}"))
        if stream.closed:
            answer.append(("Stream-Closed", "true"))
        return _respond(201 if new else 200, answer)

    def _append(self, path: str, headers: Sequence[tuple[str, str]], body: bytes) -> Response:
        close = _header(headers, "stream-closed") == "true"
        stream = self.current(path)
        if not body and close:
            if stream is None:
                return _text(404, "Stream not found")
            if stream.soft_deleted:
                return _text(410, "Stream is gone")
            if not stream.closed:
                self._set(path, replace(stream, closed=True))
            return _respond(
                204, (("Stream-Next-Offset", stream.current_offset), ("Stream-Closed", "true"))
            )
        if not body:
            return _text(400, "Empty body")
        content_type = _header(headers, "content-type")
        if not content_type:
            return _text(400, "Content-Type header is required")
        if stream is None:
            return _text(404, "Stream not found")
        if stream.soft_deleted:
            return _text(410, "Stream is gone")
        if stream.closed:
            return _text(
                409,
                "Stream is closed",
                ("Stream-Closed", "true"),
                ("Stream-Next-Offset", stream.current_offset),
            )
        if normalize_content_type(content_type) != normalize_content_type(stream.content_type):
            return _text(409, "Content-type mismatch")
        try:
            data, ids = process_append(stream.content_type, body, initial=False)
        except BadAppend as error:
            return _text(400, str(error))
        stream = stream.appended(data, ids)
        if close:
            stream = replace(stream, closed=True)
        self._set(path, stream)
        answer = [("Stream-Next-Offset", stream.current_offset)]
        if close:
            answer.append(("Stream-Closed", "true"))
        return _respond(204, answer)

    def _delete(self, path: str) -> Response:
        stream = self.current(path)
        if stream is None:
            return _text(404, "Stream not found")
        if stream.soft_deleted:
            return _text(410, "Stream is gone")
        if self.forks_of(path):
            self._set(path, replace(stream, soft_deleted=True))
        else:
            self._delete_with_cascade(path)
        return _respond(204, ())

    def _delete_with_cascade(self, path: str) -> None:
        """``deleteWithCascade``: a fork's soft-deleted source goes with its last fork."""
        stream = self.current(path)
        self._set(path, None)
        source_path = stream.forked_from if stream is not None else None
        if source_path is None:
            return
        source = self.current(source_path)
        if source is not None and source.soft_deleted and not self.forks_of(source_path):
            self._delete_with_cascade(source_path)

    def _head(self, path: str) -> Response:
        stream = self.current(path)
        if stream is None:
            return _respond(404, (("content-type", "text/plain"),))
        if stream.soft_deleted:
            return _respond(410, (("content-type", "text/plain"),))
        headers = [("Stream-Next-Offset", stream.current_offset), ("cache-control", "no-store")]
        headers.append(("content-type", stream.content_type))
        if stream.closed:
            headers.append(("Stream-Closed", "true"))
        tag = stream_etag(path, "-1", stream.current_offset, closed=stream.closed)
        headers.append(("etag", tag))
        return _respond(200, headers)


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    return next((v for n, v in headers if n.lower() == wanted), None)
