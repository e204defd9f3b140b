"""Every byte the edge keeps per stream, scope or segment is counted in ``--cache-bytes``.

The per-entry overheads in ``edge.store.local`` are estimates; these tests measure what each kind
of entry really costs with ``tracemalloc`` and fail if an estimate falls below it, so the budget
cannot silently undercount (84k empty segments once grew RSS by ~70 MB inside a 16 MiB budget).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import replace

import pytest

from edge.log.policy import keys_of, stream_id
from edge.log.segment import Segment
from edge.log.stream_log import LogKey
from edge.protocol.answer_key import AnswerKey, answer_key
from edge.protocol.paths import normalise_path
from edge.store.local import LocalTier, StoredHit

ENTRIES = 5000
KEY = LogKey(stream="/v1/stream/budget", scope="public")


def _offset(i: int, j: int) -> str:
    return f"{i:016d}_{j:016d}"


def segments(local: LocalTier, n: int) -> None:
    for i in range(n):
        local.put(KEY, Segment(start=_offset(i, 0), end=_offset(i, 1), body=b"x"))


def scopes(local: LocalTier, n: int) -> None:
    for i in range(n):
        local.log_for(LogKey(stream=KEY.stream, scope=f"cred-{i:032x}"))


def streams(local: LocalTier, n: int) -> None:
    for i in range(n):
        local.log_for(LogKey(stream=f"/v1/stream/{i:024d}", scope="public"))


def frames(local: LocalTier, n: int) -> None:
    for i in range(n):
        name = ("sse", _offset(i, 0), _offset(i, 1), "0123456789abcdef", True, False, "4242", True)
        assert local.put_derived(KEY, name, b"x", local.instance_for(KEY.stream))


def responses(local: LocalTier, n: int) -> None:
    for i in range(n):
        stream = f"/v1/stream/{i:024d}"
        instance = local.instance_for(stream)
        hit = StoredHit(
            instance=instance, etag=f'"{i}"', ok=b"HTTP/1.1 200 OK\r\n" + b"h" * 60,
            not_modified=b"HTTP/1.1 304 Not Modified\r\n" + b"h" * 60, body=b"x", cors=(),
            log=local.log_for(LogKey(stream=stream, scope="public")),
        )  # fmt: skip
        assert local.put_response(key(stream, "offset=-1", gzip=i % 2 == 0), hit)


@pytest.mark.parametrize("fill", [segments, scopes, streams, frames, responses])
def test_the_budget_counts_at_least_what_entries_really_cost(
    fill: Callable[[LocalTier, int], None],
) -> None:
    local = LocalTier(1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill(local, ENTRIES)
        gc.collect()
        real = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert local.bytes_used >= real, (local.bytes_used / ENTRIES, real / ENTRIES)


def test_many_scopes_stay_within_the_budget() -> None:
    local = LocalTier(256 * 1024)
    scopes(local, 20_000)
    assert local.bytes_used <= 256 * 1024
    bytes_, entries = local.usage()["log"]
    assert 0 < entries < 20_000
    assert bytes_ <= 256 * 1024


def test_usage_reports_every_structure_and_purge_empties_it() -> None:
    local = LocalTier(1 << 30)
    segments(local, 3)
    frames(local, 2)
    local.log_for(KEY)
    usage = local.usage()
    assert usage["segment"][1] == 3
    assert usage["derived"][1] == 2
    assert usage["log"][1] == 1
    assert usage["instance"][1] == 1
    assert local.bytes_used == sum(size for size, _ in usage.values())
    local.forget(KEY.stream)
    assert all(usage == (0, 0) for usage in local.usage().values())
    assert local.bytes_used == 0


def key(stream: str, query: str, *, gzip: bool, scope: str = "public") -> AnswerKey:
    return AnswerKey(stream=stream, query=query, scope=scope, gzip=gzip, origin=None)


def stored(local: LocalTier, stream: str) -> StoredHit:
    return StoredHit(
        instance=local.instance_for(stream), etag='"t"', ok=b"ok", not_modified=b"nm",
        body=b"body" * 100, cors=(), log=local.log_for(LogKey(stream=stream, scope="public")),
    )  # fmt: skip


def test_stored_responses_live_and_die_with_their_stream_instance() -> None:
    local = LocalTier(1 << 30)
    hit = stored(local, KEY.stream)
    assert local.put_response(key(KEY.stream, "offset=-1", gzip=True), hit)
    assert local.response(key(KEY.stream, "offset=-1", gzip=True)) is hit
    assert local.response(key(KEY.stream, "offset=-1", gzip=False)) is None  # representation
    assert local.response(key(KEY.stream, "offset=-1", gzip=True, scope="cred-x")) is None
    assert local.usage()["response"][1] == 1
    # An alias path is never a key: the index would not find it when the stream is purged.
    assert answer_key(
        path=KEY.stream + "/./", query="", scope="public", accept_encoding=None, origin=None,
        cors_varies=False,
    ) is None  # fmt: skip
    assert not local.put_response(key(KEY.stream + "/x", "offset=-1", gzip=True), hit)
    local.forget(KEY.stream)
    assert local.response(key(KEY.stream, "offset=-1", gzip=True)) is None
    assert local.usage()["response"] == (0, 0)
    # Made under the purged instance: refused, so nothing of it is answered again.
    assert not local.put_response(key(KEY.stream, "offset=-1", gzip=True), hit)


def test_stored_responses_are_evicted_like_any_entry() -> None:
    local = LocalTier(64 * 1024)
    for i in range(200):
        stream = f"/v1/stream/evict-{i}"
        local.put_response(key(stream, "", gzip=False), stored(local, stream))
    assert local.bytes_used <= 64 * 1024
    assert 0 < local.usage()["response"][1] < 200


def test_forgetting_a_scope_forgets_the_answers_stored_for_it() -> None:
    local = LocalTier(1 << 30)
    mine, theirs = (
        key(KEY.stream, "offset=-1", gzip=False, scope="cred-a"),
        key(KEY.stream, "offset=-1", gzip=False, scope="cred-b"),
    )
    for answer_key_ in (mine, theirs):
        hit = stored(local, KEY.stream)
        assert local.put_response(
            answer_key_,
            replace(hit, log=local.log_for(LogKey(stream=KEY.stream, scope=answer_key_.scope))),
        )
    local.forget_scope(LogKey(stream=KEY.stream, scope="cred-a"))
    assert local.response(mine) is None
    assert local.response(theirs) is not None


# What the memos of pure functions (outside the budget) may cost together when full.
MEMOS_MAX_BYTES = 2 * 1024 * 1024


def test_the_memos_outside_the_budget_stay_small_when_full() -> None:
    """The memos of ``answer_key``, ``normalise_path``, ``stream_id`` and ``keys_of`` fill with
    values seen once (each catch-up read's target, each stream, each instance's generation), so
    they grow with what was ever seen until full: filled past their size with such values, they
    cost at most ``MEMOS_MAX_BYTES`` together."""
    for memo in (answer_key, normalise_path, stream_id, keys_of):
        memo.cache_clear()
    distinct = 20_000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(distinct):
            stream = f"/v1/stream/soak-{i}"
            scope = "public" if i % 20 else f"s={i * 99991:x}"
            query = f"offset={_offset(i, 7 * i)}"
            answer_key(stream, query, scope, "gzip" if i % 2 else None, None, False)
            normalise_path(stream)
            stream_id(stream)
            keys_of(stream, f"{i:016x}")
        gc.collect()
        real = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        for memo in (answer_key, normalise_path, stream_id, keys_of):
            memo.cache_clear()
    assert real <= MEMOS_MAX_BYTES, real
