"""``make demo``: an agent streams an answer through the edge while viewers watch it live.

Starts the real origin and an edge in front of it, creates a stream, then runs a simulated agent
(an idempotent producer writing tokens at a realistic rate, then closing the stream) and N SSE
viewers reading through the edge. Each viewer resumes from its last ``streamNextOffset`` if its
connection ends early, as the official clients do. Prints a summary and exits 0 when every viewer
got exactly the bytes written; ``--keep-running`` then leaves origin and edge up for your own
clients until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from devstack.demo_auth import DemoAuth
from devstack.processes import new_logs_dir, start_edge, start_origin
from edge.protocol.sse import SseDecoder

WORDS = (
    "the edge keeps one upstream per stream and every viewer reads the same bytes "
    "resuming by offset after a dropped connection so nothing is lost or doubled"
).split()


@dataclass
class Viewer:
    index: int
    received: bytearray = field(default_factory=bytearray)
    connections: int = 0
    closed_seen: bool = False
    error: str | None = None


def tokens(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        word = rng.choice(WORDS)
        # Leading spaces, as LLM tokens come; SSE framing must not eat them.
        out.append((" " + word + ("\n" if i % 40 == 39 else "")).encode())
    return out


async def agent(
    http: aiohttp.ClientSession,
    url: str,
    parts: list[bytes],
    rate_per_second: float,
    auth: dict[str, str] | None = None,
) -> None:
    """An idempotent producer (PROTOCOL.md §5.2.1): retries are safe, so the demo retries."""
    interval = 1.0 / rate_per_second
    started = time.perf_counter()
    for seq, part in enumerate(parts):
        headers = {
            **(auth or {}),
            "Content-Type": "text/plain",
            "Producer-Id": "demo-agent",
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        for attempt in range(5):
            async with http.post(url, data=part, headers=headers) as response:
                if response.status in (200, 204):
                    break
                await asyncio.sleep(0.1 * (attempt + 1))
        else:
            raise RuntimeError(f"append {seq} failed: {response.status}")
        await asyncio.sleep(max(0.0, started + (seq + 1) * interval - time.perf_counter()))
    async with http.post(url, headers={**(auth or {}), "Stream-Closed": "true"}) as response:
        if response.status not in (200, 204):
            raise RuntimeError(f"close failed: {response.status}")


async def watch(
    http: aiohttp.ClientSession,
    url: str,
    viewer: Viewer,
    deadline: float,
    auth: dict[str, str] | None = None,
) -> None:
    offset = "-1"
    while not viewer.closed_seen and time.monotonic() < deadline:
        viewer.connections += 1
        decoder = SseDecoder()
        try:
            async with http.get(f"{url}?offset={offset}&live=sse", headers=auth) as response:
                if response.status != 200:
                    viewer.error = f"HTTP {response.status}"
                    await asyncio.sleep(0.2)
                    continue
                pending = bytearray()
                async for chunk in response.content.iter_any():
                    for event in decoder.feed(chunk):
                        if event.event == "data":
                            pending += event.data.encode()
                        elif event.event == "control":
                            control = json.loads(event.data)
                            # Bytes count once their control event names the offset after them.
                            viewer.received += pending
                            pending.clear()
                            offset = control["streamNextOffset"]
                            if control.get("streamClosed"):
                                viewer.closed_seen = True
                    if viewer.closed_seen:
                        return
        except (aiohttp.ClientError, TimeoutError) as error:
            viewer.error = type(error).__name__
            await asyncio.sleep(0.2)


async def run(args: argparse.Namespace) -> int:
    logs = new_logs_dir("edge-demo-")
    print(f"logs in {logs}")
    origin = start_origin(logs)
    auth = DemoAuth(logs) if args.auth == "jwt" else None
    edge = start_edge(origin.url, logs, *(auth.edge_args() if auth else []), *args.edge_arg)
    writer = auth.headers("demo-agent", "read write") if auth else None
    try:
        print(f"origin {origin.url}  edge {edge.url}  metrics {edge.admin_url}/metrics")
        stream_url = f"{edge.url}/v1/stream/demo-run-{int(time.time())}"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            create = {**(writer or {}), "Content-Type": "text/plain"}
            async with http.put(stream_url, headers=create) as response:
                if response.status not in (200, 201):
                    print(f"could not create the stream: HTTP {response.status}")
                    return 1
            origin.reset_counts()
            parts = tokens(args.tokens, args.seed)
            written = b"".join(parts)
            viewers = [Viewer(index=i) for i in range(args.viewers)]
            deadline = time.monotonic() + args.tokens / args.rate + 60
            started = time.perf_counter()
            watchers = [
                asyncio.create_task(
                    watch(
                        http,
                        stream_url,
                        v,
                        deadline,
                        auth.headers(f"viewer-{v.index}") if auth else None,
                    )
                )
                for v in viewers
            ]
            await asyncio.sleep(0.5)  # let viewers connect before the first token
            await agent(http, stream_url, parts, args.rate, writer)
            await asyncio.wait_for(asyncio.gather(*watchers), timeout=60)
            elapsed = time.perf_counter() - started
        counts = origin.counts()
        exact = [v for v in viewers if bytes(v.received) == written and v.closed_seen]
        sizes = sorted(len(v.received) for v in viewers)
        print()
        print(f"stream        {stream_url}")
        print(f"agent wrote   {args.tokens} tokens, {len(written)} bytes in {elapsed:.1f} s")
        signed = ", each with its own JWT (--auth jwt)" if auth else ""
        print(f"viewers       {len(viewers)} via SSE through the edge{signed}")
        print(f"bytes each    min {sizes[0]}  max {sizes[-1]}")
        print(f"exact copies  {len(exact)}/{len(viewers)} got exactly the bytes written, once")
        print(f"reconnects    {sum(v.connections - 1 for v in viewers)}")
        requests = counts["requests"]
        writes = sum(r["count"] for r in requests if r["method"] in ("POST", "PUT"))
        live = sum(r["count"] for r in requests if r["live"])
        print(
            f"origin        {counts['total']} requests ({writes} writes, {live} live reads "
            f"from the edge's one tail); peak {counts['peak_open_live']} live connection(s) "
            f"held open for {len(viewers)} viewers"
        )
        if auth:
            print(f"viewer        {auth.viewer_url(stream_url)}")
        ok = len(exact) == len(viewers)
        print("RESULT        " + ("ok" if ok else "MISMATCH"))
        if args.keep_running:
            print(f"\nstill running: point clients at {edge.url} (Ctrl-C to stop)")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            await stop.wait()
        return 0 if ok else 1
    finally:
        edge.stop()
        origin.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--viewers", type=int, default=200, help="SSE viewers (default 200)")
    parser.add_argument("--tokens", type=int, default=300, help="tokens the agent writes")
    parser.add_argument("--rate", type=float, default=50.0, help="tokens per second")
    parser.add_argument("--seed", type=int, default=7, help="seed for the token text")
    parser.add_argument(
        "--keep-running", action="store_true", help="keep origin and edge up after the run"
    )
    parser.add_argument(
        "--edge-arg", action="append", default=[], help="extra flag for `edge serve` (repeatable)"
    )
    parser.add_argument(
        "--auth",
        choices=("none", "jwt"),
        default="none",
        help="jwt: the edge verifies tokens (a generated HS256 JWKS); prints a viewer URL with one",
    )
    args = parser.parse_args(argv)
    if args.viewers < 1 or args.tokens < 1 or args.rate <= 0:
        parser.error("--viewers and --tokens must be >= 1 and --rate > 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
