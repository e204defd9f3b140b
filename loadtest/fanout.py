"""Fan-out benchmark: N SSE viewers of one agent run, through the edge vs straight from the origin.

    .venv/bin/python -m loadtest.fanout --viewers 1000 5000 10000 --seconds 15

For each N and each target (edge, origin) in one run: an agent appends 20 events/s, each a JSON
item stamped with its send time; N viewers hold SSE connections (spread over worker processes,
raw sockets, uvloop); a sample of them decodes every event and records append→viewer latency.
It prints a table and writes it to docs/benchmarks.md: p50/p99 latency, viewers that got every
event, origin live connections (peak), edge CPU (cores busy) and RSS (peak).

Everything runs on this machine's 2 cores: the viewers' own processes compete with the edge, so
the figures are a floor for what the edge does on a machine of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from devstack.processes import REPO
from edge.protocol.sse import SseDecoder
from loadtest.benchkit import (
    Bench,
    EdgeDidNotStart,
    command_line,
    now_utc,
    pinned,
    proc_cpu_seconds,
    proc_peak_rss_mb,
    proc_rss_mb,
    publish,
)
from loadtest.rawhttp import run_client

SAMPLED_PER_WORKER = 100
CONNECT_BATCH = 250


@dataclass
class WorkerReport:
    connected: int
    failed: int
    latencies: list[float]
    complete: int  # sampled viewers that saw every event


class RawViewer(asyncio.Protocol):
    """One SSE connection over HTTP/1.0 (no chunked framing to undo). Most only count bytes;
    sampled ones decode events and time them against the stamp the agent put in each item."""

    # The edge rotates SSE connections (--sse-max-seconds, §10.2): a sampled viewer resumes
    # from its last event id as real clients do; set once the run is over.
    stopping = False

    def __init__(
        self,
        request: bytes,
        sampled: bool,
        latencies: list[float],
        address: tuple[str, int, str] = ("", 0, ""),
    ) -> None:
        self.request = request
        self.address = address  # host, port, path: where a sampled viewer resumes
        self.last_id: str | None = None
        self.resumed = 0
        self.sampled = sampled
        self.latencies = latencies
        self.decoder = SseDecoder()
        self.in_body = False
        self.head = b""
        self.seen: set[int] = set()
        self.connected = asyncio.get_running_loop().create_future()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.in_body:
            self.head += data
            head, sep, rest = self.head.partition(b"\r\n\r\n")
            if not sep:
                return
            self.in_body = True
            if not self.connected.done():
                self.connected.set_result(head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")))
            data = rest
        if not self.sampled:
            return
        now = time.time()
        for event in self.decoder.feed(data):
            if event.id is not None:
                self.last_id = event.id
            if event.event == "data":
                for item in json.loads(event.data):
                    if item["seq"] not in self.seen:
                        self.seen.add(item["seq"])
                        self.latencies.append(now - item["t"])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.connected.done():
            self.connected.set_result(False)
        elif self.sampled and not RawViewer.stopping and self.last_id is not None:
            self.resume()

    def resume(self) -> None:
        host, port, path = self.address
        self.request = (
            f"GET {path}?offset={self.last_id}&live=sse HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n"
        ).encode()
        self.in_body, self.head, self.closed = False, b"", False
        self.decoder = SseDecoder()
        self.resumed += 1
        asyncio.get_running_loop().create_task(
            asyncio.get_running_loop().create_connection(lambda: self, host, port)
        )


async def _worker_main(
    ready: Any,
    stop: Any,
    host: str,
    port: int,
    path: str,
    count: int,
    hold_seconds: float,
    events: int,
) -> WorkerReport:
    loop = asyncio.get_running_loop()
    request = f"GET {path}?offset=now&live=sse HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode()
    latencies: list[float] = []
    viewers: list[RawViewer] = []
    transports: list[asyncio.BaseTransport] = []
    failed = 0
    for start in range(0, count, CONNECT_BATCH):
        batch = []
        for index in range(start, min(count, start + CONNECT_BATCH)):
            viewer = RawViewer(request, index < SAMPLED_PER_WORKER, latencies, (host, port, path))
            batch.append(loop.create_connection(lambda v=viewer: v, host, port))
            viewers.append(viewer)
        for result in await asyncio.gather(*batch, return_exceptions=True):
            if isinstance(result, BaseException):
                failed += 1
            else:
                transports.append(result[0])
    oks = await asyncio.gather(
        *(v.connected for v in viewers if not v.connected.done() or True), return_exceptions=True
    )
    connected = sum(1 for ok in oks if ok is True)
    ready.put(connected)  # the agent starts only once every worker's viewers are in
    # Hold until the parent says the agent is done (and a grace period has passed), however long
    # a saturated server made the agent's appends take; hold_seconds is only a safety net.
    await loop.run_in_executor(None, stop.wait, hold_seconds)
    RawViewer.stopping = True
    for transport in transports:
        transport.close()
    complete = sum(1 for v in viewers if v.sampled and len(v.seen) >= events)
    return WorkerReport(
        connected=connected,
        failed=failed + count - connected,
        latencies=latencies,
        complete=complete,
    )


def _worker(args: tuple[str, int, str, int, float, int], ready: Any, stop: Any, queue: Any) -> None:
    queue.put(run_client(_worker_main(ready, stop, *args)))


async def agent(base: str, path: str, rate: float, seconds: float) -> int:
    count = int(rate * seconds)
    async with aiohttp.ClientSession() as http:
        started = time.monotonic()
        for seq in range(count):
            body = json.dumps([{"seq": seq, "t": time.time()}]).encode()
            async with http.post(
                base + path, data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status in (200, 204), r.status
            await asyncio.sleep(max(0.0, started + (seq + 1) / rate - time.monotonic()))
    return count


async def create(base: str, path: str) -> None:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http, http.put(base + path, headers=headers) as r:
        assert r.status in (200, 201), r.status


def run_case(
    bench: Bench, target: str, viewers: int, args: argparse.Namespace, edge_workers: int
) -> dict[str, Any]:
    seconds, rate, workers, cores = args.seconds, args.rate, args.workers, bench.cores
    origin = bench.origin(f"origin-{target}-{viewers}")
    # 0: the edge's own default, derived from its open-file limit (edge.web.descriptors).
    cap = ["--max-connections", str(args.max_connections)] if args.max_connections else []
    edge = None
    try:
        if target == "edge":
            # One worker is pinned beside the origin (which does almost nothing here: one
            # tail); more workers take every core.
            edge = bench.edge(
                origin, *cap, "--workers", str(edge_workers), name=f"edge-{target}-{viewers}",
                cores=cores.server if edge_workers == 1 else cores.every,
            )  # fmt: skip
        base = edge.url if edge else origin.url
        host, port = base.removeprefix("http://").split(":")
        path = f"/v1/stream/fanout-{viewers}-{int(time.time())}"
        asyncio.run(create(base, path))
        events = int(rate * seconds)
        hold = 10 * seconds + 120  # a safety net only: workers stop when told
        context = multiprocessing.get_context("fork")
        queue: Any = context.Queue()
        ready: Any = context.Queue()
        stop: Any = context.Event()
        per_worker = [
            viewers // workers + (1 if i < viewers % workers else 0) for i in range(workers)
        ]
        procs = [
            context.Process(
                target=_worker, args=((host, int(port), path, n, hold, events), ready, stop, queue)
            )
            for n in per_worker
        ]
        with pinned(cores.load):
            for proc in procs:
                proc.start()
        for _ in procs:
            ready.get(timeout=120)
        time.sleep(1.0)  # the last viewers' first frames
        origin.reset_counts()
        pid = edge.process.pid if edge else origin.process.pid
        cpu_before, wall_before = proc_cpu_seconds(pid), time.monotonic()
        appended = asyncio.run(agent(base, path, rate, seconds))
        cpu = (proc_cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
        rss_now = proc_rss_mb(pid)
        time.sleep(3.0)  # the last events' way to the last viewers
        stop.set()
        reports: list[WorkerReport] = [queue.get(timeout=hold + 60) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        latencies = sorted(x for r in reports for x in r.latencies)
        counts = origin.counts(path)
        sampled = min(viewers, SAMPLED_PER_WORKER * workers)
        refused = refusals(edge.metrics_text()) if edge else {}
        return {
            "target": target,
            "viewers": viewers,
            "connected": sum(r.connected for r in reports),
            "events": events,
            "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1]
            if latencies
            else float("nan"),
            "complete": f"{sum(r.complete for r in reports)}/{sampled}",
            "origin_live_peak": counts["peak_open_live"],
            "cpu_cores": cpu,
            "rss_mb": rss_now,
            "rss_peak_mb": proc_peak_rss_mb(pid),
            "appends_ok": f"{appended}/{events}",
            "refused": refused,
        }
    finally:
        if edge:
            edge.stop()
        origin.stop()


def refusals(metrics_text: str) -> dict[str, int]:
    """The edge's ``edge_refusals_total`` by kind (every reason together)."""
    by_kind: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if line.startswith("edge_refusals_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            by_kind[kind] = by_kind.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return by_kind


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| viewers | target | connected | p50 ms | p99 ms | sampled viewers with every event "
        "| origin live conns (peak) | server CPU (cores) | server RSS MB (peak) "
        "| agent appends ok | edge refusals (sse / write) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        target = r["target"]
        if target == "edge" and r.get("edge_workers", 1) != 1:
            target = f"edge --workers {r['edge_workers']}"
        counts = r["refused"]
        refused = (
            f"{counts.get('sse', 0)} / {counts.get('write', 0)}" if target != "origin" else "-"
        )
        lines.append(
            f"| {r['viewers']} | {target} | {r['connected']} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['complete']} | {r['origin_live_peak']} | "
            f"{r['cpu_cores']:.2f} | {r['rss_mb']:.0f} ({r['rss_peak_mb']:.0f}) | "
            f"{r['appends_ok']} | {refused} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--viewers", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument(
        "--targets", nargs="+", default=["edge", "origin"], choices=["edge", "origin"]
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the agent writes")
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--workers", type=int, default=2, help="viewer processes")
    parser.add_argument(
        "--edge-workers", type=int, nargs="+", default=[1], help="edge --workers values to run"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=0,
        help="the edge's --max-connections (the whole edge's, shared by its workers); 0, the "
        "default, passes none: the edge derives it from its open-file limit",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the origin and a one-worker edge on the first core, the viewers and the agent on "
        "the others: what one core of edge carries",
    )
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args()
    bench = Bench.begin("edge-fanout-", pin=args.pin)
    cores = bench.cores
    if args.pin:
        os.sched_setaffinity(0, cores.load)  # the agent, in this process
    rows = []
    try:
        for viewers in args.viewers:
            for target in args.targets:
                for edge_workers in args.edge_workers if target == "edge" else [0]:
                    row = run_case(bench, target, viewers, args, edge_workers)
                    row["edge_workers"] = edge_workers
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    except EdgeDidNotStart:
        return 2
    rendered = table(rows)
    print(rendered)
    # A pinned run is its own section: the per-core figures the capacity plan reads.
    heading = "## Fan-out on one pinned core" if args.pin else "## Fan-out ("
    pinning = f"Pinned: {bench.pinning('the origin')}.\n\n" if args.pin else ""
    section = (
        f"{heading.rstrip(' (')} ({now_utc()})\n\n"
        f"`{command_line('loadtest.fanout')}` — an agent appends "
        f"{args.rate:g} JSON events/s for {args.seconds:g} s; viewers join at `offset=now` "
        f"over SSE "
        f"from {args.workers} worker processes on the same 2-core machine; latency is append "
        f"(agent clock) → decoded at a sampled viewer ({SAMPLED_PER_WORKER} per worker).\n\n"
        f"{pinning}"
        f"{rendered}\n\n"
    )
    publish(args.output, heading, section, any_date=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
