"""The pump of a resume route: an upstream SSE answer copied, detached from its client, into
the durable stream that keeps it (``edge.resume``).

Rules this module owns:

* A kept answer's stream is created at the origin (``PUT``, ``application/json``,
  ``Stream-TTL`` = ``--resume-retention``) before anything of it is read, holding the request
  ids it owes (``request_message``); one the origin will not create is not kept (the caller
  relays the answer without ids, ``edge_resume_unkept_total``).
* While the upstream is quiet, the pump appends a lease (``LEASE``) every third of
  ``--resume-lease``: an open stream with nothing new for a whole lease has lost its pump.
  ``end_lapsed`` is what a reader then does: it writes what the request is still owed and the
  close as the same producer with epoch 1, which fences the lost pump's writes off (the origin
  refuses a lower epoch), so the answer ends once and nothing more is appended. A reader that
  cannot read the log then (the origin away) ends nothing: the pump may be waiting out the same
  outage, and an error given to a client could contradict the answer the log goes on to hold.
* The pump runs in a task of its own: a client that leaves cancels none of it (MCP 2025-11-25:
  a disconnect is not a cancellation). It copies the upstream answer to its end, one append per
  upstream chunk, each answered by the origin before the next chunk is read; then it appends
  what a JSON-RPC request is still owed and closes the stream (``Stream-Closed: true``).
* The pump writes as one idempotent producer (``StreamWriter``): a write the origin did not
  answer is sent again, for some 16 s, with the same ``Producer-Seq``, so the origin
  takes each event once; a write it refuses (or never answers) stops the pump: what was kept
  stays, and it tries to end the answer with what it still owes (if the origin refuses that
  too, the lease lapses and readers end it).
* Caps (``--resume-max-pumps``, ``--resume-max-bytes``, ``--resume-max-seconds``): past the
  pumps cap (answers kept, and requests still waiting for the answer they may keep: ``at_cap``)
  a new answer is not kept (relayed without ids); an answer that outgrows the bytes or
  seconds cap is kept no further: the pump appends ``UNKEPT``, what the request is owed and the
  close (readers elsewhere end with the error), and hands the rest of the upstream answer to its
  own client on this process (``Handoff``), without ids; once that client is gone (even while
  the upstream says nothing), the upstream answer is closed. Each is counted in
  ``edge_resume_unkept_total{reason}``.
* On ``close`` (the process stopping), pumps get ``--drain-seconds`` to finish; the rest end
  their answers with what they still owe, so no reader elsewhere waits for them. A process
  killed outright cannot: its leases lapse.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

import aiohttp

from edge.config import Settings
from edge.metrics import RESUME_UNKEPT_REASONS, Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import strip_hop_by_hop
from edge.protocol.sse import SseDecoder
from edge.resume.events import (
    LEASE,
    UNKEPT,
    Finale,
    append_body,
    kept_message,
    request_message,
)
from edge.resume.ids import ResumePoint, mint_token, stream_name

logger = logging.getLogger(__name__)
T = TypeVar("T")

JSON = "application/json"
# Attempts of one write the origin did not answer (or answered 5xx) before the pump gives up;
# the waits between them double from RETRY_FIRST_SECONDS (0.25 s ... 8 s: about 16 s in all,
# long enough for an origin's restart).
WRITE_ATTEMPTS = 7
RETRY_FIRST_SECONDS = 0.25

# Response headers of the upstream a kept answer does not pass on: the body is the edge's.
NOT_PASSED_ON = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "cache-control", "etag",
     "content-type"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Kept:
    """The upstream answer is being pumped into ``path``; its client reads from ``point``,
    with ``headers`` of the upstream's answer passed on (an MCP session id, say)."""

    path: str
    point: ResumePoint
    headers: list[tuple[str, str]]
    handoff: Handoff


# How many upstream events past a cap wait for the answer's own client before the pump waits.
HANDOFF_EVENTS = 64


class Handoff:
    """The rest of an answer that outgrew its caps, for the answer's own client on this process:
    upstream messages, then None at the end. A client gone (``leave``) takes nothing more."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[dict[str, str] | None] = asyncio.Queue(HANDOFF_EVENTS)
        self._gone = asyncio.Event()

    async def put(self, message: dict[str, str] | None) -> bool:
        """False if the client is gone (the caller stops)."""
        if self._gone.is_set():
            return False
        put = asyncio.ensure_future(self._queue.put(message))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({put, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            put.cancel()
            gone.cancel()
        return not self._gone.is_set()

    async def get(self) -> dict[str, str] | None:
        return await self._queue.get()

    async def left(self) -> None:
        """Returns once the client is gone."""
        await self._gone.wait()

    def leave(self) -> None:
        self._gone.set()


@dataclass(frozen=True, slots=True)
class Copied:
    """The upstream answer ended (or broke off): end the stream."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The origin refused a write: what was kept stays; try to end the stream."""


