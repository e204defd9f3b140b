"""The viewers of ``loadtest.join``: processes of raw HTTP/1.1 connections opening a live run.

Rules this module owns:
* A viewer does what a client opening a live run does: ``GET <stream>?offset=-1``, again from
  each ``Stream-Next-Offset`` until an answer says ``Stream-Up-To-Date`` (or ``Stream-Closed``),
  then follows live from there, by SSE (``&live=sse``) or long-poll (``&live=long-poll``, a 204
  polled again with its ``Stream-Cursor``), until the stream says it is closed.
* One keep-alive connection per viewer, opened at its join time, carries its catch-up and its
  live reads (what a client library's pool does); a connection the server ends before the
  stream is closed is opened again and the read resumed from the last offset (counted).
* A viewer is a ``loadtest.rawhttp`` answer reader, on uvloop: no client library's per-request work
  between a byte's arrival and its stamp. An SSE body is kept
  raw while it streams (only the first ``event: data`` frame and the final chunk are looked
  for) and decoded, chunks then events, once it ends; once a viewer has its first live event,
  its SSE connection is read every ``READ_INTERVAL_S`` (``Pacer``), so the stream's end is seen
  up to that much late. Thousands of viewers decoding every frame, or reading each on its own,
  would take the load generator's core and delay the joins it measures.
* Times are ``time.monotonic()`` (one clock for every process of the machine), each viewer's
  relative to its own start (the moment it opens its connection); its lag is that start minus
  its scheduled join time (the load generator's own health).
* The parent drives a process over a pipe: it answers ``("ready",)`` once forked, is sent
  ``("go", t0)``, sends ``("live", when)`` once each of its viewers has the head of its first
  live answer (or ended before; ``when`` None if the deadline came first), and ``("done",
  [Record, ...])`` once every viewer is done or ``deadline`` has passed. A record carries the
  viewer's times, its byte count and the SHA-256 of its bytes (catch-up and live, in order),
  which the parent compares with the stream's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge.protocol.sse import SseDecoder
from loadtest.benchkit import run_and_wait
from loadtest.rawhttp import AnswerReader, dechunk, dechunk_partial, receive, run_client

MAX_RECONNECTS = 5


@dataclass(frozen=True, kw_only=True)
class Slot:
    index: int
    at: float  # seconds after t0
    mode: str  # "sse" | "long-poll"


@dataclass(frozen=True, kw_only=True)
class Record:
    index: int
    mode: str
    lag_s: float
    connect_s: float | None  # connection made
    ttfb_s: float | None  # first byte of the first catch-up answer
    caught_up_s: float | None  # the catch-up's last answer complete
    live_head_s: float | None  # first byte of the first live answer
    first_live_s: float | None  # the first live event (an SSE data frame, a long-poll's bytes)
    done_s: float | None
    live_requests: int
    reconnects: int
    size: int
    digest: str
    error: str | None


class Pacer:
    """Reads the SSE connections of viewers already live every ``READ_INTERVAL_S``: they pause
    reading after each read and are resumed together, so thousands of viewers cost this process
    a read per interval each instead of one per event (their events wait in the socket; the
    server's buffers are far from full at these rates)."""

    def __init__(self) -> None:
        self.paused: set[Viewer] = set()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(READ_INTERVAL_S)
            paused, self.paused = self.paused, set()
            for viewer in paused:
                transport = viewer.transport
                if transport is not None and not transport.is_closing():
                    transport.resume_reading()


READ_INTERVAL_S = 0.2


class Viewer(AnswerReader):
    def __init__(self, slot: Slot, host: str, port: int, path: str) -> None:
        super().__init__(f"{host}:{port}")
        self.slot = slot
        self.host, self.port, self.path = host, port, path
        self.streaming = False  # inside an SSE body
        self.raw = bytearray()  # that body, as it came (chunked framing and all)
        self.raw_chunked = False
        self.body = bytearray()  # the stream's bytes this viewer got
        self.phase = "catchup"  # then "live", "done"
        self.offset = "-1"
        self.cursor: str | None = None
        self.live_requests = 0
        self.reconnects = 0
        self.error: str | None = None
        self.started = 0.0
        self.lag = 0.0
        self.connect: float | None = None
        self.ttfb: float | None = None
        self.caught_up: float | None = None
        self.live_head: float | None = None
        self.first_live: float | None = None
        self.done_at: float | None = None
        self.closing_raw: tuple[bytes, bool] | None = None
        self.reconnecting: asyncio.Task[None] | None = None
        self.pacer: Pacer | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_live: Callable[[], None] | None = None  # once: live, or done before it

    # --- requests ---

    def _request(self) -> None:
        query = f"offset={self.offset}"
        if self.phase == "live":
            query += "&live=" + self.slot.mode
            if self.cursor:
                query += f"&cursor={self.cursor}"
            self.live_requests += 1
        self.get(self.path, query)

    def _live(self) -> None:
        if self.on_live is not None:
            self.on_live()
            self.on_live = None

    def _finish(self, error: str | None = None) -> None:
        if self.phase == "done":
            return
        self._live()
        self.phase = "done"
        self.error = error
        self.done_at = time.monotonic() - self.started
        if self.transport is not None:
            self.transport.close()
        if not self.finished.done():
            self.finished.set_result(None)

    # --- the connection ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.connect is None:
            self.connect = time.monotonic() - self.started
        self.buffer.clear()
        self.head = None
        self.streaming = False
        self._request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.phase == "done":
            return
        if self.streaming:
            self._sse_ended()
            if self.phase == "done":
                return
        if self.reconnects >= MAX_RECONNECTS:
            self._finish(f"connection lost {self.reconnects} times ({exc})")
            return
        self.reconnects += 1
        self.reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            await asyncio.get_running_loop().create_connection(lambda: self, self.host, self.port)
        except OSError as failure:
            self._finish(f"reconnect failed: {failure}")

    def data_received(self, data: bytes) -> None:
        if self.ttfb is None:
            self.ttfb = time.monotonic() - self.started
        if self.streaming:
            self._sse_bytes(data)
            return
        super().data_received(data)

    # --- answers ---

    def reading(self) -> bool:
        return self.phase != "done" and not self.streaming

    def on_head(self, status: int, headers: dict[str, str]) -> bool:
        if self.phase == "live" and self.live_head is None:
            self.live_head = time.monotonic() - self.started
            self._live()
        if self.phase == "live" and self.slot.mode == "sse" and status == 200:
            self.head = None
            self.streaming = True
            self.raw = bytearray()
            self.raw_chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            rest = bytes(self.buffer)
            self.buffer.clear()
            if rest:
                self._sse_bytes(rest)
            return False
        return True

    def on_answer(self, status: int, headers: dict[str, str], body: bytes) -> bool:
        self._answer(status, headers, body)
        if headers.get("connection", "").lower() == "close" and self.transport is not None:
            self.transport.close()  # connection_lost sends the next request on a new one
            return False
        return True

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        closed = headers.get("stream-closed", "").lower() == "true"
        self.cursor = headers.get("stream-cursor", self.cursor)
        if status == 204 and self.phase == "live":
            if closed:
                self._finish()
            else:
                self._request()  # the long-poll timed out: poll again with its cursor
            return
        if status != 200:
            self._finish(f"HTTP {status} in {self.phase} at {self.offset}")
            return
        if self.phase == "live" and body and self.first_live is None:
            self.first_live = time.monotonic() - self.started
        self.body += body
        self.offset = headers.get("stream-next-offset", self.offset)
        if closed:
            if self.phase == "catchup":
                self.caught_up = time.monotonic() - self.started
            self._finish()
            return
        if self.phase == "catchup" and "stream-up-to-date" in headers:
            self.caught_up = time.monotonic() - self.started
            self.phase = "live"
        self._request()

    # --- SSE ---

    def _sse_bytes(self, data: bytes) -> None:
        if self.first_live is None:
            window = self.raw[-16:] + data
            if b"event: data" in window or b"event:data" in window:
                self.first_live = time.monotonic() - self.started
        self.raw += data
        if self.raw_chunked and (self.raw.endswith(b"\r\n0\r\n\r\n") or self.raw == b"0\r\n\r\n"):
            self._sse_ended()
        elif self.first_live is not None and self.pacer is not None and self.transport is not None:
            self.transport.pause_reading()  # until the pacer's next round
            self.pacer.paused.add(self)

    def _sse_ended(self) -> None:
        """The SSE answer ended (its last chunk, or the connection). One that ends with the
        stream's close is kept raw and decoded after the run (so the moment of the close is
        stamped, not this process's decoding); otherwise its events are taken now and the read
        resumes from where they end."""
        self.streaming = False
        raw, self.raw = bytes(self.raw), bytearray()
        if CLOSED_MARK in raw[-CLOSED_MARK_WINDOW:]:
            self.closing_raw = (raw, self.raw_chunked)
            self._finish()
            return
        if self._take_events(raw, self.raw_chunked):
            self._finish()
        elif self.transport is not None and not self.transport.is_closing():
            self._request()  # the server ended the answer before the stream: resume from here

    def _take_events(self, raw: bytes, chunked: bool) -> bool:
        """Add an SSE body's data up to its last control frame; True if the stream closed."""
        if chunked:
            parsed = dechunk(raw)
            raw = parsed[0] if parsed is not None else dechunk_partial(raw)
        closed = False
        pending: list[str] = []  # data frames count once a control frame gives their end
        for event, data in sse_events(raw.decode()):
            if event == "data":
                pending.append(data)
            elif event == "control":
                control = json.loads(data)
                self.body += "".join(pending).encode()
                pending.clear()
                self.offset = control.get("streamNextOffset", self.offset)
                self.cursor = control.get("streamCursor", self.cursor)
                closed = closed or bool(control.get("streamClosed"))
        return closed

    def settle(self) -> None:
        """After the run: decode the SSE answer that ended with the stream's close."""
        if self.closing_raw is not None:
            raw, chunked = self.closing_raw
            self.closing_raw = None
            if not self._take_events(raw, chunked) and self.error is None:
                self.error = "the SSE answer's last control frame does not close the stream"


# The control frame that ends a closed stream's SSE answer (both servers write it compactly).
CLOSED_MARK = b'"streamClosed":true'
CLOSED_MARK_WINDOW = 4096


def sse_events(text: str) -> list[tuple[str, str]]:
    """The complete events of an SSE body as (event, data), in order. Both servers end lines
    with LF only, so blocks and lines are split at C speed; anything else goes through the
    edge's own decoder (HTML Living Standard §9.2.6)."""
    if "\r" in text:
        return [(e.event, e.data) for e in SseDecoder().feed(text)]
    events = []
    blocks = text.split("\n\n")
    for block in blocks[:-1]:  # the last is what follows the final blank line: incomplete
        name = ""
        data: list[str] = []
        for line in block.split("\n"):
            if not line or line[0] == ":":
                continue
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if data:
            events.append((name or "message", "\n".join(data)))
    return events


async def _one(viewer: Viewer, t0: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, t0 + viewer.slot.at - time.monotonic()))
    viewer.started = time.monotonic()
    viewer.lag = viewer.started - (t0 + viewer.slot.at)
    try:
        await loop.create_connection(lambda: viewer, viewer.host, viewer.port)
    except OSError as failure:
        viewer._finish(f"connect failed: {failure}")
    await viewer.finished


