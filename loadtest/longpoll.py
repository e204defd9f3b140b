"""Long-poll release: N long-polls at the tail of one stream, released by one append.

    .venv/bin/python -m loadtest.longpoll [--waiters 2000] [--rounds 3] [--edge-args "..."]
        [--targets origin edge] [--processes 2] [--no-write]

For each target (straight at the origin, then through the edge; one origin, a fresh open
``text/plain`` stream each), ``--processes`` client processes (raw asyncio sockets on uvloop,
HTTP/1.1 keep-alive, one connection per waiter) hold ``--waiters`` long-polls
``GET <stream>?offset=<tail>&live=long-poll[&cursor=<Stream-Cursor>]`` at the tail. Once the
server reports them all waiting (the origin's per-stream counter of open long-polls, the edge's
``edge_long_polls_waiting``), the parent sends one append straight to the origin (the same
writer for both targets) and each waiter's latency is from that append's send to its complete
answer (clocks: ``time.monotonic``, one clock for every process of this machine). Every answer
must be a 200 with exactly the appended bytes and ``Stream-Next-Offset`` the append's; a 204
(timeout) before the append is answered by polling again with its ``Stream-Cursor``, as the
protocol's clients do. One unreported warm-up round, then ``--rounds``; p50/p99/max are the
medians over the rounds. Servers on core 0, clients on the other core (see ``benchkit``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.processes import REPO
from loadtest.benchkit import (
    Bench,
    EdgeDidNotStart,
    Target,
    append,
    create_stream,
    publish,
    text_body,
)
from loadtest.longpoll_clients import client
from loadtest.rawhttp import ClientProcesses

CONTENT_TYPE = "text/plain"
WAITING_TIMEOUT_S = 20.0


def waiting_now(target: Target, path: str) -> int:
    if target.edge is None:
        return int(target.origin.counts(path)["open"]["long-poll"])
    total = 0.0
    for line in target.edge.metrics_text().splitlines():
        if line.startswith("edge_long_polls_waiting"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def percentile(sorted_values: list[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * share) - 1))]


def run_target(target: Target, args: argparse.Namespace, load: frozenset[int]) -> dict[str, Any]:
    origin = target.origin
    host, port = target.address
    path = f"/v1/stream/longpoll-{target.name}-{int(time.time() * 1000)}"
    create_stream(origin.url, path, CONTENT_TYPE)
    tail = append(origin.url, path, b"start\n", CONTENT_TYPE)
    shares = [
        args.waiters // args.processes + (i < args.waiters % args.processes)
        for i in range(args.processes)
    ]
    clients = ClientProcesses.start(client, [(host, port, path, n) for n in shares], load)
    pipes = clients.pipes
    rounds: list[dict[str, Any]] = []
    origin_parts = urlsplit(origin.url)
    try:
        for number in range(args.rounds + 1):  # round 0 warms up the edge's tail
            for pipe in pipes:
                pipe.send(("poll", tail))
            sent = sum(pipe.recv()[1] for pipe in pipes)
            deadline = time.monotonic() + WAITING_TIMEOUT_S
            waiting = 0
            while time.monotonic() < deadline:
                waiting = waiting_now(target, path)
                if waiting >= sent:
                    break
                time.sleep(0.05)
            time.sleep(0.2)  # the last waiters' requests past the counter and into their wait
            body = text_body(args.append_bytes, seed=number) + b"\n"
            writer = http.client.HTTPConnection(
                origin_parts.hostname or "127.0.0.1", origin_parts.port, timeout=30
            )
            writer.connect()
            sent_at = time.monotonic()
            writer.request("POST", path, body=body, headers={"Content-Type": CONTENT_TYPE})
            reply = writer.getresponse()
            reply.read()
            writer.close()
            assert reply.status in (200, 204), reply.status
            tail = reply.headers["Stream-Next-Offset"]
            for pipe in pipes:
                pipe.send(("collect", body, tail))
            latencies: list[float] = []
            errors: list[str] = []
            failed = repolls = 0
            for pipe in pipes:
                _, times, some_errors, error_count, polls = pipe.recv()
                latencies += [1000 * (t - sent_at) for t in times]
                errors += some_errors
                failed += error_count
                repolls += polls
            latencies.sort()
            result = {
                "target": target.name,
                "round": number,
                "waiters": sent,
                "seen_waiting": waiting,
                "exact": len(latencies),
                "failed": failed,
                "errors": errors,
                "repolls": repolls,
                "p50_ms": statistics.median(latencies) if latencies else float("nan"),
                "p99_ms": percentile(latencies, 0.99) if latencies else float("nan"),
                "max_ms": latencies[-1] if latencies else float("nan"),
            }
            print(json.dumps(result), flush=True)
            if number > 0:
                rounds.append(result)
    finally:
        for pipe in pipes:
            pipe.send(("stop",))
        clients.reap()
    return {
        "target": target.name,
        "waiters": args.waiters,
        "exact": f"{min(r['exact'] for r in rounds)}/{args.waiters}",
        "failed": sum(r["failed"] for r in rounds),
        "seen_waiting": min(r["seen_waiting"] for r in rounds),
        "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
        "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
        "max_ms": statistics.median(r["max_ms"] for r in rounds),
        "p99_rounds": [round(r["p99_ms"], 1) for r in rounds],
    }


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| target | waiters | exact answers (worst round) | seen waiting (worst round) "
        "| p50 ms | p99 ms | max ms | p99 per round |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['waiters']} | {r['exact']} | {r['seen_waiting']} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
            f"| {', '.join(str(x) for x in r['p99_rounds'])} |"
        )
    by_target = {r["target"]: r for r in rows}
    if "origin" in by_target and "edge" in by_target:
        ratio = by_target["edge"]["p99_ms"] / by_target["origin"]["p99_ms"]
        lines.append(f"\nedge p99 / origin p99: {ratio:.2f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.longpoll",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--waiters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--append-bytes", type=int, default=100)
    parser.add_argument("--edge-args", default="", help="passed to `edge serve` (shell words)")
    parser.add_argument(
        "--targets", nargs="+", default=["origin", "edge"], choices=["origin", "edge"]
    )
    parser.add_argument("--no-pin", action="store_true", help="run everything on every core")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench.begin("edge-longpoll-", pin=not args.no_pin, edge_args=args.edge_args)
    try:
        rows = bench.run_targets(
            "longpoll", args.targets, lambda target: run_target(target, args, bench.cores.load)
        )
    except EdgeDidNotStart:
        return 2
    rendered = render(rows)
    print(rendered)
    if not args.no_write:
        date = time.strftime("%Y-%m-%d")
        shown = f"`{args.edge_args}`" if args.edge_args else "none"
        heading = f"## Long-poll release ({date}, edge args {shown})"
        section = (
            f"{heading}\n\n"
            f"{bench.provenance('loadtest.longpoll')}. {args.waiters} long-polls (HTTP/1.1, "
            f"one connection each, from "
            f"{args.processes} client processes on raw sockets) wait at the tail of one open "
            f"`text/plain` stream, straight at the origin, then through the edge; one "
            f"{args.append_bytes + 1}-byte append, sent straight to the origin, releases them. "
            f"Latency: from the append's send to each waiter's complete answer; every answer "
            f"checked (200, exactly the appended bytes, the append's `Stream-Next-Offset`). "
            f"p50/p99/max are medians of {args.rounds} rounds after a warm-up round. Pinning: "
            f"{bench.pinning('the origin')}. {bench.load_average(minutes='1')}: "
            f"the machine is shared "
            f"with other engineers' work, so the figures are noisy.\n\n{rendered}\n"
        )
        publish(args.output, heading, section)
    failed = sum(r["failed"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
