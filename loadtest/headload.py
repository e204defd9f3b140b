"""A closed-loop HTTP/1.1 ``HEAD`` load generator, for the HEAD cell of ``loadtest.hits``.

    .venv/bin/python -m loadtest.headload URL [-c 64] [-d 5] [-H 'Name: value' ...]

wrk cannot time ``HEAD``: its parser is not told the method, so it waits for a body the answer
never has (wg/wrk#198), and ab speaks HTTP/1.0, where an answer with no ``Content-Length`` (the
reference origin's ``HEAD``) ends by closing the connection: a connection per request. This is
the part of wrk the cell needs: ``-c`` keep-alive connections, each with one request in flight
at a time, for ``-d`` seconds; prints one JSON object (req/s, p50 and p99 in ms, requests,
errors), the figures ``loadtest.wrk.WrkRun`` holds.

Rules this module owns:
* An answer is its head: it ends at the blank line (a ``HEAD`` answer has no body). A status
  other than 2xx/3xx, bytes after the head that do not start the next answer, or a connection
  the server closes count as errors; a closed connection is opened again.
* Only answers whose request was sent before the deadline count, and the rate is over the
  time from the first request to the last answer, as wrk's is.
* It is Python (uvloop when installed): a fast cache may be faster than this generator can
  ask. ``loadtest.hits`` says so beside the HEAD row; compare the servers within the row.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from loadtest.benchkit import pinned
from loadtest.wrk import WrkFailed, WrkRun

ROOT = Path(__file__).resolve().parents[1]


class Tally:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.latencies: list[float] = []
        self.errors = 0
        self.last_answer = 0.0


class HeadConnection(asyncio.Protocol):
    def __init__(self, request: bytes, tally: Tally, done: asyncio.Future[None]) -> None:
        self._request = request
        self._tally = tally
        self._done = done
        self._buffer = bytearray()
        self._sent_at = 0.0
        self._transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        self._sent_at = time.perf_counter()
        if self._sent_at >= self._tally.deadline:
            self._transport.close()
            return
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end == -1:
            return
        now = time.perf_counter()
        status = self._buffer[9:12]
        if len(self._buffer) != end + 4 or not self._buffer.startswith(b"HTTP/1."):
            self._tally.errors += 1  # a body after a HEAD answer, or two answers to one request
        elif not (status.startswith((b"2", b"3"))):
            self._tally.errors += 1
        self._buffer.clear()
        self._tally.latencies.append(now - self._sent_at)
        self._tally.last_answer = now
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


async def run(
    url: str, connections: int, duration_s: float, headers: list[str]
) -> dict[str, float]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"HEAD {target or '/'} HTTP/1.1", f"Host: {parts.netloc}", *headers]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    tally = Tally(started + duration_s)

    async def one() -> None:
        while time.perf_counter() < tally.deadline:
            done: asyncio.Future[None] = loop.create_future()
            try:
                await loop.create_connection(
                    functools.partial(HeadConnection, request, tally, done), host, port
                )
            except OSError:
                tally.errors += 1
                await asyncio.sleep(0.01)
                continue
            await done
            if time.perf_counter() < tally.deadline:
                tally.errors += 1  # the server closed a keep-alive connection mid-run

    await asyncio.gather(*(one() for _ in range(connections)))
    latencies = sorted(tally.latencies)
    if not latencies:
        raise SystemExit(f"no answer from {url}")
    elapsed = max(tally.last_answer - started, 1e-9)

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "requests": len(latencies),
        "errors": tally.errors,
    }


def measure(
    url: str,
    *,
    headers: dict[str, str],
    connections: int,
    duration_s: float,
    cores: frozenset[int],
) -> WrkRun:
    """One run in a process of its own on ``cores``, as ``loadtest.wrk.run`` runs wrk."""
    seconds = max(1, round(duration_s))
    argv = [sys.executable, "-m", "loadtest.headload", url, "-c", str(connections)]
    argv += ["-d", str(seconds)]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    with pinned(cores):
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
    if done.returncode != 0:
        raise WrkFailed(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    try:
        figures = json.loads(done.stdout)
        return WrkRun(
            rps=float(figures["rps"]),
            p50_ms=float(figures["p50_ms"]),
            p99_ms=float(figures["p99_ms"]),
            requests=int(figures["requests"]),
            errors=int(figures["errors"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise WrkFailed(f"unreadable HEAD load report ({error}): {done.stdout!r}") from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.headload", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("-c", "--connections", type=int, default=64)
    parser.add_argument("-d", "--duration", type=float, default=5.0, help="seconds")
    parser.add_argument("-H", "--header", action="append", default=[], help="'Name: value'")
    args = parser.parse_args(argv)
    work = run(args.url, args.connections, args.duration, args.header)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(work)
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(work)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
