"""The pure cache core: segments, stitching, tail facts, expiry and the catch-up plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.log.policy import (
    Fetch,
    Hit,
    etag,
    if_none_match_hits,
    plan_catchup,
)
from edge.log.segment import Segment, is_json, stitch
from edge.log.stream_log import (
    NEVER,
    LogKey,
    StreamInstance,
    StreamLog,
    TailFact,
    TailVerdict,
    judge_shared,
)
from edge.protocol.answer_key import accepts_gzip
from edge.store.local import LocalTier, entry_cost

KEY = LogKey(stream="/s", scope="public")
MiB = 1024 * 1024


def seg(start: str, end: str, body: bytes) -> Segment:
    return Segment(start=start, end=end, body=body)


def tier(*segments: Segment, budget: int = MiB) -> LocalTier:
    local = LocalTier(budget)
    for segment in segments:
        assert local.put(KEY, segment)
    return local


def plan(
    log: StreamLog | None,
    local: LocalTier,
    offset: str,
    *,
    now: float = 100.0,
    freshness: float = 1.0,
    max_bytes: int = MiB,
) -> Hit | Fetch:
    return plan_catchup(
        log, local.get, KEY, offset, now=now, freshness_seconds=freshness, max_bytes=max_bytes
    )


_tickets = iter(range(10**9))


def observe(log: StreamLog, tail: str, *, closed: bool, now: float, **kw: bool) -> TailVerdict:
    """An answer whose request started and arrived just now."""
    ticket = next(_tickets)
    return log.observe_tail(tail, closed=closed, now=now, started=ticket, received=ticket, **kw)


def open_log(tail: str, observed_at: float = 100.0) -> StreamLog:
    instance = StreamInstance(stream=KEY.stream, content_type="text/plain")
    log = StreamLog(key=KEY, instance=instance)
    observe(log, tail, closed=False, now=observed_at)
    log.instance.touched_origin(observed_at)
    return log


# --- segments ---


def test_bytes_stitch_by_concatenation() -> None:
    assert (
        stitch([seg("a", "b", b"he"), seg("b", "c", b"l"), seg("c", "d", b"lo")], json=False)
        == b"hello"
    )


def test_json_segments_stitch_as_one_array() -> None:
    parts = [seg("a", "b", b"[1,2]"), seg("b", "c", b" [ 4 ] "), seg("c", "d", b'[{"k":3}]')]
    assert stitch(parts, json=True) == b'[1,2,4,{"k":3}]'
    assert stitch([], json=True) == b"[]"


def test_json_content_type_detection() -> None:
    assert is_json("application/json; charset=utf-8")
    assert not is_json("application/jsonl")
    assert not is_json(None)


# --- the plan ---


def test_unknown_stream_is_a_miss() -> None:
    decision = plan(None, tier(), "-1")
    assert isinstance(decision, Fetch)
    assert (decision.offset, decision.is_delta) == ("-1", False)


def test_covered_to_a_fresh_tail_is_a_hit() -> None:
    local = tier(seg("-1", "0_5", b"hello"), seg("0_5", "1_1", b" world"))
    decision = plan(open_log("1_1", observed_at=99.5), local, "-1")
    assert isinstance(decision, Hit)
    assert decision.up_to_date
    assert not decision.closed
    assert [s.start for s in decision.coverage.segments] == ["-1", "0_5"]
    assert decision.coverage.end == "1_1"


def test_stale_tail_asks_only_for_the_delta() -> None:
    local = tier(seg("-1", "0_5", b"hello"), seg("0_5", "1_1", b" world"))
    decision = plan(open_log("1_1", observed_at=90.0), local, "-1")
    assert isinstance(decision, Fetch)
    assert decision.offset == "1_1"
    assert decision.is_delta


def test_a_gap_asks_from_where_the_chain_breaks() -> None:
    local = tier(seg("-1", "0_5", b"hello"), seg("0_9", "1_1", b"ld"))
    decision = plan(open_log("1_1"), local, "-1")
    assert isinstance(decision, Fetch)
    assert decision.offset == "0_5"
    assert [s.start for s in decision.prefix.segments] == ["-1"]


def test_write_makes_the_tail_stale() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5")
    assert isinstance(plan(log, local, "-1"), Hit)
    log.mark_stale()
    assert isinstance(plan(log, local, "-1"), Fetch)


def test_closed_tail_is_trusted_forever_and_never_reopens() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5")
    late = next(_tickets)  # a request that left before the closure was known ...
    observe(log, "0_5", closed=True, now=100.0)
    log.mark_stale()
    verdict = log.observe_tail("0_5", closed=False, now=101.0, started=late, received=late + 10)
    assert verdict is TailVerdict.OLDER  # ... arrives late: older, not a reopening
    decision = plan(log, local, "-1", now=10_000.0)
    assert isinstance(decision, Hit)
    assert decision.closed
    eof = plan(log, local, "0_5", now=10_000.0)
    assert isinstance(eof, Hit)
    assert eof.coverage.segments == ()
    assert eof.closed


def test_size_cap_stops_stitching_and_is_not_up_to_date() -> None:
    local = tier(seg("-1", "0_4", b"aaaa"), seg("0_4", "0_8", b"bbbb"), seg("0_8", "0_9", b"c"))
    decision = plan(open_log("0_9", observed_at=0.0), local, "-1", max_bytes=6)
    assert isinstance(decision, Hit)
    assert not decision.up_to_date
    assert decision.coverage.end == "0_4"
    # one segment is always whole, even past the cap
    single = plan(open_log("0_9", observed_at=0.0), local, "-1", max_bytes=1)
    assert isinstance(single, Hit)
    assert single.coverage.end == "0_4"


def test_absolute_expiry_ends_service() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5")
    observe(log, "0_5", closed=True, now=100.0)
    log.instance.expires_at = 150.0
    assert isinstance(plan(log, local, "-1", now=149.0), Hit)
    assert isinstance(plan(log, local, "-1", now=150.0), Fetch)


def test_sliding_ttl_counts_from_the_last_origin_touch() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5", observed_at=100.0)
    observe(log, "0_5", closed=True, now=100.0)
    log.instance.ttl_seconds = 10
    assert isinstance(plan(log, local, "-1", now=104.0), Hit)
    # past half the TTL the origin is touched again (reads the edge absorbs do not extend it)
    assert isinstance(plan(log, local, "-1", now=105.5), Fetch)
    assert log.expired(110.0)


# --- validators and caching headers ---


def test_etags_differ_by_range_closure_and_encoding() -> None:
    tags = {
        etag("/s", "-1", "0_5", digest="d1", closed=False, encoding=None),
        etag("/s", "-1", "0_5", digest="d1", closed=True, encoding=None),
        etag("/s", "-1", "0_5", digest="d1", closed=False, encoding="gzip"),
        etag("/s", "-1", "0_6", digest="d1", closed=False, encoding=None),
        etag("/t", "-1", "0_5", digest="d1", closed=False, encoding=None),
        etag("/s", "-1", "0_5", digest="d2", closed=False, encoding=None),
    }
    assert len(tags) == 6
    closed = etag("/s", "-1", "0_5", digest="d1", closed=True, encoding=None)
    assert closed.endswith(':-1:0_5:d1:c"')


def test_if_none_match() -> None:
    tag = '"x:-1:0_5"'
    assert if_none_match_hits(tag, tag)
    assert if_none_match_hits(f'"other", W/{tag}', tag)
    assert if_none_match_hits("*", tag)
    assert not if_none_match_hits('"x:-1:0_6"', tag)
    assert not if_none_match_hits(None, tag)
    # A CDN that fetched gzip and decoded it for an identity client weakened the gzip tag.
    identity = etag("/s", "-1", "0_5", digest="0f" * 16, closed=True, encoding=None)
    gzipped = etag("/s", "-1", "0_5", digest="0f" * 16, closed=True, encoding="gzip")
    assert if_none_match_hits(f"W/{gzipped}", identity)
    assert if_none_match_hits(f"W/{identity}", gzipped)
    assert not if_none_match_hits(gzipped, identity)  # strong: the gzip bytes themselves


# What a tag names: (stream, start, end, digest, closed); two of each, so contents collide often.
CONTENTS = st.tuples(
    st.sampled_from(["/s", "/t"]),
    st.sampled_from(["-1", "0_3"]),
    st.sampled_from(["0_5", "0_5:x"]),  # an offset may hold a colon
    st.sampled_from(["0f" * 16, "a1" * 16]),
    st.booleans(),
)
CODINGS = st.sampled_from([None, "gzip"])
# A tag a client sends: the content and coding it was given for, and whether a cache weakened it.
HELD = st.tuples(CONTENTS, CODINGS, st.booleans())


def tag_of(content: tuple[str, str, str, str, bool], coding: str | None) -> str:
    stream, start, end, digest, closed = content
    return etag(stream, start, end, digest=digest, closed=closed, encoding=coding)


@given(
    held=st.lists(HELD, min_size=1, max_size=4),
    star=st.booleans(),
    current=CONTENTS,
    coding=CODINGS,
    spaces=st.sampled_from([",", ", ", " ,  "]),
)
def test_a_revalidation_is_a_304_exactly_when_the_client_holds_the_bytes_meant(
    held: list[tuple[tuple[str, str, str, str, bool], str | None, bool]],
    star: bool,
    current: tuple[str, str, str, str, bool],
    coding: str | None,
    spaces: str,
) -> None:
    """The one rule both paths use (``if_none_match_hits``) against a model of what a client
    holds: a strong tag is the very representation it was given; a weak one, the same bytes
    once decoded, in whatever coding (RFC 9110 §8.8.1). A 304 tells it to use what it holds:
    right exactly when that is the answer's content (and coding, for a strong tag)."""
    sent = [
        ("W/" if weak else "") + tag_of(content, held_coding) for content, held_coding, weak in held
    ]
    if star:
        sent.insert(len(sent) // 2, "*")
    expected = star or any(
        content == current and (weak or held_coding == coding)
        for content, held_coding, weak in held
    )
    assert if_none_match_hits(spaces.join(sent), tag_of(current, coding)) is expected


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("gzip", True),
        ("gzip, br", True),
        ("br;q=1, gzip;q=0", False),
        ("*", True),
        ("identity", False),
        (None, False),
    ],
)
def test_accepts_gzip(header: str | None, ok: bool) -> None:
    assert accepts_gzip(header) is ok


