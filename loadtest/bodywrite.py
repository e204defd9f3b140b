"""How a large stored body is best written to a client socket: the 64 KB hit's question.

``python -m loadtest.bodywrite [--size 65536] [--runs 3] [--duration 3]``

A bare uvloop protocol (no parsing beyond finding the end of each head, no lookup) answers every
request with one pre-serialised head and a body of ``--size`` bytes, written one of four ways:

* ``writelines``: ``transport.writelines([head, body])``, what ``edge.web.fastpath`` does today;
* ``join``: ``transport.write(head + body)``, one buffer (a copy of the body per answer);
* ``two``: ``transport.write(head)`` then ``transport.write(body)``;
* ``sendfile``: the head by ``transport.write``, then, while the transport holds nothing
  unsent, ``os.sendfile`` of the body from a ``memfd`` (the kernel references the pages instead
  of copying them from user space), the unsent rest by ``transport.write``.

Each variant is its own process on the server core, read by ``wrk -t1 -c64`` on the load cores,
the variants interleaved run by run; req/s medians are printed (and nothing is written: this
probes a design question, it does not measure the edge). It is the ceiling for a 64 KB hit of
any Python server on uvloop here: the edge's hit path adds its parse, key and checks to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

from devstack.processes import free_port
from loadtest import wrk
from loadtest.benchkit import pinned, plan_cores

VARIANTS = ("writelines", "join", "two", "sendfile")


def serve(mode: str, port: int, size: int) -> None:  # pragma: no cover - a child process
    import uvloop

    body = os.urandom(size)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
        + str(size).encode()
        + b'\r\nETag: "s:0:1"\r\nCache-Control: public, max-age=60\r\n'
        b"Cache-Status: edge; hit\r\nDate: Tue, 01 Dec 2026 18:00:00 GMT\r\n\r\n"
    )
    memfd = os.memfd_create("body")
    os.write(memfd, body)

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.buffer = b""
            self.fd = transport.get_extra_info("socket").fileno()

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                self.buffer = self.buffer[end + 4 :]
                self.answer()

        def answer(self) -> None:
            transport = self.transport
            if mode == "writelines":
                transport.writelines([head, body])
            elif mode == "join":
                transport.write(head + body)
            elif mode == "two":
                transport.write(head)
                transport.write(body)
            else:
                transport.write(head)
                sent = 0
                if transport.get_write_buffer_size() == 0:
                    try:
                        sent = os.sendfile(self.fd, memfd, 0, size)
                    except BlockingIOError:
                        sent = 0
                if sent < size:
                    transport.write(memoryview(body)[sent:])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Answer, "127.0.0.1", port, backlog=1024)
        await asyncio.Event().wait()

    uvloop.run(main())


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.size)
        return 0
    cores = plan_cores(True)
    figures: dict[str, list[float]] = {mode: [] for mode in VARIANTS}
    for _ in range(args.runs):
        for mode in VARIANTS:
            port = free_port()
            argv = [sys.executable, "-m", "loadtest.bodywrite", "--size", str(args.size)]
            with pinned(cores.server):
                child = subprocess.Popen([*argv, "--serve", mode, str(port)])
            try:
                wait_listening(port)
                run = wrk.run(
                    f"http://127.0.0.1:{port}/", headers={}, connections=64,
                    duration_s=args.duration, cores=cores.load,
                )  # fmt: skip
                figures[mode].append(run.rps)
            finally:
                child.terminate()
                child.wait(10)
    print(f"{args.size:,} B bodies, wrk -t1 -c64 -d{args.duration:g}s, {args.runs} runs:")
    print("| write | req/s median | runs |")
    print("|---|---:|---|")
    for mode in VARIANTS:
        runs = ", ".join(f"{r:,.0f}" for r in figures[mode])
        print(f"| {mode} | {statistics.median(figures[mode]):,.0f} | {runs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
