"""The agent of ``loadtest.audience``: a writer that appends on its schedule, answered or not.

Rules this module owns:
* One line (``loadtest.join.line``: a sequence number, words, a newline) every 1/rate s, sent
  straight to the origin when it is due, whether or not the appends before it were answered
  (an open loop, up to ``WRITER_CONNECTIONS`` in flight), then, every append answered, the
  stream closed. An origin busy with thousands of long-polls gets the same appends as an idle
  one: a writer that waited for each answer made 28 of 400 at 3,000 viewers straight at the
  origin, and the servers were not compared at the same write load.
* An append's time is when it was due and sent; the time the origin took to answer it is kept
  beside (``latencies``). Appends in flight together may land in another order:
  ``delivery.appends_in`` places them where the stream has them.
* Each worker thread keeps its keep-alive connection, but never sends on one idle for
  ``IDLE_REUSE_S`` (node closes an idle keep-alive connection after 5 s, and a POST sent into
  that close could not be told apart from a lost append).
"""

from __future__ import annotations

import http.client
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from loadtest.benchkit import close_stream
from loadtest.join import line

CONTENT_TYPE = "text/plain"
WRITER_CONNECTIONS = 64  # appends in flight at once, at most: 3 s of a 20/s writer
IDLE_REUSE_S = 2.0  # node closes a keep-alive connection idle 5 s: never send on one that old


class Writer(threading.Thread):
    """Appends ``seconds * rate`` lines to ``path`` at the origin, each when it is due, then
    closes the stream."""

    def __init__(self, origin_url: str, path: str, rate: float, seconds: float, size: int):
        super().__init__(daemon=True)
        self.origin_url, self.path, self.rate, self.size = origin_url, path, rate, size
        self.due = int(seconds * rate)
        self.sent: list[tuple[float, bytes]] = []  # (due and sent at, bytes), answered ones
        self.latencies: list[float] = []  # each answered append's send to its answer
        self.error: str | None = None
        self.local = threading.local()
        self.lock = threading.Lock()

    def connection(self) -> http.client.HTTPConnection:
        held = getattr(self.local, "held", None)
        if held is not None and time.monotonic() - held[1] < IDLE_REUSE_S:
            return held[0]  # type: ignore[no-any-return]
        if held is not None:
            held[0].close()
        parts = urlsplit(self.origin_url)
        return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)

    def post(self, sent_at: float, data: bytes) -> None:
        try:
            connection = self.connection()
            connection.request("POST", self.path, body=data, headers={"Content-Type": CONTENT_TYPE})
            reply = connection.getresponse()
            reply.read()
            self.local.held = (connection, time.monotonic())
        except (OSError, http.client.HTTPException) as failure:
            self.local.held = None
            with self.lock:
                self.error = self.error or f"append {data[:7]!r}: {failure}"
            return
        with self.lock:
            if reply.status not in (200, 204):
                self.error = self.error or f"append {data[:7]!r}: HTTP {reply.status}"
                return
            self.sent.append((sent_at, data))
            self.latencies.append(time.monotonic() - sent_at)

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=WRITER_CONNECTIONS) as pool:
            started = time.monotonic()
            for seq in range(self.due):
                time.sleep(max(0.0, started + seq / self.rate - time.monotonic()))
                pool.submit(self.post, time.monotonic(), line(seq, self.size))
        try:
            close_stream(self.origin_url, self.path, CONTENT_TYPE)
        except (OSError, http.client.HTTPException, RuntimeError) as failure:
            self.error = self.error or f"close: {failure}"
