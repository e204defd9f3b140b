"""What one resumable answer costs (issue 30): the origin's requests and bytes, and the edge's
CPU per event, for an answer on a resume route; and what one resume (a second reader replaying
the whole answer) costs.

    python -m loadtest.resume_cost [--events 200] [--size 200] [--rounds 3] [--profile RAW]
                                   [--no-write]

Real processes: the reference origin, two edges (``--workers 1`` each) with a resume route,
and a raw SSE backend (``devstack/mcp_upstream.py``'s ``/raw/paced``: N progress
notifications of about ``--size`` bytes of data, then the JSON-RPC result). The answers are
asked of the first edge; each round's back-to-back answer is then resumed from its first event,
on the first edge and on the second. Byte-counting TCP relays in this process sit on the edges'
links (clients to edges, edges to the backend, edges to the origin), so every figure is wire
bytes, heads and chunk framing included; the origin's own request counter (its stats port)
says which requests reached it for the answer's stream. An edge's CPU is its process tree's
(schedstat) from the request to the end of its work for it (the origin holds no read of the
stream open). Each answer is checked: every event once, in order, each with an edge id, then
the result. Bounded: well under a minute at the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devstack.processes import REPO, Edge, Origin, start_edge, start_mcp_upstream
from devstack.raw_call import CALL, MCP_HEADERS
from devstack.sse_viewer import sse_events
from edge.protocol.sse import SseDecoder, SseEvent
from edge.resume.ids import parse_id
from loadtest import pyspy
from loadtest.benchkit import (
    Bench,
    EdgeDidNotStart,
    pinned,
    process_tree,
    publish,
    run_and_wait,
)

# The edge's work for an answer is over once the origin holds no read of its stream open.
SETTLE_SECONDS = 10.0


def cpu_seconds(edge: Edge) -> float:
    """CPU time of the edge's process tree so far, to the nanosecond (schedstat)."""
    return run_and_wait(process_tree(edge.process.pid))[0]


