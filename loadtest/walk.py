"""How many of the edge's modules a request walks through, and how much back and forth.

    .venv/bin/python -m loadtest.walk [--runs 5] [--write] [--label "before (dbf863e)"]

Starts the reference origin (a process, ``devstack``) and an edge IN this process (the stream
application of ``create_app`` on aiohttp's test server on loopback: one worker, no
``--workers``), and for each walk traces, with ``sys.setprofile``, every Python call whose code
lives under the ``edge/`` package from just before the request is sent until its answer is in:

* ``cache miss``: ``GET ?offset=-1`` of an open stream with some bytes that this edge never
  read, until the whole answer is read;
* ``SSE join``: ``GET ?offset=<tail>&live=sse`` of a stream the edge has caught up once (not
  traced), until the answer's head and its first frame are in (or ``SSE_READ_S`` passed);
* ``long-poll``: ``GET ?offset=<tail>&live=long-poll`` of a stream the edge has caught up once,
  answered by an append sent straight to the origin from another task once the poll waits,
  until the whole answer is read.

Each walk runs on a fresh stream and a fresh application (so no live tail, cache entry or task
of an earlier walk is in its trace), after one untraced round of all three on a throwaway
application and stream (imports and first-use setup of the process are not the walk's).
``--runs`` traced rounds; the table shows each figure's median over them (min-max when they
differ: a timer of the edge that fires inside one window, an origin answer that comes in
another order).

How it is counted (``count_walk``, pure, tested in ``tests/unit/test_walk.py``):

* A *module* is a file under ``edge/``, named by its path relative to the package
  (``frame.f_code.co_filename``), so the count is the same whatever the package layout:
  ``streams.py`` or ``instances/registry.py``, ``web/app.py`` or ``web/wiring.py``.
* Only *calls* count, on the call edge, and only fresh calls: a coroutine or generator resumed
  by the event loop is the same call continuing (``resumed`` column, not in the walk). Module
  code run by an import is left out.
* A call's *caller module* is the module of the nearest frame under ``edge/`` on the calling
  stack (aiohttp's or asyncio's frames in between are skipped); none (an entry from the event
  loop, aiohttp's server, a callback scheduled by ``call_soon``) is an *entry*, not a
  transition.
* *modules*: the distinct edge modules entered. *calls*: fresh edge calls. *transitions*:
  calls whose caller module is an edge module other than the callee's. *back and forth*:
  transitions A→B made after some transition B→A in the same walk (each one counted), the
  steps of a conversation between two modules rather than a walk down through them.
  *repeated crossings*: transitions A→B made after an earlier A→B (one module going back to
  the same other module for the next piece: ``catchup.py`` asking ``streams.py`` for a ticket,
  then a take-in, then a settlement); transitions minus the distinct pairs crossed.

Prints the table and, per walk, its modules with the calls into each (from anywhere / from
another edge module); ``--write``
replaces or adds the section ``## <label>`` in ``docs/walks.md`` (the label defaults to the
edge's revision).

Rules this module owns:
* Only the counting is pure; the tracer records ``(caller module, callee module)`` events and
  nothing else, and ``count_walk`` turns a walk's events into its figures.
* The trace window is the client's: opened just before the request is written, closed once the
  answer (or the SSE head and first frame) is in. Whatever the edge runs meanwhile, on this
  thread, counts (a timer firing inside the window too; ``--runs`` shows such noise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dis
import importlib
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from inspect import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR, CO_ITERABLE_COROUTINE
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

import edge
from devstack.processes import REPO, Origin, new_logs_dir, start_origin
from loadtest.benchkit import append, create_stream, git_revision, insert_section

CONTENT_TYPE = "text/plain"
HISTORY = b"history line of the stream, before any walk\n" * 40
SSE_READ_S = 1.0  # an SSE join with no frame by then is cut off: its head is what it got
POLL_PARKED_S = 0.3  # time for the long-poll to reach the edge and wait there
WALKS = ("cache miss", "SSE join", "long-poll")
EDGE_DIR = Path(edge.__file__).resolve().parent
OUTPUT = REPO / "docs" / "walks.md"
INTRO = (
    "# Walks\n\n"
    "The edge modules a request walks through, from `python -m loadtest.walk`: a cache miss, "
    "an SSE join and a long-poll answered by an append, each traced (`sys.setprofile`) from "
    "the request's arrival to its answer. How it counts is in the script's docstring.\n"
)

Event = tuple[str | None, str]  # (caller module or None for an entry, callee module)


# --- the counting (pure) ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WalkCounts:
    modules: tuple[str, ...]  # distinct modules entered, in order of first entry
    calls: int  # fresh calls into edge code
    transitions: int  # calls from one edge module into another
    back_and_forth: int  # transitions A→B after a transition B→A
    repeats: int  # transitions A→B after an earlier transition A→B
    called: dict[str, int]  # per module: fresh calls into it, from anywhere
    entered: dict[str, int]  # per module: transitions into it


def count_walk(events: Iterable[Event]) -> WalkCounts:
    """The figures of one walk's ``(caller module, callee module)`` events, in call order."""
    modules: dict[str, None] = {}
    seen_pairs: set[tuple[str, str]] = set()
    called: Counter[str] = Counter()
    entered: Counter[str] = Counter()
    calls = transitions = back_and_forth = repeats = 0
    for caller, callee in events:
        calls += 1
        called[callee] += 1
        modules.setdefault(callee, None)
        if caller is None or caller == callee:
            continue
        transitions += 1
        entered[callee] += 1
        if (callee, caller) in seen_pairs:
            back_and_forth += 1
        if (caller, callee) in seen_pairs:
            repeats += 1
        seen_pairs.add((caller, callee))
    return WalkCounts(
        modules=tuple(modules),
        calls=calls,
        transitions=transitions,
        back_and_forth=back_and_forth,
        repeats=repeats,
        called=dict(called),
        entered=dict(entered),
    )


