"""Issue 18's closing figures: offload and correctness through Varnish and nginx, running the
shipped configs, next to the edge alone.

    .venv/bin/python -m loadtest.cdn [--readers 1000] [--herd 500] [--viewers 200]
        [--long-poll-timeout 5] [--edge-args "..."] [--no-write]

One real origin, one real edge (``--cdn-purge varnish=`` the Varnish in front of it,
``--long-poll-timeout`` shortened so herds that time out are quick, ``--max-response-bytes
64 KiB`` so a capped answer is cheap to make), Debian's Varnish 7.1 with
``deploy/varnish/edge.vcl`` and nginx with ``deploy/nginx/edge.conf`` (only their ports
rewritten; ``devstack.cdn``). Each figure is measured three times, with the clients straight at
the edge, through Varnish and through nginx, each on a fresh stream:

* offload: ``--readers`` concurrent cold readers of a closed stream, then as many warm ones;
* a herd of ``--herd`` long-polls parked at a stream's tail and released by one append, and a
  herd that times out, two rounds (the second follows the cursor the first was given);
* correctness: DELETE and recreate through the tier, an operator ``POST /purge`` after the
  origin's stream was replaced behind the edge's back, a 404 then a create at the origin: how
  long until every reader gets the new instance, and whether, 2 s on, any read still gets an
  old byte or an old ETag a 304; a HEAD after a capped GET (the true tail?); a credentialed read
  then an anonymous one (was the anonymous one served the credential's copy?);
* SSE: ``--viewers`` viewers per tier of one writer (20 appends/s): every viewer exact, latency
  from each append's send to each viewer having it; 20 viewers per tier resume by
  ``Last-Event-ID`` after the writer went on.

What reached the edge is the edge's own count (``/metrics``), what reached the origin the
origin's request counter for the stream; every answer is checked against what was written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from devstack.cdn_stack import (
    Answer,
    Stack,
    append,
    create,
    delete,
    edge_reads,
    fetch,
    herd,
    herd_outcomes,
    long_lived_at_edge,
    long_polls_waiting,
    start_stack,
    tier_url,
)
from devstack.processes import REPO
from loadtest.benchkit import Bench, publish, split_edge_args
from loadtest.cdn_report import GIVE_UP_SECONDS, quantile, render
from loadtest.cdn_sse import sse_figures

TIERS = ("edge", "varnish", "nginx")
MAX_RESPONSE_BYTES = 64 * 1024
DOUBLE_PURGE_PASSED_SECONDS = 3.0
READING = (
    "How to read it. Every wait and spread is measured where the answers arrive, in one Python "
    "client process, so absolute milliseconds are mostly the client's (about 1 ms per answer at "
    'these herd sizes); compare the tiers within a run. The "edge" rows are the clients '
    "straight at the edge: every request reaches it by definition. Through nginx, DELETE + "
    "recreate and the operator purge keep serving the old instance (and 304 to its ETag) past the "
    "probe by design: nginx open source cannot purge by key, so it keeps only the edge's "
    "`Cache-Control`, the browser's lifetime (`--browser-max-age`), and serves old bytes for at "
    'most that long (docs/cdn.md, "nginx").'
)
PURGE_BOUND_SECONDS = 2.0


def origin_reads(stack: Stack, path: str) -> int:
    counts = stack.origin.counts(path)
    return sum(r["count"] for r in counts["requests"] if r["method"] in ("GET", "HEAD"))


class Run:
    def __init__(self, stack: Stack, session: aiohttp.ClientSession, args: argparse.Namespace):
        self.stack, self.session, self.args = stack, session, args
        self.serial = 0

    def path(self, what: str, tier: str) -> str:
        self.serial += 1
        return f"/v1/stream/cdn-{what}-{tier}-{os.getpid()}-{self.serial}"

    # --- offload -----------------------------------------------------------------------------

    async def offload(self, tier: str) -> dict[str, Any]:
        path = self.path("offload", tier)
        body = b"closed stream bytes, " * 800
        await create(self.session, self.stack.edge.url + path, [body], close=True)
        # The creating PUT made the edge purge the CDN, at once and once more 2 s later
        # (the double purge, docs/cdn.md); that second one would take the cold phase's copy.
        await asyncio.sleep(DOUBLE_PURGE_PASSED_SECONDS)
        url = tier_url(self.stack, tier) + path + "?offset=-1"
        row: dict[str, Any] = {"tier": tier}
        for phase in ("cold", "warm"):
            edge_before, origin_before = edge_reads(self.stack.edge), origin_reads(self.stack, path)
            started = time.monotonic()
            answers = await herd(self.session, url, self.args.readers, give_up_after=60)
            waits = [a.at - started for a in answers]
            await asyncio.sleep(0.2)  # the edge counts an answer just after the client has it
            row[phase] = {
                "exact": sum(a.status == 200 and a.body == body for a in answers),
                "edge": edge_reads(self.stack.edge) - edge_before,
                "origin": origin_reads(self.stack, path) - origin_before,
                "p50": statistics.median(waits),
                "p99": quantile(waits, 0.99),
            }
        return row

    # --- long-poll herds ---------------------------------------------------------------------

    async def parked(self, url: str, give_up_after: float) -> asyncio.Task[Any]:
        task = asyncio.create_task(
            herd_outcomes(self.session, url, self.args.herd, give_up_after=give_up_after)
        )
        deadline = time.monotonic() + self.args.long_poll_timeout
        while long_polls_waiting(self.stack.edge) < 1:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # the rest of the herd reaches the tier and parks
        return task

    async def released(self, tier: str) -> dict[str, Any]:
        path = self.path("released", tier)
        tail = await create(self.session, self.stack.edge.url + path, [b"before "])
        url = tier_url(self.stack, tier) + path + f"?offset={tail}&live=long-poll"
        news = b"the news"
        edge_before, origin_before = edge_reads(self.stack.edge), origin_reads(self.stack, path)
        waiting = await self.parked(url, self.args.long_poll_timeout * 3)
        appended = time.monotonic()
        await append(self.session, self.stack.edge.url + path, news)
        outcomes = await waiting
        answers = [o for o in outcomes if isinstance(o, Answer)]
        await asyncio.sleep(0.2)
        arrivals = [a.at for a in answers] or [appended]
        return {
            "tier": tier,
            "exact": sum(a.status == 200 and a.body == news for a in answers),
            "cursors": len({a.header("Stream-Cursor") for a in answers}),
            "edge": edge_reads(self.stack.edge) - edge_before,
            "origin": origin_reads(self.stack, path) - origin_before,
            "spread": max(arrivals) - min(arrivals),
            "p99": quantile([t - appended for t in arrivals], 0.99),
        }

    async def timed_out(self, tier: str) -> dict[str, Any]:
        path = self.path("timeout", tier)
        tail = await create(self.session, self.stack.edge.url + path, [b"quiet"])
        url = tier_url(self.stack, tier) + path + f"?offset={tail}&live=long-poll"
        rounds = []
        for _ in range(2):
            edge_before, origin_before = edge_reads(self.stack.edge), origin_reads(self.stack, path)
            started = time.monotonic()
            give_up = self.args.long_poll_timeout * 4
            outcomes = await herd_outcomes(self.session, url, self.args.herd, give_up_after=give_up)
            answers = [o for o in outcomes if isinstance(o, Answer)]
            await asyncio.sleep(0.2)
            arrivals = [a.at - started for a in answers] or [give_up]
            cursors = {a.header("Stream-Cursor") for a in answers if a.status == 204}
            rounds.append(
                {
                    "answered": sum(a.status == 204 for a in answers),
                    "cursors": len(cursors),
                    "edge": edge_reads(self.stack.edge) - edge_before,
                    "origin": origin_reads(self.stack, path) - origin_before,
                    "first": min(arrivals),
                    "last": max(arrivals),
                }
            )
            cursor = next(iter(cursors), None)
            if cursor is None:
                break
            url = (
                tier_url(self.stack, tier) + path + f"?offset={tail}&live=long-poll&cursor={cursor}"
            )
        return {"tier": tier, "rounds": rounds}

    # --- correctness -------------------------------------------------------------------------

    async def until_new(self, url: str, new: bytes) -> float | None:
        """Seconds until ``url`` answers ``new`` (None: not within GIVE_UP_SECONDS)."""
        started = time.monotonic()
        while time.monotonic() - started < GIVE_UP_SECONDS:
            answer = await fetch(self.session, url)
            if answer.status == 200 and answer.body == new:
                return time.monotonic() - started
            await asyncio.sleep(0.05)
        return None

    async def after_bound(self, url: str, old: bytes, old_etag: str | None, since: float) -> str:
        """Past PURGE_BOUND_SECONDS from ``since``: old bytes among 10 reads, and what the old
        ETag gets."""
        await asyncio.sleep(max(0.0, since + PURGE_BOUND_SECONDS - time.monotonic()))
        stale = 0
        for _ in range(10):
            stale += (await fetch(self.session, url)).body == old
        if old_etag is None:
            return f"{stale}/10 old"
        revalidated = await fetch(self.session, url, headers={"If-None-Match": old_etag})
        return f"{stale}/10 old; old ETag → {revalidated.status}"

    async def replaced(self, tier: str, how: str) -> dict[str, Any]:
        path = self.path(how, tier)
        through = tier_url(self.stack, tier) + path
        # The old instance is made at the origin, so no purge of its creation can take the
        # tier's copy, and stored once the edge gives it long: only the change's purge may end
        # it in time. "recreate" then deletes and recreates through the tier, "purge" at the
        # origin behind the edge's back, with an operator purge after.
        old, new = b"old instance " * 20, b"NEW instance " * 20
        await create(self.session, self.stack.origin.url + path, [old], close=True)
        await long_lived_at_edge(self.session, self.stack.edge.url + path + "?offset=-1")
        await fetch(self.session, through + "?offset=-1")
        stored = await fetch(self.session, through + "?offset=-1")
        writer = through if how == "recreate" else self.stack.origin.url + path
        await delete(self.session, writer)
        await create(self.session, writer, [new], close=True)
        if how == "purge":
            purge = f"{self.stack.edge.admin_url}/purge?path={path}"
            async with self.session.post(purge) as response:
                assert response.status < 300, response.status
        since = time.monotonic()
        took = await self.until_new(through + "?offset=-1", new)
        later = await self.after_bound(through + "?offset=-1", old, stored.header("ETag"), since)
        return {"took": took, "later": later}

    async def missing_then_created(self, tier: str) -> float | None:
        path = self.path("404", tier)
        through = tier_url(self.stack, tier) + path + "?offset=-1"
        for _ in range(2):
            assert (await fetch(self.session, through)).status == 404
        body = b"created just after a miss"
        await create(self.session, self.stack.origin.url + path, [body])
        return await self.until_new(through, body)

    async def head_tail(self, tier: str) -> str:
        path = self.path("head", tier)
        edge = self.stack.edge.url + path
        await create(self.session, edge, [b"a" * 40_000])
        first = await fetch(self.session, edge + "?offset=-1")
        tail = await append(self.session, edge, b"b" * 40_000)
        await fetch(self.session, edge + f"?offset={first.header('Stream-Next-Offset')}")
        through = tier_url(self.stack, tier) + path
        capped = await fetch(self.session, through + "?offset=-1")
        head = await fetch(self.session, through, method="HEAD")
        cap = "capped GET" if capped.header("Stream-Next-Offset") != tail else "GET not capped"
        truth = "true tail" if head.header("Stream-Next-Offset") == tail else "WRONG tail"
        return f"{truth} ({cap})"

    async def credentialed(self, tier: str) -> str:
        """Per case a fresh closed stream: a credentialed read, then an anonymous one. The
        anonymous one was served the credential's copy if it never reached the edge (through a
        CDN) or says private."""
        leaks = 0
        for credential in ({"Authorization": "Bearer alice"}, {"Cookie": "session=alice"}):
            for query in ("", "&_=1"):
                path = self.path("private", tier)
                await create(self.session, self.stack.edge.url + path, [b"whose?"], close=True)
                through = tier_url(self.stack, tier) + path + "?offset=-1" + query
                await fetch(self.session, through, headers=credential)
                before = edge_reads(self.stack.edge)
                anonymous = await fetch(self.session, through)
                await asyncio.sleep(0.1)
                shared = edge_reads(self.stack.edge) == before
                leaks += shared or "private" in (anonymous.header("Cache-Control") or "")
        return f"{leaks}/4 served another's copy"


async def measure(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True),
        auto_decompress=False,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        timeout=aiohttp.ClientTimeout(total=120),
    ) as session:
        run = Run(stack, session, args)
        figures: dict[str, Any] = {"offload": [], "released": [], "timed_out": [], "correct": []}
        for tier in TIERS:
            print(f"{tier}: offload, herds", file=sys.stderr)
            figures["offload"].append(await run.offload(tier))
            figures["released"].append(await run.released(tier))
            figures["timed_out"].append(await run.timed_out(tier))
        for tier in TIERS:
            print(f"{tier}: correctness", file=sys.stderr)
            figures["correct"].append(
                {
                    "tier": tier,
                    "recreate": await run.replaced(tier, "recreate"),
                    "purge": await run.replaced(tier, "purge"),
                    "created": await run.missing_then_created(tier),
                    "head": await run.head_tail(tier),
                    "credentialed": await run.credentialed(tier),
                }
            )
        print("SSE", file=sys.stderr)
        figures["sse"] = await sse_figures(stack, session, viewers=args.viewers, tiers=TIERS)
        return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.cdn",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--herd", type=int, default=500)
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--long-poll-timeout", type=float, default=5.0)
    parser.add_argument("--edge-args", default="", help="more for `edge serve` (shell words)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Not pinned: the caches, the edge and the clients share every core.
    bench = Bench.begin("edge-cdn-", pin=False)
    origin = bench.origin("cdn-origin")
    edge_args = [
        "--long-poll-timeout",
        f"{args.long_poll_timeout:g}",
        "--max-response-bytes",
        str(MAX_RESPONSE_BYTES),
        *split_edge_args(args.edge_args),
    ]
    try:
        stack = start_stack(origin, bench.logs, *edge_args)
        try:
            figures = asyncio.run(measure(stack, args))
        finally:
            stack.stop()
    finally:
        origin.stop()
    rendered = render(
        figures,
        readers=args.readers,
        herd=args.herd,
        viewers=args.viewers,
        long_poll_timeout=args.long_poll_timeout,
    )
    print(rendered)
    if not args.no_write:
        heading = (
            f"## CDN tier: offload and correctness through Varnish and nginx ({bench.started})"
        )
        section = (
            f"{heading}\n\n{bench.provenance('loadtest.cdn')}, edge args "
            f"`{' '.join(edge_args)} --cdn-purge varnish=<the Varnish>`. Debian's Varnish 7.1 "
            "(`deploy/varnish/edge.vcl`) and nginx 1.22 (`deploy/nginx/edge.conf`), as shipped "
            'but for their ports, in front of the edge; "edge" rows are the clients straight '
            "at the edge. One client process (aiohttp), one connection per request. "
            f"{bench.load_average()} (a machine shared with other "
            f"engineers' tests).\n\n{rendered}\n\n{READING}\n"
        )
        publish(args.output, heading, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
