"""Long-poll release benchmark: N long-polls wait at the tail of one stream; one append releases
them. Straight from the origin vs through the edge, in one invocation, on the same cores.

    .venv/bin/python -m loadtest.longpoll --polls 2000 --rounds 5 --runs 3

Each run starts a fresh origin (and, for the edge, a fresh edge in front of it). Client worker
processes (raw sockets, uvloop, HTTP/1.1 keep-alive) open the long-polls; once every one is in
and has had ``--settle`` seconds to reach the server's wait (at the edge: once its
``edge_long_polls_waiting`` says so), the parent appends one item straight to the origin and
each client notes when its answer's first byte arrives. A released client re-polls at once from
the answer's ``Stream-Next-Offset`` with its ``Stream-Cursor`` (as the official clients do). The
first release is a warm-up and not counted (the crowd's first requests also wait for the server
to accept its connections). Release latency = first byte at the client minus the moment the
append was sent; the ``--rounds`` releases' latencies are pooled per run, and the table shows
each run's p50/p99 and their median.

``--baseline NAME=DIR`` measures another checkout's edge in the same invocation (before/after
comparisons on the same noisy machine); ``--profile FILE`` records the edge with py-spy.

Everything shares this machine's cores (the clients with the server), and other work on the
machine makes the figures noisy: compare targets of the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from devstack.processes import Edge, Origin, new_logs_dir, start_edge, start_origin

CONNECT_BATCH = 250


@dataclass(frozen=True, kw_only=True, slots=True)
class Round:
    latencies: list[float]  # first byte at the client, seconds after the append was sent
    statuses: dict[int, int]


class Poller(asyncio.Protocol):
    """One keep-alive connection that long-polls, re-polling from each answer."""

    def __init__(self, worker: Worker, index: int, offset: str) -> None:
        self.worker = worker
        self.index = index
        self.offset = offset
        self.cursor: str | None = None
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.first_byte: float | None = None
        self.answers = 0
        self.lost = False
        self.scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.poll()

    def poll(self) -> None:
        assert self.transport is not None
        target = f"{self.worker.path}?offset={quote(self.offset, safe='')}&live=long-poll"
        if self.cursor is not None:
            target += f"&cursor={quote(self.cursor, safe='')}"
        self.transport.write(
            f"GET {target} HTTP/1.1\r\nHost: {self.worker.host}\r\n\r\n".encode("latin-1")
        )

    def data_received(self, data: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = time.monotonic()
        self.buffer += data
        if not self.scheduled:
            # Parse and re-poll after this loop pass: every socket readable now gets its
            # arrival time first, so one client's own work does not count as the server's.
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        self.scheduled = False
        while self._answer_complete():
            pass

    def _answer_complete(self) -> bool:
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return False
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            length = int(headers["content-length"])
            if len(rest) < length:
                return False
            self.buffer = rest[length:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            end = rest.find(b"\r\n0\r\n\r\n")
            if rest.startswith(b"0\r\n\r\n"):
                end, skip = 0, 5
            elif end < 0:
                return False
            else:
                skip = end + 7
            self.buffer = rest[skip:]
        else:
            self.buffer = rest  # 204: no body
        assert self.first_byte is not None
        arrived, self.first_byte = self.first_byte, None if not self.buffer else time.monotonic()
        self.offset = headers.get("stream-next-offset", self.offset)
        self.cursor = headers.get("stream-cursor", self.cursor)
        self.answers += 1
        self.worker.answered(self, status, arrived)
        self.poll()
        return bool(self.buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class Worker:
    def __init__(self, host: str, port: int, path: str, count: int, queue: Any) -> None:
        self.host = f"{host}:{port}"
        self.address = (host, port)
        self.path = path
        self.count = count
        self.queue = queue
        self.rounds: dict[int, list[tuple[int, float]]] = {}

    def answered(self, poller: Poller, status: int, arrived: float) -> None:
        got = self.rounds.setdefault(poller.answers, [])
        got.append((status, arrived))
        if len(got) == self.count:
            self.queue.put(("round", poller.answers, self.rounds.pop(poller.answers)))

    async def main(self, offset: str, stop: Any) -> None:
        loop = asyncio.get_running_loop()
        pollers: list[Poller] = []
        for start in range(0, self.count, CONNECT_BATCH):
            batch = []
            for index in range(start, min(self.count, start + CONNECT_BATCH)):
                poller = Poller(self, index, offset)
                pollers.append(poller)
                batch.append(loop.create_connection(lambda p=poller: p, *self.address))
            await asyncio.gather(*batch)
        self.queue.put(("connected", len(pollers), None))
        await loop.run_in_executor(None, stop.wait)
        for poller in pollers:
            if poller.transport is not None:
                poller.transport.close()


def _worker(
    host: str, port: int, path: str, count: int, offset: str, queue: Any, stop: Any
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop

    uvloop.run(Worker(host, port, path, count, queue).main(offset, stop))


def request(base: str, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str]]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def waiting_at_edge(edge: Edge) -> float:
    for line in edge.metrics_text().splitlines():
        if line.startswith("edge_long_polls_waiting "):
            return float(line.split()[1])
    return 0.0


def start_profile(edge: Edge, output: Path) -> subprocess.Popen[bytes]:
    """py-spy (``pip install py-spy``) sampling the edge, as collapsed stacks."""
    command = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid"]
    command += [str(edge.process.pid), "--rate", "1000", "--format", "raw"]
    command += ["--output", str(output), "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run_once(
    target: str,
    polls: int,
    rounds: int,
    clients: int,
    settle: float,
    logs: Path,
    edge_args: list[str],
    profile: Path | None = None,
    repo: Path | None = None,
) -> list[Round]:
    origin: Origin = start_origin(logs, long_poll_timeout_ms=30_000, name=f"origin-{target}")
    edge: Edge | None = None
    procs: list[multiprocessing.Process] = []
    stop = multiprocessing.Event()
    try:
        if target != "origin":
            edge = start_edge(
                origin.url, logs, "--long-poll-timeout", "30", "--max-connections", "19000",
                *edge_args, name=target, **({"repo": repo} if repo is not None else {}),
            )  # fmt: skip
        base = edge.url if edge is not None else origin.url
        host, port = base.removeprefix("http://").split(":")
        path = f"/v1/stream/longpoll-{int(time.time() * 1000)}"
        status, headers = request(origin.url, "PUT", path)
        assert status in (200, 201), status
        offset = headers["stream-next-offset"]
        if edge is not None:
            # The first live read starts the edge's tail; the crowd then joins a running one.
            request(edge.url, "GET", f"{path}?offset={quote(offset, safe='')}")
        queue: Any = multiprocessing.Queue()
        shares = [polls // clients + (1 if i < polls % clients else 0) for i in range(clients)]
        for share in shares:
            proc = multiprocessing.Process(
                target=_worker, args=(host, int(port), path, share, offset, queue, stop)
            )
            proc.start()
            procs.append(proc)
        for _ in procs:
            kind, count, _ = queue.get(timeout=120)
            assert kind == "connected"
            assert count > 0
        results: list[Round] = []
        spy: subprocess.Popen[bytes] | None = None
        # Round 0 is a warm-up, not counted: the crowd's first requests also wait for the
        # server to accept 2,000 connections (a full accept queue delays some by seconds).
        for number in range(rounds + 1):
            time.sleep(settle)
            if edge is not None:
                give_up = time.monotonic() + 20
                while (waiting := waiting_at_edge(edge)) < polls and time.monotonic() < give_up:
                    time.sleep(0.2)
                if waiting < polls:
                    print(
                        f"  warning: only {waiting:.0f} of {polls} long-polls waiting at the edge"
                    )
            sent = time.monotonic()
            status, _ = request(origin.url, "POST", path, json.dumps([{"round": number}]).encode())
            assert status in (200, 204), status
            latencies: list[float] = []
            statuses: dict[int, int] = {}
            for _ in procs:
                kind, got, answers = queue.get(timeout=60)
                assert kind == "round"
                assert got == number + 1, (kind, got)
                for code, arrived in answers:
                    latencies.append(arrived - sent)
                    statuses[code] = statuses.get(code, 0) + 1
            if number == 0:
                if spy is None and profile is not None and edge is not None:
                    spy = start_profile(edge, profile)
                continue
            results.append(Round(latencies=latencies, statuses=statuses))
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        return results
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        if edge is not None:
            edge.stop()
        origin.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="appends per run")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per target")
    parser.add_argument("--clients", type=int, default=2, help="client worker processes")
    parser.add_argument("--settle", type=float, default=1.5, help="seconds before each append")
    parser.add_argument("--targets", nargs="+", default=["origin", "edge"])
    parser.add_argument("--edge-arg", action="append", default=[], help="extra edge flag")
    parser.add_argument("--profile", type=Path, help="py-spy collapsed stacks of the edge here")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="another checkout (e.g. `git archive main | tar -x -C DIR`) whose edge is measured "
        "too, as target NAME (default 'baseline'); repeatable",
    )
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logs = new_logs_dir("longpoll-")
    table: dict[str, list[tuple[float, float]]] = {}
    checkouts = dict(
        (b.split("=", 1)[0], Path(b.split("=", 1)[1])) if "=" in b else ("baseline", Path(b))
        for b in args.baseline
    )
    targets = [*args.targets, *checkouts]
    for run in range(1, args.runs + 1):
        for target in targets:
            rounds = run_once(
                target, args.polls, args.rounds, args.clients, args.settle, logs, args.edge_arg,
                args.profile.with_suffix(f".{target}.txt") if args.profile and run == 1 else None,
                checkouts.get(target),
            )  # fmt: skip
            # The first round's crowd had no cursor yet; every round counts.
            pooled = [value for r in rounds for value in r.latencies]
            statuses: dict[int, int] = {}
            for r in rounds:
                for code, n in r.statuses.items():
                    statuses[code] = statuses.get(code, 0) + n
            p50, p99 = percentile(pooled, 50) * 1000, percentile(pooled, 99) * 1000
            per_round = " ".join(
                f"{percentile(r.latencies, 99) * 1000:.0f}/{max(r.latencies) * 1000:.0f}"
                for r in rounds
            )
            print(
                f"run {run} {target:8} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                f"statuses {statuses}  per-round p99/max [{per_round}]",
                flush=True,
            )
            table.setdefault(target, []).append((p50, p99))
    print(
        f"\n{args.polls} long-polls released by one append, {args.rounds} rounds x {args.runs} runs"
    )
    print(f"{'target':10} {'p50 ms (median)':>16} {'p99 ms (median)':>16}   runs (p50/p99)")
    for target, runs in table.items():
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)
        detail = ", ".join(f"{a:.0f}/{b:.0f}" for a, b in runs)
        print(f"{target:10} {p50:16.1f} {p99:16.1f}   {detail}")
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