# --- the local tier ---


def test_a_stored_answer_is_kept_only_under_its_instances_generation() -> None:
    """Its bytes carry purge keys naming the generation it was built under: the tier refuses
    it once the instance has another (``FastPath.answer`` checks the same at every hit)."""
    from edge.protocol.answer_key import AnswerKey
    from edge.store.local import StoredHit

    local = LocalTier(MiB)
    log = local.log_for(KEY)
    key = AnswerKey(stream=KEY.stream, query="offset=-1", scope=KEY.scope, gzip=False)

    def hit(generation: str) -> StoredHit:
        return StoredHit(
            instance=log.instance, generation=generation, etag='"t"', ok=b"ok", not_modified=b"",
            body=b"", cors=(), log=log,
        )  # fmt: skip

    log.instance.generation = "g1"
    assert not local.put_response(key, hit(""))
    assert local.put_response(key, hit("g1"))
    assert local.response(key) is not None


def test_budget_evicts_least_recently_used_and_counts() -> None:
    one = entry_cost(seg("0_0", "0_1", b"x" * 1000))
    local = LocalTier(3 * one + entry_cost(StreamInstance(stream=KEY.stream)))
    for i in range(3):
        local.put(KEY, seg(f"0_{i}", f"0_{i + 1}", b"x" * 1000))
    assert local.get(KEY, "0_0") is not None  # touch: 0_1 is now the oldest
    local.put(KEY, seg("0_3", "0_4", b"x" * 1000))
    assert local.get(KEY, "0_1") is None
    assert local.evictions == 1
    assert local.bytes_used <= 3 * one + entry_cost(StreamInstance(stream=KEY.stream))


