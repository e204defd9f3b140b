"""What the tests of resume routes share (``test_resume_routes.py``, ``test_resume_faults.py``,
``test_resume_attacks.py``, ``test_resume_auth.py``, ``test_resume_fleet.py``): the agent backend
of ``devstack/mcp_upstream.py`` (the SDK's server at ``/mcp``, the raw SSE answers at ``/raw``)
with what reached it and the edge flags that route to it, the raw call posted to it
(``devstack.raw_call``, which ``loadtest.resume_cost`` posts too), an origin that goes away and
comes back with what it kept, and the reads of an answer: its events
(``devstack.sse_viewer.sse_events``), a resume of it, what its stream holds at the origin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import mcp.types as types
import pytest

from devstack.demo_resume import kept
from devstack.mcp_client import CallLog, call
from devstack.processes import Edge, Origin, Process, free_port, start_mcp_upstream, start_origin
from devstack.raw_call import CALL, MCP_HEADERS
from devstack.sse_viewer import sse_events
from edge.protocol.reads import PUBLIC_SCOPE
from edge.protocol.sse import SseDecoder, SseEvent
from edge.resume.ids import parse_id, stream_name
from tests.integration.replicas import start_replicas

__all__ = [
    "CALL",
    "MCP_HEADERS",
    "RESULT",
    "Backend",
    "RestartableOrigin",
    "answers_heard",
    "dropped_call",
    "id_after",
    "kept_at",
    "kept_so_far",
    "messages",
    "read_resume",
    "read_until_cut",
    "slow_ended",
    "sse_events",
    "start_backend",
    "steps_and_end",
    "two_edges",
    "until",
    "until_kept",
]

# The final message of the backend's raw answers (``/raw/paced``, ``/raw/slow``...).
RESULT = {"jsonrpc": "2.0", "id": 42, "result": {}}


@dataclass
class Backend:
    """The agent backend, and every request that reached it (one JSON line each in ``seen``)."""

    process: Process
    seen: Path

    @property
    def mcp_url(self) -> str:
        return str(self.process.ready["url"])

    @property
    def raw_url(self) -> str:
        return self.mcp_url.removesuffix("/mcp") + "/raw"

    def mcp_route(self) -> tuple[str, str]:
        """An edge's flags for the route ``/mcp`` to the SDK's server."""
        return ("--resume-route", f"/mcp={self.mcp_url}")

    def raw_route(self) -> tuple[str, str]:
        """An edge's flags for the route ``/raw`` to the raw answers."""
        return ("--resume-route", f"/raw={self.raw_url}")

    def seen_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.seen.read_text().splitlines()]

    def stop(self) -> None:
        self.process.stop()


def start_backend(logs: Path, name: str = "mcp-upstream") -> Backend:
    seen = logs / "seen.jsonl"
    seen.touch()
    return Backend(process=start_mcp_upstream(logs, seen, name=name), seen=seen)


@contextmanager
def two_edges(
    origin_url: str, logs: Path, names: tuple[str, str], *flags: str
) -> Iterator[tuple[Edge, Edge]]:
    """Two edges with ``flags`` (a resume route among them), started together, stopped on
    leaving."""
    a, b = start_replicas(origin_url, logs, list(names), *flags)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


class RestartableOrigin:
    """An origin of the test's own on a fixed port and data directory, so that it can be
    stopped and started again with what it kept; ``origin`` is the one started last."""

    def __init__(self, logs: Path, name: str) -> None:
        self._logs, self._name = logs, name
        self._port, self._data = free_port(), logs / f"{name}-data"
        self.origin = self._start(name)

    def _start(self, name: str) -> Origin:
        return start_origin(self._logs, data_dir=self._data, port=self._port, name=name)

    @property
    def url(self) -> str:
        return self.origin.url

    def stop(self) -> None:
        self.origin.stop()

    def start_again(self) -> None:
        self.origin = self._start(f"{self._name}-again")


