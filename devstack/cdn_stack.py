"""A CDN stack and its clients, for the CDN tests and ``loadtest.cdn``: the real origin, a real
edge told to purge the Varnish in front of it, and Varnish and nginx running the shipped configs
(``devstack.cdn``); answers with their arrival time, herds of identical requests, and the edge's
own count of the requests that reached it.

Rules this module owns:
* What reached the edge is the edge's own count (``edge_requests_total`` on its admin
  ``/metrics``, hit-path answers and every worker folded in), never inferred from timing.
* A stream is made with the protocol's own requests (PUT with a content type, POSTs, POST
  ``Stream-Closed: true``), each answer checked.
"""

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


def tier_url(stack: Stack, tier: str) -> str:
    """Where clients go for ``tier``: "edge" (straight at it), "varnish" or "nginx"."""
    return stack.edge.url if tier == "edge" else stack.cdn(tier).url


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

    @property
    def stored_for(self) -> int | None:
        """The ``ttl`` the nearest cache gave its stored copy (RFC 9211), if it said."""
        found = re.search(r";\s*ttl=(-?\d+)", self.nearest_cache)
        return int(found.group(1)) if found else None

    @property
    def cdn_lifetime(self) -> int | None:
        """The lifetime the edge gives a CDN: ``Surrogate-Control``'s max-age, else
        ``Cache-Control``'s (None: no max-age)."""
        for name in ("Surrogate-Control", "Cache-Control"):
            found = re.search(r"(?:^|[\s,])max-age=(\d+)", self.header(name) or "")
            if found:
                return int(found.group(1))
        return None


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


async def herd_outcomes(
    session: aiohttp.ClientSession, url: str, count: int, *, give_up_after: float = 20.0
) -> list[Answer | BaseException]:
    """``count`` identical GETs of ``url`` at once: each answer with its arrival time, or why it
    never came (a client timeout after ``give_up_after`` seconds)."""
    budget = aiohttp.ClientTimeout(total=give_up_after)

    async def one() -> Answer:
        async with session.get(url, timeout=budget) as response:
            body = await response.read()
            return Answer(response.status, response.headers, body, time.monotonic())

    return await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)


async def herd(
    session: aiohttp.ClientSession, url: str, count: int, *, give_up_after: float = 20.0
) -> list[Answer]:
    """As ``herd_outcomes``, failing if any answer never came."""
    answers = []
    for outcome in await herd_outcomes(session, url, count, give_up_after=give_up_after):
        if isinstance(outcome, BaseException):
            raise outcome
        answers.append(outcome)
    return answers


def long_polls_waiting(edge: Edge) -> int:
    """Long-polls the edge holds now (``edge_long_polls_waiting``)."""
    for line in edge.metrics_text().splitlines():
        if line.startswith("edge_long_polls_waiting "):
            return int(float(line.split()[1]))
    return 0


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


async def long_lived_at_edge(
    session: aiohttp.ClientSession, url: str, *, at_least: int = 60, within: float = 5.0
) -> Answer:
    """Read ``url`` at the edge until it gives a CDN a lifetime of ``at_least`` seconds (a
    stream the edge has only read gets a short one until it has learned, by a HEAD in the
    background, that the stream has no end of life)."""
    deadline = time.monotonic() + within
    while True:
        answer = await fetch(session, url)
        if (answer.cdn_lifetime or 0) >= at_least:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: the edge still gives {answer.headers!r}")
        await asyncio.sleep(0.05)


async def delete(session: aiohttp.ClientSession, url: str) -> None:
    async with session.delete(url) as response:
        assert response.status in (200, 204), response.status


async def append(session: aiohttp.ClientSession, url: str, part: bytes) -> str:
    async with session.post(url, data=part, headers=TEXT) as response:
        assert response.status in (200, 204), response.status
        return response.headers["Stream-Next-Offset"]
