"""A 100 B keep-alive hit against the per-core HTTP ceiling: the edge's stored hit beside nginx
answering ``return 200`` from its config (no proxy, no cache, nothing looked up).

    .venv/bin/python -m loadtest.ceiling [--duration 5] [--runs 3] [--connections 64] [--no-write]

One reference origin, one edge (``--workers 1``) in front of it and Debian nginx (one worker)
answering every request with the same 100 bytes, the servers pinned to one core and ``wrk`` to
the other (``loadtest.benchkit``). The edge's answer is checked (200, the stream's 100 bytes, a
hit), each server is read once to warm it, then ``wrk -t1 -cC -dDs`` per server, interleaved run
by run; medians of ``--runs``. Prints req/s, p99 and the server's CPU per request (its
``/proc`` time over the requests wrk counted), each server's runs and their spread, edge/nginx,
and the issue 29 target (the edge at least half of nginx's ``return 200``), and nginx's CPU per
request over the edge's: what one core gives each when both are bound by it (on a shared
machine wrk's core bounds req/s too, and that ratio still holds). Inserts the table at the top
of docs/benchmarks.md (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import urllib.request
from pathlib import Path

from devstack.processes import REPO
from loadtest import wrk
from loadtest.benchkit import Bench, pinned, proc_cpu_seconds, publish
from loadtest.nginx import start_nginx

BODY = b"x" * 100
STREAM = "/v1/stream/ceiling-100"
TARGET = 0.5  # issue 29: a 100 B keep-alive hit at least half of nginx's `return 200`


def put_stream(origin_url: str) -> None:
    """A closed ``text/plain`` stream of ``BODY``, made at the origin."""
    url = origin_url + STREAM
    for method, headers, data in (
        ("PUT", {"Content-Type": "text/plain"}, None),
        ("POST", {"Content-Type": "text/plain", "Stream-Closed": "true"}, BODY),
    ):
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=10):
            pass


def checked_hit(edge_url: str) -> None:
    for attempt in range(2):  # the first fills, the second is a stored hit
        with urllib.request.urlopen(f"{edge_url}{STREAM}?offset=-1", timeout=10) as answer:
            body, status = answer.read(), answer.headers.get("Cache-Status", "")
        assert body == BODY, body
        if attempt:
            assert status.startswith("edge; hit"), status


def measure(
    url: str, pid: int, bench: Bench, args: argparse.Namespace
) -> tuple[float, float, float]:
    """req/s, p99 ms, CPU µs per request of the server ``pid``."""
    before = proc_cpu_seconds(pid)
    run = wrk.run(
        url, headers={}, connections=args.connections, duration_s=args.duration,
        cores=bench.cores.load,
    )  # fmt: skip
    spent = proc_cpu_seconds(pid) - before
    if run.errors:
        raise SystemExit(f"{url}: {run.errors} errors")
    return run.rps, run.p99_ms, 1e6 * spent / max(1, run.requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.ceiling", description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    bench = Bench.begin("edge-ceiling-", pin=True, edge_args="--workers 1")
    origin = bench.origin("ceiling-origin")
    edge = nginx = None
    try:
        put_stream(origin.url)
        edge = bench.edge(origin, name="ceiling-edge")
        checked_hit(edge.url)
        with pinned(bench.cores.server):
            nginx = start_nginx(origin.url, fixed=BODY)
        servers = {
            "edge": (f"{edge.url}{STREAM}?offset=-1", edge.process.pid),
            "nginx": (f"{nginx.url}/", nginx.worker_pids()[0]),
        }
        for url, _ in servers.values():
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.read() == BODY
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers}
        for _ in range(args.runs):
            for name, (url, pid) in servers.items():
                runs[name].append(measure(url, pid, bench, args))
        checked_hit(edge.url)
    finally:
        if nginx is not None:
            nginx.stop()
        if edge is not None:
            edge.stop()
        origin.stop()
    median = {
        name: tuple(statistics.median(r[i] for r in rows) for i in range(3))
        for name, rows in runs.items()
    }
    ratio = median["edge"][0] / median["nginx"][0]
    heading = f"## A 100 B hit against the per-core ceiling ({bench.started})"
    lines = [
        heading,
        "",
        f"{bench.provenance('loadtest.ceiling')}. {bench.pinning('nginx')}; wrk -t1 "
        f"-c{args.connections} -d{args.duration:g}s, medians of {args.runs} interleaved runs. "
        f"{bench.load_average()}.",
        "",
        "| server | req/s | p99 ms | CPU µs / request | runs (req/s) | runs (CPU µs) | spread |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    for name, rows in runs.items():
        rps, p99, cpu = median[name]
        every = ", ".join(f"{r[0]:,.0f}" for r in rows)
        cpus = ", ".join(f"{r[2]:.1f}" for r in rows)
        spread = (max(r[0] for r in rows) - min(r[0] for r in rows)) / rps
        what = "edge, a stored 100 B hit" if name == "edge" else "nginx `return 200` (100 B)"
        lines.append(
            f"| {what} | {rps:,.0f} | {p99:.2f} | {cpu:.1f} | {every} | {cpus} | {spread:.0%} |"
        )
    per_core = median["nginx"][2] / median["edge"][2]
    lines += [
        "",
        f"edge / nginx `return 200`: **{ratio:.2f}\u00d7** (target \u2265 {TARGET}\u00d7: "
        f"{'met' if ratio >= TARGET else 'not met'}). CPU per request, nginx / edge: "
        f"**{per_core:.2f}\u00d7** (what one core gives each when both are bound by it).",
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        publish(args.output, heading, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
