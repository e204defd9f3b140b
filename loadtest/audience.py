"""Long-poll audience: N viewers follow one stream the way the official client does while an
agent appends, through each server side by side.

    .venv/bin/python -m loadtest.audience [--viewers 300 1000 3000] [--seconds 20] [--rate 20]
        [--targets origin edge-w1 edge-w2 nginx] [--edge-args "..."] [--processes 2]
        [--profile PATH] [--no-pin] [--no-write]

For each viewer count and each target (the origin alone; the edge ``--workers 1`` and
``--workers 2``; Debian nginx as a plain unbuffered proxy, ``loadtest/nginx.py`` with
``cache=False``; all in front of one origin, each run a fresh open ``text/plain`` stream and a
fresh server), ``--processes`` client processes (``audience_clients.py``: raw keep-alive
HTTP/1.1 on uvloop, one connection per viewer) read the stream from ``-1`` and then long-poll it
as the TypeScript client's ``live: true`` does: at once again from each answer's
``Stream-Next-Offset`` with its ``Stream-Cursor``, a 204 polled again with its cursor. Once every
viewer is long-polling at the tail, an agent appends a ``--append-bytes`` line ``--rate`` times a
second straight to the origin (the same writer for every target; each append sent when it is
due, whether or not the previous one was answered: ``writer.Writer``) for ``--seconds``, then closes
the stream; the run ends when every viewer has seen the close (or 30 s after it).

Reported per run: delivery p50/p99/max (from each append's send to each viewer's receipt of the
answer that completed it, every (viewer, append) pair), answers/s (every 200 and 204 the viewers
got, over the run: the agent's first append to the last viewer's close), the server's CPU per
answer (its process tree's CPU seconds from ``/proc/<pid>/stat`` over the run, divided by the
answers), the origin's CPU over the run (the appends, and what a proxy asked it), the GETs of
the stream the origin counted (its launcher's side port), and how many viewers are exact
(``delivery.py``). ``--profile PATH`` records the ``--workers 1`` edge with py-spy over its
runs and prints the top frames (the profiler pauses the edge to sample it: not a run to quote
figures from). Prints the table and inserts it at the top of docs/benchmarks.md (``--no-write``:
print only).

A script of its own, not a mode of ``loadtest.longpoll``: that one parks N long-polls and
releases them with one append, in rounds, on one origin and one edge; this one is a steady
audience over four servers (two edges of their own, nginx), a writer running throughout and a
per-byte account of every viewer, and shares none of its loop.

Rules this module owns:
* Servers run on core 0 (the origin, nginx, the one-worker edge), the two-worker edge on every
  core, the viewers' processes on core 1 (``benchkit``); each target's server is started for
  its run and stopped after, so no run inherits another's connections or caches.
* The targets choose the edge's ``--workers``: ``--edge-args`` naming it is refused (exit 2).
* No figure without checked bytes: a run with a viewer that is not exact, or an agent that
  failed, fails the script (exit 1), after its figures are printed.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.processes import REPO, Edge, Origin
from loadtest import pyspy
from loadtest.audience_clients import Report, client
from loadtest.benchkit import (
    Bench,
    EdgeDidNotStart,
    create_stream,
    edge_workers,
    now_utc,
    pinned,
    proc_cpu_seconds,
    publish,
)
from loadtest.delivery import AppendMissing, Expected, appends_in, percentile
from loadtest.join import final_content, warm_up
from loadtest.nginx import NginxFailed, start_nginx
from loadtest.rawhttp import ClientProcesses
from loadtest.writer import CONTENT_TYPE, WRITER_CONNECTIONS, Writer

TARGETS = ("origin", "edge-w1", "edge-w2", "nginx")
READY_TIMEOUT_S = 120.0
SETTLE_S = 1.0  # after every viewer has sent its first long-poll, for the last ones to park
GRACE_S = 30.0  # after the close, how long viewers may take to see it


@dataclass(frozen=True, kw_only=True)
class Server:
    """The server one run measures, in front of (or being) the origin."""

    name: str
    url: str
    pid: int  # the root of its process tree: the CPU it uses is the tree's
    edge: Edge | None

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", int(parts.port or 80)


@contextlib.contextmanager
def serving(bench: Bench, origin: Origin, name: str, viewers: int) -> Iterator[Server]:
    """``name``'s server, started for one run and stopped after."""
    if name == "origin":
        yield Server(name=name, url=origin.url, pid=origin.process.pid, edge=None)
    elif name == "nginx":
        with pinned(bench.cores.server):
            nginx = start_nginx(origin.url, cache=False)
        try:
            yield Server(name=name, url=nginx.url, pid=nginx.pid, edge=None)
        finally:
            nginx.stop()
    else:
        workers = name.removeprefix("edge-w")
        cores = bench.cores.server if workers == "1" else bench.cores.every
        edge = bench.edge(
            origin, "--workers", workers, name=f"audience-{name}-{viewers}", cores=cores
        )
        try:
            yield Server(name=name, url=edge.url, pid=edge.process.pid, edge=edge)
        finally:
            edge.stop()


