"""Join storm: K viewers open one live run within a second while an agent writes to it.

    .venv/bin/python -m loadtest.join --viewers 5000 [--mode sse|long-poll|mixed]
        [--seconds-to-join 1] [--edge-args "..."] [--targets origin edge] [--gc-pauses]
        [--profile [PATH]] [--step-costs N] [--no-write]

For each target (straight at the origin, then through the edge; one origin, a fresh open
``text/plain`` stream each with ``--history-bytes`` already in it), an agent appends one
``--append-bytes`` line ``--rate`` times a second straight to the origin (the same writer for
both targets), from ``--lead-in`` seconds before the first viewer joins. K viewers join at
evenly spread times over ``--seconds-to-join``. Each (``loadtest/join_clients.py``:
``--processes`` client processes, raw asyncio sockets on uvloop, one keep-alive HTTP/1.1
connection per viewer) does what a client opening a live run does: ``GET ?offset=-1`` (again
from each ``Stream-Next-Offset`` until ``Stream-Up-To-Date``), then follows live from there by
SSE or long-poll (``mixed``: every other viewer each) until the stream says it is closed. The
agent closes the stream once every viewer is live (has the head of its first live answer) and
at least ``--follow`` seconds after the last join, or ``--max-seconds`` after the first.

Per viewer, from its start (it opening its connection): time to the first byte of its catch-up
(TTFB) and to its first live event (an SSE data frame, a long-poll answer with bytes), and the
phases between; every viewer's bytes (catch-up, then live) must equal the stream's final
content, read from the origin at the end. Origin reads: the GETs of the stream the origin
counted (its launcher's side port), the agent's appends aside. The server's CPU from the first
join until every viewer is live is read from ``/proc`` (run, and waited runnable while another
process had the core). ``--step-costs N`` then measures the server's CPU per viewer for each
step of a join alone (``join_clients.step_costs``); ``--gc-pauses`` runs the edge under
``loadtest.gcwatch`` and reports its cyclic collections from the first join to the close;
``--profile`` records the edge with py-spy from the first join until every viewer is live and
prints the top frames. Prints the tables and inserts them at the top of docs/benchmarks.md
(``--no-write``: print only).

Servers run on core 0 and the viewers' processes on core 1 (see ``benchkit``). Rules this
module owns:
* No figure without checked bytes: a viewer whose bytes are not the stream's, or that ended in
  an error, is counted as not exact and fails the run (exit 1), as does an agent's failure. A
  viewer that has not seen the stream's end ``--max-seconds`` + 30 s after the first join is
  *unfinished*: not exact, and a failure through the edge; straight at the origin it is what
  the origin alone could not do, reported as such. A time a viewer never reached counts as
  "never" in its percentiles.
* The edge is ``python -m edge serve`` with ``--edge-args`` (under ``loadtest.gcwatch`` with
  ``--gc-pauses``); a flag it does not know fails the run (exit 2) with its own message.
* A warm-up read of another stream (catch-ups, a long-poll and an SSE read of a closed stream)
  goes to each target first, so a fresh process's first-request costs are not the storm's.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.processes import REPO, Edge, Origin
from loadtest import pyspy
from loadtest.benchkit import (
    Bench,
    EdgeDidNotStart,
    Target,
    append,
    close_stream,
    create_stream,
    process_tree,
    publish,
    request,
    run_and_wait,
    text_body,
)
from loadtest.join_clients import Record, Slot, client, step_costs
from loadtest.rawhttp import ClientProcesses

CONTENT_TYPE = "text/plain"
CLIENT_GRACE_S = 30.0  # after the close, how long viewers may take to see it
PHASES = ("connect_s", "ttfb_s", "caught_up_s", "live_head_s", "first_live_s", "done_s")


def line(seq: int, size: int) -> bytes:
    """One agent line of ``size`` bytes: a sequence number, words, a newline (no line starts
    with a space: the reference origin's SSE drops one)."""
    head = f"{seq:07d} ".encode()
    words = text_body(max(1, size - len(head) - 1), seed=seq).replace(b"\n", b" ")
    return head + words + b"\n"


def history(size: int, line_bytes: int) -> bytes:
    """What a stream holds before its run: lines as the agent writes them (negative numbers)."""
    return b"".join(line(-1 - i, line_bytes) for i in range(max(1, size // line_bytes)))


class Agent(threading.Thread):
    """Appends a line every 1/rate s straight to the origin; once ``release`` is set and
    ``close_at`` (time.monotonic) has come, closes the stream."""

    def __init__(self, origin_url: str, path: str, rate: float, size: int) -> None:
        super().__init__(daemon=True)
        self.origin_url, self.path, self.rate, self.size = origin_url, path, rate, size
        self.close_at = math.inf
        self.release = threading.Event()
        self.appends = 0
        self.latencies: list[float] = []
        self.error: str | None = None
        self.closed_at: float | None = None  # when the close was answered

    def close_when(self, at: float) -> None:
        self.close_at = at
        self.release.set()

    def run(self) -> None:
        parts = urlsplit(self.origin_url)
        connection = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=30
        )
        started = time.monotonic()
        try:
            while not (self.release.is_set() and time.monotonic() >= self.close_at):
                sent = time.monotonic()
                connection.request(
                    "POST",
                    self.path,
                    body=line(self.appends, self.size),
                    headers={"Content-Type": CONTENT_TYPE},
                )
                reply = connection.getresponse()
                reply.read()
                self.latencies.append(time.monotonic() - sent)
                if reply.status not in (200, 204):
                    self.error = f"append {self.appends}: HTTP {reply.status}"
                    return
                self.appends += 1
                time.sleep(max(0.0, started + self.appends / self.rate - time.monotonic()))
            close_stream(self.origin_url, self.path, CONTENT_TYPE)
            self.closed_at = time.monotonic()
        except (OSError, http.client.HTTPException) as failure:
            self.error = f"append {self.appends}: {failure}"
        finally:
            connection.close()


def final_content(origin_url: str, path: str) -> bytes:
    """The closed stream's bytes, read from the origin from -1 to its closed tail."""
    content = bytearray()
    offset = "-1"
    for _ in range(10_000):
        status, headers, data = request(origin_url, "GET", f"{path}?offset={offset}")
        if status != 200:
            raise RuntimeError(f"final read of {path} at {offset}: HTTP {status}")
        content += data
        offset = headers["stream-next-offset"]
        if headers.get("stream-closed") == "true":
            return bytes(content)
    raise RuntimeError(f"final read of {path}: no end")


def warm_up(origin: Origin, base: str) -> None:
    path = f"/v1/stream/join-warm-{int(time.time() * 1000)}"
    create_stream(origin.url, path, CONTENT_TYPE)
    tail = append(origin.url, path, line(0, 100), CONTENT_TYPE)
    close_stream(origin.url, path, CONTENT_TYPE)
    for query in ("offset=-1", "offset=-1", f"offset={tail}&live=long-poll"):
        request(base, "GET", f"{path}?{query}")
    request(base, "GET", f"{path}?offset={tail}&live=sse")


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * share) - 1))]