def _record(viewer: Viewer) -> Record:
    viewer.settle()
    body = bytes(viewer.body)
    return Record(
        index=viewer.slot.index,
        mode=viewer.slot.mode,
        lag_s=viewer.lag,
        connect_s=viewer.connect,
        ttfb_s=viewer.ttfb,
        caught_up_s=viewer.caught_up,
        live_head_s=viewer.live_head,
        first_live_s=viewer.first_live,
        done_s=viewer.done_at,
        live_requests=viewer.live_requests,
        reconnects=viewer.reconnects,
        size=len(body),
        digest=hashlib.sha256(body).hexdigest(),
        error=viewer.error
        if viewer.phase == "done"
        else (viewer.error or f"{viewer.phase} at end"),
    )


async def _client_main(
    conn: Any, host: str, port: int, path: str, slots: list[Slot], deadline_s: float
) -> None:
    conn.send(("ready",))
    command = await receive(conn)
    if command[0] != "go":
        return
    t0 = command[1]
    viewers = [Viewer(slot, host, port, path) for slot in slots]
    pacer = Pacer()
    pacer.task = asyncio.ensure_future(pacer.run())
    for viewer in viewers:
        viewer.pacer = pacer
    waiting = [len(viewers)]

    def live() -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            conn.send(("live", time.monotonic()))

    for viewer in viewers:
        viewer.on_live = live
    if not viewers:
        conn.send(("live", time.monotonic()))
    tasks = [asyncio.ensure_future(_one(v, t0)) for v in viewers]
    remaining = t0 + deadline_s - time.monotonic()
    await asyncio.wait(tasks, timeout=max(1.0, remaining))
    for task in tasks:
        task.cancel()
    pacer.task.cancel()
    for viewer in viewers:
        if viewer.transport is not None:
            viewer.transport.close()
    if waiting[0] > 0:
        conn.send(("live", None))  # not every viewer got there in time
    conn.send(("done", [_record(v) for v in viewers]))


