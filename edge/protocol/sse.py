"""Server-Sent Events, decoded incrementally (HTML Living Standard §9.2.6).

Rules this module owns:

* Bytes arrive in arbitrary chunks, possibly splitting a UTF-8 character; an event is dispatched
  only at the blank line that ends it. Bytes that are not UTF-8 decode as U+FFFD (HTML's "UTF-8
  decode"): never an error.
* Lines end in CRLF, LF or CR; a CR at the very end of a chunk waits for the next chunk, since it
  may be the first half of a CRLF.
* Each character is examined once, whatever the chunking: a line of megabytes arriving in many
  chunks is kept as its pieces and joined once (rescanning it per chunk was quadratic and held
  the event loop for seconds per MiB: the origin tail's and the resume pump's).
* ``data`` lines of one event are joined with ``\\n``; a field's value loses one leading space;
  lines starting with ``:`` are comments (heartbeats); unknown fields are ignored.
* An event with no ``data`` line is not dispatched, but its ``id`` still sets the last event id.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class SseEvent:
    event: str
    data: str
    id: str | None
    retry_ms: int | None = None


class SseDecoder:
    def __init__(self) -> None:
        # "UTF-8 decode" (HTML): a byte that is not UTF-8 is a U+FFFD, never an error that
        # would end the pump or the tail reading it.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # the line begun and not yet ended, as it came
        self._partial_size = 0
        self._pending_cr = False
        self._event = ""
        self._data: list[str] = []
        self._data_size = 0
        self._retry_ms: int | None = None
        self._id_seen: str | None = None
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None  # the reconnection time, once a frame has set it
        self.comments = 0

    @property
    def held(self) -> int:
        """Characters held for the event not yet complete (its data lines and the line begun):
        what an upstream that never ends a line or an event makes a reader keep, for the
        reader to bound."""
        return self._partial_size + self._data_size

    def feed(self, chunk: bytes | str) -> list[SseEvent]:
        """Decode a chunk; return the events it completed."""
        # A chunk may end inside a multi-byte character; the incremental decoder keeps the half.
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        events: list[SseEvent] = []
        start, size = 0, len(text)
        # The next LF and CR at or after ``start``, each searched again only once passed: every
        # character is looked at once (in C), however long a line or many its chunks.
        lf, cr = text.find("\n"), text.find("\r")
        while True:
            if 0 <= lf < start:
                lf = text.find("\n", start)
            if 0 <= cr < start:
                cr = text.find("\r", start)
            if lf < 0 and cr < 0:
                break
            end = lf if cr < 0 or 0 <= lf < cr else cr
            line, start = text[start:end], end + 1
            if end == cr:
                if end + 1 == size:
                    self._pending_cr = True  # may be the first half of a CRLF
                elif text[end + 1] == "\n":
                    start += 1
            if self._partial:
                line = "".join(self._partial) + line
                self._partial.clear()
                self._partial_size = 0
            event = self._line(line)
            if event is not None:
                events.append(event)
        if start < size:
            self._partial.append(text[start:])
            self._partial_size += size - start
        return events

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._data_size += len(value)
        elif name == "id" and "\0" not in value:
            self._id_seen = value
            self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self._retry_ms = int(value)
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        event = None
        if self._data:
            event = SseEvent(
                event=self._event or "message",
                data="\n".join(self._data),
                id=self._id_seen,
                retry_ms=self._retry_ms,
            )
        self._event, self._data, self._retry_ms, self._id_seen = "", [], None, None
        self._data_size = 0
        return event


# --- encoding ---------------------------------------------------------------------------------


def _field_lines(name: str, text: str) -> str:
    # Every line break form ends a field line in SSE, so each becomes its own line: a payload
    # cannot smuggle in an event of its own (CR-only included). "name:value" as the reference
    # origin writes it, except that a value starting with a space gets one more, since every
    # decoder drops one (the origin loses it there).
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "".join(
        f"{name}: {line}\n" if line.startswith(" ") else f"{name}:{line}\n" for line in lines
    )


def encode_event(event: str, data: str, *, event_id: str | None = None) -> bytes:
    frame = f"event: {event}\n" + _field_lines("data", data)
    if event_id is not None:
        frame += f"id: {event_id}\n"
    return (frame + "\n").encode()


def encode_retry(milliseconds: int) -> bytes:
    return f"retry: {milliseconds}\n\n".encode()


def encode_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()
