"""Soak: does one edge stay flat (memory, descriptors, tasks) under hours-like churn?

    .venv/bin/python -m loadtest.soak --minutes 15

Starts the reference origin, redis-server and one edge (``--redis-url``, ``--cache-bytes`` 16MiB,
which fills during the warm-up), then for ``--minutes`` churns: streams (JSON and text,
alternately) are created, appended to at a steady rate, closed, read a while longer and deleted
(each lives 30-60 s, a few hundred over 15 min); SSE viewers join open streams and leave (raw
sockets; one in ten leaves before the response headers); catch-up reads land at random known
offsets, a quarter revalidate with ``If-None-Match``, one in twenty carries a random cookie (a
scope of its own).

Every ``--sample-seconds`` it records the edge's RSS and open descriptors (``/proc``) and, from
its admin ``/metrics``, the cache gauges, every ``edge_budget_*`` series, the event-loop task
count, live tails and SSE viewers (whichever exist). At the end: the least-squares slope per
minute of each series after ``--warmup-minutes``, and a verdict (``flat`` when RSS, descriptors
and tasks are). Table and slopes go to ``docs/soak.md``.

Correctness, checked while churning: whatever a viewer or a catch-up read got must equal the
writer's bytes (items, for JSON) at that position; a read that starts after a DELETE must get
404. Exit code: 1 if the edge died, 2 if any check failed, 130 on Ctrl-C; 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import resource
import signal
import string
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devstack.processes import REPO, new_logs_dir, start_edge, start_origin, start_redis
from edge.protocol.sse import SseDecoder

MiB = 1024 * 1024
NAMED = {
    "edge_cache_bytes": "cache MiB",
    "edge_cache_segments": "segments",
    "edge_event_loop_tasks": "tasks",
    "edge_live_tails": "tails",
    "edge_sse_viewers": "viewers",
}
VERDICT_SERIES = ("RSS MiB", "RSS - cache MiB", "fds", "tasks")
RSS_FLAT_MIB_PER_MIN = 0.25


@dataclass
class Stream:
    """One stream's history as its writer sent it. Bytes (items) are recorded before each append
    is sent, so a viewer that sees an append before the writer's response still checks out."""

    path: str
    json: bool
    via_origin: bool
    written: bytearray = field(default_factory=bytearray)
    items: list[Any] = field(default_factory=list)
    offsets: list[tuple[str, int]] = field(default_factory=list)  # (offset, position)
    etags: dict[str, str] = field(default_factory=dict)
    closed: bool = False
    deleting: bool = False
    deleted_at: float | None = None
    broken: bool = False  # an append never landed: nothing can be checked

    def difference(self, position: int, got: bytes | list[Any]) -> str | None:
        """None when ``got`` is what was written at ``position``; else where and how not."""
        reference: bytearray | list[Any] = self.items if self.json else self.written
        expected = reference[position : position + len(got)]
        if expected == got:
            return None
        at = next(
            (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
            len(expected),
        )
        span = 2 if self.json else 24
        return (
            f"{len(got)} {'items' if self.json else 'bytes'} from position {position}, "
            f"{len(reference)} written; first difference at +{at}: "
            f"expected {expected[at : at + span]!r}, got {got[at : at + span]!r}"
        )


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)

    def mismatch(self, what: str) -> None:
        self.counts["mismatches"] += 1
        if len(self.mismatches) < 50:
            self.mismatches.append(what)
            print(f"MISMATCH {what}", flush=True)