class CountingRelay:
    """A TCP relay to ``target`` that counts the bytes each way: ``sent`` (to the target) and
    ``received`` (from it)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
        self._host, self._port = host, int(port)
        self.sent = 0
        self.received = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._serving: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        """Stop listening and end every relayed connection (each pipe sees its end)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        serving = asyncio.current_task()
        assert serving is not None
        self._serving.add(serving)
        try:
            far_reader, far_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.close()
            return
        finally:
            serving.add_done_callback(self._serving.discard)
        self._open |= {writer, far_writer}
        try:
            await asyncio.gather(
                self._pipe(reader, far_writer, to_target=True),
                self._pipe(far_reader, writer, to_target=False),
            )
        finally:
            self._open -= {writer, far_writer}

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_target: bool
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                if to_target:
                    self.sent += len(chunk)
                else:
                    self.received += len(chunk)
                writer.write(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def snapshot(self) -> tuple[int, int]:
        return self.sent, self.received


@dataclass
class Links:
    upstream: CountingRelay  # in front of the backend
    origin: CountingRelay  # in front of the origin
    clients: list[CountingRelay] = field(default_factory=list)  # in front of each edge

    def snapshot(self) -> dict[str, tuple[int, int]]:
        sent = sum(relay.sent for relay in self.clients)
        received = sum(relay.received for relay in self.clients)
        return {
            "client": (sent, received),
            "upstream": self.upstream.snapshot(),
            "origin": self.origin.snapshot(),
        }

    def all(self) -> list[CountingRelay]:
        return [self.upstream, self.origin, *self.clients]


@dataclass
class Cost:
    """One answer (or resume): what it cost, as measured."""

    events: int
    origin_requests: Counter[str] = field(default_factory=Counter)
    to_origin: int = 0
    from_origin: int = 0
    upstream_sent: int = 0  # the backend's answer, as it reached the edge
    client_received: int = 0  # the client's answer, as it left the edge
    edge_cpu: float = 0.0
    seconds: float = 0.0


def request_kinds(counts: dict[str, Any]) -> Counter[str]:
    """The origin's counted requests for one path, by method (a GET by how it read)."""
    kinds: Counter[str] = Counter()
    for entry in counts["requests"]:
        method, live = entry["method"], entry.get("live")
        name = f"GET {live}" if method == "GET" and live else method
        kinds[name] += int(entry["count"])
    return kinds


def checked(events: list[SseEvent], first: int, last: int) -> None:
    """Progress ``first``..``last`` once each, in order, each with an edge id, then the
    result."""
    *progress, final = [json.loads(event.data) for event in events]
    steps = [message["params"]["progress"] for message in progress]
    if steps != list(range(first, last + 1)):
        raise AssertionError(f"progress {steps[:5]}... != {first}..{last}")
    if final.get("id") != 42 or "result" not in final:
        raise AssertionError(f"final message {final!r}")
    if not all(event.id is not None and parse_id(event.id) is not None for event in events):
        raise AssertionError("an event without an edge id")


class Run:
    def __init__(self, origin: Origin, edges: dict[str, tuple[Edge, str]], links: Links) -> None:
        """``edges``: each edge by name, with the URL of its counting relay."""
        self.origin = origin
        self.edges = edges
        self.links = links
        # The origin's counts for each answer's stream when last measured.
        self._counts_before: dict[str, dict[str, Any]] = {}

    async def _settled(self, path: str) -> dict[str, Any]:
        """The origin's counts for ``path`` once it holds no read of it open."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            counts = await asyncio.to_thread(self.origin.counts, path)
            if sum(counts["open"].values()) == 0 or time.monotonic() > deadline:
                return counts
            await asyncio.sleep(0.05)

    async def measure(
        self,
        client: aiohttp.ClientSession,
        on: str,
        method: str,
        target: str,
        headers: dict[str, str],
    ) -> tuple[Cost, list[SseEvent]]:
        """One request on edge ``on``, read to its end, and what it cost."""
        edge, edge_url = self.edges[on]
        before_links = self.links.snapshot()
        before_cpu = cpu_seconds(edge)
        before_total = (await asyncio.to_thread(self.origin.counts))["total"]
        started = time.monotonic()
        body = CALL if method == "POST" else None
        async with client.request(method, edge_url + target, json=body, headers=headers) as answer:
            if answer.status != 200:
                raise AssertionError(f"{method} {target}: {answer.status}")
            path = answer.headers["Edge-Resume-Stream"]
            events = await sse_events(answer, SseDecoder())
        seconds = time.monotonic() - started
        path_before = request_kinds(self._counts_before.get(path, {"requests": []}))
        counts = await self._settled(path)
        after_cpu = cpu_seconds(edge)
        after_total = (await asyncio.to_thread(self.origin.counts))["total"]
        after_links = self.links.snapshot()
        kinds = request_kinds(counts)
        kinds.subtract(path_before)
        self._counts_before[path] = counts
        elsewhere = after_total - before_total - sum(kinds.values())
        if elsewhere:
            kinds["(other paths)"] = elsewhere
        cost = Cost(
            events=len(events),
            origin_requests=+kinds,
            to_origin=after_links["origin"][0] - before_links["origin"][0],
            from_origin=after_links["origin"][1] - before_links["origin"][1],
            upstream_sent=after_links["upstream"][1] - before_links["upstream"][1],
            client_received=after_links["client"][1] - before_links["client"][1],
            edge_cpu=after_cpu - before_cpu,
            seconds=seconds,
        )
        return cost, events


@dataclass(frozen=True)
class Row:
    name: str
    costs: list[Cost]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def render(rows: list[Row]) -> str:
    lines = [
        "| answer | events to the client | origin requests | bytes to the origin | bytes from "
        "the origin | bytes the backend sent | bytes the client got | edge CPU ms | edge CPU "
        "µs / event | wall s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        costs = row.costs
        kinds: Counter[str] = Counter()
        for cost in costs:
            kinds.update(cost.origin_requests)
        requests = (
            "none"
            if not kinds
            else ", ".join(
                f"{round(count / len(costs), 1):g} {kind}" for kind, count in sorted(kinds.items())
            )
        )
        events = _mean([c.events for c in costs])
        cpu = _mean([c.edge_cpu for c in costs])
        lines.append(
            f"| {row.name} | {events:,.0f} | {requests} "
            f"| {_mean([c.to_origin for c in costs]):,.0f} "
            f"| {_mean([c.from_origin for c in costs]):,.0f} "
            f"| {_mean([c.upstream_sent for c in costs]):,.0f} "
            f"| {_mean([c.client_received for c in costs]):,.0f} "
            f"| {cpu * 1000:,.0f} | {cpu * 1e6 / events:,.0f} "
            f"| {_mean([c.seconds for c in costs]):.1f} |"
        )
    return "\n".join(lines)


async def measure_all(args: argparse.Namespace, bench: Bench) -> list[Row]:
    seen = bench.logs / "seen.jsonl"
    seen.touch()
    with pinned(bench.cores.server):
        upstream = start_mcp_upstream(bench.logs, seen, name="resume-cost-backend")
    origin = bench.origin("resume-cost-origin")
    links = Links(
        upstream=CountingRelay(str(upstream.ready["url"])), origin=CountingRelay(origin.url)
    )
    edges: dict[str, tuple[Edge, str]] = {}
    try:
        upstream_url = await links.upstream.start()
        origin_url = await links.origin.start()
        for name in ("a", "b"):
            with pinned(bench.edge_cores):
                edge = start_edge(
                    origin_url, bench.logs, "--workers", "1", "--resume-route",
                    f"/raw={upstream_url}/raw", *bench.edge_args, name=f"resume-cost-edge-{name}",
                )  # fmt: skip
            relay = CountingRelay(edge.url)
            links.clients.append(relay)
            edges[name] = (edge, await relay.start())
        return await _answers(Run(origin, edges, links), args)
    finally:
        for relay in links.all():
            await relay.close()
        for edge, _ in edges.values():
            edge.stop()
        origin.stop()
        upstream.stop()


RESUMED_HERE = "a resume on the same edge: the whole replayed"
RESUMED_ELSEWHERE = "a resume on another edge: the whole replayed"


async def _answers(run: Run, args: argparse.Namespace) -> list[Row]:
    n, size = args.events, args.size
    kinds = {
        f"{n} events, {args.every_ms:g} ms apart": f"every={args.every_ms / 1000}",
        f"{n} events back to back": "every=0",
    }
    rows: dict[str, list[Cost]] = {name: [] for name in [*kinds, RESUMED_HERE, RESUMED_ELSEWHERE]}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        warm = f"/raw/paced?n={n}&size={size}&every=0"
        for on in ("a", "b"):  # a warm-up on each edge, not counted
            _, events = await run.measure(client, on, "POST", warm, MCP_HEADERS)
            await run.measure(client, on, "GET", "/raw", {"Last-Event-ID": events[0].id or ""})
        profiler = None
        if args.profile is not None:
            edge, _ = run.edges["a"]
            profiler = pyspy.Recorder.start(edge.process.pid, args.profile, 300, args.cores)
        for _ in range(args.rounds):
            for name, pace in kinds.items():
                target = f"/raw/paced?n={n}&size={size}&{pace}"
                cost, events = await run.measure(client, "a", "POST", target, MCP_HEADERS)
                checked(events, 1, n)
                rows[name].append(cost)
            first = {"Last-Event-ID": events[0].id or ""}
            for on, name in (("a", RESUMED_HERE), ("b", RESUMED_ELSEWHERE)):
                cost, replayed = await run.measure(client, on, "GET", "/raw", first)
                checked(replayed, 2, n)
                rows[name].append(cost)
        if profiler is not None:
            frames = pyspy.top_frames(profiler.stop().read_text())
            print(f"py-spy on the edge that relayed the answers:\n{pyspy.table(frames)}\n")
    return [Row(name, costs) for name, costs in rows.items()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.resume_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=200, help="progress events per answer")
    parser.add_argument("--size", type=int, default=200, help="bytes of data per event, about")
    parser.add_argument("--every-ms", type=float, default=20, help="the paced answer's gap")
    parser.add_argument("--rounds", type=int, default=3, help="answers of each kind (mean)")
    parser.add_argument("--edge-args", default="", help="passed to `edge serve` (shell words)")
    parser.add_argument("--pin", action="store_true", help="servers on core 0, this on core 1")
    parser.add_argument(
        "--profile", type=Path, help="py-spy the relaying edge over the measured rounds (raw out)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench.begin("edge-resume-cost-", pin=args.pin, edge_args=args.edge_args)
    try:
        args.cores = bench.cores.load
        rows = asyncio.run(measure_all(args, bench))
    except EdgeDidNotStart:
        return 2
    rendered = render(rows)
    print(rendered)
    if not args.no_write:
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        heading = f"## What one resumable answer costs (issue 30; {date})"
        section = (
            f"{heading}\n\n"
            f"{bench.provenance('loadtest.resume_cost')}. The reference origin, two edges "
            f"(`--workers 1` each) with a resume route (the answers are asked of the first), "
            f"and a raw SSE backend answering a JSON-RPC request with {args.events} progress "
            f"notifications of about {args.size} bytes of data each, then the result. "
            f"Byte-counting TCP relays on the edges' links (clients, backend, origin): wire "
            f"bytes, heads and chunk framing included. Origin requests: what the origin counted "
            f"for the answer's stream (a GET by how it read). Edge CPU: its process tree's "
            f"(schedstat), from the request to the end of the edge's work for it (its tail of "
            f"the stream closed). A resume: a second reader after the answer ended, with the "
            f"first event's id (the rest replayed), on the edge that relayed the answer, then "
            f"on the other (its CPU is that edge's). Means of {args.rounds} answers of each kind "
            f"after a warm-up on each edge; every answer checked (each event once, in order, "
            f"with an edge id, then the result). Pinning: "
            f"{bench.pinning('origin and backend')}. {bench.load_average(minutes='1')}: the "
            f"machine is shared, so CPU and wall figures are noisy.\n\n{rendered}\n"
        )
        publish(args.output, heading, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
