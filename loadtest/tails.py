"""Origin live connections per stream behind HAProxy: the deployed routing against others.

    python -m loadtest.tails --streams 30 --viewers 5 --hot 300

For each routing (``deployed``: the ``backend edges`` lines of ``deploy/haproxy/haproxy.cfg``;
``leastconn``: what it shipped before issue 19; or any ``;``-separated HAProxy lines), starts
the loopback cluster (``devstack.cluster``: origin, Redis, ``--replicas`` edges, HAProxy),
opens ``--viewers`` SSE viewers on each of ``--streams`` JSON streams (interleaved over the
streams, as viewers of many runs arrive), waits ``--settle`` seconds, and reads the origin's
open live connections and each replica's viewers and tails (``edge_sse_viewers``,
``edge_live_tails``). Then ``--hot`` viewers join one more stream: how they spread over the
replicas and how many origin connections that stream costs. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from devstack.cluster import Cluster, deployed_routing, start_cluster
from loadtest.benchkit import metric_total

JSON = {"Content-Type": "application/json"}
LEASTCONN = ("balance leastconn",)


@dataclass
class Run:
    routing: str
    viewers: list[int]
    tails: list[int]
    origin_live: int
    hot_viewers: list[int]
    hot_origin_live: int


def _per_replica(cluster: Cluster, name: str) -> list[int]:
    return [metric_total(edge.metrics_text(), name) for edge in cluster.edges]


def _live(cluster: Cluster, path: str | None = None) -> int:
    open_now = cluster.origin.counts(path)["open"]
    return int(open_now["sse"] + open_now["long-poll"])


async def _view(http: aiohttp.ClientSession, url: str) -> None:
    """An SSE viewer that reads until cancelled (reconnecting if cut)."""
    while True:
        try:
            async with http.get(f"{url}?offset=-1&live=sse") as response:
                async for _ in response.content.iter_any():
                    pass
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)


async def _measure(cluster: Cluster, name: str, args: argparse.Namespace) -> Run:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        prefix = f"/v1/stream/tails-{time.monotonic_ns()}"
        paths = [f"{prefix}-{i}" for i in range(args.streams)]
        for path in [*paths, f"{prefix}-hot"]:
            async with http.put(cluster.url + path, headers=JSON) as answer:
                assert answer.status == 201, answer.status
        viewers = [
            asyncio.ensure_future(_view(http, cluster.url + path))
            for _ in range(args.viewers)
            for path in paths
        ]
        try:
            await asyncio.sleep(args.settle)
            spread = _per_replica(cluster, "edge_sse_viewers")
            tails = _per_replica(cluster, "edge_live_tails")
            origin_live = _live(cluster)
            viewers += [
                asyncio.ensure_future(_view(http, f"{cluster.url}{prefix}-hot"))
                for _ in range(args.hot)
            ]
            await asyncio.sleep(args.settle)
            after = _per_replica(cluster, "edge_sse_viewers")
            hot = [now - before for now, before in zip(after, spread, strict=True)]
            hot_live = _live(cluster, f"{prefix}-hot")
        finally:
            for task in viewers:
                task.cancel()
            await asyncio.gather(*viewers, return_exceptions=True)
    return Run(
        routing=name,
        viewers=spread,
        tails=tails,
        origin_live=origin_live,
        hot_viewers=hot,
        hot_origin_live=hot_live,
    )


def _routing(name: str) -> tuple[str, ...]:
    if name == "deployed":
        return deployed_routing()
    if name == "leastconn":
        return LEASTCONN
    return tuple(line.strip() for line in name.split(";") if line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.tails", description=__doc__)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--viewers", type=int, default=5, help="SSE viewers per stream")
    parser.add_argument("--hot", type=int, default=300, help="viewers of the one hot stream")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--settle", type=float, default=4.0, help="seconds before counting")
    parser.add_argument("--routing", action="append", help="deployed, leastconn, or lines")
    args = parser.parse_args(argv)
    runs: list[Run] = []
    for name in args.routing or ["deployed", "leastconn"]:
        logs = Path(tempfile.mkdtemp(prefix="edge-tails-"))
        cluster = start_cluster(
            logs, replicas=args.replicas, edge_args=("--tail-linger", "1"), routing=_routing(name)
        )
        try:
            runs.append(asyncio.run(_measure(cluster, name, args)))
        finally:
            cluster.stop()
        print(json.dumps(runs[-1].__dict__), file=sys.stderr, flush=True)
    print(
        f"{args.streams} streams x {args.viewers} SSE viewers, then one stream with {args.hot}, "
        f"{args.replicas} replicas behind HAProxy\n"
    )
    print(
        "| routing | viewers per replica | tails per replica | origin live | hot stream: "
        "viewers per replica | hot stream: origin live |"
    )
    print("|---|---|---|---|---|---|")
    for run in runs:
        print(
            f"| {run.routing} | {run.viewers} | {run.tails} | {run.origin_live} "
            f"| {run.hot_viewers} | {run.hot_origin_live} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
