"""The waiting side of ``loadtest.longpoll``: processes of raw long-poll connections.

Rules this module owns:
* One keep-alive HTTP/1.1 connection per waiter, on uvloop, a ``loadtest.rawhttp``
  answer reader: no client library's per-request work stands between an answer's last
  byte and the time it is stamped with.
* An answer is stamped with ``time.monotonic()`` when its last byte is parsed; the parent's
  append is stamped with the same clock (one clock for every process of the machine).
* A 204 before the append (the long-poll timed out) is answered, as the protocol's clients do,
  by polling again from the same offset with the ``Stream-Cursor`` it carried; every request
  after the first sends the last cursor the waiter was given.
* The parent drives each process over a pipe: ``("poll", offset)`` → ``("sent", n)``;
  ``("collect", body, next_offset)`` → ``("answers", times, some_errors, errors, repolls)``,
  where a time counts only for a 200 with exactly ``body`` and that ``Stream-Next-Offset``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from loadtest.rawhttp import AnswerReader, receive, run_client

CONNECT_BATCH = 250
ROUND_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Answer:
    done_at: float  # time.monotonic() when the answer was complete
    status: int
    next_offset: str
    body: bytes


class Waiter(AnswerReader):
    """One keep-alive connection that long-polls."""

    def __init__(self, host: str, path: str) -> None:
        super().__init__(host)
        self.path = path
        self.cursor: str | None = None
        self.offset = ""
        self.answer: asyncio.Future[Answer | str] | None = None
        self.repolls = 0
        self.lost = False

    def poll(self, offset: str) -> None:
        self.offset = offset
        self.answer = asyncio.get_running_loop().create_future()
        self._send()

    def _send(self) -> None:
        query = f"offset={self.offset}&live=long-poll"
        if self.cursor:
            query += f"&cursor={self.cursor}"
        self.get(self.path, query)

    def on_answer(self, status: int, headers: dict[str, str], body: bytes) -> bool:
        self.cursor = headers.get("stream-cursor", self.cursor)
        if status == 204 and "stream-closed" not in headers:
            self.repolls += 1  # the long-poll timed out before the append: poll again
            self._send()
            return True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(
                Answer(
                    done_at=time.monotonic(),
                    status=status,
                    next_offset=headers.get("stream-next-offset", ""),
                    body=body,
                )
            )
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(f"connection lost: {exc}")


async def _connect(loop: asyncio.AbstractEventLoop, waiter: Waiter, host: str, port: int) -> None:
    await loop.create_connection(lambda: waiter, host, port)


async def _client_main(conn: Any, host: str, port: int, path: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    waiters: list[Waiter] = []
    while True:
        command = await receive(conn)
        if command[0] == "stop":
            break
        if command[0] == "poll":
            offset = command[1]
            waiters = [w for w in waiters if not w.lost]
            while len(waiters) < count:
                batch = [
                    Waiter(f"{host}:{port}", path)
                    for _ in range(min(CONNECT_BATCH, count - len(waiters)))
                ]
                await asyncio.gather(*(_connect(loop, w, host, port) for w in batch))
                waiters += batch
            for waiter in waiters:
                waiter.poll(offset)
            conn.send(("sent", len(waiters)))
        elif command[0] == "collect":
            _, body, next_offset = command
            futures = [w.answer for w in waiters if w.answer is not None]
            done, _ = await asyncio.wait(futures, timeout=ROUND_TIMEOUT_S)
            times: list[float] = []
            errors: list[str] = []
            for future in futures:
                answer = future.result() if future in done else "no answer in time"
                if isinstance(answer, str):
                    errors.append(answer)
                elif answer.status != 200:
                    errors.append(f"HTTP {answer.status}")
                elif answer.body != body or answer.next_offset != next_offset:
                    errors.append(
                        f"{len(answer.body)} bytes to {answer.next_offset}, not the append"
                    )
                else:
                    times.append(answer.done_at)
            repolls = sum(w.repolls for w in waiters)
            for waiter in waiters:
                waiter.repolls = 0
            conn.send(("answers", times, errors[:5], len(errors), repolls))
    for waiter in waiters:
        if waiter.transport is not None:
            waiter.transport.close()


def client(conn: Any, host: str, port: int, path: str, count: int) -> None:
    """A client process's entry point: ``count`` waiters on ``host:port`` for ``path``."""
    run_client(_client_main(conn, host, port, path, count))
