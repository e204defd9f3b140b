"""Long-polls at the tail, released together: one answer built per group, written to every socket.

Rules this module owns:

* A long-poll that has caught up waits on the board (``edge.live.board``), not on a task timer
  of its own. When its tail records a batch (or closes, ends, or the edge drains), each group of
  that stream is settled once by the hub's own long-poll rules (``LiveHub.settle``, the same
  code a single long-poll runs), one cursor is drawn per cursor class, and every waiter of the
  class gets that same answer.
* Direct write, as the SSE fan-out does: for a waiter whose request gave its socket, the answer
  is encoded once per ``Framing`` (HTTP version, keep-alive, a reader's private copy) by the
  web layer's ``encode`` and the
  same bytes are written to every such socket in one pass; its handler then only completes
  the request (``AlreadyWritten``). A waiter whose socket is closing, or whose answer cannot be
  encoded, gets the ``Answer`` itself and is answered by its handler as before.
* When settling says the waiters cannot be answered from here (the stream is gone, or their
  offset is not at the tail any more), they are woken without an answer and each runs its own
  long-poll loop again, as before.
* One timer for all: deadlines are looked at ``TIMEOUT_GRANULARITY_SECONDS`` after the earliest
  one passes, so a crowd that arrived together times out together (late by at most that, never
  early).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from edge.answer import Answer
from edge.live.board import Board, Waiter, by_answer_class
from edge.live.host import PollHost
from edge.live.tail import Tail
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.protocol.cursor import current_interval, next_cursor

logger = logging.getLogger(__name__)

TIMEOUT_GRANULARITY_SECONDS = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class Framing:
    """What, besides the answer, decides a request's response bytes: waiters with equal
    framings get the same bytes for the same answer."""

    version: tuple[int, int]
    keep_alive: bool
    reader_only: bool = False  # an authorized reader's copy of a shared answer: private
    origin: str | None = None  # the request's Origin: its CORS headers are its own
    # A body of unknown length is written to the close, never in chunks (an HTTP/1.0 reader).
    close_delimited: bool = False


class Sink(Protocol):
    """The one writer of a client connection (``edge.web.connection_protocol``): what is sent
    through it leaves in order, after everything sent before."""

    def send(self, data: bytes) -> None: ...

    def closing(self) -> bool: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Socket:
    """Where a released long-poll's answer may be written directly, and how it is framed."""

    sink: Sink
    framing: Framing


@dataclass(frozen=True, kw_only=True, slots=True)
class AlreadyWritten:
    """The answer was written to the socket already: the handler only completes the request."""

    status: int
    keep_alive: bool


# The web layer's serialisation of an answer for a framing; ValueError when it cannot be.
Encode = Callable[[Answer, Framing], bytes]
Outcome = Answer | AlreadyWritten | None
# What a parked long-poll is told once it leaves the board (see ``LongPollFanout.park``).
Released = Callable[[Outcome], None]


@dataclass(eq=False, kw_only=True, slots=True)
class Ticket:
    """How a waiter is answered: its handler awaits ``future``, or (parked by its connection,
    with no handler) ``released`` is called once."""

    tail: Tail
    socket: Socket | None
    released: Released | None = None
    future: asyncio.Future[Outcome] | None = None

    @property
    def open(self) -> bool:
        """Not answered yet, and its reader still waits."""
        return self.future is None or not self.future.done()

    def resolve(self, outcome: Outcome) -> None:
        if self.future is not None:
            if not self.future.done():
                self.future.set_result(outcome)
            return
        released, self.released = self.released, None
        if released is not None:
            released(outcome)


def with_cursor(answer: Answer, cursor: str) -> Answer:
    """The same answer with another ``Stream-Cursor`` (answers without one stay as they are)."""
    if not any(name == "Stream-Cursor" for name, _ in answer.headers):
        return answer
    headers = [(n, cursor if n == "Stream-Cursor" else v) for n, v in answer.headers]
    return replace(answer, headers=headers)


