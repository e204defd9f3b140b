"""The viewers of ``loadtest.audience``: processes of raw HTTP/1.1 connections following one
stream by long-poll, as the official TypeScript client's ``live: true`` does.

Rules this module owns:
* A viewer reads as the official client's ``fetchNext`` does: ``GET <stream>?offset=-1`` first;
  then, from each answer's ``Stream-Next-Offset`` and with its ``Stream-Cursor`` (the last one
  given), ``offset=<next>&live=long-poll&cursor=<cursor>`` once an answer said
  ``Stream-Up-To-Date`` (a 204, the long-poll's timeout, is up to date), else the catch-up
  ``offset=<next>&cursor=<cursor>``; at once, on the same keep-alive connection, until an
  answer says ``Stream-Closed: true``. Any other status, or the connection ending before the
  close, ends the viewer with an error (the client would throw).
* A viewer is a ``loadtest.rawhttp`` answer reader on uvloop; each answer with bytes is stamped
  with ``time.monotonic()`` when its last byte is parsed (one clock for every process of the
  machine) and kept as a ``delivery.Receipt``; its bytes go into a running SHA-256, not a buffer.
* The parent drives a process over a pipe: once forked it connects its viewers, each sends its
  first read, and it answers ``("ready", n)`` once ``n`` of them are long-polling at the tail;
  ``("go", deadline)`` zeroes the answer counts and is answered ``("done", last_end)`` once
  every viewer has ended (``last_end`` None if the deadline came first); ``("collect",
  appends, expected)`` is answered with a ``Report`` (delivery times computed here, on the load
  generator's core, not shipped as receipts); ``("stop",)`` closes every connection.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any

from loadtest.delivery import Append, Expected, Receipt, deliveries, is_exact
from loadtest.rawhttp import AnswerReader, receive, run_client

CONNECT_BATCH = 250
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Report:
    viewers: int
    exact: int
    unfinished: int  # had not seen the close by the deadline
    answers: int  # since "go": 200s and 204s
    timeouts: int  # of which 204s before the close (long-polls that timed out)
    errors: int
    some_errors: list[str]
    latencies: bytes  # array('d') of every (viewer, append) delivery time, seconds


class Viewer(AnswerReader):
    """One keep-alive connection following the stream from its start."""

    def __init__(self, authority: str, path: str) -> None:
        super().__init__(authority)
        self.path = path
        self.offset = "-1"
        self.cursor: str | None = None
        self.up_to_date = False
        self.digest = hashlib.sha256()
        self.length = 0
        self.receipts: list[Receipt] = []
        self.answers = self.timeouts = 0
        self.error: str | None = None
        self.live = asyncio.get_running_loop().create_future()  # first up-to-date answer
        self.ended = asyncio.get_running_loop().create_future()  # its end time

    def ask(self) -> None:
        query = f"offset={self.offset}"
        if self.up_to_date:
            query += "&live=long-poll"
        if self.cursor:
            query += f"&cursor={self.cursor}"
        self.get(self.path, query)

    def on_answer(self, status: int, headers: dict[str, str], body: bytes) -> bool:
        now = time.monotonic()
        self.answers += 1
        if status not in (200, 204):
            self._end(now, f"HTTP {status} at {self.offset}")
            return False
        self.cursor = headers.get("stream-cursor", self.cursor)
        self.offset = headers.get("stream-next-offset", self.offset)
        if body:
            self.digest.update(body)
            self.length += len(body)
            self.receipts.append(Receipt(at=now, total=self.length))
        self.up_to_date = status == 204 or "stream-up-to-date" in headers
        if self.up_to_date and not self.live.done():
            self.live.set_result(now)
        if headers.get("stream-closed", "").lower() == "true":
            self._end(now, None)
            return False
        self.timeouts += status == 204
        self.ask()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(time.monotonic(), f"connection lost at {self.offset}: {exc}")

    def _end(self, now: float, error: str | None) -> None:
        if self.ended.done():
            return
        self.error = error
        self.ended.set_result(now)
        if not self.live.done():
            self.live.set_result(now)


async def _open(loop: asyncio.AbstractEventLoop, viewer: Viewer, host: str, port: int) -> None:
    try:
        await loop.create_connection(lambda: viewer, host, port)
    except OSError as failure:
        viewer._end(time.monotonic(), f"connect: {failure}")
        return
    viewer.ask()


def report(viewers: list[Viewer], appends: list[Append], expected: Expected) -> Report:
    latencies = array.array("d")
    exact = 0
    errors = [v.error for v in viewers if v.error is not None]
    for viewer in viewers:
        latencies.extend(deliveries(appends, viewer.receipts))
        exact += is_exact(
            length=viewer.length,
            sha256=viewer.digest.hexdigest(),
            ended=viewer.ended.done(),
            errors=viewer.error is not None,
            expected=expected,
        )
    return Report(
        viewers=len(viewers),
        exact=exact,
        unfinished=sum(not v.ended.done() for v in viewers),
        answers=sum(v.answers for v in viewers),
        timeouts=sum(v.timeouts for v in viewers),
        errors=len(errors),
        some_errors=errors[:5],
        latencies=latencies.tobytes(),
    )


async def _client_main(conn: Any, host: str, port: int, path: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    viewers: list[Viewer] = []
    while len(viewers) < count:
        batch = [
            Viewer(f"{host}:{port}", path) for _ in range(min(CONNECT_BATCH, count - len(viewers)))
        ]
        await asyncio.gather(*(_open(loop, v, host, port) for v in batch))
        viewers += batch
    done, _ = await asyncio.wait([v.live for v in viewers], timeout=READY_TIMEOUT_S)
    conn.send(("ready", sum(1 for v in viewers if v.live.done() and not v.ended.done())))
    try:
        while True:
            command = await receive(conn)
            if command[0] == "stop":
                break
            if command[0] == "go":
                for viewer in viewers:
                    viewer.answers = viewer.timeouts = 0
                remaining = command[1] - time.monotonic()
                done, pending = await asyncio.wait(
                    [v.ended for v in viewers], timeout=max(0.0, remaining)
                )
                last = max((f.result() for f in done), default=None) if not pending else None
                conn.send(("done", last))
            elif command[0] == "collect":
                conn.send(("report", report(viewers, command[1], command[2])))
    finally:
        for viewer in viewers:
            if viewer.transport is not None:
                viewer.transport.close()


def client(conn: Any, host: str, port: int, path: str, count: int) -> None:
    """A client process's entry point: ``count`` viewers of ``path`` at ``host:port``."""
    run_client(_client_main(conn, host, port, path, count))
