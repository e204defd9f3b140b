"""Cached hits side by side: the origin alone, the edge in front of it, nginx in front of it.

    .venv/bin/python -m loadtest.hits [--edge-args "--workers 1"] [--duration 5] [--runs 3]
        [--connections 64] [--cells 100B 64KB ...] [--profile [PATH]] [--no-write]

One invocation starts one reference origin, one edge (``python -m edge serve`` with
``--edge-args``) and one Debian nginx (``proxy_cache``, one worker: see ``loadtest/nginx.py``),
all in front of the same origin and on the same cores. Closed ``text/plain`` streams of 100 B and
64 KB are created at the origin. For each cell (body size by identity or ``Accept-Encoding:
gzip``, and a closed range read from a mid-stream offset) every server is read once to warm its
cache, then checked: status 200, the bytes written (gzip decompressed), and a hit where there is
a cache. Then ``wrk -t1 -cC -dDs --latency`` per server, the servers interleaved run by run so
a neighbour's burst of load spreads over all three; medians of ``--runs``; every server checked
again afterwards. Prints a table (req/s, p99, edge/origin, edge/nginx) and inserts it at the top
of docs/benchmarks.md (``--no-write``: print only).

Servers run on core 0 and wrk on core 1 when this process may use two cores; an edge with
``--workers N`` (N > 1) gets every core, so it shares core 1 with wrk. ``--profile`` adds a run
of the 100 B identity cell against the edge under ``py-spy record`` and prints its top frames.

Rules this module owns:
* No figure without checked bytes: a server that answers a cell wrongly (status, encoding,
  bytes) before or after its timing, or not from its cache, fails the run (exit 1).
* The edge is whatever ``python -m edge serve`` is installed, with ``--edge-args``: a flag it
  does not know fails the run (exit 2) with the edge's own message, never a silent default.
* Cells and servers are compared within one run only; a run's section names its command, its
  date, the edge's revision, its pinning and the machine's load.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.processes import REPO, ProcessFailed, new_logs_dir, start_edge, start_origin
from loadtest import pyspy, wrk
from loadtest.benchkit import (
    affinity_of,
    append,
    close_stream,
    create_stream,
    edge_workers,
    insert_section,
    pinned,
    plan_cores,
    raise_nofile,
    request,
    split_edge_args,
    text_body,
)
from loadtest.nginx import NginxFailed, start_nginx

CONTENT_TYPE = "text/plain"
PREFIX_BYTES = 1024  # what a mid-stream read skips
SERVERS = ("origin", "edge", "nginx")


@dataclass(frozen=True, kw_only=True)
class Cell:
    label: str
    size: int
    gzip: bool
    mid: bool


CELLS = {
    "100B": Cell(label="100 B", size=100, gzip=False, mid=False),
    "64KB": Cell(label="64 KB", size=64 * 1024, gzip=False, mid=False),
    "100B-gzip": Cell(label="100 B, gzip", size=100, gzip=True, mid=False),
    "64KB-gzip": Cell(label="64 KB, gzip", size=64 * 1024, gzip=True, mid=False),
    "64KB-mid": Cell(label="64 KB from a mid-stream offset", size=64 * 1024, gzip=False, mid=True),
}


@dataclass(frozen=True, kw_only=True)
class Stream:
    target: str  # path?offset=...
    body: bytes  # what a read of target must return


class WrongBytes(RuntimeError):
    pass


def make_stream(origin: str, size: int, mid: bool, stamp: str) -> Stream:
    path = f"/v1/stream/hits-{size}{'-mid' if mid else ''}-{stamp}"
    create_stream(origin, path, CONTENT_TYPE)
    offset = "-1"
    if mid:
        offset = append(origin, path, text_body(PREFIX_BYTES, seed=size + 1), CONTENT_TYPE)
    body = text_body(size, seed=size)
    append(origin, path, body, CONTENT_TYPE)
    close_stream(origin, path, CONTENT_TYPE)
    return Stream(target=f"{path}?offset={offset}", body=body)


def headers_for(cell: Cell) -> dict[str, str]:
    return {"Accept-Encoding": "gzip"} if cell.gzip else {}


def check(base: str, stream: Stream, cell: Cell) -> tuple[str, str]:
    """One read; the bytes must be the stream's. Returns (encoding served, cache status)."""
    status, headers, data = request(base, "GET", stream.target, headers=headers_for(cell))
    encoding = headers.get("content-encoding", "identity")
    if status != 200:
        raise WrongBytes(f"{base}{stream.target}: HTTP {status}")
    if encoding == "gzip" and cell.gzip:
        data = gzip.decompress(data)
    elif encoding != "identity":
        raise WrongBytes(f"{base}{stream.target}: unexpected Content-Encoding {encoding}")
    if data != stream.body:
        raise WrongBytes(
            f"{base}{stream.target}: {len(data)} bytes, not the {len(stream.body)} written"
        )
    cache = headers.get("cache-status") or headers.get("x-cache-status") or "-"
    return encoding, cache


