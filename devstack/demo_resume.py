"""``make demo ARGS=--resume``: an MCP tool call survives the loss of the replica serving it.

Starts the reference origin, Redis, two edges with a resume route (``/mcp``) to the official MCP
SDK's server (``devstack/mcp_upstream.py``: stateless, no event store, so on its own a dropped
call is lost) and HAProxy in front (``devstack.cluster``: ``/mcp`` round-robin to either
replica, as the shipped config does). The SDK's client calls a slow tool through HAProxy, and:

1. the replica that takes the call (P) relays it: it pumps the server's answer into a stream
   at the origin and serves the client from that stream;
2. the client drops mid-call (the lift) and resumes with its resumption token through HAProxy,
   with P drained there for the moment so that the resume lands on the other replica (Q), which
   replays what was missed from the origin's log, then follows the rest live;
3. Q, now relaying the answer to the client, is SIGKILLed mid-call; HAProxy's health check
   marks it down; the client resumes with its latest token through HAProxy and lands on the
   survivor, P;
4. the client has every progress notification once, in order, and the result; the tool ran
   once, and no ``Last-Event-ID`` reached the SDK's server.

Prints each step and a final ``RESULT ok`` or ``RESULT FAILED`` (exit code 0 or 1), within
``--deadline`` seconds. Why Q is the replica killed, not P: P pumps the answer, and a pump
killed with its replica takes the rest of the upstream answer with it (the SDK's server answered
a connection that is gone): a resume then gets what was logged, then a JSON-RPC error within
``--resume-lease``. ``docs/resume.md`` says so; ``tests/integration/test_resume_fleet.py``
proves it behind HAProxy.

Rules this module owns:

* The verdict is the client's own account (what the SDK heard) checked against what the
  server was asked (its seen file) and what the origin holds, never the edges' word.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from devstack.cluster import Cluster, start_cluster
from devstack.mcp_client import CallLog, call, count_call, text_of
from devstack.processes import Process, new_logs_dir, start_mcp_upstream

TAG = "demo"


class Narrator:
    """Prints each step with the seconds since the demo began."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.began:5.1f}s] {line}", flush=True)


async def until(check: Callable[[], bool], what: str, seconds: float = 30) -> None:
    """Wait for what ``check`` looks for (another process's doing), failing after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not seen in {seconds:g} s")
        await asyncio.sleep(0.05)


async def kept(origin_url: str, stream: str) -> tuple[list[Any], bool]:
    """The upstream's events the answer's stream holds at the origin now (not the edge's own
    messages), and whether it is closed."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{origin_url}{stream}?offset=-1") as read,
    ):
        read.raise_for_status()
        messages = await read.json()
        return [m for m in messages if "event" in m], read.headers.get("Stream-Closed") == "true"


def is_up(cluster: Cluster, replica: str) -> bool:
    """HAProxy's view of ``replica`` in ``backend edges_any`` (its operational state: 2 is up)."""
    for line in cluster.haproxy_command("show servers state edges_any").splitlines():
        words = line.split()
        if len(words) > 5 and words[1] == "edges_any" and words[3] == replica:
            return words[5] == "2"
    raise LookupError(replica)