def origin_gets(origin: Origin, path: str) -> int:
    counts = origin.counts(path)
    return sum(int(entry["count"]) for entry in counts["requests"] if entry["method"] == "GET")


def run_one(
    bench: Bench, origin: Origin, server: Server, viewers: int, args: argparse.Namespace
) -> dict[str, Any]:
    warm_up(origin, server.url)
    path = f"/v1/stream/audience-{server.name}-{viewers}-{int(time.time() * 1000)}"
    create_stream(origin.url, path, CONTENT_TYPE)
    host, port = server.address
    shares = [
        viewers // args.processes + (i < viewers % args.processes) for i in range(args.processes)
    ]
    clients = ClientProcesses.start(
        client, [(host, port, path, n) for n in shares if n], bench.cores.load
    )
    pipes = clients.pipes
    writer = Writer(origin.url, path, args.rate, args.seconds, args.append_bytes)
    profiler = None
    profile_path = None
    try:
        ready = 0
        for pipe in pipes:
            if not pipe.poll(READY_TIMEOUT_S):
                raise RuntimeError("a client process did not connect its viewers")
            ready += pipe.recv()[1]
        time.sleep(SETTLE_S)
        for pipe in pipes:
            pipe.send(("go", time.monotonic() + 0.1 + args.seconds + GRACE_S))
        time.sleep(0.1)  # the clients zero their counts before the first append
        gets_before = origin_gets(origin, path)
        if args.profile and server.name == "edge-w1":
            profile_path = Path(f"{args.profile}-{viewers}")
            profiler = pyspy.Recorder.start(
                server.pid, profile_path, args.seconds + GRACE_S, bench.cores.load
            )
        cpu_before = proc_cpu_seconds(server.pid)
        origin_cpu_before = proc_cpu_seconds(origin.process.pid)
        started = time.monotonic()
        writer.start()
        ends: list[float | None] = []
        for pipe in pipes:
            remaining = started + args.seconds + GRACE_S + 30 - time.monotonic()
            ends.append(pipe.recv()[1] if pipe.poll(max(0.0, remaining)) else None)
        cpu = proc_cpu_seconds(server.pid) - cpu_before
        origin_cpu = proc_cpu_seconds(origin.process.pid) - origin_cpu_before
        known = [e for e in ends if e is not None]
        finished = max(known) if len(known) == len(ends) else time.monotonic()
        if profiler is not None:
            profiler.stop()
            profiler = None
        writer.join(timeout=120)
        gets = origin_gets(origin, path) - gets_before
        content = final_content(origin.url, path)
        try:
            appends = appends_in(content, writer.sent)
        except AppendMissing as missing:
            writer.error = writer.error or str(missing)
            appends = []
        if len(content) != sum(len(data) for _, data in writer.sent):
            writer.error = (
                writer.error or f"the stream holds {len(content)} bytes, not the appends'"
            )
        expected = Expected.of([content])
        for pipe in pipes:
            pipe.send(("collect", appends, expected))
        reports: list[Report] = [pipe.recv()[1] for pipe in pipes]
    finally:
        if profiler is not None:
            profiler.kill()
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        clients.reap()
    latencies = array.array("d")
    for r in reports:
        latencies.frombytes(r.latencies)
    ordered = sorted(latencies)
    answers = sum(r.answers for r in reports)
    window = finished - started
    row = {
        "viewers": viewers,
        "target": server.name,
        "ready": ready,
        "exact": sum(r.exact for r in reports),
        "unfinished": sum(r.unfinished for r in reports),
        "errors": sum(r.errors for r in reports),
        "some_errors": [e for r in reports for e in r.some_errors][:5],
        "agent_error": writer.error,
        "appends": len(appends),
        "appends_due": writer.due,
        "append_p50_ms": 1000 * percentile(writer.latencies, 0.50),
        "append_p99_ms": 1000 * percentile(writer.latencies, 0.99),
        "never": sum(1 for x in ordered if x == float("inf")),
        "p50_ms": 1000 * percentile(ordered, 0.50),
        "p99_ms": 1000 * percentile(ordered, 0.99),
        "max_ms": 1000 * ordered[-1] if ordered else float("nan"),
        "answers": answers,
        "timeouts": sum(r.timeouts for r in reports),
        "window_s": window,
        "answers_per_s": answers / window if window > 0 else float("nan"),
        "cpu_s": cpu,
        "cpu_us_per_answer": 1e6 * cpu / answers if answers else float("nan"),
        "origin_cpu_s": origin_cpu,
        "origin_gets": gets,
        "profile": str(profile_path) if profile_path else None,
    }
    print(json.dumps(row), flush=True)
    return row


