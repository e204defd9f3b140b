"""The local tier: everything the edge keeps about streams, under one byte budget, LRU.

Rules this module owns:

* **One budget.** Segments, per-scope stream logs, stream instances and every cache derived from
  them (encoded SSE frames, ...) live in one LRU bounded by ``--cache-bytes``. Each entry costs
  its bytes plus a measured per-entry overhead (``tests/unit/test_budget.py`` checks the
  estimates against ``tracemalloc``), so nothing the edge keeps per stream, scope or request
  grows outside the budget, and ``/metrics`` reports every structure in it.
* **One instance at a time.** A stream's entries all belong to its current ``StreamInstance``:
  ``forget`` forgets the instance with every entry of the stream; evicting the instance does the
  same, so no entry outlives the instance it was made for. Work that began under an instance
  that is no longer current (``current(instance)`` is False) must not store what it brings.
* Entries are indexed by stream, so a forgetting or a write touches only that stream.
* A segment larger than the whole budget is simply not kept.
* Stored responses (``StoredHit``: a complete serialised answer, for the pre-serialised hit
  path) are entries like any other: counted in the budget, LRU, indexed by stream and forgotten
  with its instance. They are keyed by the request's ``AnswerKey`` (``edge.protocol.answer_key``),
  whose stream is the normalised path; each carries the instance it was derived from and is
  refused once that instance is not current (or names another generation of it than the one it
  was built under). Derived entries (gzip bodies, SSE frames) too.
* **Compress once** (``Compressor``): each gzip representation of an answer is made once, kept
  as a derived entry of the instance it was made from, and reused. It is named by what it is
  made of (the stream scope's key, the answer's range and the content digest of its segments),
  so a stored one can only ever be the same bytes compressed; it is refused once its instance
  is no longer current (a compression in a thread can outlive a delete). Identical
  compressions in flight are done once (single-flight); bodies of ``OFF_LOOP_BYTES`` or more
  are compressed in a worker thread (zlib releases the GIL), so one large body never stalls
  every viewer on the event loop.
"""

from __future__ import annotations

import asyncio
import gzip
import sys
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from edge.coalesce import SingleFlight
from edge.log.segment import Segment
from edge.log.stream_log import NEVER, LogKey, StreamInstance, StreamLog
from edge.protocol.answer_key import AnswerKey

# Measured with tracemalloc on CPython 3.11 (tests/unit/test_budget.py keeps them honest):
# the key tuple, the LRU's dict and order slots, the stream index slot and the object itself.
SEGMENT_OVERHEAD_BYTES = 640
LOG_OVERHEAD_BYTES = 760
INSTANCE_OVERHEAD_BYTES = 760
DERIVED_OVERHEAD_BYTES = 700
RESPONSE_OVERHEAD_BYTES = 900
MAX_TEMPLATES = 1024
COMPRESS_LEVEL = 5
OFF_LOOP_BYTES = 128 * 1024

SEGMENT, LOG, INSTANCE, DERIVED, RESPONSE = "segment", "log", "instance", "derived", "response"
STRUCTURES = (SEGMENT, LOG, INSTANCE, DERIVED, RESPONSE)
EntryKey = tuple[Any, ...]


@dataclass(kw_only=True, slots=True, eq=False)
class StoredHit:
    """One representation of a stored answer (immutable, or at the tail while it holds),
    serialised once: ``ok`` and ``not_modified`` are heads up to their ``Date`` line
    (``edge.protocol.http1``), or, for an answer that carries ``Age`` (``ages``), up to where
    each hit's ``Age`` line goes, ``ok_rest`` and ``not_modified_rest`` after it. Nothing of it
    changes once made but ``kept``, which the tier sets."""

    instance: StreamInstance
    etag: str
    ok: bytes
    not_modified: bytes
    body: bytes
    # The instance's generation it was built under: its purge keys name it, so it is given only
    # while the instance still has it.
    generation: str = ""
    ages: bool = False  # an at-tail answer: each hit gets its own ``Age``, between the parts
    ok_rest: bytes = b""
    not_modified_rest: bytes = b""
    # The CORS headers (``OriginCors.for_request``) the answer was built with: another set
    # means the full path would answer differently now.
    cors: tuple[tuple[str, str], ...]
    # The log it was built from (its stream instance and credential scope): the answer is
    # given only while the tier keeps that log (``StreamLog.kept``).
    log: StreamLog
    # An at-tail answer of an open stream: the tail it ends at. It is given only while that is
    # still the log's trusted tail (``edge.log.policy.at_tail_holds``); None: immutable.
    tail_end: str | None = None
    tail_closed: bool = False  # a HEAD's: the tail it reports may be a closed one
    # What a fill of its scope sends upstream (the read's that stored it): an at-tail answer's
    # refresh-ahead asks the origin with them (``edge.refresh_ahead``).
    credentials: tuple[tuple[str, str], ...] = ()
    # The tier holds it (set by ``LocalTier``): one that remembers it past a lookup (the hit
    # path's heads met before) gives it only while this is true.
    kept: bool = False

    @property
    def size(self) -> int:
        heads = len(self.ok) + len(self.not_modified) + len(self.ok_rest)
        return heads + len(self.not_modified_rest) + len(self.body) + len(self.etag)


