"""Cached hits side by side: the origin alone, the edge in front of it, nginx in front of it.

    .venv/bin/python -m loadtest.hits [--edge-args "--workers 1"] [--duration 5] [--runs 3]
        [--connections 64] [--cells 100B tail2KB jwt1 ...] [--profile [PATH]] [--no-write]

One invocation starts one reference origin, an edge (``python -m edge serve`` with
``--edge-args``) per configuration the chosen cells need, and Debian nginx (one worker: see
``loadtest/nginx.py``), all in front of the same origin and on the same cores. Every cell reads
a stream made at the origin (``text/plain``; closed unless the cell says open):

* ``100B``, ``64KB``: ``GET ?offset=-1`` of a closed stream of that size; ``100B-gzip``,
  ``64KB-gzip`` the same with ``Accept-Encoding: gzip``; ``64KB-mid`` a closed range read from
  a mid-stream offset.
* ``tail2KB``: ``GET ?offset=-1`` of an OPEN 2 KB stream, an at-tail answer
  (``Stream-Up-To-Date: true``) the edge keeps for its default ``--tail-freshness`` (1 s) and
  then asks the origin again; nginx is a 1 s micro-cache (``proxy_cache_valid 200 1s``), not the
  forced one-hour cache, which would go on serving an old tail.
* ``cookie``: the closed 100 B read with ``Cookie: session=abc``, a credential scope of its own
  (the edge's default ``--scope-headers``; nginx keys on the cookie too).
* ``jwt1``, ``jwt10k``: the closed 100 B read with ``Authorization: Bearer`` one token, or 10,000
  distinct valid tokens round-robin (a wrk Lua script), against an edge started with
  ``--auth jwt --jwt-jwks FILE --origin-header ...`` (``loadtest/authbench.py`` mints them).
* ``forward``: the closed 100 B read with a session cookie, against an edge started with
  ``--auth forward --auth-url`` a small auth service this process runs (204, ``max-age=60``).
* ``head``: ``HEAD`` of the closed 100 B stream, timed by ``loadtest/headload.py`` (wrk cannot
  time HEAD); the edge answers a HEAD of a stream it knows all of itself (stored for its hit
  path), and "served as" says where it did not.

Default: every cell. The origin column of the auth cells is the origin sent the same requests
(it has no auth and ignores the credentials); their nginx column is "n/a": nginx cannot check a
token or ask an auth service, and caching one reader's authorized answer for everyone is not
the same service. For each cell every server is read once to warm its cache, then checked:
status, the bytes written (gzip decompressed), ``Stream-Up-To-Date`` at the tail, the stream's
offset on HEAD, a hit where there is a cache (but the edge's HEAD), and on the auth edges that a
read without credentials, or with a forged one, is refused (401/403), never a stored 200. Then
``wrk -t1 -cC -dDs --latency`` per server, the servers interleaved run by run so a neighbour's
burst of load spreads over all three; medians of ``--runs``; every check again afterwards.
Prints a table (req/s, p99, edge/origin, edge/nginx, the edge's hit share from its /metrics)
and the issue 17 targets, and inserts them at the top of docs/benchmarks.md (``--no-write``:
print only).

Servers run on core 0 and the load generator on core 1 when this process may use two cores;
an edge with ``--workers N`` (N > 1) gets every core, so it shares core 1 with the load.
``--profile`` adds a run of the 100 B identity cell against the edge under ``py-spy record``
and prints its top frames.

Rules this module owns:
* No figure without checked bytes: a server that answers a cell wrongly (status, encoding,
  bytes, a credential-less read let through) before or after its timing, or not from its
  cache, fails the run (exit 1).
* The edge is whatever ``python -m edge serve`` is installed, with ``--edge-args``: a flag it
  does not know fails the run (exit 2) with the edge's own message, never a silent default.
  Cells that need another configuration (``--auth``) get an edge of their own, with
  ``--edge-args`` too, started for them and stopped after them.
* Cells and servers are compared within one run only; a run's section names its command, its
  date, the edge's revision, its pinning and the machine's load.
* The targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from devstack.processes import REPO, Edge, Origin
from loadtest import authbench, headload, pyspy, wrk
from loadtest.benchkit import (
    Bench,
    Cores,
    EdgeDidNotStart,
    SetupFailed,
    affinity_of,
    append,
    close_stream,
    create_stream,
    edge_workers,
    now_utc,
    pinned,
    publish,
    request,
    split_edge_args,
    text_body,
)
from loadtest.nginx import Nginx, NginxFailed, start_nginx

CONTENT_TYPE = "text/plain"
PREFIX_BYTES = 1024  # what a mid-stream read skips
SERVERS = ("origin", "edge", "nginx")
COOKIE = "session=abc"  # the cookie cell's credential
JWT_MANY = 10_000
ORIGIN_CREDENTIAL = "Authorization: Bearer hits-edge"  # the auth edges' --origin-header
OVER_ORIGIN = 1.5  # issue 17: each of its cells at least this times the origin


@dataclass(frozen=True, kw_only=True)
class Cell:
    label: str
    size: int
    gzip: bool = False
    mid: bool = False
    open: bool = False  # the stream stays open: ?offset=-1 is an at-tail read
    method: str = "GET"
    cookie: str | None = None
    edge: str = "plain"  # the edge configuration: plain (--edge-args only), jwt, forward
    tokens: int = 0  # jwt: distinct tokens, round-robin
    nginx: str = "forced"  # forced (1 h proxy_cache), micro (1 s micro-cache), none (n/a)
    issue17: bool = False  # a cell whose target is edge >= OVER_ORIGIN x origin

    @property
    def stream_key(self) -> tuple[int, bool, bool]:
        return (self.size, self.mid, self.open)


CELLS = {
    "100B": Cell(label="100 B", size=100),
    "64KB": Cell(label="64 KB", size=64 * 1024),
    "100B-gzip": Cell(label="100 B, gzip", size=100, gzip=True),
    "64KB-gzip": Cell(label="64 KB, gzip", size=64 * 1024, gzip=True),
    "64KB-mid": Cell(label="64 KB from a mid-stream offset", size=64 * 1024, mid=True),
    "tail2KB": Cell(
        label="2 KB open stream at its tail (nginx: 1 s micro-cache)",
        size=2048,
        open=True,
        nginx="micro",
        issue17=True,
    ),
    "cookie": Cell(label="100 B, Cookie scope", size=100, cookie=COOKIE, issue17=True),
    "jwt1": Cell(
        label="100 B, --auth jwt, one token",
        size=100,
        edge="jwt",
        tokens=1,
        nginx="none",
        issue17=True,
    ),
    "jwt10k": Cell(
        label=f"100 B, --auth jwt, {JWT_MANY:,} tokens round-robin",
        size=100,
        edge="jwt",
        tokens=JWT_MANY,
        nginx="none",
        issue17=True,
    ),
    "forward": Cell(
        label="100 B, --auth forward",
        size=100,
        edge="forward",
        cookie=authbench.SESSION,
        nginx="none",
        issue17=True,
    ),
    "head": Cell(label="HEAD, 100 B", size=100, method="HEAD", issue17=True),
}


@dataclass(frozen=True, kw_only=True)
class Stream:
    path: str
    target: str  # path?offset=...
    body: bytes  # what a read of target must return
    tail: str  # its Stream-Next-Offset


@dataclass(frozen=True, kw_only=True)
class Auth:
    """The credentials of the auth cells, made once per run for the ones chosen."""

    jwt: authbench.JwtMaterial | None = None
    forward: authbench.ForwardService | None = None
    rotation: wrk.Script | None = None  # jwt10k's tokens, one per request


@dataclass(frozen=True, kw_only=True)
class Load:
    """What a cell's requests carry: fixed headers, or a script that varies one."""

    headers: dict[str, str]
    script: wrk.Script | None = None
    checks: tuple[dict[str, str], ...] = ()  # the header sets each check reads with
    refused: tuple[dict[str, str], ...] = ()  # header sets the edge must refuse


