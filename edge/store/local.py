"""The local tier: every cached segment of every stream under one byte budget, LRU.

Nothing else in the edge grows with traffic: stream facts live in a count-bounded LRU beside it,
both are indexed by stream so a purge or a write touches only that stream, and a segment larger
than the whole budget is simply not kept.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from cachetools import LRUCache

from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamLog

SegmentKey = tuple[LogKey, str]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Per-segment bookkeeping (key objects, dict slots), so many empty segments still cost budget.
SEGMENT_OVERHEAD_BYTES = 200
DEFAULT_MAX_STREAM_LOGS = 100_000


def _segment_cost(segment: Segment) -> int:
    return segment.size + SEGMENT_OVERHEAD_BYTES


class _NotifyingLRU(LRUCache[K, V], Generic[K, V]):
    """An LRU that reports what it evicts, so indexes beside it stay true."""

    def __init__(
        self,
        maxsize: int,
        on_evict: Callable[[K], None],
        getsizeof: Callable[[V], int] | None = None,
    ) -> None:
        super().__init__(maxsize=maxsize, getsizeof=getsizeof)
        self._on_evict = on_evict

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self._on_evict(key)
        return key, value


class _StreamIndex(Generic[K]):
    """stream path -> the keys stored for it."""

    def __init__(self, stream_of: Callable[[K], str]) -> None:
        self._keys: dict[str, set[K]] = {}
        self._stream_of = stream_of

    def add(self, key: K) -> None:
        self._keys.setdefault(self._stream_of(key), set()).add(key)

    def discard(self, key: K) -> None:
        stream = self._stream_of(key)
        keys = self._keys.get(stream)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[stream]

    def keys_of(self, stream: str) -> list[K]:
        return list(self._keys.get(stream, ()))


class LocalTier:
    def __init__(
        self,
        budget_bytes: int,
        max_logs: int = DEFAULT_MAX_STREAM_LOGS,
        on_evict: Callable[[], object] = lambda: None,
    ) -> None:
        self.evictions = 0
        self._on_evict = on_evict
        self._segment_index: _StreamIndex[SegmentKey] = _StreamIndex(lambda k: k[0].stream)
        self._log_index: _StreamIndex[LogKey] = _StreamIndex(lambda k: k.stream)
        self._segments: _NotifyingLRU[SegmentKey, Segment] = _NotifyingLRU(
            budget_bytes, self._segment_evicted, getsizeof=_segment_cost
        )
        self._logs: _NotifyingLRU[LogKey, StreamLog] = _NotifyingLRU(
            max_logs, self._log_index.discard
        )

    def _segment_evicted(self, key: SegmentKey) -> None:
        self.evictions += 1
        self._segment_index.discard(key)
        self._on_evict()

    # --- segments ---

    def get(self, key: LogKey, start: str) -> Segment | None:
        return self._segments.get((key, start))

    def put(self, key: LogKey, segment: Segment) -> bool:
        """Keep ``segment`` unless a longer one already starts there; False if it cannot fit."""
        if _segment_cost(segment) > self._segments.maxsize:
            return False
        known = self._segments.get((key, segment.start))
        if known is not None and known.end >= segment.end:
            return True
        self._segments[(key, segment.start)] = segment
        self._segment_index.add((key, segment.start))
        return True

    @property
    def bytes_used(self) -> int:
        return int(self._segments.currsize)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # --- stream facts ---

    def log(self, key: LogKey) -> StreamLog | None:
        return self._logs.get(key)

    def log_for(self, key: LogKey) -> StreamLog:
        log = self._logs.get(key)
        if log is None:
            log = StreamLog(key=key)
            self._logs[key] = log
            self._log_index.add(key)
        return log

    def logs_of(self, stream: str) -> Iterator[StreamLog]:
        for key in self._log_index.keys_of(stream):
            log = self._logs.get(key)
            if log is not None:
                yield log

    def purge_scope(self, key: LogKey) -> int:
        """Forget ``key.stream`` in ``key.scope`` only; returns the segments dropped."""
        doomed = [k for k in self._segment_index.keys_of(key.stream) if k[0] == key]
        for segment_key in doomed:
            self._segments.pop(segment_key, None)
            self._segment_index.discard(segment_key)
        if self._logs.pop(key, None) is not None:
            self._log_index.discard(key)
        return len(doomed)

    def purge(self, stream: str) -> int:
        """Forget everything about ``stream`` in every scope; returns the segments dropped."""
        doomed = self._segment_index.keys_of(stream)
        for key in doomed:
            self._segments.pop(key, None)
            self._segment_index.discard(key)
        for log_key in self._log_index.keys_of(stream):
            self._logs.pop(log_key, None)
            self._log_index.discard(log_key)
        return len(doomed)