def test_longer_segment_at_the_same_start_wins() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    local.put(KEY, seg("-1", "0_3", b"hel"))
    got = local.get(KEY, "-1")
    assert got is not None
    assert got.end == "0_5"
    local.put(KEY, seg("-1", "0_9", b"hello you"))
    got = local.get(KEY, "-1")
    assert got is not None
    assert got.end == "0_9"


def test_segment_larger_than_the_budget_is_not_kept() -> None:
    local = LocalTier(100)
    assert not local.put(KEY, seg("-1", "0_1", b"x" * 500))
    assert local.segment_count == 0


def test_purge_drops_every_scope_of_one_stream_only() -> None:
    local = LocalTier(MiB)
    other_scope = LogKey(stream="/s", scope="cred-1")
    other_stream = LogKey(stream="/t", scope="public")
    for key in (KEY, other_scope, other_stream):
        local.put(key, seg("-1", "0_1", b"x"))
        local.log_for(key)
    instance = local.instance_for("/s")
    assert local.forget("/s") == 2
    assert not local.current(instance)  # the instance is forgotten with its entries
    assert local.get(KEY, "-1") is None
    assert local.get(other_scope, "-1") is None
    assert local.get(other_stream, "-1") is not None
    assert local.log(KEY) is None
    assert local.log(other_stream) is not None


def test_a_write_floor_disbelieves_older_tails() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5")
    early = next(_tickets)  # a fetch leaves the origin ...
    log.instance.reached("0_9", next(_tickets))  # ... a write answers Stream-Next-Offset 0_9 ...
    log.mark_stale()
    # ... and the fetch lands after it, still saying 0_5: older, not a new instance.
    verdict = log.observe_tail("0_5", closed=False, now=100.0, started=early, received=early + 5)
    assert verdict is TailVerdict.OLDER
    decision = plan(log, local, "-1")
    assert isinstance(decision, Fetch)
    assert decision.offset == "0_5"
    observe(log, "0_9", closed=False, now=100.0)
    local.put(KEY, seg("0_5", "0_9", b" you"))
    assert isinstance(plan(log, local, "-1"), Hit)


