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
import asyncio
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.processes import (
    REPO,
    Edge,
    Origin,
    ProcessFailed,
    new_logs_dir,
    start_edge,
    start_origin,
)
from loadtest.benchkit import (
    append,
    create_stream,
    edge_workers,
    insert_section,
    pinned,
    plan_cores,
    raise_nofile,
    split_edge_args,
    text_body,
)
from loadtest.hits import git_revision

CONTENT_TYPE = "text/plain"
CONNECT_BATCH = 250
ROUND_TIMEOUT_S = 60.0
WAITING_TIMEOUT_S = 20.0


@dataclass(frozen=True, kw_only=True)
class Answer:
    done_at: float  # time.monotonic() when the answer was complete
    status: int
    next_offset: str
    body: bytes


class Waiter(asyncio.Protocol):
    """One keep-alive connection that long-polls; parses one HTTP/1.1 answer at a time."""

    def __init__(self, host: str, path: str) -> None:
        self.host = host
        self.path = path
        self.transport: asyncio.Transport | None = None
        self.cursor: str | None = None
        self.offset = ""
        self.buffer = bytearray()
        self.head: tuple[int, dict[str, str]] | None = None
        self.answer: asyncio.Future[Answer | str] | None = None
        self.repolls = 0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def poll(self, offset: str) -> None:
        self.offset = offset
        self.answer = asyncio.get_running_loop().create_future()
        self._send()

    def _send(self) -> None:
        query = f"offset={self.offset}&live=long-poll"
        if self.cursor:
            query += f"&cursor={self.cursor}"
        assert self.transport is not None
        self.transport.write(
            f"GET {self.path}?{query} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self._parse_one():
            pass

    def _parse_one(self) -> bool:
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end == -1:
                return False
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            del self.buffer[: end + 4]
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self.head = (status, headers)
        status, headers = self.head
        body = self._body(status, headers)
        if body is None:
            return False
        self.head = None
        self.cursor = headers.get("stream-cursor", self.cursor)
        if status == 204 and "stream-closed" not in headers:
            self.repolls += 1  # the long-poll timed out before the append: poll again
            self._send()
            return True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(
                Answer(
                    done_at=time.monotonic(),
                    status=status,
                    next_offset=headers.get("stream-next-offset", ""),
                    body=body,
                )
            )
        return True

    def _body(self, status: int, headers: dict[str, str]) -> bytes | None:
        """The complete body, or None while it is still arriving."""
        if status in (204, 304) or 100 <= status < 200:
            return b""
        if "content-length" in headers:
            length = int(headers["content-length"])
            if len(self.buffer) < length:
                return None
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
            return body
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._chunked()
        return None  # until close: not expected from either server

    def _chunked(self) -> bytes | None:
        body = bytearray()
        at = 0
        while True:
            line_end = self.buffer.find(b"\r\n", at)
            if line_end == -1:
                return None
            size = int(bytes(self.buffer[at:line_end]).split(b";")[0], 16)
            if size == 0:  # the last chunk, then trailers (none expected) and a blank line
                end = self.buffer.find(b"\r\n\r\n", line_end)
                if end == -1:
                    return None
                del self.buffer[: end + 4]
                return bytes(body)
            start = line_end + 2
            if len(self.buffer) < start + size + 2:
                return None
            body += self.buffer[start : start + size]
            at = start + size + 2

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(f"connection lost: {exc}")


async def _client_main(conn: Any, host: str, port: int, path: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    waiters: list[Waiter] = []
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command[0] == "stop":
            break
        if command[0] == "poll":
            offset = command[1]
            waiters = [w for w in waiters if not w.lost]
            while len(waiters) < count:
                batch = [
                    Waiter(f"{host}:{port}", path)
                    for _ in range(min(CONNECT_BATCH, count - len(waiters)))
                ]
                await asyncio.gather(
                    *(loop.create_connection(lambda w=w: w, host, port) for w in batch)
                )
                waiters += batch
            for waiter in waiters:
                waiter.poll(offset)
            conn.send(("sent", len(waiters)))
        elif command[0] == "collect":
            _, body, next_offset = command
            futures = [w.answer for w in waiters if w.answer is not None]
            done, _ = await asyncio.wait(futures, timeout=ROUND_TIMEOUT_S)
            times: list[float] = []
            errors: list[str] = []
            for future in futures:
                answer = future.result() if future in done else "no answer in time"
                if isinstance(answer, str):
                    errors.append(answer)
                elif answer.status != 200:
                    errors.append(f"HTTP {answer.status}")
                elif answer.body != body or answer.next_offset != next_offset:
                    errors.append(
                        f"{len(answer.body)} bytes to {answer.next_offset}, not the append"
                    )
                else:
                    times.append(answer.done_at)
            repolls = sum(w.repolls for w in waiters)
            for waiter in waiters:
                waiter.repolls = 0
            conn.send(("answers", times, errors[:5], len(errors), repolls))
    for waiter in waiters:
        if waiter.transport is not None:
            waiter.transport.close()


def _client(conn: Any, host: str, port: int, path: str, count: int) -> None:
    raise_nofile()
    import uvloop

    uvloop.run(_client_main(conn, host, port, path, count))


def waiting_now(target: str, origin: Origin, edge: Edge | None, path: str) -> int:
    if target == "origin":
        return int(origin.counts(path)["open"]["long-poll"])
    assert edge is not None
    total = 0.0
    for line in edge.metrics_text().splitlines():
        if line.startswith("edge_long_polls_waiting"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def percentile(sorted_values: list[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * share) - 1))]


def run_target(
    target: str, origin: Origin, edge: Edge | None, args: argparse.Namespace, load: frozenset[int]
) -> dict[str, Any]:
    base = edge.url if edge is not None else origin.url
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", int(parts.port or 80)
    path = f"/v1/stream/longpoll-{target}-{int(time.time() * 1000)}"
    create_stream(origin.url, path, CONTENT_TYPE)
    tail = append(origin.url, path, b"start\n", CONTENT_TYPE)
    context = multiprocessing.get_context("fork")
    shares = [
        args.waiters // args.processes + (i < args.waiters % args.processes)
        for i in range(args.processes)
    ]
    pipes, procs = [], []
    with pinned(load):
        for share in shares:
            mine, theirs = context.Pipe()
            proc = context.Process(target=_client, args=(theirs, host, port, path, share))
            proc.start()
            pipes.append(mine)
            procs.append(proc)
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
                waiting = waiting_now(target, origin, edge, path)
                if waiting >= sent:
                    break
                time.sleep(0.05)
            time.sleep(0.2)  # the last waiters' requests past the counter and into their wait
            body = text_body(args.append_bytes, seed=number) + b"\n"
            writer = http.client.HTTPConnection(
                origin_parts.hostname, origin_parts.port, timeout=30
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
                "target": target,
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
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return {
        "target": target,
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
    edge_args = split_edge_args(args.edge_args)
    raise_nofile()
    cores = plan_cores(not args.no_pin)
    edge_cores = cores.every if edge_workers(edge_args) > 1 else cores.server
    logs = new_logs_dir("edge-longpoll-")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    with pinned(cores.server):
        origin = start_origin(logs, name="longpoll-origin")
    edge = None
    rows = []
    try:
        if "edge" in args.targets:
            try:
                with pinned(edge_cores):
                    edge = start_edge(origin.url, logs, *edge_args, name="longpoll-edge")
            except ProcessFailed as failure:
                print(
                    f"the edge did not start with --edge-args {args.edge_args!r}:", file=sys.stderr
                )
                print(str(failure)[-3000:], file=sys.stderr)
                return 2
        for target in args.targets:
            rows.append(
                run_target(target, origin, edge if target == "edge" else None, args, cores.load)
            )
    finally:
        if edge is not None:
            edge.stop()
        origin.stop()
    rendered = render(rows)
    print(rendered)
    if not args.no_write:
        date = time.strftime("%Y-%m-%d")
        shown = f"`{args.edge_args}`" if args.edge_args else "none"
        heading = f"## Long-poll release ({date}, edge args {shown})"
        load_after = os.getloadavg()
        section = (
            f"{heading}\n\n"
            f"`{' '.join(['python -m loadtest.longpoll', *sys.argv[1:]])}` at {started}, edge at "
            f"`{git_revision()}`. {args.waiters} long-polls (HTTP/1.1, one connection each, from "
            f"{args.processes} client processes on raw sockets) wait at the tail of one open "
            f"`text/plain` stream, straight at the origin, then through the edge; one "
            f"{args.append_bytes + 1}-byte append, sent straight to the origin, releases them. "
            f"Latency: from the append's send to each waiter's complete answer; every answer "
            f"checked (200, exactly the appended bytes, the append's `Stream-Next-Offset`). "
            f"p50/p99/max are medians of {args.rounds} rounds after a warm-up round. Pinning: "
            f"{cores.describe(edge_cores)}. Load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after: the machine is shared with other engineers' work, so "
            f"the figures are noisy.\n\n{rendered}\n"
        )
        insert_section(args.output, heading, section)
        print(f"written to {args.output}")
    failed = sum(r["failed"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
