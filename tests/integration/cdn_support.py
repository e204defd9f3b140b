"""What the CDN tests share: the stack (real origin, real edge, Varnish and nginx running the
shipped configs in front of it), answers with their arrival time, herds, and the edge's own
count of the requests that reached it."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from multidict import CIMultiDictProxy

from devstack.cdn import Cdn, PortTaken, free_port, start_nginx, start_varnish
from devstack.processes import Edge, Origin, start_edge

TEXT = {"Content-Type": "text/plain"}


@dataclass
class Stack:
    origin: Origin
    edge: Edge
    varnish: Cdn
    nginx: Cdn

    def cdn(self, name: str) -> Cdn:
        return {"varnish": self.varnish, "nginx": self.nginx}[name]

    def stop(self) -> None:
        for process in (self.varnish, self.nginx, self.edge):
            process.stop()


def start_stack(origin: Origin, logs_dir: Path, *edge_args: str, name: str = "cdn-edge") -> Stack:
    """An edge told to purge the Varnish in front of it, that Varnish, and nginx. Varnish's port
    is chosen first (the edge's ``--cdn-purge`` names it); if another process takes it before
    Varnish binds, both start again on another."""
    for _ in range(3):
        varnish_port = free_port()
        edge = start_edge(
            origin.url,
            logs_dir,
            *edge_args,
            "--cdn-purge",
            f"varnish=http://127.0.0.1:{varnish_port}/",
            name=name,
        )
        try:
            varnish = start_varnish(edge.url, port=varnish_port)
        except PortTaken:
            edge.stop()
            continue
        try:
            nginx = start_nginx(edge.url)
        except BaseException:
            varnish.stop()
            edge.stop()
            raise
        return Stack(origin=origin, edge=edge, varnish=varnish, nginx=nginx)
    raise RuntimeError("Varnish could not keep a port three times")


def edge_reads(edge: Edge) -> int:
    """Requests that reached the edge other than writes, by the edge's own /metrics (folded
    across workers, hit-path answers included)."""
    total = 0.0
    for line in edge.metrics_text().splitlines():
        if not line.startswith("edge_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if labels.get("kind") != "write":
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def reads_after(edge: Edge, before: int, expected: int, *, within: float = 3.0) -> int:
    """How many reads reached the edge since ``before``, once at least ``expected`` have been
    counted (an answer is counted as it completes, a moment after the client has it) or
    ``within`` has passed."""
    deadline = time.monotonic() + within
    while True:
        seen = edge_reads(edge) - before
        if seen >= expected or time.monotonic() >= deadline:
            return seen
        await asyncio.sleep(0.02)


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    at: float  # monotonic time the whole answer had arrived

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def cache_status(self) -> list[str]:
        """The Cache-Status members, nearest the origin first (every field line, in order)."""
        members: list[str] = []
        for line in self.headers.getall("Cache-Status", []):
            members += [member.strip() for member in line.split(",") if member.strip()]
        return members

    @property
    def nearest_cache(self) -> str:
        return self.cache_status[-1] if self.cache_status else ""


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> Answer:
    async with session.request(method, url, headers=headers, data=data) as response:
        body = await response.read()
        return Answer(response.status, response.headers, body, time.monotonic())


async def herd(
    session: aiohttp.ClientSession, url: str, count: int, *, give_up_after: float = 20.0
) -> list[Answer]:
    """``count`` identical GETs of ``url`` at once; each answer with its arrival time."""
    budget = aiohttp.ClientTimeout(total=give_up_after)

    async def one() -> Answer:
        async with session.get(url, timeout=budget) as response:
            body = await response.read()
            return Answer(response.status, response.headers, body, time.monotonic())

    return await asyncio.gather(*(one() for _ in range(count)))


async def create(
    session: aiohttp.ClientSession,
    url: str,
    parts: list[bytes],
    *,
    close: bool = False,
) -> str:
    """Create the stream at ``url`` (text), append ``parts`` one by one, optionally close it;
    returns its tail offset."""
    async with session.put(url, headers=TEXT) as response:
        assert response.status in (200, 201), response.status
        tail = response.headers["Stream-Next-Offset"]
    for part in parts:
        async with session.post(url, data=part, headers=TEXT) as response:
            assert response.status in (200, 204), response.status
            tail = response.headers["Stream-Next-Offset"]
    if close:
        async with session.post(url, headers={"Stream-Closed": "true"}) as response:
            assert response.status in (200, 204), response.status
    return tail


async def delete(session: aiohttp.ClientSession, url: str) -> None:
    async with session.delete(url) as response:
        assert response.status in (200, 204), response.status


async def append(session: aiohttp.ClientSession, url: str, part: bytes) -> str:
    async with session.post(url, data=part, headers=TEXT) as response:
        assert response.status in (200, 204), response.status
        return response.headers["Stream-Next-Offset"]