class LongPollFanout:
    def __init__(self, hub: PollHost, *, encode: Encode | None = None) -> None:
        self._hub = hub
        self._board: Board[Ticket] = Board()
        self._timer: asyncio.TimerHandle | None = None
        self._encode = encode  # the web layer's framing; None: no direct writes
        # Waiters on the board (edge_long_polls_waiting, set at scrape time: no lock per wait).
        self.waiting = 0
        hub.metrics.fold_at_scrape(self._fold)

    async def wait(
        self,
        key: LogKey,
        tail: Tail,
        offset: str,
        cursor: int | None,
        deadline: float,
        socket: Socket | None,
    ) -> Outcome:
        """Wait at the tail until released: an answer, ``AlreadyWritten``, or None (look again)."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        ticket = Ticket(tail=tail, socket=socket, future=future)
        waiter = self._join(key, tail, offset, cursor, deadline, ticket)
        try:
            return await future
        finally:
            self.unpark(waiter)

    def park(
        self,
        key: LogKey,
        tail: Tail,
        offset: str,
        cursor: int | None,
        deadline: float,
        socket: Socket,
        released: Released,
    ) -> Waiter[Ticket]:
        """Wait at the tail with no handler awaiting: ``released`` is called once, with what
        ``wait`` would return, unless ``unpark`` takes the waiter off first (its client left)."""
        return self._join(key, tail, offset, cursor, deadline, Ticket(
            tail=tail, socket=socket, released=released
        ))  # fmt: skip

    def _join(
        self,
        key: LogKey,
        tail: Tail,
        offset: str,
        cursor: int | None,
        deadline: float,
        ticket: Ticket,
    ) -> Waiter[Ticket]:
        waiter = Waiter(
            key=key, source=id(tail), offset=offset, cursor=cursor, deadline=deadline,
            ticket=ticket,
        )  # fmt: skip
        self._board.join(waiter)
        self._arm()
        self.waiting += 1
        return waiter

    def unpark(self, waiter: Waiter[Ticket]) -> None:
        """Take ``waiter`` off the board without answering it (idempotent)."""
        waiter.ticket.released = None
        if self._board.leave(waiter):
            self.waiting -= 1

    def _fold(self, metrics: Metrics) -> None:
        metrics.long_polls_waiting.set(self.waiting)

    # --- what releases them (the tail's listener calls, draining, the timer) ---

    def batch(self, key: LogKey) -> None:
        self._release_key(key)

    def ended(self, key: LogKey) -> None:
        self._release_key(key)

    def wake_all(self) -> None:
        for key in self._board.streams():
            assert isinstance(key, LogKey)
            self._release_key(key)

    def _release_key(self, key: LogKey) -> None:
        for members in self._board.groups(key):
            self._release_safely(key, members, expired=False)

    def _arm(self) -> None:
        deadline = self._board.next_deadline()
        if deadline is None:
            return
        when = deadline + TIMEOUT_GRANULARITY_SECONDS
        if self._timer is not None and self._timer.when() <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        try:
            for members in self._board.due(now):
                first = members[0]
                assert isinstance(first.key, LogKey)
                self._release_safely(first.key, members, expired=True)
        finally:
            self._arm()

    # --- one release ---

    def _release_safely(self, key: LogKey, members: list[Waiter[Ticket]], *, expired: bool) -> None:
        """A release that fails (a bug) must not strand its waiters, nor stop the tail or the
        timer that called it: whoever it did not answer runs its own loop, and fails there."""
        try:
            self._release(key, members, expired=expired)
        except Exception:
            logger.exception("releasing long-polls of %s failed", key)
            for waiter in members:
                self._resolve(waiter, None)

    # --- one release ---

    def _release(self, key: LogKey, members: list[Waiter[Ticket]], *, expired: bool) -> None:
        hub = self._hub
        first = members[0]
        tail, offset = first.ticket.tail, first.offset
        current = current_interval(hub.clock())
        template: Answer | None = None
        for cursor_class, waiters in by_answer_class(members, current=current).items():
            cursor = next_cursor(cursor_class, current=current, rng=hub.rng)
            if template is None:
                outcome = hub.settle(key, tail, offset, cursor=cursor, waited=True, expired=expired)
                if not isinstance(outcome, Answer):
                    if outcome.wakes:
                        for waiter in members:
                            self._resolve(waiter, None)
                    return
                template = answer = outcome
            else:
                answer = with_cursor(template, cursor)
            self._deliver(waiters, answer)

    def _resolve(self, waiter: Waiter[Ticket], outcome: Outcome) -> None:
        if self._board.leave(waiter):
            self.waiting -= 1
        waiter.ticket.resolve(outcome)

    def _deliver(self, waiters: list[Waiter[Ticket]], answer: Answer) -> None:
        # Per framing: the bytes (None: not encodable) and what each handler is told.
        frames: dict[Framing, tuple[bytes | None, AlreadyWritten]] = {}
        written = 0
        left = 0
        for waiter in waiters:
            if self._board.leave(waiter):
                left += 1
            ticket = waiter.ticket
            if not ticket.open:  # cancelled: its client left
                continue
            socket = ticket.socket
            if socket is None or self._encode is None or socket.sink.closing():
                ticket.resolve(answer)  # its handler answers it the usual way
                continue
            framing = socket.framing
            known = frames.get(framing)
            if known is None:
                done = AlreadyWritten(status=answer.status, keep_alive=framing.keep_alive)
                known = frames[framing] = (self._encoded(answer, framing), done)
            frame, done = known
            if frame is None:
                ticket.resolve(answer)
                continue
            socket.sink.send(frame)
            written += 1
            ticket.resolve(done)
        if left:
            self.waiting -= left
        if written:
            self._hub.metrics.served_bytes.inc(written * len(answer.body))

    def _encoded(self, answer: Answer, framing: Framing) -> bytes | None:
        assert self._encode is not None
        try:
            return self._encode(answer, framing)
        except ValueError:
            # A header value aiohttp would refuse (a control character): each handler answers
            # the usual way and aiohttp turns it into the error it always did.
            logger.warning(
                "long-poll answer could not be encoded for a direct write", exc_info=True
            )
            return None
