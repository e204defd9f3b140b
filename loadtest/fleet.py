"""The scaled run that checks the capacity plan (issue 19, item 4).

    python -m loadtest.fleet                     # 300 streams x 5 viewers, then 3,000 of one
    python -m loadtest.fleet --streams 30 --hot 300 --seconds 20   # a quicker look

Starts the loopback fleet (``devstack.cluster``: the origin, a Redis Cluster of three primaries
with a replica each, ``--replicas`` edges, HAProxy routed as ``deploy/haproxy/haproxy.cfg``) and
runs, each on a fleet of its own: (i) ``--streams`` live streams with ``--viewers`` SSE viewers
each, an agent appending ``--rate`` stamped items per second to every stream; (ii) one hot
stream with ``--hot`` viewers. Halfway through each, the replica serving the most viewers is
killed (SIGKILL); its viewers resume through HAProxy from their last event id, as
``EventSource`` does. Prints, per scenario, beside what ``loadtest.capacity`` (the plan's
formulas, docs/scaling.md) predicts: origin live connections (before the kill, after it, and
the peak), origin reads (GETs: tails and fills; the agents' appends pass through and are not
counted) per stream per second, viewers per replica before and after the kill, p50/p99 delivery
(append to viewer, before the kill and overall), the edges' CPU, and how many viewers got
every item exactly once. Writes the table to docs/benchmarks.md.

The viewers run in ``--clients`` processes of their own on this machine's cores, shared with
the fleet: at thousands of viewers the latencies are the load generator's as much as the edge's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devstack.agents import Producer
from devstack.cluster import Cluster, start_cluster
from edge.protocol.sse import SseDecoder
from loadtest.benchkit import metric_total, proc_cpu_seconds, write_section
from loadtest.capacity import MEASURED, FleetPrediction, fleet_prediction

JSON = {"Content-Type": "application/json"}
REPO = Path(__file__).resolve().parent.parent
CONNECT_BATCH = 200
# devstack.cluster's health checks (inter 500ms fall 2): how long a dead replica takes
# new connections before HAProxy stops sending them there.
RESUME_DETECTION_S = 1.0


@dataclass
class Viewer:
    """What one viewer of a stream got: item numbers in order, and per item when it arrived
    and how long after its append."""

    numbers: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    connected: bool = False
    closed: bool = False
    resumes: int = 0


async def view(http: aiohttp.ClientSession, url: str, viewer: Viewer) -> None:
    """Read by SSE until the stream closes, resuming from the last event id after any break
    (a killed replica, a rotation), as ``EventSource`` and the official clients do."""
    last: str | None = None
    while not viewer.closed:
        headers = {"Last-Event-ID": last} if last else {}
        decoder = SseDecoder()
        pending: list[str] = []
        try:
            async with http.get(f"{url}?offset=-1&live=sse", headers=headers) as response:
                if response.status != 200:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status
                    )
                viewer.connected = True
                async for chunk in response.content.iter_any():
                    for event in decoder.feed(chunk):
                        if event.event == "data":
                            pending.append(event.data)
                        elif event.event == "control":
                            now = time.time()
                            for data in pending:
                                for item in json.loads(data):
                                    viewer.numbers.append(int(item["n"]))
                                    viewer.arrivals.append(now)
                                    viewer.latencies.append(now - float(item["t"]))
                            pending.clear()
                            last = event.id or last
                            if json.loads(event.data).get("streamClosed"):
                                viewer.closed = True
                                return
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            pass
        viewer.resumes += 1
        await asyncio.sleep(0.2)


async def _client(urls: list[str], ready: Any, stop: Any, hold: float) -> list[Viewer]:
    viewers = [Viewer() for _ in urls]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tasks = []
        for start in range(0, len(urls), CONNECT_BATCH):
            for url, viewer in zip(
                urls[start : start + CONNECT_BATCH],
                viewers[start : start + CONNECT_BATCH],
                strict=True,
            ):
                tasks.append(asyncio.ensure_future(view(http, url, viewer)))
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 60
        while not all(v.connected for v in viewers) and time.monotonic() < deadline:  # noqa: ASYNC110 (polls many flags)
            await asyncio.sleep(0.1)
        ready.put(sum(v.connected for v in viewers))
        deadline = time.monotonic() + hold
        while not stop.is_set() and time.monotonic() < deadline:
            if all(task.done() for task in tasks):
                break
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return viewers


def _client_process(urls: list[str], ready: Any, stop: Any, results: Any, hold: float) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    viewers = asyncio.run(_client(urls, ready, stop, hold))
    results.put([asdict(v) for v in viewers])


async def agent(producer: Producer, rate: float, seconds: float) -> int:
    """Append stamped items at ``rate`` per second for ``seconds``; how many it appended. An
    idempotent producer (Producer-Id/Epoch/Seq), as a real agent is: an append retried after
    its replica died mid-request is taken once by the origin, never twice."""
    count = int(rate * seconds)
    # Agents are not in step: each starts at its own phase of the append period (in step,
    # every stream's append lands in the same millisecond, a burst no real fleet sees).
    await asyncio.sleep(random.uniform(0, 1 / rate))
    started = time.monotonic()
    for n in range(count):
        await producer.append("item", n=n, t=time.time())
        await asyncio.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
    return count


def _live(cluster: Cluster) -> int:
    open_now = cluster.origin.counts()["open"]
    return int(open_now["sse"] + open_now["long-poll"])


def _viewers_per_replica(cluster: Cluster, dead: set[int]) -> list[int | None]:
    return [
        None if i in dead else metric_total(edge.metrics_text(), "edge_sse_viewers")
        for i, edge in enumerate(cluster.edges)
    ]


@dataclass
class Report:
    scenario: str
    viewers: int
    streams: int
    connected: int = 0
    origin_live_before: int = 0
    origin_live_after: int = 0
    origin_live_peak: int = 0
    origin_reads_per_stream_second: float = 0.0
    viewers_before: list[int | None] = field(default_factory=list)
    viewers_after: list[int | None] = field(default_factory=list)
    p50_ms: float = 0.0
    p99_before_ms: float = 0.0
    p99_ms: float = 0.0
    edge_cpu_cores: float = 0.0
    origin_cpu_cores: float = 0.0
    machine_busy_cores: float = 0.0  # everything on the machine: the fleet and its load
    clients_cpu_cores: float = 0.0  # the viewers' own processes
    exact: int = 0
    resumed: int = 0
    prediction: FleetPrediction | None = None


def _busy() -> float:
    """Seconds of CPU the whole machine has spent busy (every core; /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _p(values: list[float], q: float) -> float:
    return 1000 * values[max(0, int(len(values) * q) - 1)] if values else float("nan")


def _edges_cpu(cluster: Cluster, dead: set[int]) -> float:
    return sum(
        proc_cpu_seconds(edge.process.pid) for i, edge in enumerate(cluster.edges) if i not in dead
    )


async def scenario(
    cluster: Cluster, name: str, streams: int, per_stream: int, args: argparse.Namespace
) -> Report:
    report = Report(scenario=name, viewers=streams * per_stream, streams=streams)
    report.prediction = fleet_prediction(streams, per_stream, len(cluster.edges), args.rate)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    context = multiprocessing.get_context("fork")
    ready: Any = context.Queue()
    results: Any = context.Queue()
    stop: Any = context.Event()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        paths = [f"/v1/stream/fleet-{name}-{int(time.time())}-{i}" for i in range(streams)]
        for path in paths:
            async with http.put(cluster.url + path, headers=JSON) as answer:
                assert answer.status == 201, answer.status
        # Viewer v watches stream v % streams: each stream's viewers arrive interleaved with
        # the others', as a real audience does, and are spread over the client processes.
        urls = [cluster.url + paths[v % streams] for v in range(report.viewers)]
        shares = [urls[c :: args.clients] for c in range(args.clients)]
        hold = args.seconds * 3 + 180
        procs = [
            context.Process(
                target=_client_process, args=(share, ready, stop, results, hold), daemon=True
            )
            for share in shares
            if share
        ]
        for proc in procs:
            proc.start()
        try:
            report.connected = sum(ready.get(timeout=180) for _ in procs)
            await asyncio.sleep(2.0)  # the last viewers' tails open
            cluster.origin.reset_counts()
            dead: set[int] = set()
            cpu_before, wall_before = _edges_cpu(cluster, dead), time.monotonic()
            origin_before, machine_before = proc_cpu_seconds(cluster.origin.process.pid), _busy()
            clients_before = sum(proc_cpu_seconds(proc.pid or 0) for proc in procs)
            cpu_of_victim = 0.0
            started_wall = time.time()
            kill_wall = started_wall + args.seconds / 2
            producers = [
                Producer(http, cluster.url + path, producer_id=f"agent-{i}")
                for i, path in enumerate(paths)
            ]
            agents = [
                asyncio.ensure_future(agent(producer, args.rate, args.seconds))
                for producer in producers
            ]
            while not all(task.done() for task in agents):
                live = _live(cluster)
                report.origin_live_peak = max(report.origin_live_peak, live)
                if not dead and time.time() >= kill_wall:
                    report.origin_live_before = live
                    report.viewers_before = _viewers_per_replica(cluster, dead)
                    counts = [v or 0 for v in report.viewers_before]
                    victim = counts.index(max(counts))
                    cpu_of_victim = proc_cpu_seconds(cluster.edges[victim].process.pid)
                    cluster.edges[victim].process.signal(signal.SIGKILL)
                    dead.add(victim)
                await asyncio.sleep(1.0)
            sent = [task.result() for task in agents]
            await asyncio.sleep(args.settle)  # the killed replica's tails end (--tail-linger)
            report.origin_live_after = _live(cluster)
            report.viewers_after = _viewers_per_replica(cluster, dead)
            wall = time.monotonic() - wall_before
            report.edge_cpu_cores = (_edges_cpu(cluster, dead) + cpu_of_victim - cpu_before) / wall
            report.origin_cpu_cores = (
                proc_cpu_seconds(cluster.origin.process.pid) - origin_before
            ) / wall
            report.machine_busy_cores = (_busy() - machine_before) / wall
            report.clients_cpu_cores = (
                sum(proc_cpu_seconds(proc.pid or 0) for proc in procs) - clients_before
            ) / wall
            reads = sum(
                entry["count"]
                for entry in cluster.origin.counts()["requests"]
                if entry["method"] == "GET"
            )
            report.origin_reads_per_stream_second = reads / streams / (args.seconds + args.settle)
            await asyncio.gather(*(producer.close() for producer in producers))
            viewers: list[Viewer] = []
            by_client = [results.get(timeout=hold + 60) for _ in procs]
            stop.set()
            for proc in procs:
                proc.join(timeout=30)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
    # Undo the interleaving: client c held urls[c::clients].
    ordered: list[Viewer | None] = [None] * report.viewers
    for c, got in enumerate(by_client):
        for k, raw in enumerate(got):
            ordered[c + k * args.clients] = Viewer(**raw)
    viewers = [v for v in ordered if v is not None]
    latencies = sorted(x for v in viewers for x in v.latencies)
    before = sorted(
        lat
        for v in viewers
        for lat, at in zip(v.latencies, v.arrivals, strict=True)
        if at < kill_wall
    )
    if latencies:
        report.p50_ms = 1000 * statistics.median(latencies)
        report.p99_ms = _p(latencies, 0.99)
        report.p99_before_ms = _p(before, 0.99)
    report.exact = sum(
        1
        for v_index, viewer in enumerate(ordered)
        if viewer is not None
        and viewer.closed
        and viewer.numbers == list(range(sent[v_index % streams]))
    )
    report.resumed = sum(1 for v in viewers if v.resumes > 0)
    return report


def _span(values: tuple[int, int]) -> str:
    low, high = values
    return str(low) if low == high else f"{low}-{high}"


def _replicas(counts: list[int | None]) -> str:
    return " / ".join("killed" if c is None else str(c) for c in counts)


def table(reports: list[Report], replicas: int) -> str:
    rows = [
        "| scenario | | origin live before / after the kill (peak) | origin reads / stream / s "
        "| viewers per replica before the kill | after | p50 / p99 delivery (p99 before the "
        "kill) | CPU (cores): edges / origin / viewers' processes / machine | exact viewers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        p = r.prediction
        assert p is not None
        rows.append(
            f"| {r.scenario}: {r.viewers} viewers of {r.streams} stream(s), {r.connected} "
            f"connected | measured | {r.origin_live_before} / {r.origin_live_after} "
            f"({r.origin_live_peak}) | {r.origin_reads_per_stream_second:.2f} | "
            f"{_replicas(r.viewers_before)} | {_replicas(r.viewers_after)} | "
            f"{r.p50_ms:.0f} / {r.p99_ms:.0f} ms ({r.p99_before_ms:.0f} ms) | "
            f"{r.edge_cpu_cores:.2f} / {r.origin_cpu_cores:.2f} / {r.clients_cpu_cores:.2f} / "
            f"{r.machine_busy_cores:.2f} | "
            f"{r.exact}/{r.viewers} ({r.resumed} resumed) |"
        )
        rows.append(
            f"| | plan | {_span(p.tails_before)} / {_span(p.tails_after)} | - | "
            f"{_span(p.serving_before)} of {replicas} serving, the busiest "
            f"{_span(p.busiest_before)} | the busiest {_span(p.busiest_after)} | "
            f"before the kill ≤ {MEASURED.p99_ms:.0f} ms (≤ {MEASURED.viewers_per_core:,} "
            f"viewers a core); the kill's resumes add HAProxy's detection (inter x fall: "
            f"{RESUME_DETECTION_S:g} s here) | sends alone {p.edge_cpu_cores:.2f} | all |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.fleet", description=__doc__)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--viewers", type=int, default=5, help="SSE viewers per stream")
    parser.add_argument("--hot", type=int, default=3000, help="viewers of the hot stream")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long agents append")
    parser.add_argument("--rate", type=float, default=1.0, help="appends per stream per second")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds after the agents")
    parser.add_argument("--clients", type=int, default=2, help="viewer processes")
    parser.add_argument("--redis-mode", choices=("cluster", "standalone"), default="cluster")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
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
            edge_args=("--tail-linger", "1", "--workers", "1"),
            redis_mode=args.redis_mode,
            # The reference origin's file store breaks past 100 streams written at once
            # (devstack.cluster.start_cluster says how); its memory store does not.
            origin_on_disk=False,
        )
        try:
            report = asyncio.run(scenario(cluster, name, streams, per_stream, args))
        finally:
            cluster.stop()
        reports.append(report)
        print(json.dumps(asdict(report)), flush=True)
    rendered = table(reports, args.replicas)
    print(rendered)
    if not args.no_write:
        command = " ".join(["python -m loadtest.fleet", *sys.argv[1:]])
        section = (
            f"## The scaled run (issue 19; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
            f"\n\n`{command}`: {args.replicas} replicas (`--workers 1` each) behind HAProxy "
            f"routed as deployed, a Redis {args.redis_mode}, the reference origin; agents append "
            f"{args.rate:g} item/s per stream for {args.seconds:g} s; the replica with the most "
            f"viewers is SIGKILLed halfway. Load average at the end (the run's own): "
            f"{os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores (the viewers' {args.clients} processes share them). The "
            f"plan rows are `loadtest.capacity.fleet_prediction`: the 5th-95th percentile of "
            f"40 simulated placements by HAProxy's bounded-load rule ({MEASURED.source}).\n\n"
            f"{rendered}\n\n"
        )
        write_section(args.output, "## The scaled run (issue 19", section)
    return 0 if all(r.exact == r.viewers for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
