"""What a resume route keeps of an upstream SSE answer, and how it is given back as events.

Rules this module owns:

* Each upstream event with data is kept as one JSON message ``{"event": NAME, "data": TEXT}`` of
  an ``application/json`` stream: JSON messages are atomic at the origin, so an event is never
  split or merged by a read, and an event id can count messages (``edge.resume.ids``).
* The upstream's own ids never reach the stream (they name a store on one upstream process);
  events with empty data (an MCP server's "priming" event, which exists only to carry such an
  id) are not kept; ``retry`` and comments are the upstream's own business and are dropped.
* JSON this module cannot parse (malformed, or nested past the parser's recursion) is not JSON
  here: it owes and pays nothing, and is never an error.
* For a JSON-RPC request (MCP), the answer is complete once a response for every request id in
  the request body was kept (``Finale``); an upstream that ends before that gets a JSON-RPC error
  for each id still owed, kept like any event, so no reader waits for an answer that will not
  come. A body with no request ids (notifications, not JSON) owes nothing.
* The reader's side (``Replay``) turns the stream's Durable Streams SSE (``data`` events holding
  JSON arrays of messages, ``control`` events with ``streamNextOffset``) into the upstream's
  events again, each with the edge's id: the offset where the read of its batch started and how
  many messages from there it is. A resume point's ``skip`` drops the events already seen.
* A message read after the read caught up (a ``control`` event) was appended since: it is news
  (the log moved, the pump is alive) even when the point's ``skip`` drops it, so a point past
  the log (a forged ``skip``) never makes its reader take a live pump for lost. What a read
  re-reads before it catches up (after a rotation) is not news.
* An answer's stream also holds the edge's own messages (``{"edge": ...}``), never shown and
  never given an id: the first (``request_message``) names the JSON-RPC ids the request is owed,
  so a replica that never saw the request can end the answer (``Finale.of_log``); a lease
  (``LEASE``) is appended while the upstream is quiet, so readers can tell a quiet pump from a
  dead one (``edge.web.resume_pump``); ``UNKEPT`` marks where an answer outgrew the caps: the
  answer's own reader (``Replay(own=True)``) stops there (the rest comes to it directly), any
  other reads on to the owed errors and the close.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.protocol.sse import SseEvent, encode_event
from edge.resume.ids import ResumePoint, encode_id

JsonRpcId = int | str
# What ``json.loads`` raises for text that is not JSON here: malformed, or nested deeper than
# the parser recurses (valid JSON all the same, from a client's body or an upstream's event).
NOT_JSON = (ValueError, RecursionError)
# JSON-RPC 2.0 §5.1: reserved for implementation-defined server errors.
UPSTREAM_ENDED_CODE = -32000
UPSTREAM_ENDED = "the upstream ended before answering; the edge closed the resumable answer"


# The pump's heartbeat in the log: it is alive though its upstream says nothing.
LEASE: dict[str, Any] = {"edge": "lease"}
# The answer outgrew the edge's caps: kept no further (its own client gets the rest directly;
# other readers read on to the owed errors and the close).
UNKEPT: dict[str, Any] = {"edge": "unkept"}


def request_message(owed: Sequence[JsonRpcId]) -> dict[str, Any]:
    """The first message of an answer's stream: the request ids it owes."""
    return {"edge": "request", "owed": list(owed)}


def kept_message(event: SseEvent) -> dict[str, str] | None:
    """What is appended for one upstream event, or None for one that is not kept."""
    if event.data == "":
        return None
    return {"event": event.event, "data": event.data}


def append_body(messages: Sequence[dict[str, Any]]) -> bytes:
    """One append of ``messages`` to a JSON stream (an array appends each element)."""
    return json.dumps(list(messages), separators=(",", ":"), ensure_ascii=False).encode()


def _request_ids(value: Any) -> list[JsonRpcId]:
    items = value if isinstance(value, list) else [value]
    ids: list[JsonRpcId] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("method"), str):
            continue
        request_id = item.get("id")
        if isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
            ids.append(request_id)
    return ids