def test_purging_one_scope_keeps_the_others() -> None:
    local = LocalTier(MiB)
    private = LogKey(stream="/s", scope="cred-1")
    for key in (KEY, private):
        local.put(key, seg("-1", "0_1", b"x"))
        local.log_for(key)
    assert local.forget_scope(private) == 1
    assert local.get(private, "-1") is None
    assert local.log(private) is None
    assert local.get(KEY, "-1") is not None
    assert local.log(KEY) is not None


def test_a_live_upstreams_word_holds_only_while_it_keeps_speaking() -> None:
    local = tier(seg("-1", "0_5", b"hello"))
    log = open_log("0_5", observed_at=100.0)
    ticket = next(_tickets)
    log.observe_tail(
        "0_5", closed=False, now=100.0, started=ticket, received=ticket, authoritative=True
    )
    hit = plan_catchup(
        log, local.get, KEY, "-1", now=130.0, freshness_seconds=1.0, max_bytes=MiB,
        authority_seconds=36.0,
    )  # fmt: skip
    assert isinstance(hit, Hit)
    # Silent past the origin's keep-alive interval: the stream may be gone; ask the origin.
    silent = plan_catchup(
        log, local.get, KEY, "-1", now=137.0, freshness_seconds=1.0, max_bytes=MiB,
        authority_seconds=36.0,
    )  # fmt: skip
    assert isinstance(silent, Fetch)


@given(
    held_as=st.sampled_from(["text/plain", "application/json", "application/json; charset=utf-8"]),
    shared_as=st.sampled_from([None, "text/plain", "application/json"]),
    heard_open_at=st.one_of(st.just(NEVER), st.floats(0, 100)),
    seen_closed_at=st.floats(0, 100),
    tail_offset=st.sampled_from(["0_5", "0_9"]),
    stale=st.booleans(),
)
def test_a_shared_closure_closes_only_the_instance_it_names(
    held_as: str,
    shared_as: str | None,
    heard_open_at: float,
    seen_closed_at: float,
    tail_offset: str,
    stale: bool,
) -> None:
    """A closure another replica shares (at 0_9, where the chain held ends) is believed of the
    instance held only if it names the same content type and the edge has not heard the stream
    open at 0_9 since it was seen closed there (a closed stream never reopens: that closure was
    another instance's, recreated behind every replica's back up to the same offset)."""
    instance = StreamInstance(stream="/s", content_type=held_as)
    log = StreamLog(key=LogKey(stream="/s", scope=""), instance=instance)
    log.tail = TailFact(
        offset=tail_offset, closed=False, authoritative=False, observed_at=heard_open_at,
        heard_at=heard_open_at,
    )  # fmt: skip
    if stale:
        log.mark_stale()
    tail = log.tail
    verdict = judge_shared(instance, tail, "0_9", content_type=shared_as, seen_at=seen_closed_at)
    another_type = shared_as is not None and shared_as != held_as  # parameters and all
    reopened = tail_offset == "0_9" and heard_open_at >= seen_closed_at
    if another_type:
        assert verdict is TailVerdict.NEW_INSTANCE
    elif reopened:
        assert verdict is TailVerdict.OLDER
    else:
        assert verdict is TailVerdict.BELIEVED


def test_a_tail_heard_open_elsewhere_tells_an_earlier_closure_apart_and_serves_nothing() -> None:
    """A segment another replica shared from an answer that said the stream open at its end:
    what a replica that reads only the shared tier knows of when the stream was open there."""
    instance = StreamInstance(stream="/s", content_type="text/plain")
    log = StreamLog(key=LogKey(stream="/s", scope=""), instance=instance)
    log.heard_open("0_9", 50.0)
    assert not log.tail_trusted(now=50.0, freshness_seconds=1.0)  # nothing to serve from it
    seen = {"content_type": "text/plain"}
    assert judge_shared(instance, log.tail, "0_9", **seen, seen_at=40.0) is TailVerdict.OLDER
    assert judge_shared(instance, log.tail, "0_9", **seen, seen_at=60.0) is TailVerdict.BELIEVED
    log.heard_open("0_9", 30.0)  # an earlier word changes nothing
    assert judge_shared(instance, log.tail, "0_9", **seen, seen_at=40.0) is TailVerdict.OLDER