def parse_metrics(text: str) -> dict[str, float]:
    """The series the soak follows, named for the table; ``edge_budget_*`` generically."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, raw = line.rpartition(" ")
        name, _, labels = series.partition("{")
        value = float(raw)
        if name in NAMED:
            found[NAMED[name]] = value / MiB if name.endswith("_bytes") else value
        elif name.startswith("edge_budget_") and not name.endswith("_created"):
            label = ",".join(v for _, v in re.findall(r'(\w+)="([^"]*)"', labels))
            column = name.removeprefix("edge_") + (f"[{label}]" if label else "")
            if name.endswith("_bytes"):
                found[column + " MiB"] = value / MiB
            else:
                found[column] = value
    return found


def proc_sample(pid: int) -> dict[str, float]:
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return {"RSS MiB": rss, "fds": float(len(os.listdir(f"/proc/{pid}/fd")))}


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def threshold(column: str, mean: float) -> float:
    """What counts as flat, per minute: RSS 0.25 MiB; other MiB series the larger of 0.25 MiB
    and 2% of their mean; counts the larger of 2 and 2% of their mean."""
    if column in ("RSS MiB", "RSS - cache MiB"):
        return RSS_FLAT_MIB_PER_MIN
    floor = 0.25 if column.endswith("MiB") else 2.0
    return max(floor, 0.02 * abs(mean))


class Soak:
    def __init__(self, args: argparse.Namespace, edge_url: str, origin_url: str, admin: str):
        self.args = args
        self.edge_url = edge_url
        self.origin_url = origin_url
        self.admin = admin
        self.host, port = edge_url.removeprefix("http://").split(":")
        self.port = int(port)
        self.rng = random.Random(args.seed)
        self.tally = Tally()
        self.streams: dict[str, Stream] = {}
        self.viewers = 0
        self.samples: list[dict[str, float]] = []
        self.edge_died = False
        self.seconds = args.minutes * 60
        # Short runs shrink stream lifetimes so they still see closes and deletes.
        self.scale = min(1.0, self.seconds / 300)
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self, edge_pid: int, alive: Callable[[], bool]) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as http:
            self.http = http
            started = time.monotonic()
            end = started + self.seconds
            loops = [
                asyncio.create_task(self.stream_spawner(end)),
                asyncio.create_task(self.viewer_spawner(end)),
                asyncio.create_task(self.reader(end)),
            ]
            try:
                await self.sampler(started, end, edge_pid, alive)
            finally:
                for task in [*loops, *self.tasks]:
                    task.cancel()
                await asyncio.gather(*loops, *self.tasks, return_exceptions=True)

    # -- streams ---------------------------------------------------------------------------

    async def stream_spawner(self, end: float) -> None:
        mean_life = (self.args.stream_min_seconds + self.args.stream_max_seconds) / 2
        interval = mean_life * self.scale / self.args.streams
        index = 0
        while time.monotonic() < end:
            self.spawn(self.life(index))
            index += 1
            await asyncio.sleep(interval * self.rng.uniform(0.5, 1.5))

    async def life(self, index: int) -> None:
        # JSON and text alternate; every third stream is written at the origin directly, so the
        # edge learns of its appends only through its tails and tail freshness.
        stream = Stream(
            path=f"/v1/stream/soak-{index}", json=index % 2 == 0, via_origin=index % 3 == 0
        )
        try:
            await self.lifecycle(stream)
        except (aiohttp.ClientError, TimeoutError) as error:
            self.tally.counts[f"writer {type(error).__name__}"] += 1
        finally:
            self.streams.pop(stream.path, None)

    async def lifecycle(self, stream: Stream) -> None:
        base = self.origin_url if stream.via_origin else self.edge_url
        content_type = "application/json" if stream.json else "text/plain"
        async with self.http.put(base + stream.path, headers={"Content-Type": content_type}) as r:
            if r.status != 201:
                self.tally.counts[f"create {r.status}"] += 1
                return
            stream.offsets.append((r.headers["Stream-Next-Offset"], 0))
        self.streams[stream.path] = stream
        self.tally.counts["streams created"] += 1
        lifetime = self.scale * self.rng.uniform(
            self.args.stream_min_seconds, self.args.stream_max_seconds
        )
        started = time.monotonic()
        seq = 0
        while time.monotonic() < started + lifetime and not stream.broken:
            await self.append(stream, base, content_type, seq)
            seq += 1
            next_at = started + seq / self.args.append_rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        async with self.http.post(base + stream.path, headers={"Stream-Closed": "true"}) as r:
            self.tally.counts[
                "streams closed" if r.status in (200, 204) else f"close {r.status}"
            ] += 1
        stream.closed = True
        await asyncio.sleep(20 * self.scale)  # catch-up reads of the closed stream
        stream.deleting = True
        async with self.http.delete(self.edge_url + stream.path) as r:
            self.tally.counts[
                "streams deleted" if r.status in (200, 204) else f"delete {r.status}"
            ] += 1
        stream.deleted_at = time.monotonic()
        await asyncio.sleep(10 * self.scale)  # reads now must get 404

    def next_part(self, stream: Stream, seq: int) -> bytes:
        big = self.rng.random() < 0.025
        if stream.json:
            pad = "x" * (self.rng.randrange(8_000, 32_000) if big else self.rng.randrange(40))
            batch = [{"seq": seq, "n": n, "pad": pad} for n in range(self.rng.randint(1, 3))]
            stream.items += batch
            return json.dumps(batch).encode()
        if big:
            text = "".join(
                self.rng.choices(string.ascii_letters, k=self.rng.randrange(8_000, 32_000))
            )
        else:
            # LLM-like tokens: leading spaces, the odd newline and multi-byte character.
            text = self.rng.choice([f" tok{seq}", f" w{seq},", "\n", " é", " 日本語", f"{seq}"])
        part = text.encode()
        stream.written += part
        return part

    async def append(self, stream: Stream, base: str, content_type: str, seq: int) -> None:
        part = self.next_part(stream, seq)
        headers = {
            "Content-Type": content_type,
            "Producer-Id": "soak",
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        for _ in range(20):  # an idempotent producer: a retry of a landed append is not applied
            try:
                async with self.http.post(base + stream.path, data=part, headers=headers) as r:
                    if r.status in (200, 204):
                        # A retry of an append that landed is a duplicate: 204 without the
                        # offset it reached (the reference origin's answer).
                        if "Stream-Next-Offset" in r.headers:
                            size = len(stream.items) if stream.json else len(stream.written)
                            stream.offsets.append((r.headers["Stream-Next-Offset"], size))
                        self.tally.counts["appends"] += 1
                        return
                    self.tally.counts[f"append {r.status}"] += 1
            except (aiohttp.ClientError, TimeoutError):
                self.tally.counts["append errors"] += 1
            await asyncio.sleep(0.1)
        stream.broken = True

    # -- viewers ---------------------------------------------------------------------------

    async def viewer_spawner(self, end: float) -> None:
        while time.monotonic() < end:
            open_streams = [s for s in self.streams.values() if not s.closed]
            if self.viewers < self.args.viewers and open_streams:
                self.viewers += 1
                self.spawn(self.viewer(self.rng.choice(open_streams)))
                await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(0.1)

    async def viewer(self, stream: Stream) -> None:
        try:
            await self.view(stream)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            self.tally.counts[f"viewer {type(error).__name__}"] += 1
        finally:
            self.viewers -= 1

    async def view(self, stream: Stream) -> None:
        offset, position = ("-1", 0)
        if self.rng.random() < 0.2:
            offset, position = self.rng.choice(stream.offsets)
        cookie = f"Cookie: s={self.rng.getrandbits(48)}\r\n" if self.rng.random() < 0.05 else ""
        request = (
            f"GET {stream.path}?offset={offset}&live=sse HTTP/1.0\r\n"
            f"Host: {self.host}:{self.port}\r\n{cookie}\r\n"
        )
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.tally.counts["viewers"] += 1
        try:
            writer.write(request.encode())
            if self.rng.random() < 0.1:  # leaves before the response headers
                await asyncio.sleep(self.rng.uniform(0, 0.02))
                self.tally.counts["viewers left early"] += 1
                return
            got_bytes = bytearray()
            served = "no response"
            got_items: list[Any] = []
            try:
                async with asyncio.timeout(self.rng.uniform(2, 30)):
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                    if not head.startswith(("http/1.1 200", "http/1.0 200")):
                        self.tally.counts[f"viewer status {head[9:12]}"] += 1
                        return
                    binary = "stream-sse-data-encoding: base64" in head
                    status = re.search(r"^cache-status: (.*?)\r$", head, re.MULTILINE)
                    served = status.group(1) if status else "no cache-status"
                    decoder = SseDecoder()
                    pending: list[str] = []
                    while chunk := await reader.read(65536):
                        for event in decoder.feed(chunk):
                            if event.event == "data":
                                pending.append(event.data)
                            elif event.event == "control":
                                # Bytes count once their control event names the offset after.
                                for data in pending:
                                    if stream.json:
                                        got_items += json.loads(data)
                                    else:
                                        got_bytes += (
                                            base64.b64decode(data) if binary else data.encode()
                                        )
                                pending.clear()
                                if json.loads(event.data).get("streamClosed"):
                                    raise TimeoutError
            except TimeoutError:
                pass
            got: bytes | list[Any] = got_items if stream.json else bytes(got_bytes)
            self.tally.counts["viewers checked"] += 1
            self.tally.counts["viewer bytes" if not stream.json else "viewer items"] += len(got)
            difference = None if stream.broken else stream.difference(position, got)
            if difference:
                scoped = "with a cookie" if cookie else "no cookie"
                self.tally.mismatch(
                    f"SSE viewer of {stream.path} from {offset} ({scoped}; {served}): {difference}"
                )
        finally:
            writer.close()

    # -- catch-up reads --------------------------------------------------------------------

    async def reader(self, end: float) -> None:
        while time.monotonic() < end:
            if self.streams:
                self.spawn(self.read_once(self.rng.choice(list(self.streams.values()))))
            await asyncio.sleep(self.rng.expovariate(self.args.reads_per_second))

    async def read_once(self, stream: Stream) -> None:
        offset, position = self.rng.choice(stream.offsets)
        headers: dict[str, str] = {}
        etag = stream.etags.get(offset)
        if etag and self.rng.random() < 0.25:
            headers["If-None-Match"] = etag
        if self.rng.random() < 0.05:
            headers["Cookie"] = f"s={self.rng.getrandbits(48)}"
            self.tally.counts["scoped reads"] += 1
        after_delete = stream.deleted_at is not None
        try:
            async with self.http.get(
                f"{self.edge_url}{stream.path}?offset={offset}", headers=headers
            ) as r:
                body = await r.read()
                self.tally.counts["reads"] += 1
                if r.status in (404, 410):
                    self.tally.counts["reads 404"] += 1
                    if not stream.deleting:  # a DELETE in flight may already have landed
                        self.tally.mismatch(f"read {stream.path} got {r.status} before DELETE")
                    return
                if after_delete:
                    self.tally.mismatch(f"read {stream.path} got {r.status} after DELETE")
                    return
                if r.status == 304:
                    self.tally.counts["reads 304"] += 1
                    return
                if r.status != 200:
                    self.tally.counts[f"read {r.status}"] += 1
                    return
                if "ETag" in r.headers:
                    stream.etags[offset] = r.headers["ETag"]
                got: bytes | list[Any] = json.loads(body) if stream.json else body
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            self.tally.counts[f"read {type(error).__name__}"] += 1
            return
        difference = None if stream.broken else stream.difference(position, got)
        if difference:
            self.tally.mismatch(f"catch-up read of {stream.path} at {offset}: {difference}")

    # -- samples ---------------------------------------------------------------------------

    async def sampler(
        self, started: float, end: float, pid: int, alive: Callable[[], bool]
    ) -> None:
        columns: list[str] = []
        while True:
            if not alive():
                self.edge_died = True
                print("EDGE DIED", flush=True)
                return
            sample = {"minute": (time.monotonic() - started) / 60, **proc_sample(pid)}
            try:
                async with self.http.get(self.admin + "/metrics") as r:
                    sample.update(parse_metrics(await r.text()))
            except (aiohttp.ClientError, TimeoutError):
                self.tally.counts["metrics errors"] += 1
            if "cache MiB" in sample:
                # What the edge holds outside its one budget: this must not grow.
                sample["RSS - cache MiB"] = sample["RSS MiB"] - sample["cache MiB"]
            sample["open streams"] = float(sum(not s.closed for s in self.streams.values()))
            sample["soak viewers"] = float(self.viewers)
            self.samples.append(sample)
            if list(sample) != columns:
                columns = list(sample)
                print(" | ".join(f"{c:>{max(8, len(c))}}" for c in columns), flush=True)
            print(
                " | ".join(f"{_fmt(c, sample[c]):>{max(8, len(c))}}" for c in columns), flush=True
            )
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(self.args.sample_seconds, max(0.0, end - time.monotonic())))


def _fmt(column: str, value: float) -> str:
    return f"{value:.2f}" if column == "minute" or column.endswith("MiB") else f"{value:.0f}"


def summarize(soak: Soak, warmup: float) -> tuple[str, list[str]]:
    """The Markdown report and the names of the verdict series that are not flat."""
    columns: list[str] = []
    for sample in soak.samples:
        columns += [c for c in sample if c not in columns]
    table = ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for sample in soak.samples:
        table.append(
            "| " + " | ".join(_fmt(c, sample.get(c, float("nan"))) for c in columns) + " |"
        )
    after = [s for s in soak.samples if s["minute"] >= warmup]
    slopes = ["| series | slope per minute | threshold | verdict |", "|---|---:|---:|---|"]
    not_flat: list[str] = []
    for column in columns[1:]:
        points = [(s["minute"], s[column]) for s in after if column in s]
        slope = slope_per_minute(points)
        if slope is None:
            slopes.append(f"| {column} | n/a | | too few samples after warm-up |")
            continue
        limit = threshold(column, sum(v for _, v in points) / len(points))
        verdict = "flat" if abs(slope) < limit else ("growing" if slope > 0 else "shrinking")
        if column in VERDICT_SERIES and verdict == "growing":
            not_flat.append(column)
        slopes.append(f"| {column} | {slope:+.3f} | {limit:.2f} | {verdict} |")
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(soak.tally.counts.items()))
    verdict = "flat" if not not_flat else "GROWING: " + ", ".join(not_flat)
    if soak.edge_died:
        verdict = "the edge DIED"
    report = [
        f"# Soak ({time.strftime('%Y-%m-%d %H:%M')})\n",
        f"`{' '.join(['python -m loadtest.soak', *sys.argv[1:]])}` — one edge "
        f"(`--redis-url`, `--cache-bytes {soak.args.cache_bytes}`) in front of the reference "
        "origin, "
        f"{soak.args.streams} streams open at a time ({soak.args.append_rate:g} appends/s each), "
        f"up to {soak.args.viewers} SSE viewers, {soak.args.reads_per_second:g} catch-up reads/s, "
        f"all on the same 2 cores. `soak viewers` and `open streams` are the load, for context.\n",
        "\n".join(table) + "\n",
        f"Least-squares slopes after a {warmup:g}-minute warm-up ({len(after)} samples); "
        f"the verdict looks at {', '.join(VERDICT_SERIES)}: RSS is flat below "
        f"{RSS_FLAT_MIB_PER_MIN} MiB/min.\n",
        "\n".join(slopes) + "\n",
        f"**Verdict: {verdict}.** Edge {'DIED' if soak.edge_died else 'alive at the end'}.\n",
        f"Load: {counts}.\n",
    ]
    if soak.tally.mismatches:
        report.append("Mismatches:\n\n" + "\n".join(f"- {m}" for m in soak.tally.mismatches) + "\n")
    return "\n".join(report), not_flat


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--streams", type=int, default=12, help="streams open at a time")
    parser.add_argument("--stream-min-seconds", type=float, default=30.0)
    parser.add_argument("--stream-max-seconds", type=float, default=60.0)
    parser.add_argument("--append-rate", type=float, default=4.0, help="appends/s per stream")
    parser.add_argument("--viewers", type=int, default=120, help="SSE viewers at a time")
    parser.add_argument("--reads-per-second", type=float, default=20.0)
    # Small enough that the budget fills during the warm-up: after it, RSS itself must be flat.
    parser.add_argument("--cache-bytes", default="16MiB")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "soak.md")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logs = new_logs_dir("edge-soak-")
    print(f"logs: {logs}", flush=True)
    stoppable: list[Any] = []
    interrupted = False
    soak: Soak | None = None
    try:
        origin = start_origin(logs)
        stoppable.append(origin)
        redis = start_redis(logs)
        stoppable.append(redis)
        edge = start_edge(
            origin.url,
            logs,
            "--redis-url",
            redis.url,
            "--cache-bytes",
            args.cache_bytes,
            "--max-segment-bytes",
            "4MiB",
        )
        stoppable.append(edge)
        soak = Soak(args, edge.url, origin.url, edge.admin_url)
        try:
            import uvloop

            uvloop.run(soak.run(edge.process.pid, edge.process.alive))
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: stopping", flush=True)
        soak.edge_died = soak.edge_died or not edge.process.alive()
    finally:
        for process in reversed(stoppable):
            process.stop()
    assert soak is not None
    report, _ = summarize(soak, args.warmup_minutes)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    if soak.edge_died:
        return 1
    if soak.tally.mismatches:
        return 2
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
