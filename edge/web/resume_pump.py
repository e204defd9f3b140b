"""The pump of a resume route: an upstream SSE answer copied, detached from its client, into
the durable stream that keeps it (``edge.resume``).

Rules this module owns:

* A kept answer's stream is created at the origin (``PUT``, ``application/json``,
  ``Stream-TTL`` = ``--resume-retention``) before anything of it is read; one the origin will not
  create is not kept (the caller relays the answer without ids, ``edge_resume_unkept_total``).
* The pump runs in a task of its own: a client that leaves cancels none of it (MCP 2025-11-25:
  a disconnect is not a cancellation). It copies the upstream answer to its end, one append per
  upstream chunk, each answered by the origin before the next chunk is read; then it appends
  what a JSON-RPC request is still owed and closes the stream (``Stream-Closed: true``).
* An append the origin refuses stops the pump: what was kept stays, nothing is invented.
* On ``close`` (the process stopping), pumps get ``--drain-seconds`` to finish; the rest end
  their answers with what they still owe, so no reader elsewhere waits for them. A process
  killed outright cannot: a lease is for later (docs/resume.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from edge.config import Settings
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import strip_hop_by_hop
from edge.protocol.sse import SseDecoder
from edge.resume.events import Finale, append_body, kept_message
from edge.resume.ids import ResumePoint, mint_token, stream_name

logger = logging.getLogger(__name__)
T = TypeVar("T")

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


class Pumps:
    """Every pump of this process, and the tasks that outlive the requests that began them."""

    def __init__(self, settings: Settings, metrics: Metrics, origin: OriginClient) -> None:
        self._settings = settings
        self._metrics = metrics
        self._origin = origin
        self._tasks: set[asyncio.Future[Any]] = set()

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
        created and its pump started; None if the origin would not create the stream."""
        token = mint_token()
        path = self._settings.resume_stream_prefix + stream_name(token, scope)
        if not await self._create(path, credentials):
            self._metrics.resume_unkept.inc()
            return None
        self._metrics.resume_streams.inc()
        self.detached(self._pump(response, path, credentials, Finale.of_request(body)))
        passed_on = [
            (name, value)
            for name, value in strip_hop_by_hop(list(response.headers.items()))
            if name.lower() not in NOT_PASSED_ON
        ]
        return Kept(path, ResumePoint(token=token, offset="-1", skip=0), passed_on)

    async def _write(
        self, method: str, path: str, credentials: list[tuple[str, str]],
        extra: Sequence[tuple[str, str]], body: bytes = b"",
    ) -> int:  # fmt: skip
        """One write to the origin; its status (0: no answer)."""
        headers = [*credentials, ("Content-Type", "application/json"), *extra]
        try:
            response = await self._origin.open(
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

    async def _create(self, path: str, credentials: list[tuple[str, str]]) -> bool:
        ttl = str(max(1, round(self._settings.resume_retention_seconds)))
        status = await self._write("PUT", path, credentials, [("Stream-TTL", ttl)])
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
    ) -> None:
        self._metrics.resume_pumps.inc()
        try:
            if await self._copy(response, path, credentials, finale):
                await self._end(path, credentials, finale)
        except asyncio.CancelledError:
            # This process is stopping: what was kept stays, and the answer ends with what it
            # still owes, so no reader waits for it (a replica killed outright cannot: a lease
            # is for later, docs/resume.md).
            await asyncio.shield(self._end(path, credentials, finale))
            raise
        finally:
            response.close()
            self._metrics.resume_pumps.dec()

    async def _copy(
        self,
        response: aiohttp.ClientResponse,
        path: str,
        credentials: list[tuple[str, str]],
        finale: Finale,
    ) -> bool:
        """The upstream answer into the stream, to its end; False if the origin refused it
        (what was kept stays, nothing is invented)."""
        decoder = SseDecoder()
        try:
            async for chunk in response.content.iter_any():
                messages = [
                    message
                    for event in decoder.feed(chunk)
                    if (message := kept_message(event)) is not None
                ]
                for message in messages:
                    finale.heard(message)
                if messages and not await self._append(path, credentials, messages):
                    return False
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            logger.info("resume stream %s: the upstream answer broke off: %r", path, error)
        return True

    async def _end(self, path: str, credentials: list[tuple[str, str]], finale: Finale) -> None:
        """What the request is still owed, then the stream's close."""
        owed = finale.still_owed()
        finale.owed.clear()
        if owed and not await self._append(path, credentials, owed):
            return
        status = await self._write("POST", path, credentials, [("Stream-Closed", "true")])
        if status not in (200, 204):
            logger.warning("resume stream %s: the origin answered its close %d", path, status)

    async def _append(
        self, path: str, credentials: list[tuple[str, str]], messages: list[dict[str, str]]
    ) -> bool:
        started = time.perf_counter()
        status = await self._write("POST", path, credentials, [], append_body(messages))
        self._metrics.resume_append_seconds.observe(time.perf_counter() - started)
        if status not in (200, 204):
            logger.warning("resume stream %s: the origin answered an append %d", path, status)
            return False
        return True


async def _body(body: bytes) -> AsyncIterator[bytes]:
    yield body