def mode_of(index: int, mode: str) -> str:
    if mode == "mixed":
        return "sse" if index % 2 == 0 else "long-poll"
    return mode


def run_target(target: Target, args: argparse.Namespace, load: frozenset[int]) -> dict[str, Any]:
    origin, edge, base, server_pid = target.origin, target.edge, target.url, target.pid
    host, port = target.address
    warm_up(origin, base)
    path = f"/v1/stream/join-{target.name}-{int(time.time() * 1000)}"
    create_stream(origin.url, path, CONTENT_TYPE)
    append(origin.url, path, history(args.history_bytes, args.append_bytes), CONTENT_TYPE)
    window = args.seconds_to_join
    slots = [
        Slot(index=i, at=window * i / args.viewers, mode=mode_of(i, args.mode))
        for i in range(args.viewers)
    ]
    deadline = args.max_seconds + CLIENT_GRACE_S
    each = [(host, port, path, slots[n :: args.processes], deadline) for n in range(args.processes)]
    clients = ClientProcesses.start(client, each, load)
    pipes = clients.pipes
    watched = args.gc_pauses and edge is not None
    profiler = None
    agent = Agent(origin.url, path, args.rate, args.append_bytes)
    try:
        for pipe in pipes:
            if not pipe.poll(60) or pipe.recv()[0] != "ready":
                raise RuntimeError("a client process did not start")
        t0 = time.monotonic() + args.lead_in
        agent.start()
        for pipe in pipes:
            pipe.send(("go", t0))
        if args.profile and edge is not None:
            time.sleep(max(0.0, t0 - 0.3 - time.monotonic()))
            profiler = pyspy.Recorder.start(server_pid, Path(args.profile), args.max_seconds, load)
        time.sleep(max(0.0, t0 - time.monotonic()))
        cpu_t0 = run_and_wait(process_tree(server_pid))
        viewers_t0 = run_and_wait(clients.pids)
        if watched:
            os.kill(server_pid, signal.SIGUSR1)  # loadtest.gcwatch: from here on
        all_live: float | None = t0
        for pipe in pipes:  # each process says when its last viewer went live
            remaining = t0 + args.max_seconds - time.monotonic()
            when = pipe.recv()[1] if pipe.poll(max(0.0, remaining)) else None
            all_live = max(all_live, when) if all_live is not None and when else None
        cpu_live = run_and_wait(process_tree(server_pid))
        viewers_live = run_and_wait(clients.pids)
        live_at = time.monotonic()
        if profiler is not None:
            profile_path: Path | None = profiler.stop()
            profiler = None
        else:
            profile_path = None
        agent.close_when(max(t0 + window + args.follow, live_at + 0.5))
        agent.join(timeout=args.max_seconds + 60)
        if watched:
            os.kill(server_pid, signal.SIGUSR1)  # ... to the close
        records: list[Record] = []
        for pipe in pipes:
            message: tuple[str, Any] = ("live", None)
            while message[0] != "done":
                if not pipe.poll(deadline + 60):
                    raise RuntimeError("a client process did not report")
                message = pipe.recv()
            records += message[1]
    finally:
        agent.close_when(0.0)
        if profiler is not None:
            profiler.kill()
        clients.reap()
    counts = origin.counts(path)
    content = final_content(origin.url, path)
    digest = hashlib.sha256(content).hexdigest()
    unfinished = [r for r in records if r.error is not None and r.error.endswith(" at end")]
    cut_short = {r.index for r in unfinished}
    wrong = [
        r
        for r in records
        if (r.error is not None or r.digest != digest) and r.index not in cut_short
    ]
    joined_s = live_at - t0

    def ms(name: str) -> list[float]:
        """Every viewer's time to ``name``; one that never got there counts as never (inf)."""
        values = (getattr(r, name) for r in records)
        return [math.inf if value is None else 1000 * value for value in values]

    row: dict[str, Any] = {
        "target": target.name,
        "mode": args.mode,
        "viewers": args.viewers,
        "exact": len(records) - len(wrong) - len(unfinished),
        "wrong": len(wrong),
        "unfinished": len(unfinished),
        "errors": sorted({r.error or f"{r.size} bytes, not the {len(content)}" for r in wrong})[:5],
        "phases_ms": {
            name: (
                statistics.median(ms(name)) if ms(name) else math.nan,
                percentile(ms(name), 0.99),
            )
            for name in PHASES
        },
        "went_live": sum(1 for r in records if r.first_live_s is not None),
        "all_live_s": all_live - t0 if all_live is not None else None,
        "join_s": joined_s,
        "join_cpu_cores": (cpu_live[0] - cpu_t0[0]) / joined_s,
        "join_starved_cores": (cpu_live[1] - cpu_t0[1]) / joined_s,
        "join_cpu_ms_per_viewer": 1000 * (cpu_live[0] - cpu_t0[0]) / args.viewers,
        "viewers_cpu_cores": (viewers_live[0] - viewers_t0[0]) / joined_s,
        "lag_p99_ms": percentile([1000 * r.lag_s for r in records], 0.99),
        "live_requests": sum(r.live_requests for r in records),
        "reconnects": sum(r.reconnects for r in records),
        "origin_reads": sum(
            r["count"] for r in counts["requests"] if r["method"] in ("GET", "HEAD")
        ),
        "origin_reads_by_live": {
            str(live): sum(
                r["count"] for r in counts["requests"] if r["method"] == "GET" and r["live"] == live
            )
            for live in (None, "long-poll", "sse")
        },
        "origin_appends": sum(r["count"] for r in counts["requests"] if r["method"] == "POST"),
        "origin_live_peak": counts["peak_open_live"],
        "agent_appends": agent.appends,
        "agent_error": agent.error,
        "append_p99_ms": percentile([1000 * x for x in agent.latencies], 0.99),
        "closed_after_t0_s": agent.closed_at - t0 if agent.closed_at else None,
        "stream_bytes": len(content),
        "profile": str(profile_path) if profile_path else None,
    }
    if watched:
        assert edge is not None
        row["gc_pauses"] = gc_pauses(edge)
    if args.step_costs:
        row["step_costs_us"] = measure_steps(target, args, load)
        row["step_count"] = args.step_costs
    print(json.dumps(row), flush=True)
    if args.records:
        dump = Path(f"{args.records}.{target.name}.json")
        at = {slot.index: slot.at for slot in slots}
        dump.write_text(json.dumps([{**r.__dict__, "at": at[r.index]} for r in records]) + "\n")
    return row


