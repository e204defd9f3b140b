"""What the supervisor hands a worker process on its pipe: the one module both sides import.

Rules this module owns:

* The supervisor writes one ``Bootstrap`` to the worker's stdin (length-prefixed pickle: the
  pipe is private to the two processes, and the settings, purge token included, never appear
  on a command line) and keeps the pipe open for the worker's lifetime.
* The one thing it writes after the bootstrap is ``CLEARED``: the supervisor has recorded where
  the worker's siblings reach it, so it may listen on the stream port (edge.workers.child).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import BinaryIO

from edge.config import Settings

LENGTH = struct.Struct("!I")
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