def ms(value: float) -> str:
    return "never" if value == float("inf") else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| viewers | server | exact viewers | delivery p50 ms | p99 ms | max ms | answers/s "
        "| CPU µs / answer | server CPU s | origin CPU s | origin GETs | 204s | appends "
        "| append p50 / p99 ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        exact = f"{r['exact']}/{r['viewers']}"
        if r["exact"] != r["viewers"]:
            exact = f"**{exact}**"
        lines.append(
            f"| {r['viewers']:,} | {r['target']} | {exact} | {ms(r['p50_ms'])} "
            f"| {ms(r['p99_ms'])} | {ms(r['max_ms'])} | {r['answers_per_s']:,.0f} "
            f"| {r['cpu_us_per_answer']:.0f} | {r['cpu_s']:.1f} | {r['origin_cpu_s']:.1f} "
            f"| {r['origin_gets']:,} | {r['timeouts']:,} | {r['appends']}/{r['appends_due']} "
            f"| {ms(r['append_p50_ms'])} / {ms(r['append_p99_ms'])} |"
        )
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["exact"] != r["viewers"] or r["agent_error"]:
            out.append(
                f"{r['target']} at {r['viewers']}: {r['exact']}/{r['viewers']} exact, "
                f"{r['unfinished']} unfinished, {r['errors']} errors {r['some_errors']}, "
                f"agent {r['agent_error']}"
            )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.audience",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--viewers", type=int, nargs="+", default=[300, 1000, 3000])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--seconds", type=float, default=20.0, help="the agent's run, per cell")
    parser.add_argument("--rate", type=float, default=20.0, help="appends per second")
    parser.add_argument("--append-bytes", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--edge-args", default="", help="passed to `edge serve` (not --workers)")
    parser.add_argument("--profile", help="py-spy the --workers 1 edge; folded stacks to PATH-N")
    parser.add_argument("--no-pin", action="store_true", help="run everything on every core")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench.begin("edge-audience-", pin=not args.no_pin, edge_args=args.edge_args)
    if "--workers" in args.edge_args or edge_workers(bench.edge_args) != 1:
        print("--edge-args must not name --workers: the targets choose it", file=sys.stderr)
        return 2
    print(f"logs in {bench.logs}")
    origin = bench.origin("audience-origin")
    rows: list[dict[str, Any]] = []
    try:
        for viewers in args.viewers:
            for name in args.targets:
                with serving(bench, origin, name, viewers) as server:
                    rows.append(run_one(bench, origin, server, viewers, args))
    except EdgeDidNotStart:
        return 2
    except NginxFailed as failure:
        print(str(failure), file=sys.stderr)
        return 2
    finally:
        origin.stop()
    rendered = render(rows)
    print(rendered)
    profiles = []
    for r in rows:
        if r["profile"]:
            frames = pyspy.top_frames(Path(r["profile"]).read_text())
            profiles.append(
                f"`--profile`: py-spy ({pyspy.SAMPLE_RATE_HZ} Hz, idle left out) on the edge "
                f"`--workers 1` under {r['viewers']:,} long-poll viewers, {frames.samples} "
                f"samples, {r['cpu_us_per_answer']:.0f} µs CPU per answer in that (profiled) "
                f"run; folded stacks in `{r['profile']}`.\n\n{pyspy.table(frames)}"
            )
    for text in profiles:
        print("\n" + text)
    if not args.no_write:
        write_doc(args, bench, "\n\n".join([rendered, *profiles]))
    bad = failures(rows)
    for text in bad:
        print(f"not exact: {text}", file=sys.stderr)
    return 1 if bad else 0


def write_doc(args: argparse.Namespace, bench: Bench, body: str) -> None:
    shown = f"`{args.edge_args}`" if args.edge_args else "none"
    heading = f"## Long-poll audience ({now_utc()}, edge args {shown})"
    section = (
        f"{heading}\n\n"
        f"{bench.provenance('loadtest.audience')}. Viewers (one keep-alive HTTP/1.1 connection "
        f"each, {args.processes} client processes on raw sockets) read one open `text/plain` "
        f"stream from `-1` and follow it by long-poll as the official TypeScript client's "
        f"`live: true` does (at once again from each answer's `Stream-Next-Offset` with its "
        f"`Stream-Cursor`); once all are long-polling, an agent appends a "
        f"{args.append_bytes}-byte line {args.rate:g} times a second straight to the origin "
        f"for {args.seconds:g} s (each sent when due, whether or not the previous one was "
        f"answered, up to {WRITER_CONNECTIONS} in flight: a busy origin gets the same appends; "
        f"the last column is how long the origin took to answer them), then closes the "
        f"stream. Servers: the origin alone; the edge "
        f"`--workers 1` and `--workers 2`; nginx as a plain proxy (one worker, "
        f"`proxy_buffering off`, no cache, upstream keep-alive pool of 8,192, "
        f"`proxy_read_timeout 120s`); each started fresh for its run. Delivery: from each "
        f"append's send to each viewer's receipt of the answer that completed it (every "
        f"viewer and append). Answers/s: the 200s and 204s the viewers got from the first append "
        f"to the last viewer's close, over that time; CPU per answer: the server's process "
        f"tree's CPU over the same time (`/proc/<pid>/stat`) / answers. Origin GETs: reads of "
        f"the stream the origin counted over the run (the appends aside). Exact: the viewer "
        f"got every appended byte once, in order (length and SHA-256), and saw the close. "
        f"Pinning: origin, nginx and the one-worker edge on core "
        f"{','.join(map(str, sorted(bench.cores.server)))}, the two-worker edge on every core, "
        f"the viewers on core {','.join(map(str, sorted(bench.cores.load)))}. "
        f"{bench.load_average()}: the machine is shared with other engineers' work, so the "
        f"figures are noisy.\n\n{body}\n"
    )
    publish(args.output, heading, section)


if __name__ == "__main__":
    sys.exit(main())
