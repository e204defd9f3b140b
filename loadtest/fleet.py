"""The scaled run (issue 19, item 4; a skeleton until the capacity plan's figures exist).

    python -m loadtest.fleet --streams 300 --viewers 5 --hot 3000 --seconds 30

Starts the loopback fleet (``devstack.cluster``: the origin, a Redis Cluster of three primaries
with a replica each, ``--replicas`` edges, HAProxy routed as ``deploy/haproxy/haproxy.cfg``) and
runs, each on a fleet of its own: (i) ``--streams`` live streams with ``--viewers`` SSE viewers
each, an agent appending ``--rate`` stamped items per second to every stream; (ii) one hot
stream with ``--hot`` viewers. Halfway through each, one replica is killed (SIGKILL); its
viewers resume through HAProxy from their last offset. Prints, per scenario: origin live
connections (peak and at the end), origin reads (GETs: tails, fills) per stream per second (the
agents' appends pass through and are not counted), viewers per replica before the kill,
p50/p99 delivery (append to viewer), and how many viewers got every item exactly once, beside
the capacity plan's prediction (``docs/scaling.md``; ``-`` until the plan gives one).

A viewer here is a coroutine on this machine's cores, shared with the fleet: at thousands of
viewers the figures are the load generator's as much as the edge's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from devstack.cluster import Cluster, start_cluster
from edge.protocol.sse import SseDecoder

JSON = {"Content-Type": "application/json"}


@dataclass
class Viewer:
    """What one viewer of a stream got: item numbers in order, delivery latencies."""

    numbers: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    closed: bool = False


async def view(http: aiohttp.ClientSession, url: str, viewer: Viewer) -> None:
    """Read by SSE until the stream closes, resuming from the last event id after any break
    (a killed replica, a rotation), as the official clients do."""
    last: str | None = None
    while not viewer.closed:
        headers = {"Last-Event-ID": last} if last else {}
        decoder = SseDecoder()
        pending: list[str] = []
        try:
            async with http.get(f"{url}?offset=-1&live=sse", headers=headers) as response:
                async for chunk in response.content.iter_any():
                    for event in decoder.feed(chunk):
                        if event.event == "data":
                            pending.append(event.data)
                        elif event.event == "control":
                            now = time.time()
                            for data in pending:
                                for item in json.loads(data):
                                    viewer.numbers.append(int(item["n"]))
                                    viewer.latencies.append(now - float(item["t"]))
                            pending.clear()
                            last = event.id or last
                            if json.loads(event.data).get("streamClosed"):
                                viewer.closed = True
                                return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)


async def agent(http: aiohttp.ClientSession, url: str, rate: float, seconds: float) -> int:
    """Append stamped items at ``rate`` per second for ``seconds``; how many."""
    count = int(rate * seconds)
    started = time.monotonic()
    for n in range(count):
        body = json.dumps([{"n": n, "t": time.time()}]).encode()
        for _ in range(100):
            try:
                async with http.post(url, data=body, headers=JSON) as answer:
                    if answer.status in (200, 204):
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
    return count


def _metric(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _live(cluster: Cluster) -> int:
    open_now = cluster.origin.counts()["open"]
    return int(open_now["sse"] + open_now["long-poll"])


@dataclass
class Report:
    scenario: str
    viewers: int
    streams: int
    peak_origin_live: int = 0
    end_origin_live: int = 0
    origin_reads_per_stream_second: float = 0.0
    viewers_per_replica: list[int] = field(default_factory=list)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    exact: int = 0


async def scenario(
    cluster: Cluster, name: str, streams: int, per_stream: int, args: argparse.Namespace
) -> Report:
    report = Report(scenario=name, viewers=streams * per_stream, streams=streams)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        paths = [f"/v1/stream/fleet-{name}-{i}" for i in range(streams)]
        for path in paths:
            async with http.put(cluster.url + path, headers=JSON) as answer:
                assert answer.status == 201, answer.status
        viewers = [Viewer() for _ in range(streams * per_stream)]
        tasks = [
            asyncio.ensure_future(view(http, cluster.url + paths[i % streams], viewer))
            for i, viewer in enumerate(viewers)
        ]
        await asyncio.sleep(args.connect_seconds)
        cluster.origin.reset_counts()
        started = time.monotonic()
        agents = [
            asyncio.ensure_future(agent(http, cluster.url + path, args.rate, args.seconds))
            for path in paths
        ]
        killed = False
        while not all(task.done() for task in agents):
            report.peak_origin_live = max(report.peak_origin_live, _live(cluster))
            if not killed and time.monotonic() - started >= args.seconds / 2:
                victim = cluster.edges[0]
                report.viewers_per_replica = [
                    _metric(edge.metrics_text(), "edge_sse_viewers") for edge in cluster.edges
                ]
                victim.process.signal(signal.SIGKILL)
                killed = True
            await asyncio.sleep(1.0)
        sent = [task.result() for task in agents]
        report.end_origin_live = _live(cluster)
        reads = sum(
            entry["count"]
            for entry in cluster.origin.counts()["requests"]
            if entry["method"] == "GET"
        )
        report.origin_reads_per_stream_second = reads / streams / args.seconds
        for path in paths:
            async with http.post(cluster.url + path, headers={"Stream-Closed": "true"}):
                pass
        await asyncio.wait(tasks, timeout=30)
        for task in tasks:
            task.cancel()
        latencies = sorted(x for viewer in viewers for x in viewer.latencies)
        if latencies:
            report.p50_ms = statistics.median(latencies) * 1000
            report.p99_ms = latencies[int(len(latencies) * 0.99) - 1] * 1000
        report.exact = sum(
            1
            for i, viewer in enumerate(viewers)
            if viewer.closed and viewer.numbers == list(range(sent[i % streams]))
        )
    return report


def table(reports: list[Report]) -> str:
    rows = [
        "| scenario | viewers | origin live (peak / end) | origin reads/stream/s | viewers per "
        "replica before the kill | p50 / p99 delivery | exact viewers | plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        rows.append(
            f"| {r.scenario} | {r.viewers} ({r.streams} streams) | {r.peak_origin_live} / "
            f"{r.end_origin_live} | {r.origin_reads_per_stream_second:.2f} | "
            f"{r.viewers_per_replica} | {r.p50_ms:.0f} / {r.p99_ms:.0f} ms | "
            f"{r.exact}/{r.viewers} | - |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.fleet", description=__doc__)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--viewers", type=int, default=5, help="SSE viewers per stream")
    parser.add_argument("--hot", type=int, default=3000, help="viewers of the hot stream")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long agents append")
    parser.add_argument("--rate", type=float, default=2.0, help="appends per stream per second")
    parser.add_argument("--connect-seconds", type=float, default=5.0)
    parser.add_argument("--redis-mode", choices=("cluster", "standalone"), default="cluster")
    args = parser.parse_args(argv)
    reports: list[Report] = []
    for name, streams, per_stream in (
        ("streams", args.streams, args.viewers),
        ("hot", 1, args.hot),
    ):
        if streams * per_stream == 0:
            continue
        cluster = start_cluster(
            Path(tempfile.mkdtemp(prefix=f"edge-fleet-{name}-")),
            replicas=args.replicas,
            edge_args=("--tail-linger", "1"),
            redis_mode=args.redis_mode,
        )
        try:
            reports.append(asyncio.run(scenario(cluster, name, streams, per_stream, args)))
        finally:
            cluster.stop()
    print(table(reports))
    return 0 if all(r.exact == r.viewers for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