def is_hit(server: str, cache: str) -> bool:
    if server == "edge":
        return "hit" in [part.strip() for part in cache.split(";")[1:]]
    if server == "nginx":
        return cache == "HIT"
    return True


def warm_and_check(bases: dict[str, str], stream: Stream, cell: Cell) -> dict[str, str]:
    """Every cache warm and every answer right; returns the encoding each server serves."""
    served = {}
    for server, base in bases.items():
        check(base, stream, cell)
        for _ in range(20):
            encoding, cache = check(base, stream, cell)
            if is_hit(server, cache):
                break
            time.sleep(0.1)
        else:
            raise WrongBytes(f"{server} does not answer {stream.target} from cache: {cache}")
        served[server] = encoding
    return served


def git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    return revision + ("+dirty" if git("status", "--porcelain", "--", "edge") else "")


def fmt_rps(value: float) -> str:
    return f"{value:,.0f}"


def render(rows: list[dict[str, object]]) -> str:
    lines = [
        "| cell | served as (o/e/n) | origin req/s | origin p99 ms | edge req/s | edge p99 ms "
        "| nginx req/s | nginx p99 ms | edge/origin | edge/nginx | worst run spread |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        med: dict[str, dict[str, float]] = row["medians"]  # type: ignore[assignment]
        cells = [str(row["cell"]), str(row["served"])]
        for server in SERVERS:
            cells += [fmt_rps(med[server]["rps"]), f"{med[server]['p99_ms']:.2f}"]
        cells += [
            f"{med['edge']['rps'] / med['origin']['rps']:.2f}\u00d7",
            f"{med['edge']['rps'] / med['nginx']['rps']:.2f}\u00d7",
            f"{row['spread']:.0%}",
        ]
        if row["errors"]:
            cells[0] += f" (**{row['errors']} errors**)"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_cell(
    cell: Cell,
    stream: Stream,
    bases: dict[str, str],
    args: argparse.Namespace,
    load: frozenset[int],
) -> dict[str, object]:
    served = warm_and_check(bases, stream, cell)
    runs: dict[str, list[wrk.WrkRun]] = {server: [] for server in SERVERS}
    for _ in range(args.runs):
        for server in SERVERS:
            result = wrk.run(
                bases[server] + stream.target,
                headers=headers_for(cell),
                connections=args.connections,
                duration_s=args.duration,
                cores=load,
            )
            runs[server].append(result)
    for base in bases.values():  # still right after the load
        check(base, stream, cell)
    medians = {
        server: {
            "rps": statistics.median(r.rps for r in results),
            "p99_ms": statistics.median(r.p99_ms for r in results),
        }
        for server, results in runs.items()
    }
    spread = max(
        (max(r.rps for r in rs) - min(r.rps for r in rs)) / statistics.median(r.rps for r in rs)
        for rs in runs.values()
    )
    row: dict[str, object] = {
        "cell": cell.label,
        "served": "/".join(served[s] for s in SERVERS),
        "medians": medians,
        "runs_rps": {s: [round(r.rps) for r in rs] for s, rs in runs.items()},
        "errors": sum(r.errors for rs in runs.values() for r in rs),
        "spread": spread,
    }
    print(json.dumps(row), flush=True)
    return row


def profile(
    edge_pid: int, base: str, stream: Stream, args: argparse.Namespace, load: frozenset[int]
) -> tuple[Path, pyspy.Frames]:
    output = Path(args.profile)
    cell = CELLS["100B"]
    warm_and_check({"edge": base}, stream, cell)
    seconds = max(1, round(args.duration))
    recorder = pyspy.start(edge_pid, seconds, output, load)
    time.sleep(0.5)  # attached before the load starts
    wrk.run(
        base + stream.target,
        headers={},
        connections=args.connections,
        duration_s=seconds + 1,
        cores=load,
    )
    pyspy.finish(recorder, output)
    return output, pyspy.top_frames(output.read_text())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.hits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--edge-args", default="", help="passed to `edge serve` (shell words)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="wrk runs per server and cell")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c")
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--no-pin", action="store_true", help="run everything on every core")
    parser.add_argument(
        "--profile",
        nargs="?",
        const=f"/tmp/edge-hits-profile-{time.strftime('%Y%m%d-%H%M%S')}.txt",
        help="py-spy the edge under the 100 B identity load; folded stacks to PATH",
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if wrk.wrk_binary() is None:
        print("wrk not found: `make bootstrap` installs Debian's wrk", file=sys.stderr)
        return 2
    edge_args = split_edge_args(args.edge_args)
    raise_nofile()
    cores = plan_cores(not args.no_pin)
    edge_cores = cores.every if edge_workers(edge_args) > 1 else cores.server
    logs = new_logs_dir("edge-hits-")
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with pinned(cores.server):
        origin = start_origin(logs, name="hits-origin")
    edge = nginx = None
    try:
        try:
            with pinned(edge_cores):
                edge = start_edge(origin.url, logs, *edge_args, name="hits-edge")
        except ProcessFailed as failure:
            print(f"the edge did not start with --edge-args {args.edge_args!r}:", file=sys.stderr)
            print(str(failure)[-3000:], file=sys.stderr)
            return 2
        try:
            with pinned(cores.server):
                nginx = start_nginx(origin.url)
        except NginxFailed as failure:
            print(str(failure), file=sys.stderr)
            return 2
        bases = {"origin": origin.url, "edge": edge.url, "nginx": nginx.url}
        pins = {
            "origin": affinity_of(origin.process.pid),
            "edge": affinity_of(edge.process.pid),
            "nginx": ",".join(sorted({affinity_of(p) for p in nginx.worker_pids()})) or "?",
        }
        print(f"servers: {json.dumps(bases)}; cores: {json.dumps(pins)}; logs in {logs}")
        stamp = str(int(time.time() * 1000))
        streams: dict[tuple[int, bool], Stream] = {}
        cells = [CELLS[name] for name in dict.fromkeys(args.cells)]
        needed = {(c.size, c.mid) for c in cells} | ({(100, False)} if args.profile else set())
        for size, mid in sorted(needed):
            streams[(size, mid)] = make_stream(origin.url, size, mid, stamp)
        rows = [
            run_cell(cell, streams[(cell.size, cell.mid)], bases, args, cores.load)
            for cell in cells
        ]
        profiled = None
        if args.profile:
            profiled = profile(edge.process.pid, edge.url, streams[(100, False)], args, cores.load)
    except (WrongBytes, wrk.WrkFailed, pyspy.ProfileFailed) as failure:
        print(f"benchmark failed: {failure}", file=sys.stderr)
        return 1
    finally:
        if nginx:
            nginx.stop()
        if edge:
            edge.stop()
        origin.stop()
    rendered = render(rows)
    print(rendered)
    profile_text = ""
    if profiled:
        path, frames = profiled
        profile_text = (
            f"\n\n`--profile`: py-spy ({pyspy.SAMPLE_RATE_HZ} Hz, idle left out) on the edge "
            f"under the 100 B identity load, {frames.samples} samples; folded stacks in "
            f"`{path}`.\n\n{pyspy.table(frames)}"
        )
        print(profile_text.strip())
    if not args.no_write:
        write_doc(args, rendered + profile_text, cores.describe(edge_cores), started, load_before)
        print(f"written to {args.output}")
    return 0


def write_doc(
    args: argparse.Namespace,
    body: str,
    pinning: str,
    started: str,
    load_before: tuple[float, float, float],
) -> None:
    date = time.strftime("%Y-%m-%d")
    edge_args = f"`{args.edge_args}`" if args.edge_args else "none"
    heading = f"## Cached hits: origin, edge, nginx ({date}, edge args {edge_args})"
    command = " ".join(["python -m loadtest.hits", *sys.argv[1:]])
    load_after = os.getloadavg()
    section = (
        f"{heading}\n\n"
        f"`{command}` at {started}, edge at `{git_revision()}`. Closed `text/plain` streams "
        f"made at the origin; each cell reads `GET <stream>?offset=-1` (the mid-stream cell: "
        f"`?offset=` the offset after a {PREFIX_BYTES}-byte prefix, a closed range that starts "
        f"inside the stream) with `wrk -t1 -c{args.connections} -d{round(args.duration)}s "
        f"--latency`, gzip cells with `-H 'Accept-Encoding: gzip'`. req/s and p99 are medians "
        f'of {args.runs} runs, the servers interleaved run by run; "worst run spread" is the '
        f"largest (max - min) / median of req/s among the three. Before and after timing, every "
        f"server's answer was the bytes written (gzip decompressed) and a hit where there is a "
        f'cache (edge `Cache-Status: edge; hit`, nginx `X-Cache-Status: HIT`). "served as" is '
        f"the Content-Encoding of origin/edge/nginx (no one compresses under 1 KiB).\n\n"
        f"nginx: Debian's, one worker, `proxy_cache` forced (`proxy_cache_valid 200 304 1h`, "
        f"`proxy_ignore_headers Cache-Control Expires Set-Cookie Vary`), key = request URI + "
        f"`Accept-Encoding`, `access_log off`, `sendfile on`, `tcp_nopush off` (on, it "
        f"stalled each 64 KB hit ~45 ms on loopback). Its gzip rows serve the origin's "
        f"gzip answer, compressed once on the miss and cached: nginx's own `gzip on` would "
        f"compress every hit, as the origin does, so this is the compress-once comparison.\n\n"
        f"Pinning: {pinning}. Load average (1/5/15 min) {load_before[0]:.2f}/"
        f"{load_before[1]:.2f}/{load_before[2]:.2f} before, {load_after[0]:.2f}/"
        f"{load_after[1]:.2f}/{load_after[2]:.2f} after: the machine is shared with other "
        f"engineers' builds and tests, so the figures are noisy; compare ratios from one run.\n\n"
        f"{body}\n"
    )
    insert_section(args.output, heading, section)


if __name__ == "__main__":
    sys.exit(main())