async def until(check: Callable[[], bool], seconds: float = 60) -> None:
    """Wait for what ``check`` looks for (a process's doing, seen from outside), failing after
    ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not seen in {seconds} s"
        await asyncio.sleep(0.05)


async def slow_ended(backend: Backend, tag: str) -> str:
    """How the backend's ``/raw/slow`` answer tagged ``tag`` ended, once it has."""

    def ends() -> list[str]:
        return [line["end"] for line in backend.seen_lines() if line.get("slow") == tag]

    await until(lambda: bool(ends()))
    return str(ends()[0])


def messages(events: list[SseEvent]) -> list[Any]:
    return [json.loads(event.data) for event in events]


def steps_and_end(events: list[SseEvent]) -> tuple[list[Any], dict[str, Any]]:
    """The progress of an answer's notifications, and its last message (a result or an error)."""
    *progress, end = messages(events)
    return [message["params"]["progress"] for message in progress], end


async def id_after(answer: aiohttp.ClientResponse, count: int) -> str:
    """The id of an answer's ``count``-th event (one of the edge's), once read."""
    last = (await sse_events(answer, SseDecoder(), count))[count - 1].id
    assert last is not None
    return last


async def read_resume(
    client: aiohttp.ClientSession,
    url: str,
    last_id: str,
    headers: Mapping[str, str] | None = None,
) -> list[SseEvent]:
    """A resume at ``url`` after ``last_id``, served (200), read to its end."""
    asked = {**(headers or {}), "Last-Event-ID": last_id}
    async with client.get(url, headers=asked) as answer:
        assert answer.status == 200
        return await sse_events(answer, SseDecoder())


async def read_until_cut(
    response: aiohttp.ClientResponse, decoder: SseDecoder
) -> tuple[list[SseEvent], bool]:
    """The answer's events to its end, and whether it was cut short (not ended)."""
    events: list[SseEvent] = []
    try:
        async for chunk in response.content.iter_any():
            events.extend(decoder.feed(chunk))
    except aiohttp.ClientPayloadError:
        return events, True
    return events, False


async def kept_at(origin: Origin, path: str) -> tuple[list[Any], bool]:
    """The backend's events an answer's stream (``path``, its ``Edge-Resume-Stream``) holds at
    the origin now (not the edge's own messages), and whether it is closed."""
    return await kept(origin.url, path)


async def kept_so_far(origin: Origin, token: str) -> tuple[list[Any], bool]:
    """``kept_at`` for the answer an id's ``token`` names (without ``--auth``)."""
    return await kept_at(origin, "/_edge/resume/" + stream_name(token, PUBLIC_SCOPE))


async def until_kept(origin: Origin, token: str, events: int) -> None:
    """Until the answer ``token`` names holds ``events`` of the backend's events at the origin
    (the pump's doing, seen from outside); it must still be open."""
    deadline = asyncio.get_running_loop().time() + 60
    held, closed = await kept_so_far(origin, token)
    while len(held) < events:
        assert asyncio.get_running_loop().time() < deadline, held
        await asyncio.sleep(0.05)
        held, closed = await kept_so_far(origin, token)
    assert not closed


async def dropped_call(url: str, request: types.CallToolRequest, events: int) -> CallLog:
    """An SDK session's call through ``url``, dropped by its client after ``events`` events
    (the lift: the connection is gone mid-call); what it heard."""
    heard = CallLog()
    running = asyncio.create_task(call(url, request, heard))
    while len(heard.tokens) < events:
        assert not running.done(), running
        await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    return heard


def answers_heard(sessions: list[CallLog]) -> list[set[str]]:
    """The answers (their tokens) the edge's ids each SDK session heard name; every id it heard
    must be the edge's."""
    answers = []
    for heard in sessions:
        points = [parse_id(token) for token in heard.tokens]
        assert all(point is not None for point in points)
        answers.append({point.token for point in points if point is not None})
    return answers
