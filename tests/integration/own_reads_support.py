"""What the tests of the reads the connection serves itself share (``test_own_reads.py``,
``test_own_reads_auth.py``, ``test_own_relay.py``, ``test_own_heads.py``): the wire helpers of
``test_fast_path`` in one import, requests and streams, the count of reads that entered
aiohttp's request handler (``edge_full_path_requests_total``), and the mixed read load that
must enter none."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from devstack.processes import Edge
from tests.integration.test_fast_path import (
    Raw,
    edge_pair,
    exchange,
    host_port,
    make_stream,
    read_answers,
    request,
    warm,
)
from tests.integration.test_passthrough import call, metric_value

__all__ = [
    "CORS_ORIGIN",
    "READ_KINDS",
    "MixedLoad",
    "Raw",
    "append",
    "edge_pair",
    "exchange",
    "fast_path_answers",
    "full_path_requests",
    "host_port",
    "long_poll",
    "make_stream",
    "poll",
    "read_answers",
    "request",
    "sent_while_stopped",
    "settled",
    "sse",
    "sse_data",
    "tail_of",
    "warm",
]

CORS_ORIGIN = "Origin: https://app.example"
# The kinds of read (``edge_full_path_requests_total{kind}``) none of which may enter aiohttp.
READ_KINDS = ("catchup", "head", "long_poll", "sse")


def fast_path_answers(edge: Edge) -> float:
    """How many answers the edge gave from what it had stored (``FastPath.answer``)."""
    return metric_value(edge.metrics_text(), "edge_fast_path_answers_total")


async def sent_while_stopped(
    edge: Edge, sends: Sequence[tuple[asyncio.StreamWriter, bytes]]
) -> None:
    """Send each payload on its connection while ``edge`` is stopped (SIGSTOP): it meets them
    all in one pass of its loop once it goes on."""
    os.kill(edge.process.pid, signal.SIGSTOP)
    try:
        for writer, payload in sends:
            writer.write(payload)
        await asyncio.gather(*(writer.drain() for writer, _ in sends))
    finally:
        os.kill(edge.process.pid, signal.SIGCONT)


def full_path_requests(edge: Edge, kinds: tuple[str, ...] = READ_KINDS) -> dict[str, float]:
    """How many requests of each kind entered aiohttp's request handler."""
    text = edge.metrics_text()
    return {kind: metric_value(text, "edge_full_path_requests_total", kind=kind) for kind in kinds}


def long_poll(path: str, offset: str, *headers: str) -> bytes:
    return request(f"{path}?offset={offset}&live=long-poll", *headers)


def sse(path: str, offset: str, *headers: str) -> bytes:
    return request(f"{path}?offset={offset}&live=sse", *headers)


async def poll(url: str, path: str, offset: str, *headers: str) -> Raw:
    return (await exchange(url, long_poll(path, offset, *headers), ["GET"]))[0]


async def tail_of(http: aiohttp.ClientSession, url: str) -> str:
    status, headers, _ = await call(http, "GET", url + "?offset=-1")
    assert status == 200
    return dict(headers)["Stream-Next-Offset"]


async def append(http: aiohttp.ClientSession, url: str, data: bytes) -> str:
    status, headers, _ = await call(
        http, "POST", url, headers={"Content-Type": "text/plain"}, data=data
    )
    assert status == 204
    return dict(headers)["Stream-Next-Offset"]


async def settled(edges: tuple[Edge, ...], target: str, *headers: str) -> None:
    """Each edge has learnt the lifetime of a closed stream (it asks the origin once, in the
    background): until then its answers' ``Cache-Control`` differs from an edge's that has,
    so answers compared across edges are read once both know it (``warm``)."""
    for edge in edges:
        await warm(edge.url, target, *headers)


def sse_data(body: bytes) -> bytes:
    """The bytes an SSE answer's ``data`` events carry (not its JSON ``control`` events)."""
    return b"".join(
        line[5:]
        for line in body.split(b"\n")
        if line.startswith(b"data:") and not line.startswith(b"data:{")
    )


# ``at(query, method)``: the request a reader of the load's stream sends for ``query``.
At = Callable[[str, str], bytes]


@dataclass
class MixedLoad:
    """Many clients read one run every way at once while an agent appends to it: catch-ups
    from the start and from each offset they learn, each followed by a HEAD and a read at
    ``now`` (pipelined), long-polls following the tail as the official client does, SSE
    viewers from the start. ``run`` checks every follower got every byte once, in order;
    ``reads`` counts the requests sent."""

    http: aiohttp.ClientSession
    edge: Edge
    url: str  # the stream at the origin
    at: At
    reads: int = 0

    async def follow_by_long_poll(self) -> bytes:
        seen, offset = b"", "-1"
        reader, writer = await asyncio.open_connection(*host_port(self.edge.url))
        try:
            while True:
                writer.write(self.at(f"offset={offset}&live=long-poll", "GET"))
                self.reads += 1
                answer = (await asyncio.wait_for(read_answers(reader, ["GET"]), 10))[0]
                assert answer.status_line.split()[1] in (b"200", b"204"), answer.status_line
                seen += answer.body
                offset = (answer.header(b"Stream-Next-Offset") or b"").decode()
                if answer.header(b"Stream-Closed") == b"true":
                    return seen
        finally:
            writer.close()

    async def catch_up_repeatedly(self, rounds: int) -> None:
        for _ in range(rounds):
            offset = "-1"
            while True:
                self.reads += 1
                answer = (await exchange(self.edge.url, self.at(f"offset={offset}", "GET"),
                                         ["GET"]))[0]  # fmt: skip
                offset = (answer.header(b"Stream-Next-Offset") or b"").decode()
                if answer.header(b"Stream-Up-To-Date"):
                    break
            # A HEAD and a read at ``now``: the origin's to answer, relayed by the connection.
            payload = self.at("", "HEAD") + self.at("offset=now", "GET")
            self.reads += 2
            answers = await exchange(self.edge.url, payload, ["HEAD", "GET"])
            assert [a.status_line.split()[1] for a in answers] == [b"200", b"200"]
            await asyncio.sleep(0.05)

    async def view(self) -> list[Raw]:
        self.reads += 1
        return await exchange(self.edge.url, self.at("offset=-1&live=sse", "GET"), ["GET"])

    async def agent(self, first: bytes, appends: int) -> bytes:
        written = first
        for i in range(1, appends):
            part = f"{i};".encode()
            await append(self.http, self.url, part)
            written += part
            await asyncio.sleep(0.05)
        status, _, _ = await call(self.http, "POST", self.url, headers={"Stream-Closed": "true"})
        assert status == 204
        return written

    async def run(
        self, *, first: bytes, pollers: int, viewers: int, readers: int, rounds: int, appends: int
    ) -> None:
        """The load on a stream made with ``first``, until the agent closes it."""
        polling = [asyncio.ensure_future(self.follow_by_long_poll()) for _ in range(pollers)]
        viewing = [asyncio.ensure_future(self.view()) for _ in range(viewers)]
        reading = [asyncio.ensure_future(self.catch_up_repeatedly(rounds)) for _ in range(readers)]
        await asyncio.sleep(0.3)
        written = await self.agent(first, appends)
        followed = await asyncio.wait_for(asyncio.gather(*polling), 30)
        sse_answers = await asyncio.wait_for(asyncio.gather(*viewing), 30)
        await asyncio.wait_for(asyncio.gather(*reading), 60)
        assert all(seen == written for seen in followed)
        for answer in sse_answers:
            assert sse_data(answer[0].body) == written