def _scope_of_entry(entry: Hashable) -> LogKey | None:
    """The stream and scope an entry of the index was kept for (a stored answer's, from its
    ``AnswerKey``; every other kind is keyed by its ``LogKey``)."""
    assert isinstance(entry, tuple)
    kind, key = entry[0], entry[1]
    if kind == RESPONSE:
        assert isinstance(key, AnswerKey)
        return LogKey(stream=key.stream, scope=key.scope)
    return key if isinstance(key, LogKey) else None


def entry_cost(value: object) -> int:
    if isinstance(value, Segment):
        return value.size + len(value.start) + len(value.end) + SEGMENT_OVERHEAD_BYTES
    if isinstance(value, bytes):
        return len(value) + DERIVED_OVERHEAD_BYTES
    if isinstance(value, StreamLog):
        return LOG_OVERHEAD_BYTES + len(value.key.stream) + len(value.key.scope)
    if isinstance(value, StreamInstance):
        return INSTANCE_OVERHEAD_BYTES + len(value.stream)
    if isinstance(value, StoredHit):
        return value.size + RESPONSE_OVERHEAD_BYTES
    return sys.getsizeof(value)


class _BudgetLRU(LRUCache[EntryKey, Any]):
    """An LRU over mixed entries that reports every removal and keeps per-structure totals."""

    def __init__(self, maxsize: int, on_remove: Callable[[EntryKey, Any, bool], None]) -> None:
        super().__init__(maxsize=maxsize, getsizeof=entry_cost)
        self._on_remove = on_remove
        self.bytes_by_structure = dict.fromkeys(STRUCTURES, 0)
        self.entries_by_structure = dict.fromkeys(STRUCTURES, 0)
        self._evicting = False

    def __setitem__(self, key: EntryKey, value: Any) -> None:
        if key in self:
            self.__delitem__(key)
        super().__setitem__(key, value)
        if key in self:
            self.bytes_by_structure[key[0]] += entry_cost(value)
            self.entries_by_structure[key[0]] += 1

    def __delitem__(self, key: EntryKey) -> None:
        value = super().__getitem__(key) if key in self else None
        super().__delitem__(key)
        self.bytes_by_structure[key[0]] -= entry_cost(value)
        self.entries_by_structure[key[0]] -= 1
        evicted, self._evicting = self._evicting, False  # entries forgotten with it are not
        self._on_remove(key, value, evicted)

    def popitem(self) -> tuple[EntryKey, Any]:
        self._evicting = True
        return super().popitem()


def _stream_of(key: EntryKey) -> str:
    owner = key[1]
    return owner.stream if isinstance(owner, LogKey | AnswerKey) else str(owner)


