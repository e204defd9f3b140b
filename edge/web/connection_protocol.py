"""The protocol of each client connection on the stream listener: it delegates to aiohttp's
protocol, reports connects, received bytes and closes to the ``ConnectionTracker``, and answers
stored hits itself (``edge.web.fastpath``) while aiohttp has nothing in hand.

Rules this module owns:

* Every read is the connection's: a stored hit, a catch-up, long-poll or SSE read of its own
  (``fast_catchup``, ``fast_polls``, ``fast_sse``), and what those hand off or hand on
  (``HandOn``) is relayed or written by its own relay (``edge.web.own_relay``), admitted first
  as the full path admits it (a live read at ``--max-viewers`` is refused). With ``--auth``
  the relay is handed the admission the gate gave the head (``_admission``, the head in hand's):
  a read is decided once, and finished by the connection.
* A read the full path refuses before anything else (a target it refuses, a loop, a repeated
  ``Origin`` or ``Last-Event-ID``: ``edge.protocol.http1.RefusedHead``) is refused here, with
  the full path's answer (``FastPath.refusal``), before any gate; the connection reads on.
* With ``--auth jwt|forward`` every head it parses is the gate's first (``edge.web.own_gate``):
  an admission is handed to each read of its own; a refusal it writes itself (or hands to
  aiohttp, nothing written); what only a wait decides is decided in a task of the connection,
  nothing after it read meanwhile, and the head is then read again with that decision
  (``_waited``).
* A whole head met before, arriving alone while nothing is buffered, is offered to
  ``FastPath.hit`` first (no parse, no key, no lookup); answered, its first byte and its answer
  are one step of the tracker (``answered``: nothing else runs between them).
* Answers leave in request order, by construction: a head no own path serves goes to aiohttp
  alone (``WAITING``), and nothing after it is read until aiohttp's answer is written
  (``request_done``, from the tracker's middleware).
* A head with a body or an ``Expect`` (whose 417 aiohttp writes without the middleware), one
  llhttp refuses (before its end too: ``refused_before_its_end``, a bare LF, TLS), a head past
  ``MAX_HEAD_BYTES`` (aiohttp answers it 431), a backlog past
  ``MAX_WAITING_BYTES``, a handler that fails, or a fault of the fast path itself hands the
  connection to aiohttp for good, starting with what is buffered.
* A hit answered here with ``Connection: close`` ends the connection: nothing more is read, and
  the close flushes the answer first.
* aiohttp's protocol is only made when the first request needs it; a connection aiohttp never
  saw is closed here (once a client's half-close leaves nothing to answer, or at shutdown).
* A connection the tracker refuses gets the tracker's 503; what it sends is discarded, but for
  its request line (``MAX_REFUSED_LINE_BYTES`` at most), read to count the refusal by kind.
* A client that pipelines faster than it reads waits with its reading paused, not in our memory:
  heads are read only while the transport is below its high-water mark, whichever answer (its
  own, a task's, aiohttp's) put it above (``_read_while_writable`` on the way back to ``FAST``).
* A client's half-close (EOF) ends its sending, not its answers (``edge.protocol.half_close``):
  the transport stays open for writing, aiohttp never sees the EOF (its protocol would close
  the transport and cancel the handler), and the connection asks ``after_half_close`` again
  whenever what it holds changes: at the EOF, when a request reaches the application, when the
  application classifies it (a live reader is taken as gone), when an answer is written. On
  the full path it tells aiohttp to close after its last request (``RequestHandler.close``) or
  closes an idle one itself; what aiohttp holds is read by ``_aiohttp_holding`` alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import assert_never, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from edge.auth.gate import RequestAdmission
from edge.auth.policy import Refusal
from edge.live.polls import AlreadyWritten, Outcome
from edge.protocol.half_close import AfterHalfClose, Holding, after_half_close
from edge.protocol.http1 import (
    MAX_HEAD_BYTES,
    Handoff,
    HeadParser,
    RefusedHead,
    RequestHead,
    refused_before_its_end,
)
from edge.protocol.reads import RequestKind, kind_of_request_line
from edge.web.connection_tracker import REFUSAL, ConnectionTracker
from edge.web.fast_polls import AnsweredNow, Ending, HandedOff, HandOn, Parked, Waits
from edge.web.fast_sse import Refused, Streaming
from edge.web.own_gate import BAD_HEAD, BadHead, Decision, OwnGate, Undecided
from edge.web.own_relay import Found, let_go

logger = logging.getLogger(__name__)

# Bytes a connection may send while aiohttp answers its previous request; past it, aiohttp
# takes the connection for good (it queues pipelined requests itself).
MAX_WAITING_BYTES = 64 * 1024
# What a refused connection's request line may take to arrive whole (the rest is discarded).
MAX_REFUSED_LINE_BYTES = 8192
# The answer to a request whose body came slower than the connection table's body deadline.
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def protocol_factory(
    tracker: ConnectionTracker, handler_factory: web.Server
) -> Callable[[], asyncio.Protocol]:
    """For ``loop.create_server``: each connection wraps ``handler_factory`` (aiohttp's
    ``web.Server``, the runner's protocol factory) and reports to ``tracker``."""
    return lambda: _Connection(tracker, handler_factory)


class _Mode(Enum):
    FAST = "fast"  # the next head is read here; stored hits are answered here
    WAITING = "waiting"  # aiohttp answers one request; later bytes wait here until it is done
    PARKED = "parked"  # a long-poll of its own waits on the board; later bytes wait here
    STREAMING = "streaming"  # an SSE answer of its own is written; later bytes wait here
    DELEGATED = "delegated"  # every byte is aiohttp's, for the rest of the connection
    CLOSED = "closed"  # answered with Connection: close; nothing more is read
    REFUSED = "refused"  # at --max-connections: what it sends is discarded


# A member read through its Enum class costs a Python call (CPython 3.11's ``EnumType``); the
# per-read steps read this module name instead.
_FAST = _Mode.FAST


def _aiohttp_holding(handler: RequestHandler, *, cut_short: bool, live: bool) -> Holding:
    """What aiohttp's protocol holds, read from two attributes of its ``RequestHandler``
    (aiohttp 3.x; ``tests/unit/test_half_close.py`` pins them): a pending ``_waiter`` is its own
    test of a handler with nothing in hand (``_process_keepalive``), and ``_messages`` are the
    requests parsed and waiting behind the one in hand. aiohttp has no public word for either."""
    waiter = handler._waiter
    idle = waiter is not None and not waiter.done()
    queued = bool(handler._messages)
    return Holding(answering=not idle, queued=queued, cut_short=cut_short, live=live)


class _Connection(asyncio.Protocol):
    """One client connection, in one ``_Mode`` at a time (the module's rules say which)."""

    __slots__ = (
        "_admission",
        "_buffer",
        "_catchup",
        "_fast",
        "_gate",
        "_handler_factory",
        "_held",
        "_hit",
        "_in_hand",
        "_inner",
        "_lead",
        "_linger",
        "_mode",
        "_parked",
        "_parked_head",
        "_parser",
        "_paused",
        "_polls",
        "_refused_kind",
        "_relay",
        "_sending_done",
        "_sse",
        "_streaming",
        "_streaming_live",
        "_tracker",
        "_transport",
        "_waited",
        "_writable",
    )

    def __init__(self, tracker: ConnectionTracker, handler_factory: web.Server) -> None:
        self._tracker = tracker
        self._handler_factory = handler_factory
        self._inner: RequestHandler | None = None
        self._transport: asyncio.Transport | None = None
        self._linger: asyncio.TimerHandle | None = None
        fast = tracker.fast
        self._fast = fast if fast is not None and fast.enabled else None
        self._mode = _Mode.FAST if self._fast is not None else _Mode.DELEGATED
        # Heads met before whose answer is a stored hit; with --auth every head is the gate's.
        self._hit = self._fast.hit if self._fast is not None and tracker.gate is None else None
        # With --auth jwt|forward: every read is the gate's first (``edge.web.own_gate``), and
        # a head a wait decided is read again with that decision.
        self._gate = tracker.gate if self._fast is not None else None
        self._waited: tuple[bytes, RequestAdmission | Refusal | BadHead] | None = None
        # The gate's admission of the read in hand: what an own path hands on is relayed with it.
        self._admission: RequestAdmission | None = None
        polls = tracker.polls
        self._polls = polls if polls is not None and polls.enabled and self._fast else None
        # The long-poll of its own on the board, and its head (the full path's if it must
        # start over).
        self._parked: Parked | None = None
        self._parked_head = b""
        catchup = tracker.catchup
        self._catchup = catchup if catchup is not None and catchup.enabled and self._fast else None
        sse = tracker.sse
        self._sse = sse if sse is not None and sse.enabled and self._fast else None
        relay = tracker.relay
        self._relay = relay if relay is not None and relay.enabled and self._polls else None
        # The SSE answer of its own being written, and what its writes wait on while the
        # transport is above its high-water mark (None: writable).
        self._streaming: asyncio.Task[None] | None = None
        self._streaming_live = False
        self._writable: asyncio.Future[None] | None = None
        self._parser: HeadParser | None = None
        self._buffer = bytearray()
        self._paused = False
        # Reading paused while an answer of its own holds back what follows (not the same as
        # ``_paused``, the client's reading of our writes).
        self._held = False
        self._refused_kind: RequestKind | None = None
        # The client half-closed: it sends nothing more, and waits for its answers.
        self._sending_done = False
        # The request the application has in hand (between the tracker middleware's start and
        # ``request_done``), whose body may be cut short by a half-close.
        self._in_hand: web.BaseRequest | None = None
        # Bytes that lead the next ``send`` (``lead``).
        self._lead = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if not self._tracker.connected(self._transport, self):
            self._mode = _Mode.REFUSED
            self._transport.write(REFUSAL)
            self._linger = self._tracker.refuse(self._transport)
            return
        if self._mode is _Mode.DELEGATED:
            self._ensure_inner()

    def _ensure_inner(self) -> RequestHandler:
        if self._inner is None:
            self._inner = self._handler_factory()
            self._inner.connection_made(self._transport)  # type: ignore[arg-type]
        return self._inner

    def data_received(self, data: bytes) -> None:
        mode = self._mode
        if mode is _FAST and self._hit is not None and not self._buffer and not self._paused:
            # A whole head met before, its answer a stored hit (``FastPath.hit``): answered
            # without a parse, a key or a lookup. Its first byte and its answer are one step of
            # the table (``answered``): nothing else runs between them.
            try:
                answer = self._hit(data)
            except Exception:
                logger.exception("the hit path failed; the head is read as any other")
                answer = None
            if answer is not None:
                transport = self._transport
                assert transport is not None
                self._tracker.answered(transport)
                transport.write(answer)
                return
        if mode is _Mode.REFUSED:
            self._read_refused_line(data)
            return
        if mode is _Mode.CLOSED:
            return
        assert self._transport is not None
        self._tracker.bytes_received(self._transport)
        if mode is _Mode.DELEGATED:
            self._ensure_inner().data_received(data)
            self._body_progress(len(data))
            return
        self._buffer += data
        if mode is _Mode.WAITING:
            if len(self._buffer) > MAX_WAITING_BYTES:
                self._delegate()
            return
        if mode is _Mode.PARKED or mode is _Mode.STREAMING:
            if len(self._buffer) > MAX_WAITING_BYTES and not self._held:
                # Its answer is not written yet: what it pipelines waits in the kernel.
                self._held = True
                self._transport.pause_reading()
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
            logger.exception("fast path failed; the connection takes the full path")
            self._delegate()
        if self._sending_done:
            self._close_when_answered()

    def _serve(self) -> None:
        """Answer the complete heads in the buffer, in order, until one is aiohttp's."""
        fast, buffer = self._fast, self._buffer
        assert fast is not None
        while self._mode is _FAST and buffer and not self._paused:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                # aiohttp refuses these as it always has: a head too long (431), or one
                # llhttp refuses before its CRLF CRLF end, which may never come (400).
                if len(buffer) > MAX_HEAD_BYTES or refused_before_its_end(buffer):
                    self._delegate()
                return
            head = bytes(buffer[: end + 4])
            if self._parser is None:
                self._parser = fast.parser()
            parsed = fast.parse(head, self._parser)
            if isinstance(parsed, Handoff) and not parsed.once:
                self._delegate()
                return
            del buffer[: end + 4]
            if isinstance(parsed, Handoff):
                # This one request is aiohttp's; the next head waits for its answer.
                self._to_aiohttp(head)
                return
            if isinstance(parsed, RefusedHead):
                if not self._refuse_head(parsed, head):
                    return
                continue
            if not self._serve_head(parsed, head):
                return

    def _refuse_head(self, refused: RefusedHead, head: bytes) -> bool:
        """A read refused before anything else (a target the full path refuses, a loop, a
        repeated answer singleton): the full path's answer, written here; True: the connection
        reads its next head now."""
        fast, transport = self._fast, self._transport
        assert fast is not None
        assert transport is not None
        data = fast.refusal(refused)
        if data is None:
            self._to_aiohttp(head)
            return False
        self._tracker.answered(transport)
        transport.write(data)
        if not refused.keep_alive:
            self._close_after_answer()
            return False
        return True

    def _serve_head(self, parsed: RequestHead, head: bytes) -> bool:
        """Answer one head (``head``: its bytes), after the ``--auth`` gate's decision if there
        is a gate (``edge.web.own_gate``); True: the connection reads its next head now."""
        own_gate = self._gate
        if own_gate is None:
            return self._serve_read(parsed, head, None, counted=False)
        waited, self._waited = self._waited, None
        if waited is not None and waited[0] == head:
            decision: Decision = waited[1]  # what a wait decided (the gate counted it)
            counted = True
        else:
            decision = own_gate.decide_now(parsed)
            counted = False
        match decision:
            case RequestAdmission():
                return self._serve_read(parsed, head, decision, counted=counted)
            case Refusal():
                return self._refuse(decision, parsed, head, counted=counted)
            case Undecided():
                self._decide_later(own_gate, parsed, head)
                return False
            case BadHead():
                self._to_aiohttp(head)  # the full path's 400
                return False
            case _:
                assert_never(decision)

    def _serve_read(
        self,
        parsed: RequestHead,
        head: bytes,
        admission: RequestAdmission | None,
        *,
        counted: bool,
    ) -> bool:
        """Answer one read, with the gate's ``admission`` if there is a gate (``counted``: the
        gate counted it already); True: the connection reads its next head now."""
        fast, transport = self._fast, self._transport
        assert fast is not None
        assert transport is not None
        self._admission = admission
        answer = fast.answer(parsed, admission, head)
        if answer is None and self._catchup is not None:
            own = self._catchup.serve(parsed, head, self, self._answer_ended, admission)
            match own:
                case Streaming():
                    self._served(admission, counted)
                    self._tracker.request_started(transport)
                    self._stream(own, live=False)
                    return False
                case HandedOff():
                    pass
                case _:
                    assert_never(own)
        if answer is None and self._sse is not None:
            streaming = self._sse.serve(
                parsed, head, self, transport, self._answer_ended, self._admit_viewer, admission
            )
            match streaming:
                case Streaming():
                    self._served(admission, counted)
                    self._stream(streaming, live=True)
                    return False
                case Refused():
                    self._served(admission, counted)
                    return False
                case HandedOff():
                    pass
                case _:
                    assert_never(streaming)
        if answer is None and self._polls is not None:
            step = self._polls.serve(parsed, self, self._released, admission)
            if not isinstance(step, HandedOff):
                self._served(admission, counted)
            match step:
                case AnsweredNow(data=data):
                    # A live read, admitted first as the full path admits it; answered at
                    # once, it is admitted and ended in one step.
                    if not self._tracker.table.live_room():
                        self._admit_live(RequestKind.LONG_POLL, parsed.origin)  # refused
                        return False
                    self._tracker.answered(transport)
                    transport.write(data)
                    self._polls.written(step)
                    if not parsed.keep_alive:
                        self._close_after_answer()
                        return False
                    return True
                case Parked():
                    self._park(step, head, parsed.origin)
                    return False
                case Waits(target=target, expires_at=expires_at):
                    if self._admit_live(RequestKind.LONG_POLL, parsed.origin):
                        task = self._polls.serve_later(
                            target, head, self, self._answer_ended, expires_at
                        )
                        self._stream(Streaming(task), live=True)
                    return False
                case HandedOff():
                    pass
                case _:
                    assert_never(step)
        if answer is None:
            if self._relay_own(head, None, admission):
                self._served(admission, counted)
                return False  # relayed (or the edge's own HEAD) by the connection
            # This one request is aiohttp's; the next head waits for its answer.
            self._to_aiohttp(head)
            return False
        if admission is not None:
            self._served(admission, counted)
        self._tracker.answered(transport)
        if len(answer) == 1:
            transport.write(answer[0])
        else:
            transport.writelines(answer)
        if not parsed.keep_alive:
            self._close_after_answer()  # the close flushes the answer first
            return False
        return True

    def _served(self, admission: RequestAdmission | None, counted: bool) -> None:
        """A read the gate allowed is served here: counted as the full path counts it."""
        if admission is not None and not counted and self._gate is not None:
            self._gate.served()

    def _refuse(self, refusal: Refusal, parsed: RequestHead, head: bytes, *, counted: bool) -> bool:
        """The gate refused it: the full path's answer, written here (or the full path's to
        write); True: the connection reads its next head now."""
        own_gate, transport = self._gate, self._transport
        assert own_gate is not None
        assert transport is not None
        data = own_gate.refusal(refusal, parsed, counted=counted)
        if data is None:
            self._to_aiohttp(head)
            return False
        self._tracker.answered(transport)
        transport.write(data)
        if not parsed.keep_alive:
            self._close_after_answer()
            return False
        return True

    def _decide_later(self, own_gate: OwnGate, parsed: RequestHead, head: bytes) -> None:
        """Only a wait decides it (forward mode's service, a key set to fetch): a task of the
        connection's asks the gate as the full path would, then the head is read again with
        that decision (``_waited``); nothing after it is read meanwhile."""
        transport = self._transport
        assert transport is not None
        self._tracker.request_started(transport)

        async def decide() -> None:
            decision: RequestAdmission | Refusal | BadHead = BAD_HEAD
            try:
                decision = await own_gate.admit(parsed, head, transport)
            except Exception:
                logger.exception("the gate failed; the full path decides this read")
            finally:
                self._streaming = None
                if self._mode is _Mode.STREAMING:
                    self._tracker.request_finished(transport)
            if self._mode is not _Mode.STREAMING or transport.is_closing():
                return
            self._waited = (head, decision)
            self._buffer[:0] = head
            self._read_on()

        self._stream(Streaming(self._tracker.loop.create_task(decide())), live=False)

    def _close_after_answer(self) -> None:
        """The answer just written ends the connection: nothing more is read, and the close
        flushes what is queued first."""
        assert self._transport is not None
        self._mode = _Mode.CLOSED
        self._buffer.clear()
        self._transport.close()

    def _read_on(self) -> None:
        """An answer of its own is done: the connection reads its next request (what waited,
        and a half-close, are looked at on the next pass)."""
        self._mode = _Mode.FAST
        self._read_while_writable()
        self._unhold()
        if self._buffer or self._sending_done:
            self._tracker.loop.call_soon(self._resume)

    def _read_while_writable(self) -> None:
        """The connection reads heads again (``FAST``): if an answer written meanwhile (its
        own, or aiohttp's) left the transport above its high-water mark, whose pause was then
        not the reading's to heed, reading waits for ``resume_writing`` as ``pause_writing``
        makes it wait in ``FAST``: what the client pipelines stays in the kernel, not ours."""
        transport = self._transport
        if self._writable is not None and not self._paused and transport is not None:
            self._paused = True
            transport.pause_reading()

    def _to_aiohttp(self, head: bytes) -> None:
        """This one request is aiohttp's; the next head waits for its answer."""
        self._mode = _Mode.WAITING
        self._unhold()  # what waits past MAX_WAITING_BYTES is then aiohttp's (``_delegate``)
        self._ensure_inner().data_received(head)

    def _unhold(self) -> None:
        """Read again what an answer of its own held back (``MAX_WAITING_BYTES``)."""
        transport = self._transport
        if self._held and transport is not None:
            self._held = False
            if not self._paused and not transport.is_closing():
                transport.resume_reading()

    def _park(self, parked: Parked, head: bytes, origin: str | None) -> None:
        """A long-poll of its own waits on the board (``edge.web.fast_polls``)."""
        polls = self._polls
        assert polls is not None
        if not self._admit_live(RequestKind.LONG_POLL, origin):
            polls.withdraw(parked)  # past --max-viewers: refused, never waited
            return
        self._mode = _Mode.PARKED
        self._parked, self._parked_head = parked, head
        if self._sending_done:
            self._close_when_answered()

    def _released(self, outcome: Outcome) -> None:
        """The long-poll of its own left the board: answered on the wire (``AlreadyWritten``),
        woken to look again (None: its stream gone, a gap to fetch), started over by a task of
        its own as the full path would, or (an answer that could not be encoded) the full
        path's (nothing of it was written)."""
        transport, polls = self._transport, self._polls
        assert transport is not None
        parked = self._parked
        head, self._parked, self._parked_head = self._parked_head, None, b""
        if self._mode is not _Mode.PARKED:
            return
        if outcome is None and parked is not None and polls is not None:
            # Still live (admitted): it looks again where it waits, in a task of its own.
            task = polls.serve_later(
                parked.target, head, self, self._answer_ended, parked.expires_at
            )
            self._stream(Streaming(task), live=True)
            return
        self._tracker.request_finished(transport)
        if not isinstance(outcome, AlreadyWritten):
            # An answer that could not be encoded: aiohttp writes it.
            self._hand_on(HandOn(head, outcome))
            return
        if not outcome.keep_alive:
            self._close_after_answer()
            return
        self._read_on()

    def _admit_viewer(self, origin: str | None) -> bool:
        return self._admit_live(RequestKind.SSE, origin)

    def _admit_live(self, kind: RequestKind, origin: str | None) -> bool:
        """A live read of its own is about to begin: False, past --max-viewers, it is refused
        as the full path refuses it, and the connection closes."""
        transport, polls = self._transport, self._polls
        assert transport is not None
        assert polls is not None
        self._tracker.request_started(transport)
        if self._tracker.request_kind(transport, kind) is None:
            return True
        self._tracker.request_finished(transport)
        transport.write(polls.refusal(origin, kind))
        self._close_after_answer()
        return False

    def _stream(self, streaming: Streaming, *, live: bool) -> None:
        """An answer of its own is being written by a task (an SSE feed, ``live``, or a
        catch-up answer): the connection is the task's until it ends."""
        self._mode = _Mode.STREAMING
        self._streaming = streaming.task
        self._streaming_live = live
        if self._sending_done:
            self._close_when_answered()

    def _answer_ended(self, ended: Ending | HandOn) -> None:
        """An answer of its own ended (``Ending`` says how), or was not begun and is the full
        path's to give (``HandOn``: what the connection found is told to it first)."""
        transport = self._transport
        assert transport is not None
        self._streaming = None
        handed_on = isinstance(ended, HandOn)
        if self._mode is not _Mode.STREAMING or (handed_on and transport.is_closing()):
            if isinstance(ended, HandOn) and ended.found is not None:
                let_go(ended.found)  # nobody will write it
            if self._mode is _Mode.STREAMING:
                self._tracker.request_finished(transport)
                self._mode = _Mode.CLOSED
            return
        self._tracker.request_finished(transport)
        match ended:
            case HandOn():
                self._hand_on(ended)
            case Ending.CUT:
                self._mode = _Mode.CLOSED
                self._buffer.clear()
                transport.abort()  # what is queued is dropped: the client resumes by offset
            case Ending.CLOSE:
                self._close_after_answer()  # its last chunk flushes first
            case Ending.READ_ON:
                self._read_on()
            case _:
                assert_never(ended)

    def _hand_on(self, hand_on: HandOn) -> None:
        """An answer of its own was not begun: what it found is written (or relayed) by the
        connection's own relay; only what it cannot serve is aiohttp's, which asks again."""
        # Its admission was counted when the own path took the read.
        if self._relay_own(hand_on.head, hand_on.found, self._admission):
            return
        if hand_on.found is not None:
            let_go(hand_on.found)
        self._to_aiohttp(hand_on.head)

    def _relay_own(
        self, head: bytes, found: Found | None, admission: RequestAdmission | None
    ) -> bool:
        """Serve ``head`` by the connection's own relay (``edge.web.own_relay``), with the
        gate's ``admission`` of it (``--auth``), admitted first as the full path admits it;
        False: it is aiohttp's."""
        relay, transport = self._relay, self._transport
        assert transport is not None
        if relay is None:
            return False
        peer = transport.get_extra_info("peername")
        try:
            address = peer[0] if isinstance(peer, tuple) else None
            planned = relay.plan(head, found, address, admission)
        except Exception:
            # A fault of the relay's own must not cost the client its answer: aiohttp's.
            logger.exception("the connection's relay failed to plan; aiohttp answers the head")
            planned = None
        if planned is None:
            return False
        live = planned.live
        if live:
            if not self._admit_live(planned.kind, planned.origin):
                return True  # past --max-viewers: refused, and the connection closes
        else:
            self._tracker.request_started(transport)
        self._stream(Streaming(relay.start(planned, self, self._answer_ended)), live=live)
        return True

    # --- the one writer of this connection (``edge.live.polls.Sink``) ---

    def send(self, data: bytes) -> None:
        transport = self._transport
        if self._lead:
            data, self._lead = self._lead + data, b""
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def lead(self, data: bytes) -> None:
        """``data`` goes out ahead of whatever is sent next, in the same write (an SSE answer's
        head, with its first frame: one send, not two, and never after a frame)."""
        self._lead += data

    async def drain(self) -> None:
        """Wait while the transport is above its high-water mark; raise once it is lost."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client left")
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def closing(self) -> bool:
        transport = self._transport
        return transport is None or transport.is_closing()

    def buffered(self) -> int:
        """Bytes sent through this connection that its socket has not taken yet."""
        transport = self._transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def _delegate(self) -> None:
        """Everything from here on is aiohttp's, starting with what is buffered."""
        self._mode = _Mode.DELEGATED
        pending, self._buffer = bytes(self._buffer), bytearray()
        inner = self._ensure_inner()
        if pending:
            inner.data_received(pending)

    def _body_progress(self, size: int) -> None:
        """aiohttp has parsed what came: the body in hand earns time, or is whole."""
        in_hand, transport = self._in_hand, self._transport
        if in_hand is None or transport is None:
            return
        if in_hand.content.is_eof():
            self._tracker.body_ended(transport)
        else:
            self._tracker.body_received(transport, size)

    def body_timed_out(self) -> None:
        """The body in hand came too slowly (the tracker closes the transport next): answer 408
        if nothing of an answer has been written. The close makes aiohttp's read of the body
        fail, so a write relayed upstream is cut short there too, never sent partly as whole.
        ``output_size``: what aiohttp's writer has given the transport (aiohttp 3.x)."""
        in_hand, transport = self._in_hand, self._transport
        if in_hand is None or transport is None or transport.is_closing():
            return
        if in_hand._payload_writer.output_size == 0:
            transport.write(REQUEST_TIMEOUT)

    def request_started(self, request: web.BaseRequest) -> None:
        """The application has ``request`` in hand (the tracker's middleware)."""
        self._in_hand = request
        if self._transport is not None and not request.content.is_eof():
            self._tracker.body_started(self._transport)
        if self._sending_done:
            self._close_when_answered()

    def request_classified(self) -> None:
        """The application has told the tracker what the request in hand is."""
        if self._sending_done:
            self._close_when_answered()

    def request_done(self, *, completed: bool) -> None:
        """aiohttp has written its answer to the request it was given (``completed``), or its
        handler failed and aiohttp writes an answer of its own after this: then it keeps the
        connection, so that answer and every later one stay in order."""
        self._in_hand = None
        if self._mode is not _Mode.WAITING:
            return
        if not completed:
            self._delegate()
            if self._sending_done:
                self._close_when_answered()
            return
        self._mode = _Mode.FAST
        self._read_while_writable()
        if self._buffer or self._sending_done:
            self._tracker.loop.call_soon(self._resume)

    def _resume(self) -> None:
        transport = self._transport
        if self._mode is _Mode.FAST and transport is not None and not transport.is_closing():
            self._serve_safely()

    def answering_on_its_own(self) -> bool:
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        return self._mode is _Mode.STREAMING or self._mode is _Mode.PARKED

    def close_if_idle(self) -> None:
        """At shutdown: a connection aiohttp never saw ends as after a half-close: what it
        sent is answered (the buffered heads, an answer of its own in progress), then it
        closes (its buffer flushes first)."""
        transport = self._transport
        if self._inner is not None or transport is None or transport.is_closing():
            return
        self._sending_done = True
        mode = self._mode
        if mode is _Mode.FAST and self._buffer:
            self._serve_safely()
        elif mode is _Mode.STREAMING or mode is _Mode.PARKED:
            # Drained (woken): its answer ends on its own, then what follows is answered and
            # the connection closes (``_sending_done``).
            pass
        else:
            self._close_when_answered()

    def eof_received(self) -> bool | None:
        if self._mode is _Mode.REFUSED or self._mode is _Mode.CLOSED:
            return None  # nothing to answer: close it now (what is written flushes first)
        # Not aiohttp's to see: its protocol would close the transport and cancel the handler
        # of a request the client still waits to be answered.
        self._sending_done = True
        self._close_when_answered()
        return True  # keep the transport open for the answers

    def _close_when_answered(self) -> None:
        """The client has half-closed: close now if nothing it sent is left to answer, or
        have the last answer close the connection (the module's rules say when)."""
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            return
        mode = self._mode
        match mode:
            case _Mode.FAST:
                queued = b"\r\n\r\n" in self._buffer
                holding = Holding(answering=False, queued=queued, cut_short=False, live=False)
            case _Mode.PARKED:
                holding = Holding(answering=True, queued=False, cut_short=False, live=True)
            case _Mode.STREAMING:
                live = self._streaming_live
                holding = Holding(answering=True, queued=False, cut_short=False, live=live)
            case _Mode.WAITING:
                # Only heads without a body wait here; request_done asks again.
                live = self._tracker.is_live(transport)
                holding = Holding(answering=True, queued=False, cut_short=False, live=live)
            case _Mode.DELEGATED:
                assert self._inner is not None
                in_hand = self._in_hand
                cut_short = in_hand is not None and not in_hand.content.is_eof()
                live = self._tracker.is_live(transport)
                holding = _aiohttp_holding(self._inner, cut_short=cut_short, live=live)
            case _Mode.CLOSED | _Mode.REFUSED:
                return
            case _:
                assert_never(mode)
        decision = after_half_close(holding)
        match decision:
            case AfterHalfClose.CLOSE:
                transport.close()
            case AfterHalfClose.AFTER_ANSWER:
                if mode is _Mode.DELEGATED:
                    assert self._inner is not None
                    # aiohttp answers the request in hand, then closes the transport itself.
                    self._inner.close()
            case AfterHalfClose.WAIT:
                pass  # the next request's start, or its answer, asks again
            case _:
                assert_never(decision)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self._transport is not None
        if self._mode is _Mode.REFUSED:
            self._tracker.refusal_ended(self._linger, self._refused_kind)
            return
        self._tracker.closed(self._transport)
        parked = self._parked
        if parked is not None and self._polls is not None:
            self._parked = None
            self._polls.leave(parked)
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_exception(ConnectionResetError("the client left"))
            writable.exception()  # retrieved: nobody need be waiting on it
        streaming, self._streaming = self._streaming, None
        if streaming is not None:
            streaming.cancel()  # a feed asleep at the tail would never hear of it
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._tracker.loop.create_future()
        if self._mode is _Mode.FAST and self._transport is not None:
            # A client that pipelines faster than it reads waits here, not in our memory.
            self._paused = True
            self._transport.pause_reading()
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)
        if self._paused and self._transport is not None:
            self._paused = False
            if not self._held:
                self._transport.resume_reading()
            if self._buffer:
                self._tracker.loop.call_soon(self._resume)
        if self._inner is not None:
            self._inner.resume_writing()