@dataclass(frozen=True, slots=True)
class Outgrown:
    """A cap was reached (``reason``): ``pending`` and the rest go to the client, not kept."""

    reason: str
    pending: list[dict[str, str]]


CopyEnd = Copied | Refused | Outgrown


class Pumps:
    """Every pump of this process, and the tasks that outlive the requests that began them."""

    def __init__(self, settings: Settings, metrics: Metrics, origin: OriginClient) -> None:
        self._settings = settings
        self._metrics = metrics
        self._origin = origin
        self._tasks: set[asyncio.Future[Any]] = set()
        self._pumping = 0
        self._beginning = 0  # requests whose upstream answer has not begun (no headers yet)
        for reason in RESUME_UNKEPT_REASONS:
            metrics.resume_unkept.labels(reason)

    def at_cap(self) -> bool:
        """Answers kept and requests waiting for theirs fill ``--resume-max-pumps``: a new
        request is relayed as it is (its client leaving ends it)."""
        return self._pumping + self._beginning >= self._settings.resume_max_pumps

    @contextmanager
    def beginning(self) -> Iterator[None]:
        """A request whose answer may be kept, waiting for its upstream's headers: counted
        against the cap (its client may have left; it still holds a connection and a task)."""
        self._beginning += 1
        try:
            yield
        finally:
            self._beginning -= 1

    def detached(self, work: Awaitable[T]) -> asyncio.Future[T]:
        """Run ``work`` to its end whatever happens to the request that started it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self._settings.drain_seconds)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def keep(
        self,
        response: aiohttp.ClientResponse,
        body: bytes,
        scope: str,
        credentials: list[tuple[str, str]],
    ) -> Kept | None:
        """Keep the SSE ``response`` to the request ``body`` made in ``scope``: its stream
        created and its pump started; None if it is not kept (the origin would not create the
        stream, or this process keeps ``--resume-max-pumps`` answers already)."""
        if self._pumping >= self._settings.resume_max_pumps:
            self._metrics.resume_unkept.labels("pumps").inc()
            return None
        token = mint_token()
        path = self._settings.resume_stream_prefix + stream_name(token, scope)
        finale = Finale.of_request(body)
        self._pumping += 1  # counted from here: creations in flight count against the cap
        try:
            created = await self._create(path, credentials, finale)
        finally:
            self._pumping -= 1
        if not created:
            self._metrics.resume_unkept.labels("origin").inc()
            return None
        self._metrics.resume_streams.inc()
        handoff = Handoff()
        self._pumping += 1
        self.detached(self._pump(response, path, credentials, finale, handoff))
        passed_on = [
            (name, value)
            for name, value in strip_hop_by_hop(list(response.headers.items()))
            if name.lower() not in NOT_PASSED_ON
        ]
        return Kept(path, ResumePoint(token=token, offset="-1", skip=0), passed_on, handoff)

    async def _create(self, path: str, credentials: list[tuple[str, str]], finale: Finale) -> bool:
        ttl = str(max(1, round(self._settings.resume_retention_seconds)))
        headers = [*credentials, ("Content-Type", JSON), ("Stream-TTL", ttl)]
        first = append_body([request_message(finale.owed)])
        status = await write_once(self._origin, "PUT", path, headers, first)
        if status not in (200, 201):
            logger.warning("resume stream %s: the origin answered its creation %d", path, status)
            return False
        return True

    async def _pump(
        self,
        response: aiohttp.ClientResponse,
        path: str,
        credentials: list[tuple[str, str]],
        finale: Finale,
        handoff: Handoff,
    ) -> None:
        self._metrics.resume_pumps.inc()
        writer = StreamWriter(self._origin, self._metrics, path, credentials)
        decoder = SseDecoder()
        ended = False
        try:
            copied = await self._copy(response, writer, finale, decoder)
            match copied:
                case Copied() | Refused():
                    await self._end(writer, finale)
                    ended = True
                case Outgrown(reason=reason, pending=pending):
                    self._metrics.resume_unkept.labels(reason).inc()
                    logger.info("resume stream %s: kept no further (%s cap)", path, reason)
                    await writer.append([UNKEPT])
                    await self._end(writer, finale)
                    ended = True
                    limit = self._settings.resume_max_bytes
                    await _hand_over(response, decoder, pending, handoff, limit)
                case _:
                    assert_never(copied)
        except asyncio.CancelledError:
            # This process is stopping: what was kept stays, and the answer ends with what it
            # still owes, so no reader waits for it (a replica killed outright cannot: its
            # lease lapses, and a reader ends it).
            if not ended:
                await asyncio.shield(self._end(writer, finale))
            raise
        except Exception:
            # A fault of the edge's own: the answer still ends at once with what it owes,
            # rather than when a reader finds its lease lapsed.
            logger.exception("resume stream %s: the pump failed; its answer is ended", path)
            if not ended:
                await self._end(writer, finale)
        finally:
            handoff.leave()
            response.close()
            self._pumping -= 1
            self._metrics.resume_pumps.dec()

    async def _copy(
        self,
        response: aiohttp.ClientResponse,
        writer: StreamWriter,
        finale: Finale,
        decoder: SseDecoder,
    ) -> CopyEnd:
        """The upstream answer into the stream, to its end or a cap, with a lease appended
        while it is quiet."""
        settings = self._settings
        quiet = settings.resume_lease_seconds / 3
        started = written = time.monotonic()  # the stream's creation
        kept_bytes = 0
        try:
            # aclosing: a return midway (a cap, a refusal) ends the read it has waiting, so the
            # answer can be read on (the hand-over) without two reads at once.
            async with aclosing(_chunks_or_silence(response, quiet)) as chunks:
                async for chunk in chunks:
                    messages: list[dict[str, Any]] = [
                        message
                        for event in decoder.feed(chunk or b"")
                        if (message := kept_message(event)) is not None
                    ]
                    size = sum(len(message["data"]) for message in messages)
                    # What the decoder holds of an event not yet ended counts too: an upstream
                    # that never ends a line would otherwise grow it without bound.
                    if kept_bytes + size + decoder.held > settings.resume_max_bytes:
                        return Outgrown("bytes", messages)
                    if time.monotonic() - started > settings.resume_max_seconds:
                        return Outgrown("seconds", messages)
                    kept_bytes += size
                    for message in messages:
                        finale.heard(message)
                    if not messages and time.monotonic() - written >= quiet:
                        # Quiet (or only comments): the pump is alive all the same.
                        messages = [LEASE]
                    if messages:
                        if not await writer.append(messages):
                            return Refused()
                        written = time.monotonic()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            logger.info("resume stream %s: the upstream answer broke off: %r", writer.path, error)
        return Copied()

    async def _end(self, writer: StreamWriter, finale: Finale) -> None:
        """What the request is still owed, then the stream's close."""
        owed = finale.still_owed()
        finale.owed.clear()
        if not await writer.settle():
            return
        if owed and not await writer.append(owed):
            return
        await writer.close()

    async def end_lapsed(self, path: str, credentials: list[tuple[str, str]]) -> Lapsed:
        """End an open answer whose pump went silent past its lease: the owed errors and the
        close, written with epoch 1 (the lost pump, at epoch 0, is fenced off)."""
        log = await _read_whole(self._origin, path, credentials)
        match log:
            case None:
                self._metrics.resume_lapsed.labels("unreadable").inc()
                return Unreadable()
            case (_, True):
                return Ended()
            case (messages, False):
                owed = Finale.of_log(messages).still_owed()
        headers = [
            *credentials, ("Content-Type", JSON), ("Producer-Id", path.rsplit("/", 1)[-1]),
            ("Producer-Epoch", "1"), ("Producer-Seq", "0"), ("Stream-Closed", "true"),
        ]  # fmt: skip
        status = await write_once(
            self._origin, "POST", path, headers, append_body(owed) if owed else b""
        )
        if status in (200, 204):
            self._metrics.resume_lapsed.labels("fenced").inc()
            return Ended()
        again = await _read_whole(self._origin, path, credentials)
        if again is not None and again[1]:
            return Ended()  # another reader ended it first
        self._metrics.resume_lapsed.labels("unwritable").inc()
        return Unwritable(owed=owed)


