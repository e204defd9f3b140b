"""``make demo``: a shared agent run, watched live through the edge, in a browser and by bots.

Starts the real origin, an edge in front of it and the watch page's server, creates a session
(a JSON stream of typed messages, ``docs/session.md``) and prints ``watch <url>``: the page
anyone can open to watch the run, stop it or take it over. Then a worker agent answers a prompt
token by token while a reviewer comments on each line, both idempotent producers writing and
following the session through the edge, and N SSE viewers read it through the edge, resuming
by offset when a connection ends early. Prints a summary and exits 0 when every viewer got
exactly the messages the origin holds, in order, once; ``--keep-running`` paces the agent for
people (3 tokens/s unless ``--rate`` says otherwise) and then leaves everything up until Ctrl-C,
starting a new run ``--next-run-pause`` seconds after each one ends (``/run/latest`` on the page's
server leads to the newest), so a person who comes late finds a run to watch and take over;
``--public`` binds the page and the edge on every interface (the edge's admin listener stays on
loopback) and prints the page's URL at this machine's address, for a phone on the same network.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import signal
import sys
import time
from collections.abc import Callable

import aiohttp

from devstack import demo_resume, session
from devstack.agents import Follower, create_session, start_run
from devstack.demo_auth import DemoAuth
from devstack.processes import new_logs_dir, start_edge, start_origin
from devstack.reach import local_url, machine_addresses, shown_host, url_at
from devstack.watch import LATEST, RUNS, STREAM_PREFIX, Runs, serve_watch, watch_path

WORDS = (
    "the edge keeps one upstream per stream and every viewer reads the same bytes "
    "resuming by offset after a dropped connection so nothing is lost or doubled"
).split()
PEOPLE_RATE = 3.0
# --keep-running: how long an ended run stays the newest before the next one starts (seconds).
NEXT_RUN_PAUSE = 10.0


def tokens(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        word = rng.choice(WORDS)
        # Leading spaces, as LLM tokens come; SSE framing must not eat them.
        out.append(" " + word + ("\n" if i % 20 == 19 else ""))
    return out


async def read_back(
    http: aiohttp.ClientSession, url: str, credentials: dict[str, str] | None = None
) -> bytes:
    async with http.get(f"{url}?offset=-1", headers=credentials) as response:
        return await response.read()


async def run(args: argparse.Namespace) -> int:
    logs = new_logs_dir("edge-demo-")
    print(f"logs in {logs}")
    origin = start_origin(logs)
    auth = DemoAuth(logs) if args.auth == "jwt" else None
    listen = f"{args.public}:0" if args.public else "127.0.0.1:0"
    edge = start_edge(
        origin.url, logs, *(auth.edge_args() if auth else []), *args.edge_arg, listen=listen
    )
    # This machine's own clients (viewers, agents) reach the edge on loopback, whatever it binds.
    edge_url = local_url(edge.url)
    watch_runner = None
    name = f"demo-run-{int(time.time())}"
    path = f"{STREAM_PREFIX}{name}"
    stream_url = f"{edge_url}{path}"

    def credentials(who: str, scope: str = "read write", run: str = path) -> dict[str, str]:
        return auth.headers(who, run, scope) if auth else {}

    try:
        watch_runner, watch_url = await serve_watch(
            edge.url,
            edge.admin_url,
            host=args.public or "127.0.0.1",
            port=args.watch_port,
            tokens=auth.page_token if auth else None,
            public=bool(args.public),
        )
        runs = watch_runner.app[RUNS]
        print(f"origin {origin.url}  edge {edge_url}  metrics {edge.admin_url}/metrics")
        public_edge = edge_url
        if args.public:
            host = shown_host(args.public)
            watch_url, public_edge = url_at(watch_url, host), url_at(edge_url, host)
            print(
                f"public: the watch page and the edge listen on {args.public} (page port "
                f"{watch_url.rsplit(':', 1)[1]}, edge port {edge_url.rsplit(':', 1)[1]}): any "
                "device that reaches this machine can watch and write; the metrics stay on "
                f"127.0.0.1; this machine's addresses: {', '.join(machine_addresses())}"
            )
        if auth:
            auth.runs.add(path)
        rate = args.rate if args.rate is not None else (PEOPLE_RATE if args.keep_running else 50.0)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            await create_session(http, stream_url, credentials("user"))
            runs.latest = name
            print(f"watch {watch_url}{watch_path(name)}", flush=True)
            origin.reset_counts()
            viewers = [
                Follower(http, stream_url, credentials=credentials(f"viewer-{i}", "read"))
                for i in range(args.viewers)
            ]
            started = time.perf_counter()
            watchers = [asyncio.create_task(v.run()) for v in viewers]
            await asyncio.sleep(0.5)  # let viewers connect before the first message
            shared = await start_run(
                http, stream_url, tokens(args.tokens, args.seed), rate, credentials=credentials
            )
            await shared.wait(args.tokens / rate + 3600)
            await asyncio.wait_for(asyncio.gather(*watchers), timeout=60)
            elapsed = time.perf_counter() - started
            counts = origin.counts()  # before the check's own read below
            stored = await read_back(http, f"{origin.url}{path}")
        items = json.loads(stored)
        exact = [v for v in viewers if v.closed and session.encode_transcript(v.messages) == stored]
        per_writer = {p.producer_id: len(p.written) for p in shared.producers}
        writers_exact = all(
            [m for m in items if m.get("from") == p.producer_id] == p.written
            for p in shared.producers
        )
        state = session.fold(items)
        followers = len(shared.followers)
        print()
        print(f"stream        {stream_url} (one JSON stream holds the whole run)")
        print(
            f"agents wrote  {sum(per_writer.values())} messages in {elapsed:.1f} s "
            f"({', '.join(f'{k} {v}' for k, v in per_writer.items())}; "
            f"{len(stored):,} bytes in all)"
        )
        others = len(items) - sum(per_writer.values())
        ended = "done"
        if state.stopped_by:
            # As the pages name its writer (a page's id is a first name there).
            sender = state.stopped_by.rpartition(":")[0]
            ended = (
                f"stopped by {session.shown_names(items).get(sender, sender)} ({state.stopped_by})"
            )
        print(f"people wrote  {others} messages from watch pages; the run {ended}")
        signed = ", each with its own JWT (--auth jwt)" if auth else ""
        print(
            f"viewers       {len(viewers)} bots reading by SSE through the edge, as browsers "
            f"would{signed}"
        )
        print(
            f"exact copies  {len(exact)}/{len(viewers)} viewers ended with exactly the origin's "
            "transcript, every message once, in order"
        )
        print(
            f"reconnects    {sum(v.connections - 1 for v in viewers)} (the edge ends an SSE "
            "connection after --sse-max-seconds, 60 s by default; each viewer resumed from its "
            "last offset)"
        )
        requests = counts["requests"]
        writes = sum(r["count"] for r in requests if r["method"] in ("POST", "PUT"))
        live = sum(r["count"] for r in requests if r["live"])
        reads = counts["total"] - writes - live
        print(
            f"origin        {counts['total']} requests reached it: {writes} writes (every "
            f"append goes through), {live} live read(s) (the edge's one upstream tail) and "
            f"{reads} catch-up read(s) (the edge's cache fills, shared by every viewer)"
        )
        print(
            f"              at most {counts['peak_open_live']} live connection(s) open at the "
            f"origin, for {len(viewers) + followers} readers at the edge ({len(viewers)} "
            f"viewers + {followers} agents following the run)"
        )
        if auth:
            print(f"viewer        {auth.viewer_url(stream_url)}")
        ok = len(exact) == len(viewers) and writers_exact
        print("RESULT        " + ("ok" if ok else "MISMATCH"), flush=True)
        if args.keep_running:
            # The handlers go in before the line that invites Ctrl-C: a signal sent the moment
            # the line is read would otherwise meet asyncio.run's own handler and cancel the run.
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            print(
                f"\nstill running: open {watch_url}{watch_path(LATEST)} (the newest run: a new "
                f"one starts {args.next_run_pause:g} s after each ends) or point clients at "
                f"{public_edge} (Ctrl-C to stop)",
                flush=True,
            )
            later = asyncio.create_task(
                next_runs(edge_url, watch_url, runs, args, rate, credentials, auth)
            )
            await stop.wait()
            later.cancel()
            await asyncio.gather(later, return_exceptions=True)
        return 0 if ok else 1
    finally:
        if watch_runner is not None:
            await watch_runner.cleanup()
        edge.stop()
        origin.stop()


async def next_runs(
    edge_url: str,
    watch_url: str,
    runs: Runs,
    args: argparse.Namespace,
    rate: float,
    credentials: Callable[..., dict[str, str]],
    auth: DemoAuth | None,
) -> None:
    """``--keep-running``: each run, once ended, stays the newest for ``--next-run-pause``
    seconds; then a new one starts (its agents alone: the bots watched the first)."""
    async with aiohttp.ClientSession() as http:
        for number in itertools.count(2):
            await asyncio.sleep(args.next_run_pause)
            name = f"demo-run-{int(time.time())}-{number}"
            path = f"{STREAM_PREFIX}{name}"

            def for_run(who: str, scope: str = "read write", run: str = path) -> dict[str, str]:
                return credentials(who, scope, run)

            if auth:
                auth.runs.add(path)
            await create_session(http, f"{edge_url}{path}", for_run("user"))
            runs.latest = name
            print(f"next run: watch {watch_url}{watch_path(name)}", flush=True)
            shared = await start_run(
                http, f"{edge_url}{path}", tokens(args.tokens, args.seed + number), rate,
                credentials=for_run,
            )  # fmt: skip
            try:
                await shared.wait(args.tokens / rate + 3600)
            finally:
                await shared.cancel()
            print(f"run {number} ended", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--viewers", type=int, default=200, help="SSE viewers (default 200)")
    parser.add_argument("--tokens", type=int, default=300, help="tokens the agent writes")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"tokens per second (default 50, or {PEOPLE_RATE:g} with --keep-running)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed for the token text")
    parser.add_argument(
        "--watch-port", type=int, default=0, help="port of the watch page (default: any free)"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="pace the run for people, then keep origin, edge and page up",
    )
    parser.add_argument(
        "--next-run-pause",
        type=float,
        default=NEXT_RUN_PAUSE,
        metavar="SECONDS",
        help=f"with --keep-running: a new run starts this long after each ends "
        f"(default {NEXT_RUN_PAUSE:g})",
    )
    parser.add_argument(
        "--public",
        nargs="?",
        const="0.0.0.0",
        default=None,
        metavar="ADDRESS",
        help="bind the watch page and the edge on ADDRESS (default 0.0.0.0: every interface) "
        "instead of 127.0.0.1 and print the page's URL at this machine's address, so another "
        "device on the network can open it; the edge's admin listener stays on 127.0.0.1",
    )
    parser.add_argument(
        "--edge-arg", action="append", default=[], help="extra flag for `edge serve` (repeatable)"
    )
    parser.add_argument(
        "--auth",
        choices=("none", "jwt"),
        default="none",
        help="jwt: the edge verifies tokens (a generated HS256 JWKS); every viewer, agent and "
        "watch page gets its own; prints a viewer URL with one",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="instead: an MCP tool call through two edges behind HAProxy survives a replica "
        "kill (devstack/demo_resume.py; its own flags follow, see --resume --help)",
    )
    given = sys.argv[1:] if argv is None else argv
    if "--resume" in given:
        return demo_resume.main([arg for arg in given if arg != "--resume"])
    args = parser.parse_args(argv)
    if args.viewers < 1 or args.tokens < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("--viewers and --tokens must be >= 1 and --rate > 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
