"""A worker process's entry point: ``python -c 'from edge.workers.child import main; main()'``.

Rules this module owns:

* The supervisor writes one ``Bootstrap`` to the worker's stdin (length-prefixed pickle: the
  pipe is private to the two processes, and the settings, purge token included, never appear
  on a command line) and keeps the pipe open for the worker's lifetime.
* The worker's metrics stay in-process (``PROMETHEUS_MULTIPROC_DIR`` is never set: it would
  make every update a write to a file); the directory goes to ``edge.workers.mirror``.
* When the pipe closes, the supervisor is gone (killed, even with SIGKILL): the worker exits at
  once rather than keep serving a port nobody supervises, or keep a restarted edge's port busy.
* The worker reports its admin listener (``{"event": "reachable", "admin": ...}`` on stdout)
  before it takes any stream connection, and listens on the stream port only once the
  supervisor writes ``CLEARED`` on the pipe: the supervisor has recorded where it is reached,
  so every write a sibling relays from then on reaches it. Then it reports ``listening``.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import sys
import threading
from dataclasses import dataclass
from typing import BinaryIO

from edge.config import Settings

LENGTH = struct.Struct("!I")
# The exit code of a worker whose supervisor disappeared (EX_SOFTWARE would suggest a bug).
ORPHANED = 75
# The one thing the supervisor writes after the bootstrap: "your siblings reach you: listen".
CLEARED = b"L"


@dataclass(frozen=True, kw_only=True, slots=True)
class Bootstrap:
    index: int
    settings: Settings
    metrics_dir: str  # the supervisor's multiprocess directory (edge.workers.mirror)
    supervisor: str  # its private loopback listener (edge.workers.siblings)


def encode(bootstrap: Bootstrap) -> bytes:
    body = pickle.dumps(bootstrap)
    return LENGTH.pack(len(body)) + body


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise EOFError("the supervisor closed the pipe before the bootstrap")
        data += chunk
    return data


def read_bootstrap(stream: BinaryIO) -> Bootstrap:
    (size,) = LENGTH.unpack(_read_exactly(stream, LENGTH.size))
    bootstrap = pickle.loads(_read_exactly(stream, size))
    if not isinstance(bootstrap, Bootstrap):
        raise TypeError("not a worker bootstrap")
    return bootstrap


def _watch_supervisor(stream: BinaryIO, cleared: threading.Event) -> None:
    while chunk := stream.read(4096):
        if CLEARED in chunk:
            cleared.set()
    os._exit(ORPHANED)


def main() -> None:
    # Unbuffered: nothing past the bootstrap is read ahead.
    stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 - lives as long as we do
    bootstrap = read_bootstrap(stdin)
    settings = bootstrap.settings
    logging.basicConfig(
        level=settings.log_level,
        format=f"%(asctime)s %(levelname)s worker-{bootstrap.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    cleared = threading.Event()
    threading.Thread(
        target=_watch_supervisor, args=(stdin, cleared), name="supervisor-watch", daemon=True
    ).start()

    from edge.server import run_worker
    from edge.startup import StartupError

    try:
        run_worker(bootstrap, cleared)
    except StartupError as error:
        print(f"edge: error: worker {bootstrap.index}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