async def _hand_over(
    response: aiohttp.ClientResponse,
    decoder: SseDecoder,
    pending: list[dict[str, str]],
    handoff: Handoff,
    limit: int,
) -> None:
    """The rest of an outgrown answer to its own client, not kept; the upstream answer is
    closed (by the caller) once the client is gone, or once an event not yet ended holds more
    than ``limit`` characters (an upstream that never ends a line)."""
    for waiting in pending:
        if not await handoff.put(waiting):
            return
    # A quiet upstream is not waited on once the client is gone: an answer with no end of its
    # own (a GET's feed) would hold its upstream for ever.
    left = asyncio.ensure_future(handoff.left())
    try:
        while True:
            read = asyncio.ensure_future(response.content.readany())
            await asyncio.wait({read, left}, return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                read.cancel()
                return
            chunk = read.result()
            if not chunk:
                break
            for event in decoder.feed(chunk):
                message = kept_message(event)
                if message is not None and not await handoff.put(message):
                    return
            if decoder.held > limit:
                logger.info("resume route: an unkept answer's event outgrew %d bytes", limit)
                break
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        logger.info("resume route: an unkept answer broke off upstream: %r", error)
    finally:
        left.cancel()
    await handoff.put(None)


@dataclass(frozen=True, slots=True)
class Ended:
    """The answer's stream is closed now: read on to its end."""


@dataclass(frozen=True, slots=True)
class Unwritable:
    """The origin can be read but would not end the answer: the reader gives its client
    ``owed`` itself."""

    owed: list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Unreadable:
    """The answer's log could not be read (the origin away): whether the pump is lost or only
    waiting out the same outage cannot be told, so the reader ends nothing and tells its
    client nothing; it cuts the client short, to resume with its last id once the log can be
    read (then the answer goes on, or its lease has lapsed and it is ended for every reader)."""


Lapsed = Ended | Unwritable | Unreadable


async def _chunks_or_silence(
    response: aiohttp.ClientResponse, quiet: float
) -> AsyncGenerator[bytes | None]:
    """The upstream answer's chunks, and None for each ``quiet`` seconds without one."""
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(response.content.readany())
            done, _ = await asyncio.wait({pending}, timeout=quiet)
            if not done:
                yield None
                continue
            chunk, pending = pending.result(), None
            if not chunk:
                return
            yield chunk
    finally:
        if pending is not None:
            pending.cancel()


async def _read_whole(
    origin: OriginClient, path: str, credentials: list[tuple[str, str]]
) -> tuple[list[Any], bool] | None:
    """An answer's stream as kept so far, and whether it is closed; None if unreadable."""
    try:
        response = await origin.open("GET", f"{path}?offset=-1", credentials, live=False)
    except OriginError:
        return None
    try:
        if response.status != 200:
            return None
        messages = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    finally:
        response.close()
    closed = response.headers.get("Stream-Closed", "").lower() == "true"
    return (messages if isinstance(messages, list) else []), closed


class StreamWriter:
    """One answer's writes to its stream, as one idempotent producer (``Producer-Id`` the
    stream's name, epoch 0, one sequence number per write): a write the origin may or may not
    have taken (no answer, a 5xx, a pump stopped mid-write) is sent again with the same number,
    and the origin takes it once."""

    def __init__(
        self, origin: OriginClient, metrics: Metrics, path: str, credentials: list[tuple[str, str]]
    ) -> None:
        self.path = path
        self._origin = origin
        self._metrics = metrics
        self._credentials = credentials
        self._producer = path.rsplit("/", 1)[-1]
        self._seq = 0
        self._pending: tuple[tuple[tuple[str, str], ...], bytes] | None = None

    async def append(self, messages: Sequence[dict[str, Any]]) -> bool:
        started = time.perf_counter()
        taken = await self._send((), append_body(messages))
        self._metrics.resume_append_seconds.observe(time.perf_counter() - started)
        return taken

    async def close(self) -> bool:
        return await self._send((("Stream-Closed", "true"),), b"")

    async def settle(self) -> bool:
        """The write a stopped pump left unanswered, sent again (taken once either way)."""
        if self._pending is None:
            return True
        extra, body = self._pending
        return await self._send(extra, body)

    async def _send(self, extra: tuple[tuple[str, str], ...], body: bytes) -> bool:
        self._pending = (extra, body)
        headers = [
            *self._credentials, ("Content-Type", JSON), ("Producer-Id", self._producer),
            ("Producer-Epoch", "0"), ("Producer-Seq", str(self._seq)), *extra,
        ]  # fmt: skip
        status = 0
        for attempt in range(WRITE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_FIRST_SECONDS * 2 ** (attempt - 1))
            status = await write_once(self._origin, "POST", self.path, headers, body)
            if 0 < status < 500:
                break
        if status not in (200, 204):  # 200 taken, 204 taken before (or the close)
            logger.warning("resume stream %s: the origin answered a write %d", self.path, status)
            return False
        self._pending = None
        self._seq += 1
        return True


async def write_once(
    origin: OriginClient, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> int:
    """One write to the origin; its status (0: no answer)."""
    try:
        response = await origin.open(
            method, path, headers, _body(body) if body else None, live=False
        )
    except OriginError as error:
        logger.warning("resume stream %s: %s to the origin failed: %r", path, method, error)
        return 0
    try:
        await response.read()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return 0
    finally:
        response.close()
    return response.status


async def _body(body: bytes) -> AsyncIterator[bytes]:
    yield body