def gc_pauses(edge: Edge) -> dict[str, Any] | None:
    """The edge's collections from the first join to the close (``loadtest.gcwatch``)."""
    out = edge.process.log.parent / GC_PAUSES_FILE
    for _ in range(50):
        lines = out.read_text().splitlines() if out.exists() else []
        if lines and len(lines) % 2 == 0:
            found: dict[str, Any] = json.loads(lines[-1])
            return found
        time.sleep(0.1)
    return None


GC_PAUSES_FILE = "gc-pauses.jsonl"


def measure_steps(
    target: Target, args: argparse.Namespace, load: frozenset[int]
) -> dict[str, float]:
    """The server's CPU per connection for each step of a join, on a quiet open stream."""
    origin = target.origin.url
    path = f"/v1/stream/join-steps-{int(time.time() * 1000)}"
    create_stream(origin, path, CONTENT_TYPE)
    tail = append(origin, path, history(args.history_bytes, args.append_bytes), CONTENT_TYPE)
    given = (*target.address, path, tail, args.step_costs, process_tree(target.pid))
    steps = ClientProcesses.start(step_costs, [given], load)
    try:
        if not steps.pipes[0].poll(120):
            raise RuntimeError("the step costs did not come back")
        costs: dict[str, float] = steps.pipes[0].recv()
    finally:
        steps.reap()
    return costs