def module_of(filename: str, root: Path = EDGE_DIR) -> str | None:
    """``web/app.py`` for a file of the edge package; None for any other file."""
    try:
        return Path(filename).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


# --- the tracer -------------------------------------------------------------------------------


_GENERATOR_FLAGS = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE


class Tracer:
    """Records ``(caller module, callee module)`` for each fresh call of edge code."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.resumed = 0
        self._modules: dict[str, str | None] = {}  # by co_filename
        self._first_resume: dict[CodeType, int] = {}

    def _module(self, code: CodeType) -> str | None:
        name = code.co_filename
        if name not in self._modules:
            self._modules[name] = module_of(name)
        return self._modules[name]

    def _fresh(self, frame: FrameType) -> bool:
        """A first entry, not a generator or coroutine resumed where it last yielded."""
        code = frame.f_code
        if not code.co_flags & _GENERATOR_FLAGS:
            return True
        first = self._first_resume.get(code)
        if first is None:
            first = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            self._first_resume[code] = first
        return frame.f_lasti <= first

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        callee = self._module(code)
        if callee is None or code.co_name == "<module>":
            return
        if not self._fresh(frame):
            self.resumed += 1
            return
        caller = None
        back = frame.f_back
        while back is not None:
            caller = self._module(back.f_code)
            if caller is not None:
                break
            back = back.f_back
        self.events.append((caller, callee))

    def __enter__(self) -> Tracer:
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


# --- the edge in this process -----------------------------------------------------------------


def build_app(origin_url: str) -> web.Application:
    """The stream application as ``edge.server`` builds it, for a one-worker edge."""
    from edge.config import Address, Settings
    from edge.metrics import Metrics
    from edge.origin import OriginClient

    settings = Settings(
        origin=origin_url,
        listen=Address.parse("127.0.0.1:0"),
        admin_listen=Address.parse("127.0.0.1:0"),
    )
    create_app = _create_app()
    app: web.Application = create_app(settings, Metrics(), OriginClient(settings))
    return app


def _create_app() -> Callable[..., web.Application]:
    """``create_app`` wherever the composition root keeps it."""
    for name in ("edge.web.wiring", "edge.web.app"):
        try:
            found = getattr(importlib.import_module(name), "create_app", None)
        except ImportError:
            continue
        if found is not None:
            return found  # type: ignore[no-any-return]
    raise RuntimeError("no create_app in edge.web.wiring or edge.web.app")


class Walker:
    def __init__(self, origin: Origin, session: aiohttp.ClientSession) -> None:
        self.origin, self.session = origin, session
        self.serial = 0

    def stream(self, what: str) -> tuple[str, str]:
        """A fresh open stream with ``HISTORY`` in it at the origin: its path and tail."""
        self.serial += 1
        path = f"/v1/stream/walk-{what}-{int(time.time() * 1000)}-{self.serial}"
        create_stream(self.origin.url, path, CONTENT_TYPE)
        return path, append(self.origin.url, path, HISTORY, CONTENT_TYPE)

    async def walk(self, which: str, trace: bool) -> tuple[list[Event], int]:
        """One walk on a fresh application and stream: its events and resumptions."""
        path, tail = await asyncio.to_thread(self.stream, which.split()[0].lower())
        async with TestServer(build_app(self.origin.url), host="127.0.0.1") as server:
            base = str(server.make_url(path))
            if which != "cache miss":
                await self.read(base + "?offset=-1")  # caught up once, not traced
            tracer = Tracer()
            with tracer if trace else contextlib.nullcontext():
                if which == "cache miss":
                    await self.read(base + "?offset=-1")
                elif which == "SSE join":
                    await self.sse_head(base + f"?offset={tail}&live=sse")
                else:
                    await self.released(base + f"?offset={tail}&live=long-poll", path)
        return tracer.events, tracer.resumed

    async def read(self, url: str) -> bytes:
        async with self.session.get(url) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {url}: HTTP {response.status}")
            return body

    async def sse_head(self, url: str) -> None:
        async with self.session.get(url) as response:
            if response.status != 200:
                raise RuntimeError(f"GET {url}: HTTP {response.status}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(response.content.readany(), SSE_READ_S)

    async def released(self, url: str, path: str) -> None:
        news = b"the append that answers the long-poll\n"

        async def append_later() -> None:
            await asyncio.sleep(POLL_PARKED_S)
            await asyncio.to_thread(append, self.origin.url, path, news, CONTENT_TYPE)

        writer = asyncio.create_task(append_later())
        body = await self.read(url)
        await writer
        if body != news:
            raise RuntimeError(f"the long-poll got {body[:80]!r}, not the append")


async def measure(origin: Origin, runs: int) -> dict[str, list[tuple[WalkCounts, int]]]:
    results: dict[str, list[tuple[WalkCounts, int]]] = {which: [] for which in WALKS}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        walker = Walker(origin, session)
        for which in WALKS:  # warm-up: imports and the process's first-use setup
            await walker.walk(which, trace=False)
        for _ in range(runs):
            for which in WALKS:
                events, resumed = await walker.walk(which, trace=True)
                results[which].append((count_walk(events), resumed))
    return results


# --- the report -------------------------------------------------------------------------------


def _figure(values: list[int]) -> str:
    middle = f"{statistics.median(values):g}"
    low, high = min(values), max(values)
    return middle if low == high else f"{middle} ({low}-{high})"


def render(results: dict[str, list[tuple[WalkCounts, int]]]) -> str:
    lines = [
        "| walk | modules | calls | transitions | back and forth | repeated crossings | resumed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for which, runs in results.items():
        counts = [c for c, _ in runs]
        lines.append(
            f"| {which} | {_figure([len(c.modules) for c in counts])} "
            f"| {_figure([c.calls for c in counts])} "
            f"| {_figure([c.transitions for c in counts])} "
            f"| {_figure([c.back_and_forth for c in counts])} "
            f"| {_figure([c.repeats for c in counts])} "
            f"| {_figure([r for _, r in runs])} |"
        )
    lines.append("")
    for which, runs in results.items():
        first = runs[0][0]
        order = sorted(first.modules, key=lambda m: (-first.called[m], m))
        shown = ", ".join(f"{m} {first.called[m]}/{first.entered.get(m, 0)}" for m in order)
        lines.append(
            f"- {which} (first run), calls into each module / of them from another: {shown}"
        )
    return "\n".join(lines)


def section(label: str, table: str, runs: int) -> str:
    return (
        f"## {label}\n\n"
        f"`python -m loadtest.walk --runs {runs}` at edge `{git_revision()}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Medians of {runs} runs "
        f"(min-max where they differ).\n\n{table}\n"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.walk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5, help="traced rounds of the three walks")
    parser.add_argument("--write", action="store_true", help="write the section to --output")
    parser.add_argument("--label", help="the section's heading (default: at <revision>)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    origin = start_origin(new_logs_dir("edge-walk-"), name="walk-origin")
    try:
        results = asyncio.run(measure(origin, args.runs))
    finally:
        origin.stop()
    table = render(results)
    print(table)
    if args.write:
        label = args.label or f"at {git_revision()}"
        insert_section(args.output, f"## {label}", section(label, table, args.runs), intro=INTRO)
        print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
