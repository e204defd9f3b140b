"""The skeleton every benchmark shares (``hits``, ``join``, ``longpoll``, ``fanout``, ``cdn``):
start the origin and a pinned edge, run, render, write the section. A benchmark script holds
only what it measures.

    bench = Bench.begin("edge-join-", pin=..., edge_args=...)      # limits, cores, logs, load
    rows = bench.run_targets("join", ["origin", "edge"], measure)   # servers up, each Target
    publish(output, heading, f"{heading}\n\n{bench.provenance(...)} ... {bench.load_average()}")

Rules this module owns:
* One run is a ``Bench``: the open-file limit raised, the cores planned, a fresh logs directory,
  the start time and the load average before, taken once when it begins (``Bench.begin``).
* An edge that does not start is reported on stderr with the ``--edge-args`` it was given and
  the end of its output, and the run ends with exit 2 (``EdgeDidNotStart``).
* Pinning is set before a process starts, so every thread it ever makes inherits it: a server
  spawned inside ``pinned(cores)`` runs on those cores only; the helper threads this process
  made meanwhile are put back on every core.
* The servers get core 0, the load generators the other core(s), when this process may use at
  least two; with fewer, nothing is pinned, and the report says so.
* A section of ``docs/benchmarks.md`` is inserted at the top (newest first); a run with the
  same heading (same benchmark, date and edge arguments) replaces its earlier section in place;
  a benchmark that keeps one section per kind of run (``fanout``) replaces the section whose
  heading starts the same, whatever its date (``publish(..., any_date=True)``).
* A section says how it was made: the command, the start time, the edge's revision
  (``Bench.provenance``), and the machine's load average before and after
  (``Bench.load_average``).
* Streams are set up at the origin with the protocol's own requests (PUT with a content type,
  POST the bytes, POST ``Stream-Closed: true``), each answer checked.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
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

T = TypeVar("T")
BENCHMARKS_INTRO = (
    "# Benchmarks\n\nFigures printed by the scripts in `loadtest/`, newest run first.\n"
)


@dataclass(frozen=True, kw_only=True)
class Cores:
    server: frozenset[int]  # origin, nginx, a one-worker edge
    load: frozenset[int]  # wrk, the waiters' processes, py-spy
    every: frozenset[int]  # an edge with several workers

    def describe(self, edge_cores: frozenset[int], servers: str = "origin and nginx") -> str:
        if self.server == self.every:
            return f"not pinned (this process may use {len(self.every)} core(s) only)"
        return (
            f"{servers} on core {_names(self.server)}, the edge on core "
            f"{_names(edge_cores)}, the load generator on core {_names(self.load)} "
            "(taskset-style affinity set before each process starts)"
        )


def _names(cores: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def plan_cores(pin: bool) -> Cores:
    every = frozenset(os.sched_getaffinity(0))
    if not pin or len(every) < 2:
        return Cores(server=every, load=every, every=every)
    first = min(every)
    return Cores(server=frozenset({first}), load=every - {first}, every=every)


def edge_workers(edge_args: list[str]) -> int:
    """The ``--workers`` value among the edge's arguments (1 when absent)."""
    for index, arg in enumerate(edge_args):
        if arg == "--workers" and index + 1 < len(edge_args):
            return int(edge_args[index + 1])
        if arg.startswith("--workers="):
            return int(arg.split("=", 1)[1])
    return 1


def split_edge_args(text: str) -> list[str]:
    return shlex.split(text)


@contextlib.contextmanager
def pinned(cores: frozenset[int]) -> Iterator[None]:
    """Processes started inside run on ``cores``; threads started inside are unpinned after."""
    before = os.sched_getaffinity(0)
    threads_before = set(threading.enumerate())
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for thread in set(threading.enumerate()) - threads_before:
            if thread.native_id is not None:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(thread.native_id, before)


def affinity_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def raise_nofile() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def command_line(module: str) -> str:
    """How this run was started, as its section quotes it."""
    return " ".join([f"python -m {module}", *sys.argv[1:]])


def git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    return revision + ("+dirty" if git("status", "--porcelain", "--", "edge") else "")


# --- one run: the origin, a pinned edge ----------------------------------------------------------


class EdgeDidNotStart(RuntimeError):
    """Reported on stderr already; the benchmark exits 2."""