@dataclass(kw_only=True, slots=True)
class Finale:
    """The JSON-RPC responses an answer still owes its request."""

    owed: list[JsonRpcId] = field(default_factory=list)

    @classmethod
    def of_request(cls, body: bytes) -> Finale:
        try:
            value = json.loads(body)
        except NOT_JSON:
            return cls()
        return cls(owed=_request_ids(value))

    @classmethod
    def of_log(cls, messages: Iterable[Any]) -> Finale:
        """What an answer's whole stream, as kept so far, is still owed: the ids its first
        message names, less the responses kept since."""
        finale = cls()
        for message in messages:
            finale.note(message)
        return finale

    def note(self, message: Any) -> None:
        """One message of an answer's stream, read in order."""
        if not isinstance(message, dict):
            return
        if message.get("edge") == "request" and isinstance(message.get("owed"), list):
            self.owed = [
                item
                for item in message["owed"]
                if isinstance(item, (int, str)) and not isinstance(item, bool)
            ]
        elif isinstance(message.get("data"), str):
            self.heard(message)

    def heard(self, message: dict[str, Any]) -> None:
        """A kept message: a response to an owed id pays it."""
        try:
            value = json.loads(message["data"])
        except NOT_JSON:
            return
        for item in value if isinstance(value, list) else [value]:
            if (
                isinstance(item, dict)
                and "method" not in item
                and ("result" in item or "error" in item)
                and item.get("id") in self.owed
            ):
                self.owed.remove(item["id"])

    def still_owed(self) -> list[dict[str, str]]:
        """The error messages that end an answer whose upstream ended early."""
        return [
            {
                "event": "message",
                "data": json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": UPSTREAM_ENDED_CODE, "message": UPSTREAM_ENDED},
                    },
                    separators=(",", ":"),
                ),
            }
            for request_id in self.owed
        ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Replayed:
    """What one stream event gives the client: frames to write, and whether the answer ended."""

    frames: list[bytes]
    ended: bool = False
    news: int = 0  # messages past the resume point (the edge's own too): the log moved on
    handed_over: bool = False  # reached ``UNKEPT`` as the answer's own client: the rest is direct
    caught_up: bool = False  # a control event was read: the reader has all there was then


def _messages(data: str) -> list[Any]:
    try:
        value = json.loads(data)
    except NOT_JSON:
        return []
    return value if isinstance(value, list) else [value]


class Replay:
    """One reader's way through an answer's stream, from a resume point."""

    def __init__(self, point: ResumePoint, *, own: bool = False) -> None:
        """``own``: the answer's own client, which stops at ``UNKEPT`` (the rest comes to it
        directly); any other reader reads on to the errors and the close."""
        self._own = own
        self._handed_over = False
        self._token = point.token
        self._batch_offset = point.offset
        self._read_in_batch = 0
        self._skip = point.skip
        self._caught_up = False  # this read has had a control event: what follows is live

    def rewind(self) -> ResumePoint:
        """Where a new read of the stream starts, to go on exactly where this one is."""
        self._skip += self._read_in_batch
        self._read_in_batch = 0
        self._caught_up = False
        return ResumePoint(token=self._token, offset=self._batch_offset, skip=self._skip)

    def feed(self, events: Iterable[SseEvent]) -> Replayed:
        frames: list[bytes] = []
        news = 0
        caught_up = False
        for event in events:
            if event.event == "data":
                news += self._data(event.data, frames)
                if self._handed_over:
                    return Replayed(frames=frames, news=news, handed_over=True)
            elif event.event == "control":
                self._caught_up = True
                if self._control(event.data):
                    return Replayed(frames=frames, ended=True, news=news, caught_up=True)
                caught_up = True
        return Replayed(frames=frames, news=news, caught_up=caught_up)

    def _data(self, data: str, frames: list[bytes]) -> int:
        """The frames of a data event's messages, added to ``frames``; how many were new."""
        news = 0
        for message in _messages(data):
            self._read_in_batch += 1
            if self._skip > 0:
                self._skip -= 1
                if self._caught_up:  # appended since the read caught up: the log moved
                    news += 1
                continue
            news += 1
            if self._own and message == UNKEPT:
                self._handed_over = True
                return news
            if not (
                isinstance(message, dict)
                and isinstance(message.get("event"), str)
                and isinstance(message.get("data"), str)
            ):
                continue  # not one the edge kept: counted (it has an offset), never shown
            point = ResumePoint(
                token=self._token, offset=self._batch_offset, skip=self._read_in_batch
            )
            frames.append(
                encode_event(message["event"], message["data"], event_id=encode_id(point))
            )
        return news

    def _control(self, data: str) -> bool:
        """Whether the control event ends the stream."""
        try:
            control = json.loads(data)
        except NOT_JSON:
            return False
        if not isinstance(control, dict):
            return False
        next_offset = control.get("streamNextOffset")
        if isinstance(next_offset, str) and next_offset != self._batch_offset:
            self._batch_offset, self._read_in_batch = next_offset, 0
        return control.get("streamClosed") is True
