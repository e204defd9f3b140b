"""Server-Sent Events, decoded incrementally (HTML Living Standard §9.2.6).

Rules this module owns:

* Bytes arrive in arbitrary chunks, possibly splitting a UTF-8 character; an event is dispatched
  only at the blank line that ends it.
* Lines end in CRLF, LF or CR; a CR at the very end of a chunk waits for the next chunk, since it
  may be the first half of a CRLF.
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
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buffer = ""
        self._pending_cr = False
        self._event = ""
        self._data: list[str] = []
        self._retry_ms: int | None = None
        self._id_seen: str | None = None
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None  # the reconnection time, once a frame has set it
        self.comments = 0

    def feed(self, chunk: bytes | str) -> list[SseEvent]:
        """Decode a chunk; return the events it completed."""
        # A chunk may end inside a multi-byte character; the incremental decoder keeps the half.
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        self._buffer += text
        events: list[SseEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            line, end = cut
            if end == len(self._buffer) and self._buffer.endswith("\r"):
                self._pending_cr = True
            self._buffer = self._buffer[end:]
            event = self._line(line)
            if event is not None:
                events.append(event)
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
        return event


def _line_end(buffer: str) -> tuple[str, int] | None:
    """The first complete line in ``buffer`` and the index just past its terminator."""
    for index, char in enumerate(buffer):
        if char == "\n":
            return buffer[:index], index + 1
        if char == "\r":
            if index + 1 < len(buffer) and buffer[index + 1] == "\n":
                return buffer[:index], index + 2
            return buffer[:index], index + 1
    return None


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