@dataclass(frozen=True, kw_only=True)
class Bench:
    logs: Path
    cores: Cores
    edge_cores: frozenset[int]  # every core for an edge with several workers, else the servers'
    edge_args: list[str]
    edge_args_text: str  # as given, for the messages
    started: str
    load_before: tuple[float, float, float]

    @classmethod
    def begin(cls, logs_prefix: str, *, pin: bool, edge_args: str = "") -> Bench:
        words = split_edge_args(edge_args)
        raise_nofile()
        cores = plan_cores(pin)
        return cls(
            logs=new_logs_dir(logs_prefix),
            cores=cores,
            edge_cores=cores.every if edge_workers(words) > 1 else cores.server,
            edge_args=words,
            edge_args_text=edge_args,
            started=now_utc(),
            load_before=os.getloadavg(),
        )

    def origin(self, name: str) -> Origin:
        with pinned(self.cores.server):
            return start_origin(self.logs, name=name)

    def edge(
        self,
        origin: Origin,
        *more_args: str,
        name: str,
        launcher: tuple[str, ...] = ("-m", "edge"),
        also: str = "",
        cores: frozenset[int] | None = None,
    ) -> Edge:
        """The edge under test, given ``--edge-args`` then ``more_args``, on ``cores`` (default
        the plan's edge cores); ``also`` names what else its start depended on, for the
        message."""
        try:
            with pinned(self.edge_cores if cores is None else cores):
                return start_edge(
                    origin.url, self.logs, *self.edge_args, *more_args, name=name,
                    launcher=launcher,
                )  # fmt: skip
        except ProcessFailed as failure:
            print(
                f"the edge did not start with --edge-args {self.edge_args_text!r}{also}:",
                file=sys.stderr,
            )
            print(str(failure)[-3000:], file=sys.stderr)
            raise EdgeDidNotStart from None

    @contextlib.contextmanager
    def servers(
        self, name: str, *, with_edge: bool, launcher: tuple[str, ...] = ("-m", "edge")
    ) -> Iterator[tuple[Origin, Edge | None]]:
        """``<name>-origin`` and, ``with_edge``, ``<name>-edge``; both stopped after."""
        origin = self.origin(f"{name}-origin")
        edge = None
        try:
            if with_edge:
                edge = self.edge(origin, name=f"{name}-edge", launcher=launcher)
            yield origin, edge
        finally:
            if edge is not None:
                edge.stop()
            origin.stop()

    def run_targets(
        self,
        name: str,
        targets: list[str],
        measure: Callable[[Target], T],
        *,
        launcher: tuple[str, ...] = ("-m", "edge"),
    ) -> list[T]:
        """``measure`` each of ``targets`` ("origin", "edge") in turn, one origin and (when
        "edge" is among them) one edge for all, both stopped after."""
        with self.servers(name, with_edge="edge" in targets, launcher=launcher) as (origin, edge):
            return [
                measure(Target(name=t, origin=origin, edge=edge if t == "edge" else None))
                for t in targets
            ]

    def pinning(self, servers: str = "origin and nginx") -> str:
        return self.cores.describe(self.edge_cores, servers)

    def provenance(self, module: str) -> str:
        """How the run was made, as its section opens: the command, when, the edge's revision."""
        return f"`{command_line(module)}` at {self.started}, edge at `{git_revision()}`"

    def load_average(self, *, minutes: str = "1/5/15") -> str:
        """The load average before the run and now: all three (1/5/15 min), or the 1 min one."""
        after = os.getloadavg()
        if minutes == "1":
            return f"Load average {self.load_before[0]:.2f} before, {after[0]:.2f} after"
        return (
            f"Load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in self.load_before)} "
            f"before, {'/'.join(f'{x:.2f}' for x in after)} after"
        )


@dataclass(frozen=True, kw_only=True)
class Target:
    """One server a benchmark measures: the origin alone, or the edge in front of it."""

    name: str  # "origin" | "edge"
    origin: Origin
    edge: Edge | None  # the edge when name is "edge"

    @property
    def url(self) -> str:
        return self.edge.url if self.edge is not None else self.origin.url

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", int(parts.port or 80)

    @property
    def pid(self) -> int:
        return (self.edge or self.origin).process.pid