async def cut(task: asyncio.Task[Any]) -> None:
    """The client's connection is gone: its session ends, the call it was in with it."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as error:  # the SDK's own account of its broken stream
        print(f"         the SDK client's session ended with {_leaves(error)}", flush=True)


def _leaves(error: BaseException) -> str:
    """An exception group's innermost exceptions, by name (the SDK's task groups wrap them)."""
    if isinstance(error, BaseExceptionGroup):
        return ", ".join(sorted({_leaves(inner) for inner in error.exceptions}))
    return type(error).__name__


async def story(cluster: Cluster, seen: Path, n: int, delay: float) -> bool:
    say = Narrator().say
    request = count_call(n, delay, TAG)
    url = cluster.url + "/mcp"
    say(f"SDK client: tools/call count(n={n}, delay={delay:g}) through HAProxy {url}")

    first = CallLog()
    running = asyncio.create_task(call(url, request, first))
    await until(lambda: len(first.tokens) >= 3 or running.done(), "three events")
    if running.done():
        running.result()  # the call failed early: its error is the story
    pump = first.replica_of("tools/call")
    other = "edge-2" if pump == "edge-1" else "edge-1"
    stream = first.stream
    assert stream is not None, "the answer named no Edge-Resume-Stream: it is not kept"
    say(
        f"{pump} took the call: it pumps the SDK server's answer into {stream[:30]}... at the "
        "origin and serves the client from it"
    )
    say(f"heard progress {_steps(first)}; the client's connection drops (the lift)")
    await cut(running)
    token = first.tokens[-1]
    await until_kept(cluster, stream, len(first.tokens) + 2)
    cluster.haproxy_command(f"set server edges_any/{pump} state drain")
    say(
        f"{pump} drained at HAProxy (it keeps pumping; round-robin would otherwise pick either "
        f"replica): the resume lands on {other}"
    )
    held, _ = await kept(cluster.origin.url, stream)
    say(f"the client resumes with its resumption token {token} through HAProxy")

    second = CallLog()
    killed: list[str] = []

    async def heard_in_second(step: float) -> None:
        if len(second.progress) == 1:
            cluster.haproxy_command(f"set server edges_any/{pump} state ready")
        if len(second.progress) == 4:
            # Killed as the client hears its fourth event, before it reads on: the rest of the
            # call (at least one event and the result) is still to come.
            relaying = second.replica_of("resume")
            cluster.replica_named(relaying).process.kill()
            killed.append(relaying)

    second.on_progress = heard_in_second
    resumed = asyncio.create_task(call(url, request, second, resume_from=token))
    await until(lambda: len(second.progress) >= 2 or resumed.done(), "the resume's events")
    if resumed.done():
        resumed.result()
    relaying = second.replica_of("resume")
    say(
        f"served by {relaying}: events {len(first.tokens) + 1}..{len(held)} replayed from the "
        f"origin's log, then live; {pump} back in rotation"
    )
    await until(lambda: bool(killed) or resumed.done(), "two more events")
    if not killed:
        resumed.result()
        raise RuntimeError("the call ended before the kill: give it more --steps")
    say(f"heard progress {_steps(second)}; {relaying} (relaying the answer) SIGKILLed mid-call")
    await cut(resumed)
    await until(lambda: not is_up(cluster, relaying), f"HAProxy marking {relaying} down")
    say(f"HAProxy's health check marks {relaying} down")
    latest = second.tokens[-1]
    say(f"the client resumes with its latest token {latest} through HAProxy")
    third = CallLog()
    result = await call(url, request, third, resume_from=latest)
    say(f"served by {third.replica_of('resume')}: heard progress {_steps(third)}, then the result")

    heard = first.steps() + second.steps() + third.steps()
    expected = [float(step) for step in range(1, n + 1)]
    seen_lines = seen.read_text().splitlines()  # noqa: ASYNC240 (a local file)
    lines = [json.loads(line) for line in seen_lines]
    runs = sum(1 for line in lines if line.get("tool") == "count" and line.get("tag") == TAG)
    last_event_ids = [line for line in lines if line.get("last_event_id")]
    all_kept, closed = await kept(cluster.origin.url, stream)
    checks = {
        f"every progress notification once, in order ({len(heard)} of {n})": heard == expected,
        f"the result: {text_of(result)!r}": text_of(result) == f"counted {n} for {TAG}",
        f"the resumes served by the other replicas ({relaying}, then "
        f"{third.replica_of('resume')})": relaying == other and third.replica_of("resume") == pump,
        f"the tool ran once ({runs})": runs == 1,
        f"no Last-Event-ID reached the SDK server ({len(last_event_ids)})": not last_event_ids,
        f"the origin's log holds each event once and is closed ({len(all_kept)} events)": (
            closed and len(all_kept) == n + 1
        ),
    }
    print()
    for check, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'}  {check}")
    print(
        f"\n(Had {pump}, the pump, been the one killed, the rest of the SDK server's answer would "
        "have gone with it: a resume gets what was logged, then a JSON-RPC error, within "
        "--resume-lease. docs/resume.md, Failures.)"
    )
    return all(checks.values())


def _steps(log: CallLog) -> str:
    return ", ".join(f"{step:g}" for step in log.steps())


async def until_kept(cluster: Cluster, stream: str, events: int) -> None:
    """Until the origin's log holds ``events`` of the upstream's events, so the resume has some
    to replay (the pump's doing, seen from outside)."""
    deadline = time.monotonic() + 30
    while len((await kept(cluster.origin.url, stream))[0]) < events:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{events} events not kept in 30 s")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> int:
    logs = new_logs_dir("edge-demo-resume-")
    print(f"logs in {logs}", flush=True)
    seen = logs / "seen.jsonl"
    seen.touch()
    upstream: Process | None = None
    cluster: Cluster | None = None
    ok = False
    try:
        upstream = start_mcp_upstream(logs, seen)
        route = ("--resume-route", f"/mcp={upstream.ready['url']}")
        cluster = start_cluster(logs / "cluster", edge_args=route)
        edges = "  ".join(f"{cluster.replica_name(e)} {e.url}" for e in cluster.edges)
        print(
            f"origin {cluster.origin.url}  redis {cluster.redis_args[1]}  {edges}\n"
            f"SDK server {upstream.ready['url']} (stateless, no event store)\n"
            f"HAProxy {cluster.url} (/mcp round-robin to either edge: backend edges_any)\n",
            flush=True,
        )
        ok = await asyncio.wait_for(
            story(cluster, seen, args.steps, args.delay), timeout=args.deadline
        )
    except Exception as error:  # the demo reports what broke it off, then fails
        print(f"\nthe demo broke off: {type(error).__name__}: {error}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        if upstream is not None:
            upstream.stop()
    print("\nRESULT        " + ("ok" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make demo ARGS=--resume",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=10, help="the tool's progress steps")
    parser.add_argument(
        "--delay", type=float, default=1.0, help="seconds between steps (default 1)"
    )
    parser.add_argument(
        "--deadline", type=float, default=90.0, help="the whole story's bound in seconds"
    )
    args = parser.parse_args(argv)
    if args.steps < 8 or args.delay <= 0:
        parser.error("--steps must be >= 8 (the story needs them) and --delay > 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
