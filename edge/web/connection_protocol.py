"""The protocol of each client connection on the stream listener: it delegates to aiohttp's
protocol, reports connects, received bytes and closes to the ``ConnectionTracker``, and answers
stored hits itself (``edge.web.fastpath``) while aiohttp has nothing in hand.

Rules this module owns:

* Answers leave in request order, by construction: a head the fast path cannot answer goes to
  aiohttp alone (``WAITING``), and nothing after it is read until aiohttp's answer is written
  (``request_done``, from the tracker's middleware).
* A head with a body or an ``Expect`` (whose 417 aiohttp writes without the middleware), one
  llhttp refuses, a head past ``MAX_HEAD_BYTES`` (aiohttp answers it 431), a backlog past
  ``MAX_WAITING_BYTES``, a handler that fails, or a fault of the fast path itself hands the
  connection to aiohttp for good, starting with what is buffered.
* A hit answered here with ``Connection: close`` ends the connection: nothing more is read, and
  the close flushes the answer first.
* aiohttp's protocol is only made when the first request needs it; a connection aiohttp never
  saw is closed here (at a client's EOF, or at shutdown).
* A connection the tracker refuses gets the tracker's 503; what it sends is discarded, but for
  its request line (``MAX_REFUSED_LINE_BYTES`` at most), read to count the refusal by kind.
* A client that pipelines faster than it reads waits with its reading paused, not in our memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import cast

from aiohttp import web

from edge.protocol.http1 import MAX_HEAD_BYTES, Handoff, HeadParser
from edge.protocol.reads import RequestKind, kind_of_request_line
from edge.web.connection_tracker import ConnectionTracker

log = logging.getLogger(__name__)

# Bytes a connection may send while aiohttp answers its previous request; past it, aiohttp
# takes the connection for good (it queues pipelined requests itself).
MAX_WAITING_BYTES = 64 * 1024
# What a refused connection's request line may take to arrive whole (the rest is discarded).
MAX_REFUSED_LINE_BYTES = 8192


def protocol_factory(
    tracker: ConnectionTracker, handler_factory: web.Server
) -> Callable[[], asyncio.Protocol]:
    """For ``loop.create_server``: each connection wraps ``handler_factory`` (aiohttp's
    ``web.Server``, the runner's protocol factory) and reports to ``tracker``."""
    return lambda: _Connection(tracker, handler_factory)


class _Mode(Enum):
    FAST = "fast"  # the next head is read here; stored hits are answered here
    WAITING = "waiting"  # aiohttp answers one request; later bytes wait here until it is done
    DELEGATED = "delegated"  # every byte is aiohttp's, for the rest of the connection
    CLOSED = "closed"  # answered with Connection: close; nothing more is read
    REFUSED = "refused"  # at --max-connections: what it sends is discarded


class _Connection(asyncio.Protocol):
    """One client connection, in one ``_Mode`` at a time (the module's rules say which)."""

    __slots__ = (
        "_buffer",
        "_fast",
        "_handler_factory",
        "_inner",
        "_linger",
        "_mode",
        "_parser",
        "_paused",
        "_refused_kind",
        "_tracker",
        "_transport",
    )

    def __init__(self, tracker: ConnectionTracker, handler_factory: web.Server) -> None:
        self._tracker = tracker
        self._handler_factory = handler_factory
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._linger: asyncio.TimerHandle | None = None
        fast = tracker.fast
        self._fast = fast if fast is not None and fast.enabled else None
        self._mode = _Mode.FAST if self._fast is not None else _Mode.DELEGATED
        self._parser: HeadParser | None = None
        self._buffer = bytearray()
        self._paused = False
        self._refused_kind: RequestKind | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if not self._tracker.connected(self._transport, self):
            self._mode = _Mode.REFUSED
            self._linger = self._tracker.refuse(self._transport)
            return
        if self._mode is _Mode.DELEGATED:
            self._ensure_inner()

    def _ensure_inner(self) -> asyncio.Protocol:
        if self._inner is None:
            self._inner = self._handler_factory()
            self._inner.connection_made(self._transport)  # type: ignore[arg-type]
        return self._inner

    def data_received(self, data: bytes) -> None:
        mode = self._mode
        if mode is _Mode.REFUSED:
            self._read_refused_line(data)
            return
        if mode is _Mode.CLOSED:
            return
        assert self._transport is not None
        self._tracker.bytes_received(self._transport)
        if mode is _Mode.DELEGATED:
            self._ensure_inner().data_received(data)
            return
        self._buffer += data
        if mode is _Mode.WAITING:
            if len(self._buffer) > MAX_WAITING_BYTES:
                self._delegate()
            return
        self._serve_safely()

    def _read_refused_line(self, data: bytes) -> None:
        if self._refused_kind is not None:
            return
        self._buffer += data
        kind = kind_of_request_line(bytes(self._buffer))
        if kind is None and len(self._buffer) > MAX_REFUSED_LINE_BYTES:
            kind = RequestKind.OTHER  # no request line aiohttp would take either
        if kind is not None:
            self._refused_kind = kind
            self._buffer.clear()

    def _serve_safely(self) -> None:
        try:
            self._serve()
        except Exception:
            # A fault of the fast path must not cost the client its answer: the head it was
            # reading is still buffered, and aiohttp answers it and everything after.
            log.exception("fast path failed; the connection takes the full path")
            self._delegate()

    def _serve(self) -> None:
        """Answer the complete heads in the buffer, in order, until one is aiohttp's."""
        fast, buffer, transport = self._fast, self._buffer, self._transport
        assert fast is not None
        assert transport is not None
        while self._mode is _Mode.FAST and buffer and not self._paused:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._delegate()  # aiohttp refuses it (431) as it always has
                return
            head = bytes(buffer[: end + 4])
            if self._parser is None:
                self._parser = fast.parser()
            parsed = self._parser.parse(head)
            if isinstance(parsed, Handoff) and not parsed.once:
                self._delegate()
                return
            answer = None if isinstance(parsed, Handoff) else fast.answer(parsed)
            del buffer[: end + 4]
            if answer is None or isinstance(parsed, Handoff):
                # This one request is aiohttp's; the next head waits for its answer.
                self._mode = _Mode.WAITING
                self._ensure_inner().data_received(head)
                return
            self._tracker.answered(transport)
            if len(answer) == 1:
                transport.write(answer[0])
            else:
                transport.writelines(answer)
            if not parsed.keep_alive:
                self._mode = _Mode.CLOSED  # the close flushes the answer first
                buffer.clear()
                transport.close()
                return

    def _delegate(self) -> None:
        """Everything from here on is aiohttp's, starting with what is buffered."""
        self._mode = _Mode.DELEGATED
        pending, self._buffer = bytes(self._buffer), bytearray()
        inner = self._ensure_inner()
        if pending:
            inner.data_received(pending)

    def request_done(self, *, completed: bool) -> None:
        """aiohttp has written its answer to the request it was given (``completed``), or its
        handler failed and aiohttp writes an answer of its own after this: then it keeps the
        connection, so that answer and every later one stay in order."""
        if self._mode is not _Mode.WAITING:
            return
        if not completed:
            self._delegate()
            return
        self._mode = _Mode.FAST
        if self._buffer:
            self._tracker.loop.call_soon(self._resume)

    def _resume(self) -> None:
        transport = self._transport
        if self._mode is _Mode.FAST and transport is not None and not transport.is_closing():
            self._serve_safely()

    def close_if_idle(self) -> None:
        """At shutdown: a connection aiohttp never saw is closed here (its buffer flushes)."""
        if self._inner is None and self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return None  # nothing in hand: close it now (its answers are flushed first)
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        assert self._transport is not None
        if self._mode is _Mode.REFUSED:
            self._tracker.refusal_ended(self._linger, self._refused_kind)
            return
        self._tracker.closed(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._mode is _Mode.FAST and self._transport is not None:
            # A client that pipelines faster than it reads waits here, not in our memory.
            self._paused = True
            self._transport.pause_reading()
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
            if self._buffer:
                self._tracker.loop.call_soon(self._resume)
        if self._inner is not None:
            self._inner.resume_writing()