class LocalTier:
    def __init__(self, budget_bytes: int, on_evict: Callable[[], object] = lambda: None) -> None:
        self.evictions = 0
        self._on_evict = on_evict
        self._index: dict[str, set[EntryKey]] = {}
        self._entries = _BudgetLRU(budget_bytes, self._removed)
        # Header templates are the same for most streams: one shared tuple per distinct value.
        self._templates: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def _removed(self, key: EntryKey, value: object, evicted: bool) -> None:
        if isinstance(value, StreamLog | StoredHit):
            value.kept = False  # whatever was stored from it ends with it
        stream = _stream_of(key)
        keys = self._index.get(stream)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._index[stream]
        if evicted:
            self.evictions += 1
            self._on_evict()
            if key[0] == INSTANCE:
                self.forget(stream)  # no entry outlives its instance

    def _put(self, key: EntryKey, value: object) -> bool:
        if entry_cost(value) > self._entries.maxsize:
            return False
        stream = _stream_of(key)
        self._entries[key] = value
        if key not in self._entries:
            return False
        if key[0] != INSTANCE and (INSTANCE, stream) not in self._entries:
            # Making room evicted the stream's own instance: this entry would outlive it.
            self._entries.pop(key, None)
            return False
        self._index.setdefault(stream, set()).add(key)
        if isinstance(value, StreamLog | StoredHit):
            value.kept = True
        return True

    # --- instances ---

    def instance(self, stream: str) -> StreamInstance | None:
        found = self._entries.get((INSTANCE, stream))
        return found if isinstance(found, StreamInstance) else None

    def instance_for(self, stream: str) -> StreamInstance:
        found = self.instance(stream)
        if found is None:
            found = StreamInstance(stream=stream)
            self._put((INSTANCE, stream), found)
        return found

    def current(self, instance: StreamInstance) -> bool:
        """Is ``instance`` still the one the edge serves for its stream?"""
        return self._entries.get((INSTANCE, instance.stream)) is instance

    # --- segments ---

    def get(self, key: LogKey, start: str) -> Segment | None:
        found = self._entries.get((SEGMENT, key, start))
        return found if isinstance(found, Segment) else None

    def put(self, key: LogKey, segment: Segment, instance: StreamInstance | None = None) -> bool:
        """Keep ``segment`` unless a longer one already starts there; False if it cannot be kept
        (too large, or ``instance`` is no longer current)."""
        if instance is None:
            self.instance_for(key.stream)
        elif not self.current(instance):
            return False
        known = self.get(key, segment.start)
        if known is not None and known.end >= segment.end:
            return True
        return self._put((SEGMENT, key, segment.start), segment)

    # --- caches derived from segments (SSE frames, ...) ---

    def derived(self, key: LogKey, name: Hashable) -> bytes | None:
        found = self._entries.get((DERIVED, key, name))
        return found if isinstance(found, bytes) else None

    def put_derived(
        self, key: LogKey, name: Hashable, value: bytes, instance: StreamInstance
    ) -> bool:
        """Keep ``value``, derived from ``instance``'s bytes, unless that instance is no longer
        current (it was made while the stream was forgotten: it is nobody's now)."""
        if instance.stream != key.stream or not self.current(instance):
            return False
        if len(value) + DERIVED_OVERHEAD_BYTES > self._entries.maxsize // 4:
            return False
        return self._put((DERIVED, key, name), value)

    # --- stored responses (the pre-serialised hit path) ---

    def response(self, key: AnswerKey) -> StoredHit | None:
        found = self._entries.get((RESPONSE, key))
        return found if isinstance(found, StoredHit) else None

    def put_response(self, key: AnswerKey, hit: StoredHit) -> bool:
        """Keep ``hit`` for requests classified as ``key``, unless the instance it was derived
        from is no longer current, is another stream's, or has another generation now."""
        instance = hit.instance
        if instance.stream != key.stream or not self.current(instance):
            return False
        if hit.generation != instance.generation:
            return False
        if hit.size + RESPONSE_OVERHEAD_BYTES > self._entries.maxsize // 4:
            return False
        return self._put((RESPONSE, key), hit)

    # --- stream logs ---

    def log(self, key: LogKey) -> StreamLog | None:
        found = self._entries.get((LOG, key))
        if not isinstance(found, StreamLog):
            return None
        if not self.current(found.instance):
            self._entries.pop((LOG, key), None)
            return None
        return found

    def log_for(self, key: LogKey) -> StreamLog:
        found = self.log(key)
        if found is None:
            found = StreamLog(key=key, instance=self.instance_for(key.stream))
            self._put((LOG, key), found)
        return found

    def logs_of(self, stream: str) -> Iterator[StreamLog]:
        for key in list(self._index.get(stream, ())):
            if key[0] == LOG:
                found = self.log(key[1])
                if found is not None:
                    yield found

    def template(self, headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        shared = self._templates.get(headers)
        if shared is None:
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            shared = self._templates[headers] = headers
        return shared

    # --- forgetting ---

    def forget_scope(self, key: LogKey) -> int:
        """Forget ``key.stream`` in ``key.scope`` only (segments, facts, derived values and the
        stored answers of that scope); returns the segments dropped."""
        doomed = [k for k in self._index.get(key.stream, ()) if _scope_of_entry(k) == key]
        for entry in doomed:
            self._entries.pop(entry, None)
        return sum(1 for k in doomed if k[0] == SEGMENT)

    def forget(self, stream: str) -> int:
        """Forget the stream's instance and everything kept for it; returns segments dropped."""
        doomed = list(self._index.pop(stream, ()))
        for entry in doomed:
            self._entries.pop(entry, None)
        self._entries.pop((INSTANCE, stream), None)
        return sum(1 for k in doomed if k[0] == SEGMENT)

    def holds_data(self, stream: str) -> bool:
        """Anything kept for ``stream`` besides its instance?"""
        return any(key[0] != INSTANCE for key in self._index.get(stream, ()))

    def holds_learned(self, stream: str) -> bool:
        """Anything learned from the origin kept for ``stream``: bytes, what was derived from
        them, a tail fact believed; not only how it is read (its type, the origin's headers) and
        where a live follower stands (``StreamLog.followed_from``)."""
        for entry in list(self._index.get(stream, ())):
            if entry[0] in (SEGMENT, DERIVED, RESPONSE):
                return True
            if entry[0] == LOG:
                found = self.log(entry[1])
                fact = found.tail if found is not None else None
                if fact is not None and (fact.closed or fact.observed_at != NEVER):
                    return True
        return False

    def streams(self) -> list[str]:
        return list(self._index)

    # --- accounting ---

    @property
    def bytes_used(self) -> int:
        return int(self._entries.currsize)

    @property
    def segment_count(self) -> int:
        return self._entries.entries_by_structure[SEGMENT]

    def usage(self) -> dict[str, tuple[int, int]]:
        """structure -> (bytes, entries) within the budget."""
        lru = self._entries
        return {s: (lru.bytes_by_structure[s], lru.entries_by_structure[s]) for s in STRUCTURES}


class Compressor:
    """Gzip representations of answers, made once and kept in the local tier (see the rules)."""

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