def _ms(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}"


def _ratio(edge: float, origin: float) -> str:
    if math.isinf(origin):
        return "(the origin's p99 viewer never got there)" if not math.isinf(edge) else "-"
    return f"{edge / origin:.2f}"


def _pair(values: tuple[float, float]) -> str:
    return f"{_ms(values[0])} / {_ms(values[1])}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| server | mode | viewers | TTFB p50 ms | TTFB p99 ms | first live p50 ms "
        "| first live p99 ms | exact viewers | origin reads |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ttfb, live = r["phases_ms"]["ttfb_s"], r["phases_ms"]["first_live_s"]
        lines.append(
            f"| {r['target']} | {r['mode']} | {r['viewers']} | {_ms(ttfb[0])} | {_ms(ttfb[1])} "
            f"| {_ms(live[0])} | {_ms(live[1])} | {r['exact']}/{r['viewers']}"
            + (f" ({r['unfinished']} unfinished)" if r["unfinished"] else "")
            + f" | {r['origin_reads']} |"
        )
    by_target = {r["target"]: r for r in rows}
    if "origin" in by_target and "edge" in by_target:
        edge, origin = by_target["edge"]["phases_ms"], by_target["origin"]["phases_ms"]
        ratios = [
            f"{label} {_ratio(edge[name][1], origin[name][1])}"
            for label, name in (("TTFB", "ttfb_s"), ("first live", "first_live_s"))
        ]
        lines.append(f"\nedge / origin, p99: {', '.join(ratios)}")
    lines += [
        "",
        "Where the time goes (ms from each viewer's start, p50 / p99), and the server from the "
        "first join until every viewer was live:",
        "",
        "| server | connected | first byte | caught up | live answer's head | first live event "
        "| stream closed seen | all live after | server CPU (waiting for a core) "
        "| CPU per viewer | viewers' processes' CPU | live requests | origin live peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r["phases_ms"]
        live = f"{r['all_live_s']:.2f} s" if r["all_live_s"] is not None else "not all"
        lines.append(
            f"| {r['target']} | {' | '.join(_pair(p[name]) for name in PHASES)} | {live} "
            f"| {r['join_cpu_cores']:.2f} ({r['join_starved_cores']:.2f}) cores "
            f"| {r['join_cpu_ms_per_viewer']:.2f} ms | {r['viewers_cpu_cores']:.2f} cores "
            f"| {r['live_requests']} | {r['origin_live_peak']} |"
        )
    for r in rows:
        pauses = r.get("gc_pauses")
        if pauses:
            parts = [
                f"generation {g}: {pauses[g][0]} ({pauses[g][1]:.0f} ms, longest "
                f"{pauses[g][2]:.0f} ms)"
                for g in ("0", "1", "2")
            ]
            lines += [
                "",
                f"The {r['target']}'s cyclic collections from the first join to the close "
                f"(`--gc-pauses`): {'; '.join(parts)}; {pauses['objects']:,} objects tracked "
                "at the close.",
            ]
    costed = [r for r in rows if r.get("step_costs_us")]
    if costed:
        steps = list(costed[0]["step_costs_us"])
        lines += [
            "",
            "The server's CPU per viewer for each step of a join, alone (microseconds; "
            f"`--step-costs`: {costed[0]['step_count']} connections to a quiet open stream, "
            "each step done by all of them in turn):",
            "",
            "| server | " + " | ".join(steps) + " | a whole join |",
            "|---|" + "---:|" * (len(steps) + 1),
        ]
        for r in costed:
            costs = r["step_costs_us"]
            cells = " | ".join(f"{costs[step]:.0f}" for step in steps)
            lines.append(f"| {r['target']} | {cells} | {sum(costs.values()):.0f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.join",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--viewers", type=int, default=1000)
    parser.add_argument("--mode", default="sse", choices=["sse", "long-poll", "mixed"])
    parser.add_argument("--seconds-to-join", type=float, default=1.0)
    parser.add_argument("--lead-in", type=float, default=1.0, help="agent seconds before joins")
    parser.add_argument(
        "--follow", type=float, default=3.0, help="agent seconds at least after the last join"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="the agent closes the stream by then (after the first join) even if not all are live",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="agent appends per second")
    parser.add_argument("--append-bytes", type=int, default=100)
    parser.add_argument("--history-bytes", type=int, default=16 * 1024)
    parser.add_argument("--processes", type=int, default=2, help="viewers' client processes")
    parser.add_argument(
        "--step-costs",
        type=int,
        metavar="N",
        help="after each storm, the server's CPU per join step over N connections "
        "(default: as many as viewers, at most 1000; 0: off)",
    )
    parser.add_argument(
        "--gc-pauses",
        action="store_true",
        help="time the edge's cyclic collections during its run (loadtest.gcwatch)",
    )
    parser.add_argument("--edge-args", default="", help="passed to `edge serve` (shell words)")
    parser.add_argument(
        "--targets", nargs="+", default=["origin", "edge"], choices=["origin", "edge"]
    )
    parser.add_argument("--no-pin", action="store_true", help="run everything on every core")
    parser.add_argument(
        "--profile",
        nargs="?",
        const=f"/tmp/edge-join-profile-{time.strftime('%Y%m%d-%H%M%S')}.txt",
        help="py-spy the edge during its join; folded stacks to PATH",
    )
    parser.add_argument("--records", help="write every viewer's record to RECORDS.<target>.json")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step_costs is None:
        args.step_costs = min(args.viewers, 1000)
    bench = Bench.begin("edge-join-", pin=not args.no_pin, edge_args=args.edge_args)
    launcher: tuple[str, ...] = ("-m", "edge")
    if args.gc_pauses:
        launcher = ("-m", "loadtest.gcwatch", str(bench.logs / GC_PAUSES_FILE))
    try:
        rows = bench.run_targets(
            "join",
            args.targets,
            lambda target: run_target(target, args, bench.cores.load),
            launcher=launcher,
        )
    except EdgeDidNotStart:
        return 2
    rendered = render(rows)
    print(rendered)
    profile_text = ""
    profiled = next((r["profile"] for r in rows if r["profile"]), None)
    if profiled:
        frames = pyspy.top_frames(Path(profiled).read_text())
        profile_text = (
            f"\n\n`--profile`: py-spy ({pyspy.SAMPLE_RATE_HZ} Hz, idle left out) on the edge "
            f"from 0.3 s before its first viewer joined until every viewer was live, "
            f"{frames.samples} samples (py-spy stops the edge to sample it: that counts in the "
            f"edge's wait for a core above); folded stacks in `{profiled}`.\n\n"
            f"{pyspy.table(frames)}"
        )
        print(profile_text.strip())
    if not args.no_write:
        write_doc(args, rendered + profile_text, bench)
    unfinished = [r for r in rows if r["unfinished"]]
    for r in unfinished:
        print(
            f"{r['target']}: {r['unfinished']} viewers had not seen the stream's end "
            f"{args.max_seconds:g} + {CLIENT_GRACE_S:g} s after the first join",
            file=sys.stderr,
        )
    failed = sum(r["wrong"] for r in rows) + sum(1 for r in rows if r["agent_error"])
    failed += sum(1 for r in unfinished if r["target"] == "edge")
    return 1 if failed else 0


def write_doc(args: argparse.Namespace, body: str, bench: Bench) -> None:
    date = time.strftime("%Y-%m-%d")
    shown = f"`{args.edge_args}`" if args.edge_args else "none"
    heading = f"## Join storm ({date}, {args.viewers} viewers, {args.mode}, edge args {shown})"
    section = (
        f"{heading}\n\n"
        f"{bench.provenance('loadtest.join')}. One open `text/plain` stream per server with "
        f"{args.history_bytes:,} B in it; an agent appends a {args.append_bytes} B line "
        f"{args.rate:g} times a second straight to the origin, from {args.lead_in:g} s before "
        f"the first viewer joins until every viewer is live and at least {args.follow:g} s "
        f"after the last joined, then closes the stream. {args.viewers:,} viewers join at "
        f"evenly spread times over {args.seconds_to_join:g} s from {args.processes} client "
        f"processes (raw sockets, one keep-alive HTTP/1.1 connection each): `GET ?offset=-1` "
        f"until `Stream-Up-To-Date`, then live by {args.mode} from its `Stream-Next-Offset` "
        f"until the stream is closed. Times are from each viewer opening its connection: TTFB "
        f"to the first byte of its catch-up, first live to its first live event (an SSE data "
        f"frame, a long-poll answer with bytes; at {args.rate:g} appends/s the next append is "
        f"up to {1000 / args.rate:.0f} ms away). Exact: the viewer's bytes (catch-up, then "
        f"live) are the stream's final content, read from the origin. Origin reads: the "
        f"stream's GETs the origin counted (the agent's appends aside). Pinning: "
        f"{bench.pinning('the origin')}. {bench.load_average(minutes='1')}: the machine is "
        f"shared with other engineers' work, so the figures are noisy (the server's wait for "
        f"a core is in the second table).\n\n{body}\n"
    )
    publish(args.output, heading, section)


if __name__ == "__main__":
    sys.exit(main())
