"""Compress once: each gzip representation of an answer is made once, kept, and reused.

Rules this module owns:

* A representation is named by what it is made of (the stream scope's key, the answer's range
  and the content digest of its segments), so a stored one can only ever be the same bytes
  compressed; it lives in the local tier's one budget as a derived entry of the stream instance
  it was made from, is refused once that instance is no longer current (a compression in a
  thread can outlive a delete), and is forgotten with it.
* Identical compressions in flight are done once (single-flight).
* Bodies of ``OFF_LOOP_BYTES`` or more are compressed in a worker thread (zlib releases the
  GIL), so one large body never stalls every viewer on the event loop.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Hashable

from edge.coalesce import SingleFlight
from edge.log.stream_log import LogKey, StreamInstance
from edge.store.local import LocalTier

COMPRESS_LEVEL = 5
OFF_LOOP_BYTES = 128 * 1024


class Compressor:
    def __init__(self, local: LocalTier) -> None:
        self._local = local
        self._flights: SingleFlight[tuple[LogKey, StreamInstance, Hashable], bytes] = SingleFlight()
        self.made = 0  # compressions actually run (the rest were reused)

    async def gzip(
        self, key: LogKey, instance: StreamInstance, name: Hashable, body: bytes
    ) -> bytes:
        """``body`` (of ``instance``, in ``key``'s scope) compressed; kept only while
        ``instance`` is current, which a compression in a thread may outlive."""
        derived = ("gzip", name)
        stored = self._local.derived(key, derived)
        if stored is not None:
            return stored
        compressed, _ = await self._flights.run((key, instance, derived), lambda: self._make(body))
        self._local.put_derived(key, derived, compressed, instance)
        return compressed

    async def _make(self, body: bytes) -> bytes:
        self.made += 1
        if len(body) < OFF_LOOP_BYTES:
            return gzip.compress(body, compresslevel=COMPRESS_LEVEL, mtime=0)
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: gzip.compress(body, compresslevel=COMPRESS_LEVEL, mtime=0)
        )