class WrongBytes(RuntimeError):
    pass


def make_stream(origin: str, cell: Cell, stamp: str) -> Stream:
    size, mid, open_ = cell.stream_key
    path = f"/v1/stream/hits-{size}{'-mid' if mid else ''}{'-open' if open_ else ''}-{stamp}"
    create_stream(origin, path, CONTENT_TYPE)
    offset = "-1"
    if mid:
        offset = append(origin, path, text_body(PREFIX_BYTES, seed=size + 1), CONTENT_TYPE)
    body = text_body(size, seed=size)
    append(origin, path, body, CONTENT_TYPE)
    if not open_:
        close_stream(origin, path, CONTENT_TYPE)
    status, headers, _ = request(origin, "HEAD", path)
    if status != 200 or "stream-next-offset" not in headers:
        raise WrongBytes(f"HEAD {origin}{path}: HTTP {status}, no Stream-Next-Offset")
    return Stream(
        path=path, target=f"{path}?offset={offset}", body=body, tail=headers["stream-next-offset"]
    )


def load_for(cell: Cell, auth: Auth) -> Load:
    base = {"Accept-Encoding": "gzip"} if cell.gzip else {}
    if cell.cookie:
        base["Cookie"] = cell.cookie
    if cell.edge == "jwt":
        assert auth.jwt is not None
        tokens = auth.jwt.tokens[: cell.tokens]
        refused: tuple[dict[str, str], ...] = ({}, {"Authorization": f"Bearer {auth.jwt.forged}"})
        picks = sorted({0, len(tokens) // 2, len(tokens) - 1})
        checks = tuple(base | {"Authorization": f"Bearer {tokens[i]}"} for i in picks)
        if cell.tokens == 1:
            return Load(headers=checks[0], checks=checks, refused=refused)
        assert auth.rotation is not None
        return Load(headers=base, script=auth.rotation, checks=checks, refused=refused)
    if cell.edge == "forward":
        refused = ({}, {"Cookie": "session=intruder"})  # an unknown session
        return Load(headers=base, checks=(base,), refused=refused)
    return Load(headers=base, checks=(base,))


def target_of(cell: Cell, stream: Stream) -> str:
    return stream.path if cell.method == "HEAD" else stream.target


def check(base: str, stream: Stream, cell: Cell, headers: dict[str, str]) -> tuple[str, str]:
    """One read; the answer must be the stream's. Returns (encoding served, cache status)."""
    target = target_of(cell, stream)
    status, got, data = request(base, cell.method, target, headers=headers)
    where = f"{cell.method} {base}{target}"
    encoding = got.get("content-encoding", "identity")
    if status != 200:
        raise WrongBytes(f"{where}: HTTP {status}")
    if cell.method == "HEAD":
        if data or got.get("stream-next-offset") != stream.tail:
            raise WrongBytes(
                f"{where}: {len(data)} body bytes, Stream-Next-Offset "
                f"{got.get('stream-next-offset')}, not none and {stream.tail}"
            )
    else:
        if encoding == "gzip" and cell.gzip:
            data = gzip.decompress(data)
        elif encoding != "identity":
            raise WrongBytes(f"{where}: unexpected Content-Encoding {encoding}")
        if data != stream.body:
            raise WrongBytes(f"{where}: {len(data)} bytes, not the {len(stream.body)} written")
        if cell.open and (
            got.get("stream-up-to-date") != "true" or got.get("stream-next-offset") != stream.tail
        ):
            raise WrongBytes(
                f"{where}: Stream-Up-To-Date {got.get('stream-up-to-date')}, Stream-Next-Offset "
                f"{got.get('stream-next-offset')}: not an answer at the tail {stream.tail}"
            )
    cache = got.get("cache-status") or got.get("x-cache-status") or "-"
    return encoding, cache


def check_refusals(base: str, stream: Stream, cell: Cell, load: Load) -> None:
    """The auth edge refuses what it must: no credentials, a forged one. Never a 200."""
    target = target_of(cell, stream)
    for headers in load.refused:
        status, _, data = request(base, cell.method, target, headers=headers)
        shown = ", ".join(f"{k}: {v[:24]}..." for k, v in headers.items()) or "no credentials"
        if status not in (401, 403) or data == stream.body:
            raise WrongBytes(f"{base}{target} with {shown}: HTTP {status}, not refused")


def is_hit(server: str, cache: str) -> bool:
    if server == "edge":
        return "hit" in [part.strip() for part in cache.split(";")[1:]]
    if server == "nginx":
        return cache == "HIT"
    return True


def check_all(bases: dict[str, str], stream: Stream, cell: Cell, load: Load) -> None:
    for server, base in bases.items():
        for headers in load.checks:
            check(base, stream, cell, headers)
        if server == "edge":
            check_refusals(base, stream, cell, load)


def warm_and_check(bases: dict[str, str], stream: Stream, cell: Cell, load: Load) -> dict[str, str]:
    """Every cache warm and every answer right; returns how each server serves the cell."""
    served = {}
    for server, base in bases.items():
        headers = load.checks[0]
        check(base, stream, cell, headers)
        for _ in range(20):
            encoding, cache = check(base, stream, cell, headers)
            if is_hit(server, cache):
                break
            time.sleep(0.1)
        else:
            raise WrongBytes(f"{server} does not answer {stream.target} from cache: {cache}")
        served[server] = encoding if is_hit(server, cache) else f"{encoding} ({cache})"
    check_all(bases, stream, cell, load)
    return served


def fmt_rps(value: float) -> str:
    return f"{value:,.0f}"


def render(rows: list[dict[str, object]]) -> str:
    lines = [
        "| cell | served as (o/e/n) | origin req/s | origin p99 ms | edge req/s | edge p99 ms "
        "| nginx req/s | nginx p99 ms | edge/origin | edge/nginx | worst run spread "
        "| edge hits / fast path |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        med: dict[str, dict[str, float]] = row["medians"]  # type: ignore[assignment]
        cells = [str(row["cell"]), str(row["served"])]
        for server in SERVERS:
            if server in med:
                cells += [fmt_rps(med[server]["rps"]), f"{med[server]['p99_ms']:.2f}"]
            else:
                cells += ["n/a", "n/a"]
        cells.append(f"{med['edge']['rps'] / med['origin']['rps']:.2f}\u00d7")
        if "nginx" in med:
            cells.append(f"{med['edge']['rps'] / med['nginx']['rps']:.2f}\u00d7")
        else:
            cells.append("n/a")
        cells.append(f"{row['spread']:.0%}")
        cells.append(str(row["edge_hits"]))
        if row["errors"]:
            cells[0] += f" (**{row['errors']} errors**)"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio(row: dict[str, object], other: str) -> float | None:
    med: dict[str, dict[str, float]] = row["medians"]  # type: ignore[assignment]
    if other not in med:
        return None
    return med["edge"]["rps"] / med[other]["rps"]


def targets(rows: list[dict[str, object]]) -> str:
    """Issue 17's targets, as met or not by this run's medians (reported, never asserted)."""
    met: list[str] = []
    missed: list[str] = []
    tail: list[str] = []
    for row in rows:
        if not row["issue17"]:
            continue
        over_origin = ratio(row, "origin") or 0.0
        (met if over_origin >= OVER_ORIGIN else missed).append(
            f"{row['name']} {over_origin:.2f}\u00d7"
        )
        over_nginx = ratio(row, "nginx")
        if row["nginx_kind"] == "micro" and over_nginx is not None:
            verdict = "met" if over_nginx >= 1 else "**not met**"
            tail.append(f"{row['name']} {over_nginx:.2f}\u00d7, {verdict}")
    if not (met or missed):
        return ""
    text = f"Issue 17 targets (reported, not asserted): edge \u2265 {OVER_ORIGIN}\u00d7 origin: "
    text += f"met by {', '.join(met) or 'none'}"
    if missed:
        text += f"; **not met** by {', '.join(missed)}"
    text += "."
    if tail:
        text += f" Edge \u2265 nginx 1 s micro-cache (1 worker) at the tail: {'; '.join(tail)}."
    return text


@dataclass(frozen=True)
class EdgeCounts:
    hits: float = 0.0  # catch-up reads answered from the cache
    fast: float = 0.0  # ... of which by the pre-serialised hit path
    answered: float = 0.0  # requests answered

    def __add__(self, other: EdgeCounts) -> EdgeCounts:
        return EdgeCounts(
            self.hits + other.hits, self.fast + other.fast, self.answered + other.answered
        )

    def __sub__(self, other: EdgeCounts) -> EdgeCounts:
        return EdgeCounts(
            self.hits - other.hits, self.fast - other.fast, self.answered - other.answered
        )


def edge_counts(edge: Edge) -> EdgeCounts:
    """What the edge's /metrics has counted so far (every worker's, summed)."""
    hits = fast = answered = 0.0
    for family in text_string_to_metric_families(edge.metrics_text()):
        for sample in family.samples:
            if sample.name == "edge_cache_requests_total" and sample.labels.get("result") == "hit":
                hits += sample.value
            elif sample.name == "edge_fast_path_answers_total":
                fast += sample.value
            elif sample.name == "edge_requests_total":
                answered += sample.value
    return EdgeCounts(hits, fast, answered)


def fmt_share(counts: EdgeCounts) -> str:
    if not counts.answered:
        return "?"
    return f"{counts.hits / counts.answered:.1%} / {counts.fast / counts.answered:.1%}"


def time_one(
    cell: Cell, url: str, load: Load, args: argparse.Namespace, cores: frozenset[int]
) -> wrk.WrkRun:
    if cell.method == "HEAD":
        return headload.measure(
            url,
            headers=load.headers,
            connections=args.connections,
            duration_s=args.duration,
            cores=cores,
        )
    return wrk.run(
        url,
        headers=load.headers,
        connections=args.connections,
        duration_s=args.duration,
        cores=cores,
        script=load.script,
    )


def warm_rotation(
    cell: Cell, url: str, load: Load, args: argparse.Namespace, cores: frozenset[int]
) -> None:
    """Every rotated token sent to the edge before timing (each worker verifies a token's
    signature once, then knows it): the timed runs are the steady state of many readers."""
    workers = edge_workers(split_edge_args(args.edge_args))
    wanted = cell.tokens * (1 if workers == 1 else 4) + args.connections
    sent, deadline = 0, time.monotonic() + 60
    while sent < wanted and time.monotonic() < deadline:
        sent += wrk.run(
            url,
            headers=load.headers,
            connections=args.connections,
            duration_s=1,
            cores=cores,
            script=load.script,
        ).requests


def run_cell(
    name: str,
    stream: Stream,
    bases: dict[str, str],
    edge: Edge,
    auth: Auth,
    args: argparse.Namespace,
    cores: frozenset[int],
) -> dict[str, object]:
    cell = CELLS[name]
    load = load_for(cell, auth)
    served = warm_and_check(bases, stream, cell, load)
    servers = [server for server in SERVERS if server in bases]
    runs: dict[str, list[wrk.WrkRun]] = {server: [] for server in servers}
    if load.script is not None:
        warm_rotation(cell, bases["edge"] + target_of(cell, stream), load, args, cores)
    counted = EdgeCounts()
    for _ in range(args.runs):
        for server in servers:
            url = bases[server] + target_of(cell, stream)
            before = edge_counts(edge) if server == "edge" else EdgeCounts()
            runs[server].append(time_one(cell, url, load, args, cores))
            if server == "edge":
                counted = counted + (edge_counts(edge) - before)
    check_all(bases, stream, cell, load)  # still right after the load
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
        "name": name,
        "cell": cell.label,
        "served": "/".join(served.get(s, "n/a") for s in SERVERS),
        "medians": medians,
        "runs_rps": {s: [round(r.rps) for r in rs] for s, rs in runs.items()},
        "errors": sum(r.errors for rs in runs.values() for r in rs),
        "spread": spread,
        "edge_hits": fmt_share(counted),
        "issue17": cell.issue17,
        "nginx_kind": cell.nginx,
    }
    print(json.dumps(row), flush=True)
    return row


def profile(
    edge_pid: int, base: str, stream: Stream, args: argparse.Namespace, load: frozenset[int]
) -> tuple[Path, pyspy.Frames]:
    output = Path(args.profile)
    cell = CELLS["100B"]
    warm_and_check({"edge": base}, stream, cell, load_for(cell, Auth()))
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


def make_auth(cells: list[Cell], directory: Path) -> Auth:
    """The tokens, key set and auth service the chosen cells need, and nothing more."""
    count = max((cell.tokens for cell in cells if cell.edge == "jwt"), default=0)
    material = authbench.jwt_material(directory, count) if count else None
    rotation = None
    if material is not None and count > 1:
        values = [f"Bearer {t}" for t in material.tokens]
        rotation = wrk.rotation_script(directory, "Authorization", values)
    forward = (
        authbench.ForwardService().start() if any(c.edge == "forward" for c in cells) else None
    )
    return Auth(jwt=material, forward=forward, rotation=rotation)


def edge_config(group: str, auth: Auth) -> list[str]:
    """The flags an edge for ``group``'s cells gets after ``--edge-args``."""
    if group == "jwt":
        assert auth.jwt is not None
        return [
            "--auth", "jwt", "--jwt-jwks", str(auth.jwt.jwks),
            "--origin-header", ORIGIN_CREDENTIAL,
        ]  # fmt: skip
    if group == "forward":
        assert auth.forward is not None
        return [
            "--auth", "forward", "--auth-url", auth.forward.url,
            "--origin-header", ORIGIN_CREDENTIAL,
        ]  # fmt: skip
    return []


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
    parser.add_argument(
        "--cells", nargs="+", default=list(CELLS), choices=list(CELLS), help="default: all"
    )
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


def run_group(
    group: str,
    names: list[str],
    edge: Edge,
    origin: Origin,
    nginxes: dict[str, Nginx],
    streams: dict[tuple[int, bool, bool], Stream],
    auth: Auth,
    args: argparse.Namespace,
    cores: Cores,
) -> dict[str, dict[str, object]]:
    """The rows of the cells among ``names`` that run on ``group``'s edge."""
    servers = {"origin": origin.url, "edge": edge.url} | {
        f"nginx ({kind})": n.url for kind, n in nginxes.items()
    }
    pins = {"origin": affinity_of(origin.process.pid), "edge": affinity_of(edge.process.pid)}
    for kind, n in nginxes.items():
        pins[f"nginx ({kind})"] = ",".join(sorted({affinity_of(p) for p in n.worker_pids()}))
    print(f"{group} edge: servers {json.dumps(servers)}; cores {json.dumps(pins)}")
    rows = {}
    for name in names:
        cell = CELLS[name]
        if cell.edge != group:
            continue
        bases = {"origin": origin.url, "edge": edge.url}
        if cell.nginx in nginxes:
            bases["nginx"] = nginxes[cell.nginx].url
        rows[name] = run_cell(name, streams[cell.stream_key], bases, edge, auth, args, cores.load)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if wrk.wrk_binary() is None:
        print("wrk not found: `make bootstrap` installs Debian's wrk", file=sys.stderr)
        return 2
    bench = Bench.begin("edge-hits-", pin=not args.no_pin, edge_args=args.edge_args)
    names = list(dict.fromkeys(args.cells))
    cells = [CELLS[name] for name in names]
    # One edge per configuration, in the order the cells first need it; the profile, the plain one.
    groups = list(dict.fromkeys((["plain"] if args.profile else []) + [c.edge for c in cells]))
    origin = bench.origin("hits-origin")
    nginxes: dict[str, Nginx] = {}
    auth = Auth()
    rows: dict[str, dict[str, object]] = {}
    profiled = None
    try:
        try:
            with pinned(bench.cores.server):
                for kind in dict.fromkeys(c.nginx for c in cells if c.nginx != "none"):
                    nginxes[kind] = start_nginx(origin.url, micro=kind == "micro")
        except NginxFailed as failure:
            print(str(failure), file=sys.stderr)
            return 2
        auth = make_auth(cells, bench.logs)
        print(f"logs in {bench.logs}")
        stamp = str(int(time.time() * 1000))
        needed = {c.stream_key: c for c in cells} | (
            {CELLS["100B"].stream_key: CELLS["100B"]} if args.profile else {}
        )
        streams = {
            key: make_stream(origin.url, cell, stamp) for key, cell in sorted(needed.items())
        }
        for group in groups:
            also = "" if group == "plain" else f" and the {group} cells' --auth flags"
            edge = bench.edge(
                origin, *edge_config(group, auth), name=f"hits-edge-{group}", also=also
            )
            try:
                rows |= run_group(
                    group, names, edge, origin, nginxes, streams, auth, args, bench.cores
                )
                if group == "plain" and args.profile:
                    stream = streams[CELLS["100B"].stream_key]
                    profiled = profile(edge.process.pid, edge.url, stream, args, bench.cores.load)
            finally:
                edge.stop()
    except EdgeDidNotStart:
        return 2
    except (WrongBytes, wrk.WrkFailed, pyspy.ProfileFailed, SetupFailed) as failure:
        print(f"benchmark failed: {failure}", file=sys.stderr)
        return 1
    finally:
        for server in nginxes.values():
            server.stop()
        if auth.forward is not None:
            auth.forward.stop()
        origin.stop()
    ordered = [rows[name] for name in names]
    rendered = render(ordered)
    goals = targets(ordered)
    print(rendered)
    if goals:
        print(goals)
        rendered += f"\n\n{goals}"
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
        write_doc(args, rendered + profile_text, bench)
    return 0


def write_doc(args: argparse.Namespace, body: str, bench: Bench) -> None:
    date = now_utc()
    edge_args = f"`{args.edge_args}`" if args.edge_args else "none"
    # The time in the heading: every run is a section of its own, earlier ones are kept.
    heading = f"## Cached hits: origin, edge, nginx ({date}, edge args {edge_args})"
    chosen = {CELLS[name].edge for name in args.cells} | {
        name for name in args.cells if name in ("tail2KB", "cookie", "head")
    }
    notes = [
        note
        for key, note in (
            (
                "tail2KB",
                "The at-tail cell reads `?offset=-1` of an open 2 KB stream: every server's answer "
                "carried `Stream-Up-To-Date: true` and the tail offset. The edge runs its default "
                "`--tail-freshness` (1 s) with no live tail, so about once a second its stored "
                "answer lapses and a read goes to the origin; its nginx is a second instance, a "
                "micro-cache (`proxy_cache_valid 200 1s`, `proxy_cache_use_stale updating`, "
                "`proxy_cache_lock on`).",
            ),
            (
                "cookie",
                f"The cookie cell sends `Cookie: {COOKIE}`: a credential scope of its own at the "
                "edge (default `--scope-headers`), and in nginx's key.",
            ),
            (
                "jwt",
                f"The jwt cells run against an edge started with `--auth jwt --jwt-jwks FILE "
                f"--origin-header '{ORIGIN_CREDENTIAL}'`, reading with `Authorization: Bearer` "
                f"one HS256 token or {JWT_MANY:,} distinct ones round-robin (a wrk Lua script "
                f"builds the requests once). Before timing the many-token cell, the edge was "
                f"sent every token (1 s wrk runs until it had {JWT_MANY:,} requests, four passes "
                f"with several workers): each worker verifies a signature once per token, so the "
                f"timed runs are the steady state of that many readers.",
            ),
            (
                "forward",
                "The forward cell runs against an edge started with `--auth forward --auth-url` "
                "a loopback aiohttp service in the benchmark's process (204, "
                f"`Cache-Control: max-age={authbench.FORWARD_MAX_AGE}`; the edge keeps a "
                "verdict `--auth-cache-seconds`, 10 s), reading with a session cookie.",
            ),
            (
                "head",
                "The HEAD cell is timed by `loadtest/headload.py` (Python, keep-alive, one "
                "request in flight per connection; wrk cannot time HEAD), so a fast server may "
                "outrun it; the edge answers a HEAD of a stream it knows all of itself "
                "(`Cache-Control: no-store`, the real tail), from its hit path.",
            ),
        )
        if key in chosen
    ]
    if "jwt" in chosen or "forward" in chosen:
        notes.append(
            "The auth cells' origin column is the origin sent the same requests (it has no auth "
            "and ignores them); before and after timing the auth edge refused a read without "
            "credentials and one with a forged credential (401/403). Their nginx is n/a: it "
            "cannot check a token or ask an auth service."
        )
    section = (
        f"{heading}\n\n"
        f"{bench.provenance('loadtest.hits')}. `text/plain` streams made at "
        f"the origin (closed unless said); each cell reads `GET <stream>?offset=-1` (the "
        f"mid-stream cell: `?offset=` the offset after a {PREFIX_BYTES}-byte prefix, a closed "
        f"range that starts inside the stream) with `wrk -t1 -c{args.connections} "
        f"-d{round(args.duration)}s --latency`, gzip cells with `-H 'Accept-Encoding: gzip'`. "
        f"req/s and p99 are medians of {args.runs} runs, the servers interleaved run by run; "
        f'"worst run spread" is the largest (max - min) / median of req/s among the servers. '
        f"Before and after timing, every server's answer was the bytes written (gzip "
        f"decompressed) and a hit where there is a cache (edge `Cache-Status: edge; hit`, "
        f'nginx `X-Cache-Status: HIT`). "served as" is the Content-Encoding of '
        f"origin/edge/nginx (no one compresses under 1 KiB), with the edge's Cache-Status "
        f'where it is no hit. "edge hits / fast path": the shares of the edge\'s answers during '
        f"timing that its /metrics counts as cache hits (`edge_cache_requests_total"
        f'{{result="hit"}}`) and as answered by the pre-serialised hit path '
        f"(`edge_fast_path_answers_total`), over `edge_requests_total`.\n\n"
        + (" ".join(notes) + "\n\n" if notes else "")
        + f"nginx: Debian's, one worker, `proxy_cache` forced (`proxy_cache_valid 200 304 1h`, "
        f"`proxy_ignore_headers Cache-Control Expires Set-Cookie Vary`), key = request URI + "
        f"`Accept-Encoding` + `Authorization` + `Cookie`, `access_log off`, `sendfile on`, "
        f"`tcp_nopush off` (on, it stalled each 64 KB hit ~45 ms on loopback). Its gzip rows "
        f"serve the origin's gzip answer, compressed once on the miss and cached: nginx's own "
        f"`gzip on` would compress every hit, as the origin does, so this is the compress-once "
        f"comparison.\n\n"
        f"Pinning: {bench.pinning()}. {bench.load_average()}: the machine is shared with other "
        f"engineers' builds and tests, so the figures are noisy; compare ratios from one run.\n\n"
        f"{body}\n"
    )
    publish(args.output, heading, section)


if __name__ == "__main__":
    sys.exit(main())