def client(
    conn: Any, host: str, port: int, path: str, slots: list[Slot], deadline_s: float
) -> None:
    """A client process's entry point: the viewers of ``slots`` on ``host:port`` for ``path``."""
    run_client(_client_main(conn, host, port, path, slots, deadline_s))


# --- what each step of a join costs the server ------------------------------------------------


class _Stepper(asyncio.Protocol):
    """One connection of ``step_costs``: a request at a time, done at its answer's head (and,
    with a length, its body)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.done: asyncio.Future[None] | None = None
        self.head_only = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes, *, head_only: bool) -> asyncio.Future[None]:
        self.buffer.clear()
        self.head_only = head_only
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.done is None or self.done.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end == -1:
            return
        if self.head_only:
            self.done.set_result(None)
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        if at == -1:
            if self.buffer.endswith(b"\r\n0\r\n\r\n"):
                self.done.set_result(None)
            return
        length = int(head[at + 15 :].split(b"\r\n", 1)[0])
        if len(self.buffer) - end - 4 >= length:
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"lost: {exc}"))


def _ran_seconds(pids: list[int]) -> float:
    return run_and_wait(pids)[0]


async def _steps_main(
    host: str, port: int, path: str, tail: str, count: int, pids: list[int]
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    authority = f"{host}:{port}"
    catchup = f"GET {path}?offset=-1 HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    sse = f"GET {path}?offset={tail}&live=sse HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    steppers: list[_Stepper] = []
    costs: dict[str, float] = {}
    settle = 0.3  # after each step, for the server's work that follows its last answer
    before = _ran_seconds(pids)
    for start in range(0, count, STEP_BATCH):
        batch = [_Stepper() for _ in range(min(STEP_BATCH, count - start))]
        await asyncio.gather(*(loop.create_connection(lambda s=s: s, host, port) for s in batch))
        await asyncio.gather(*(s.send(catchup, head_only=False) for s in batch))
        steppers += batch
    await asyncio.sleep(settle)
    costs["connect + catch-up"] = _ran_seconds(pids) - before
    before = _ran_seconds(pids)
    for start in range(0, count, STEP_BATCH):
        batch = steppers[start : start + STEP_BATCH]
        await asyncio.gather(*(s.send(sse, head_only=True) for s in batch))
    await asyncio.sleep(settle)
    costs["SSE open"] = _ran_seconds(pids) - before
    before = _ran_seconds(pids)
    for stepper in steppers:
        assert stepper.transport is not None
        stepper.transport.close()
    await asyncio.sleep(1.0)
    costs["close"] = _ran_seconds(pids) - before
    return {step: 1e6 * seconds / count for step, seconds in costs.items()}


STEP_BATCH = 100


def step_costs(
    conn: Any, host: str, port: int, path: str, tail: str, count: int, pids: list[int]
) -> None:
    """A process's entry point: ``count`` connections to an open stream with no writer, each
    step of a join done by all of them in turn (connect and ``GET ?offset=-1``; the SSE read at
    the tail, until its answer's head; closing); sends the server's CPU microseconds per
    connection for each step (every thread of ``pids``)."""
    conn.send(run_client(_steps_main(host, port, path, tail, count, pids)))