def publish(output: Path, heading: str, section: str, *, any_date: bool = False) -> None:
    """Write ``section`` into ``output`` and say where: in place of the section with the same
    ``heading`` (``any_date``: whose heading starts with ``heading``), else first."""
    if any_date:
        write_section(output, heading, section)
    else:
        insert_section(output, heading, section)
    print(f"written to {output}")


# --- processes ---------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (an edge with --workers N is a supervisor and N)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            todo += [int(child) for child in task.read_text().split()]
    return pids


def proc_cpu_seconds(pid: int) -> float:
    total = 0
    for member in process_tree(pid):
        fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mb(pid: int) -> float:
    return sum(_status_mb(member, "VmHWM:") for member in process_tree(pid))


def proc_rss_mb(pid: int) -> float:
    return sum(_status_mb(member, "VmRSS:") for member in process_tree(pid))


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def run_and_wait(pids: list[int]) -> tuple[float, float]:
    """Seconds the threads of ``pids`` have run on a CPU, and waited runnable for one
    (``/proc/<pid>/task/<tid>/schedstat``)."""
    ran = waited = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                    fields = stat.read().split()
            except FileNotFoundError:
                continue  # a thread that ended meanwhile
            ran += int(fields[0])
            waited += int(fields[1])
    return ran / 1e9, waited / 1e9


# --- streams at the origin ---------------------------------------------------------------------


class SetupFailed(RuntimeError):
    pass


def request(
    base: str,
    method: str,
    target: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection; header names lower-cased; the body as sent."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        connection.close()


def _expect(status: int, allowed: tuple[int, ...], what: str, data: bytes) -> None:
    if status not in allowed:
        raise SetupFailed(f"{what}: HTTP {status} {data[:200]!r}")


def create_stream(base: str, path: str, content_type: str) -> str:
    """PUT the stream; returns its tail offset."""
    status, headers, data = request(base, "PUT", path, headers={"Content-Type": content_type})
    _expect(status, (200, 201), f"PUT {path}", data)
    return headers.get("stream-next-offset", "-1")


def append(base: str, path: str, body: bytes, content_type: str) -> str:
    """POST ``body``; returns the new tail offset."""
    status, headers, data = request(
        base, "POST", path, body=body, headers={"Content-Type": content_type}
    )
    _expect(status, (200, 204), f"POST {path}", data)
    return headers["stream-next-offset"]


def close_stream(base: str, path: str, content_type: str) -> None:
    status, _, data = request(
        base, "POST", path, headers={"Content-Type": content_type, "Stream-Closed": "true"}
    )
    _expect(status, (200, 204), f"close {path}", data)


def text_body(size: int, seed: int) -> bytes:
    """``size`` bytes of word-like text: compressible the way tokens and logs are."""
    import random

    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(500)
    ]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words).encode() + (b"\n" if rng.random() < 0.08 else b" ")
    return bytes(out[:size])


# --- docs/benchmarks.md ------------------------------------------------------------------------


def insert_section(
    path: Path, heading: str, section: str, *, intro: str = BENCHMARKS_INTRO
) -> None:
    """Put ``section`` (starting with ``heading``) first under the intro, or where it was;
    ``intro`` opens a file that does not exist yet."""
    text = path.read_text() if path.exists() else intro
    section = section.rstrip("\n") + "\n\n"
    start = text.find(heading + "\n")
    if start != -1:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + (text[end + 1 :] if end != -1 else "")
    else:
        first = text.find("\n## ")
        if first == -1:
            text = text.rstrip("\n") + "\n\n" + section
        else:
            text = text[: first + 1] + section + text[first + 1 :]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")


def write_section(path: Path, heading: str, section: str) -> None:
    """Replace the section whose heading starts with ``heading`` (a rerun of the same
    benchmark, whatever its date), or put it first, as ``insert_section`` does."""
    text = path.read_text() if path.exists() else ""
    start = text.find(heading)
    if start == -1:
        insert_section(path, section.split("\n", 1)[0], section)
        return
    end = text.find("\n## ", start + len(heading))
    text = text[:start] + section.rstrip("\n") + "\n\n" + (text[end + 1 :] if end != -1 else "")
    path.write_text(text.rstrip("\n") + "\n")


def metric_total(metrics_text: str, name: str) -> int:
    """An unlabelled sample of a Prometheus text exposition (``name value``); 0 when absent."""
    for line in metrics_text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0
