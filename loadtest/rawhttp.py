"""The client side every raw-socket load generator shares (``loadtest.join_clients``,
``loadtest.longpoll_clients``): the connection that sends GETs and reads their answers one at a
time (``AnswerReader``), HTTP/1.1 answers parsed out of a connection's buffer, and the client
processes, each driven by its parent over a pipe.

Rules this module owns:
* A reader's connection carries one request at a time, ``GET <path>?<query> HTTP/1.1`` with a
  ``Host`` and nothing else; its answers are read in order: ``on_head`` when the head is in
  (it may take the rest of the connection over, an SSE body), ``on_answer`` when the body is.
* An answer is parsed here, not by a client library: status line and headers (names
  lower-cased), then a body by ``Content-Length`` or chunked framing (trailers not expected);
  204, 304 and 1xx have none. No library's per-request work stands between an answer's last
  byte and the time it is stamped with.
* Parsing consumes what it used from the buffer, and only what it used: a pipelined or early
  next answer stays for the next call.
* Client processes are forked on the load generator's cores, one pipe each, and reaped: each
  given 30 s to exit, then killed (``ClientProcesses``). A client process raises its
  open-file limit and runs on uvloop (``run_client``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from loadtest.benchkit import pinned, raise_nofile

Head = tuple[int, dict[str, str]]
T = TypeVar("T")


def parse_head(buffer: bytearray) -> Head | None:
    """The status and headers at the start of ``buffer`` (taken from it), or None so far."""
    end = buffer.find(b"\r\n\r\n")
    if end == -1:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    del buffer[: end + 4]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers


def take_body(buffer: bytearray, status: int, headers: dict[str, str]) -> bytes | None:
    """The complete body at the start of ``buffer`` (taken from it), or None while it is still
    arriving."""
    if status in (204, 304) or 100 <= status < 200:
        return b""
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(buffer) < length:
            return None
        body = bytes(buffer[:length])
        del buffer[:length]
        return body
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parsed = dechunk(buffer)
        if parsed is None:
            return None
        body, used = parsed
        del buffer[:used]
        return body
    return None  # until close: not expected from either server


def dechunk(buffer: bytes | bytearray) -> tuple[bytes, int] | None:
    """A complete chunked body at the start of ``buffer`` and the bytes it took, or None."""
    body = bytearray()
    at = 0
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end == -1:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        if size == 0:  # the last chunk, then trailers (none expected) and a blank line
            end = buffer.find(b"\r\n\r\n", line_end)
            if end == -1:
                return None
            return bytes(body), end + 4
        start = line_end + 2
        if len(buffer) < start + size + 2:
            return None
        body += buffer[start : start + size]
        at = start + size + 2


def dechunk_partial(buffer: bytes) -> bytes:
    """The whole chunks of a chunked body cut short (the connection ended inside it)."""
    body = bytearray()
    at = 0
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end == -1:
            return bytes(body)
        size = int(buffer[at:line_end].split(b";")[0], 16)
        start = line_end + 2
        if size == 0 or len(buffer) < start + size + 2:
            return bytes(body)
        body += buffer[start : start + size]
        at = start + size + 2


class AnswerReader(asyncio.Protocol):
    """One keep-alive connection: a GET at a time, its answers parsed as they arrive."""

    def __init__(self, authority: str) -> None:
        self.authority = authority  # host:port, the Host header
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: Head | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def get(self, path: str, query: str) -> None:
        assert self.transport is not None
        self.transport.write(
            f"GET {path}?{query} HTTP/1.1\r\nHost: {self.authority}\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.reading() and self.parse_one():
            pass

    def reading(self) -> bool:
        """Whether answers are still parsed out of the buffer (not after the end, not while
        ``on_head`` has the connection)."""
        return True

    def parse_one(self) -> bool:
        """The next answer out of the buffer, if it is all there; False once it is not."""
        if self.head is None:
            self.head = parse_head(self.buffer)
            if self.head is None:
                return False
            if not self.on_head(*self.head):
                return False
        status, headers = self.head
        body = take_body(self.buffer, status, headers)
        if body is None:
            return False
        self.head = None
        return self.on_answer(status, headers, body)

    def on_head(self, status: int, headers: dict[str, str]) -> bool:
        """An answer's head is in; False: this reader took the connection over (and the head)."""
        return True

    def on_answer(self, status: int, headers: dict[str, str], body: bytes) -> bool:
        """A whole answer; False: read no further answers now."""
        raise NotImplementedError


async def receive(conn: Connection) -> Any:
    """The parent's next command, awaited without blocking the client's loop."""
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


def run_client(main: Coroutine[Any, Any, T]) -> T:
    """A client process's loop: its open-file limit raised, on uvloop."""
    raise_nofile()
    import uvloop

    return uvloop.run(main)


@dataclass(frozen=True, kw_only=True)
class ClientProcesses:
    pipes: list[Connection]  # the parent's ends, one per process, in order
    procs: list[BaseProcess]

    @classmethod
    def start(
        cls, client: Callable[..., None], each: Sequence[tuple[Any, ...]], load: frozenset[int]
    ) -> ClientProcesses:
        """One forked process per item of ``each``, running ``client(pipe, *item)``."""
        context = multiprocessing.get_context("fork")
        pipes: list[Connection] = []
        procs: list[BaseProcess] = []
        with pinned(load):
            for args in each:
                mine, theirs = context.Pipe()
                proc = context.Process(target=client, args=(theirs, *args))
                proc.start()
                pipes.append(mine)
                procs.append(proc)
        return cls(pipes=pipes, procs=procs)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs if proc.pid is not None]

    def reap(self) -> None:
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
