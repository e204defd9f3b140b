"""The agents of a shared run: they write through the edge and follow the session through it.

Rules this module owns:

* Every append is an idempotent producer write (PROTOCOL.md §5.2.1): one ``Producer-Id`` per
  writer, epoch 0, ``seq`` counting appends. A failed or unanswered append is retried with the
  same bytes and the same seq until the origin says 200 (appended) or 204 (it already had it), so
  an edge restart mid-write neither loses nor doubles a message.
* A follower reads the session by SSE through the edge and resumes from the last offset an event
  named (``id:`` of a data event, ``streamNextOffset`` of a control event), so it sees each
  message once, in stream order, across any number of reconnects.
* The worker checks the session between tokens: a ``stop`` makes it write ``stopped`` and nothing
  else; a ``take_over`` makes it write ``yielded`` and wait until the holder releases (or someone
  stops). It closes the stream once the reviewer has signed off, so no writer meets a closed
  stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from devstack import session
from devstack.session import Message, SessionState
from edge.protocol.sse import SseDecoder

RETRY_SECONDS = 30.0


class SessionClosed(Exception):
    """The stream was closed before this append: the run is over."""


@dataclass
class Producer:
    http: aiohttp.ClientSession
    url: str
    producer_id: str
    seq: int = 0
    written: list[Message] = field(default_factory=list)
    retries: int = 0
    credentials: dict[str, str] = field(default_factory=dict)  # e.g. a bearer token

    async def append(self, kind: str, **fields: Any) -> Message:
        message: Message = {"type": kind, "from": self.producer_id, "seq": self.seq, **fields}
        await self._post(session.encode(message), {"Content-Type": session.JSON})
        self.written.append(message)
        self.seq += 1
        return message

    async def close(self) -> None:
        await self._post(b"", {"Stream-Closed": "true"})
        self.seq += 1

    async def _post(self, body: bytes, headers: dict[str, str]) -> None:
        headers = {
            **self.credentials,
            **headers,
            "Producer-Id": self.producer_id,
            "Producer-Epoch": "0",
            "Producer-Seq": str(self.seq),
        }
        give_up = time.monotonic() + RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                async with self.http.post(self.url, data=body, headers=headers) as response:
                    if response.status in (200, 204):
                        return
                    if response.status == 409 and response.headers.get("Stream-Closed"):
                        raise SessionClosed(self.url)
                    if response.status < 500:
                        text = await response.text()
                        raise RuntimeError(f"append refused: {response.status} {text}")
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > give_up:
                raise RuntimeError(f"append {self.producer_id}:{self.seq} never succeeded")
            self.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


@dataclass
class Follower:
    """One reader of the session by SSE, resuming by offset."""

    http: aiohttp.ClientSession
    url: str
    messages: list[Message] = field(default_factory=list)
    offset: str = "-1"
    closed: bool = False
    connections: int = 0
    credentials: dict[str, str] = field(default_factory=dict)  # e.g. a bearer token
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def state(self) -> SessionState:
        return session.fold(self.messages)

    async def wait_for(
        self, predicate: Callable[[Follower], bool], within: float | None = None
    ) -> bool:
        """Wait until ``predicate(self)`` holds (True) or ``within`` seconds pass (False)."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: predicate(self) or self.closed), within
                )
            except TimeoutError:
                return False
            return predicate(self)

    async def run(self, deadline_seconds: float = 4 * 3600.0) -> None:
        give_up = time.monotonic() + deadline_seconds
        while not self.closed and time.monotonic() < give_up:
            self.connections += 1
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await self._read_once()
            if not self.closed:
                await asyncio.sleep(0.1)

    async def _read_once(self) -> None:
        decoder = SseDecoder()
        pending: list[str] = []
        url = f"{self.url}?offset={self.offset}&live=sse"
        async with self.http.get(url, headers=self.credentials) as response:
            if response.status != 200:
                return
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    if event.event == "data":
                        pending.append(event.data)
                        if event.id is not None:
                            await self._commit(pending, event.id, closed=False)
                    elif event.event == "control":
                        control = json.loads(event.data)
                        closed = bool(control.get("streamClosed"))
                        await self._commit(pending, control["streamNextOffset"], closed=closed)
                if self.closed:
                    return

    async def _commit(self, pending: list[str], offset: str, *, closed: bool) -> None:
        async with self._changed:
            for data in pending:
                self.messages.extend(json.loads(data))
            pending.clear()
            self.offset = offset
            self.closed = self.closed or closed
            self._changed.notify_all()


@dataclass
class WorkerReport:
    # Wall-clock seconds (comparable with a browser's Date.now() on the same machine) when the
    # worker saw the stop, and when its ``stopped`` was appended.
    stop_seen_at: float | None = None
    stop_acked_at: float | None = None


def _stopped(follower: Follower) -> bool:
    return follower.state().stopped_by is not None


async def worker(
    producer: Producer,
    follower: Follower,
    parts: Sequence[str],
    rate_per_second: float,
    report: WorkerReport,
    *,
    reviewer_id: str | None = None,
) -> None:
    """Write ``parts`` as tokens (with one tool call early on), obeying stop and take-over."""
    interval = 1.0 / rate_per_second
    await producer.append(session.STATUS, state=session.STARTED)
    index = 0
    while index < len(parts):
        state = follower.state()
        if state.held and state.stopped_by is None:
            await producer.append(session.STATUS, state=session.YIELDED, ref=state.held_by)
            await follower.wait_for(lambda f: not f.state().held or _stopped(f))
            state = follower.state()
            if state.stopped_by is None:
                await producer.append(session.STATUS, state=session.RESUMED, ref=state.released_by)
        if state.stopped_by is not None:
            report.stop_seen_at = time.time()
            await producer.append(session.STATUS, state=session.STOPPED, ref=state.stopped_by)
            report.stop_acked_at = time.time()
            break
        if index == 3:
            call = f"call-{producer.seq}"
            await producer.append(
                session.TOOL_CALL, call=call, name="search", args={"q": "durable streams"}
            )
            await producer.append(session.TOOL_RESULT, call=call, result="3 documents")
        await producer.append(session.TOKEN, text=parts[index])
        index += 1
        # Woken early by a control message, so a stop takes effect within one token's time.
        await follower.wait_for(lambda f: f.state().held or _stopped(f), within=interval)
    else:
        await producer.append(session.STATUS, state=session.DONE)
    if reviewer_id is not None:
        await follower.wait_for(lambda f: reviewer_id in f.state().finished, within=5.0)
    await producer.close()


async def reviewer(producer: Producer, follower: Follower, worker_id: str) -> None:
    """Review each finished line of the worker's answer; sign off when the worker finishes."""
    reviewed = 0
    with contextlib.suppress(SessionClosed):
        while not follower.closed:
            await follower.wait_for(functools.partial(_review_due, worker_id, reviewed))
            lines = _lines(follower.messages, worker_id)
            while reviewed < lines:
                reviewed += 1
                await producer.append(session.REVIEW, text=f"line {reviewed} reads well")
            if worker_id in follower.state().finished:
                await producer.append(session.STATUS, state=session.SIGNED_OFF)
                return


def _review_due(worker_id: str, reviewed: int, follower: Follower) -> bool:
    return _lines(follower.messages, worker_id) > reviewed or worker_id in follower.state().finished


def _lines(messages: Sequence[Message], worker_id: str) -> int:
    return sum(
        1
        for m in messages
        if m.get("type") == session.TOKEN
        and m.get("from") == worker_id
        and str(m.get("text", "")).endswith("\n")
    )


@dataclass
class Run:
    """One shared run: a prompt, a worker and (optionally) a reviewer, each following the
    session through the edge."""

    url: str
    user: Producer
    worker: Producer
    reviewer: Producer | None
    followers: list[Follower]
    report: WorkerReport
    tasks: list[asyncio.Task[None]]

    @property
    def producers(self) -> list[Producer]:
        return [p for p in (self.user, self.worker, self.reviewer) if p is not None]

    async def wait(self, seconds: float) -> None:
        """Until every agent finished and every follower saw the stream close."""
        await asyncio.wait_for(asyncio.gather(*self.tasks), seconds)

    async def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def create_session(
    http: aiohttp.ClientSession, url: str, credentials: dict[str, str] | None = None
) -> None:
    headers = {**(credentials or {}), "Content-Type": session.JSON}
    async with http.put(url, headers=headers) as response:
        if response.status not in (200, 201):
            raise RuntimeError(f"could not create {url}: HTTP {response.status}")


async def start_run(
    http: aiohttp.ClientSession,
    url: str,
    parts: Sequence[str],
    rate_per_second: float,
    *,
    prompt: str = "Explain how the edge keeps every viewer exact.",
    with_reviewer: bool = True,
    credentials: Callable[[str], dict[str, str]] = lambda _: {},
) -> Run:
    """Write the prompt, then start the agents; the stream must exist. ``credentials`` gives
    each writer and reader (by name) the headers it sends, e.g. a token of its own."""
    user = Producer(http, url, "user", credentials=credentials("user"))
    await user.append(session.PROMPT, text=prompt)
    worker_producer = Producer(http, url, "worker", credentials=credentials("worker"))
    reviewer_producer = (
        Producer(http, url, "reviewer", credentials=credentials("reviewer"))
        if with_reviewer
        else None
    )
    worker_follower = Follower(http, url, credentials=credentials("worker"))
    followers = [worker_follower]
    report = WorkerReport()
    tasks = [asyncio.create_task(worker_follower.run())]
    tasks.append(
        asyncio.create_task(
            worker(
                worker_producer,
                worker_follower,
                parts,
                rate_per_second,
                report,
                reviewer_id=reviewer_producer.producer_id if reviewer_producer else None,
            )
        )
    )
    if reviewer_producer is not None:
        reviewer_follower = Follower(http, url, credentials=credentials("reviewer"))
        followers.append(reviewer_follower)
        tasks.append(asyncio.create_task(reviewer_follower.run()))
        tasks.append(asyncio.create_task(reviewer(reviewer_producer, reviewer_follower, "worker")))
    return Run(
        url=url,
        user=user,
        worker=worker_producer,
        reviewer=reviewer_producer,
        followers=followers,
        report=report,
        tasks=tasks,
    )
