"""The invariants of the cache core, checked with generated inputs (Hypothesis).

* A segment moves forward and holds something; nothing else can be built, so no chain loops.
* ``cover`` follows only forward, joining segments, whatever a (corrupt) lookup returns.
* Within one stream instance offsets never go back; an answer that contradicts what the edge
  knew before its request started is a new instance, and nothing else is.
* A write through the edge is judged against the instance held: one that names another content
  type (or follows its closure) is another instance; its closure is told as the tail of the
  bytes held only when it names their content type (a close without a body names none).
* A shared-tier value is either exactly what this edge wrote for that key, or a miss.
"""

from __future__ import annotations

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from edge.log.policy import cover
from edge.log.segment import InvalidSegment, Segment, answer_segment, content_digest
from edge.log.stream_log import (
    LogKey,
    Mark,
    StreamInstance,
    StreamLog,
    StreamWrite,
    TailVerdict,
    judge_write,
)
from edge.protocol.reads import START, is_offset_token
from edge.store.shared_codec import (
    BadValue,
    SharedClosure,
    decode,
    decode_closed,
    decode_generation,
    encode,
    encode_closed,
    new_generation,
)

KEY = LogKey(stream="/s", scope="public")

offsets = st.integers(min_value=0, max_value=50).map(lambda n: f"{n:04d}_{n * 3:04d}")
any_text = st.text(max_size=12)
bodies = st.binary(max_size=8)


@given(start=st.one_of(offsets, any_text, st.just(START)), end=st.one_of(offsets, any_text))
def test_a_segment_exists_only_if_it_moves_forward(start: str, end: str) -> None:
    body = b"x"
    valid_start = start == START or is_offset_token(start)
    forward = is_offset_token(end) and end > start
    try:
        segment = Segment(start=start, end=end, body=body)
    except InvalidSegment:
        assert not (valid_start and forward)
    else:
        assert valid_start
        assert forward
        assert segment.end > segment.start


@given(start=offsets, end=offsets, body=bodies, json_stream=st.booleans())
def test_an_origin_answer_is_a_segment_only_when_forward_and_not_empty(
    start: str, end: str, body: bytes, json_stream: bool
) -> None:
    if json_stream:
        body = b"[" + b",".join(b"%d" % b for b in body) + b"]"
    segment = answer_segment(start, end, body, json=json_stream)
    if segment is not None:
        assert segment.end > segment.start
        assert body not in (b"", b"[]")
    if end <= start:  # a read past the tail answers with the real, smaller tail
        assert segment is None


@given(
    stored=st.dictionaries(offsets, st.tuples(offsets, offsets), max_size=30),
    start=offsets,
)
def test_cover_only_moves_forward_whatever_the_lookup_returns(
    stored: dict[str, tuple[str, str]], start: str
) -> None:
    # A lookup that may answer with a segment for another start (a corrupt tier): never followed.
    table: dict[str, Segment] = {}
    for key, (seg_start, seg_end) in stored.items():
        if seg_end > seg_start:
            table[key] = Segment(start=seg_start, end=seg_end, body=b"x")
    coverage = cover(lambda _k, at: table.get(at), KEY, start, max_bytes=1 << 20)
    position = start
    for segment in coverage.segments:
        assert segment.start == position
        assert segment.end > position
        position = segment.end
    assert coverage.end == position


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, bool]]:
    """Tail observations of one instance: offsets only move forward; closure is final."""
    points = sorted(set(draw(st.lists(offsets, min_size=1, max_size=8))))
    closes = draw(st.booleans())
    return [(p, closes and i == len(points) - 1) for i, p in enumerate(points)]


@given(history=histories(), delays=st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_one_instance_in_any_arrival_order_is_never_a_new_instance(
    history: list[tuple[str, bool]], delays: list[int]
) -> None:
    # Request i starts at ticket 10*i and its answer may arrive later than the next ones'.
    log = StreamLog(key=KEY, instance=StreamInstance(stream=KEY.stream))
    arrivals = sorted(
        ((10 * i + 10 * delays[i] + 5, 10 * i, offset, closed))
        for i, (offset, closed) in enumerate(history)
    )
    for received, started, offset, closed in arrivals:
        # An answer only describes the stream as it was when it left the origin.
        verdict = log.observe_tail(
            offset, closed=closed, now=0.0, started=started, received=received
        )
        assert verdict is not TailVerdict.NEW_INSTANCE
    assert log.tail is not None
    assert log.instance.high is not None
    assert log.instance.high.offset == history[-1][0]


@given(history=histories(), behind=offsets)
def test_a_tail_behind_what_was_known_before_the_request_is_a_new_instance(
    history: list[tuple[str, bool]], behind: str
) -> None:
    log = StreamLog(key=KEY, instance=StreamInstance(stream=KEY.stream))
    ticket = 0
    for offset, closed in history:
        log.observe_tail(offset, closed=closed, now=0.0, started=ticket, received=ticket + 1)
        ticket += 2
    high = history[-1][0]
    assume(behind < high)
    verdict = log.observe_tail(behind, closed=False, now=0.0, started=ticket, received=ticket + 1)
    assert verdict is TailVerdict.NEW_INSTANCE


@given(history=histories())
def test_a_closure_that_vanishes_is_a_new_instance(history: list[tuple[str, bool]]) -> None:
    log = StreamLog(key=KEY, instance=StreamInstance(stream=KEY.stream))
    final = history[-1][0]
    log.observe_tail(final, closed=True, now=0.0, started=0, received=1)
    verdict = log.observe_tail(final, closed=False, now=0.0, started=2, received=3)
    assert verdict is TailVerdict.NEW_INSTANCE


@given(blob=st.one_of(st.binary(max_size=64), st.just(b"[1]"), st.just(b"null")), start=offsets)
def test_a_shared_value_is_exactly_ours_or_a_miss(blob: bytes, start: str) -> None:
    try:
        found, _generation = decode(blob, start=start)
    except BadValue:
        return
    assert found.segment.start == start
    assert found.segment.end > start


@given(
    start=offsets,
    end=offsets,
    body=st.binary(min_size=1, max_size=32),
    generation=st.text(min_size=1, max_size=16),
    other=offsets,
    open_tail=st.booleans(),
)
def test_shared_values_round_trip_and_belong_to_their_key(
    start: str, end: str, body: bytes, generation: str, other: str, open_tail: bool
) -> None:
    assume(end > start)
    segment = Segment(start=start, end=end, body=body)
    blob = encode(segment, "text/plain", generation, seen_at=12.5, open_tail=open_tail)
    found, stamp = decode(blob, start=start)
    assert (found.segment, found.content_type, stamp) == (segment, "text/plain", generation)
    assert (found.seen_at, found.open_tail) == (12.5, open_tail)
    assert found.segment.digest == segment.digest
    if other != start:
        try:
            decode(blob, start=other)
        except BadValue:
            pass
        else:
            raise AssertionError("a value served under another key")


def test_bad_closures_are_refused() -> None:
    good = {"end": "0_1", "gen": "g", "ct": "text/plain", "at": 1.5}
    for blob in (
        b"null", b"[1]", b'{"end": "a\\nb", "gen": "0"}', b'{"end": 1, "gen": "0"}',
        # The older format named no instance: a miss, never a closure of the bytes held.
        json.dumps({"end": "0_1", "gen": "g"}).encode(),
        json.dumps({**good, "at": "1.5"}).encode(), json.dumps({**good, "at": True}).encode(),
        json.dumps({**good, "at": float("nan")}).encode(), json.dumps({**good, "ct": 7}).encode(),
        json.dumps({**good, "ct": "text/plain\n"}).encode(),
    ):  # fmt: skip
        try:
            decode_closed(blob)
        except BadValue:
            continue
        raise AssertionError(blob)
    closure = SharedClosure(end="0_1", content_type="text/plain", seen_at=1.5)
    assert decode_closed(json.dumps(good).encode()) == (closure, "g")
    assert decode_closed(encode_closed(closure, "g")) == (closure, "g")


@given(stamp=st.one_of(st.just("0"), st.just(""), any_text))
def test_an_absent_generation_key_names_no_generation(stamp: str) -> None:
    """A generation key Redis lost (restarted empty, expired, evicted) or never had confirms no
    stamp a replica holds, not even the old default "0": the tier mints one in its place."""
    assert decode_generation(None) is None
    assert decode_generation(None) != stamp


@given(count=st.integers(min_value=1, max_value=20))
def test_a_minted_generation_is_read_back_as_itself(count: int) -> None:
    for _ in range(count):
        minted = new_generation()
        assert decode_generation(minted.encode()) == minted


def test_content_digests_tell_bytes_apart_not_offsets() -> None:
    old = Segment(start="0_0", end="0_9", body=b'[{"v":"old"}]')
    new = Segment(start="0_0", end="0_9", body=b'[{"v":"new"}]')
    assert content_digest([old]) != content_digest([new])
    assert content_digest([old]) == content_digest([Segment(start="0_0", end="0_9", body=old.body)])


content_types = st.sampled_from(
    [None, "application/json", "text/plain", "Text/Plain; charset=x", "text/plain;charset=X"]
)


@given(
    held=content_types,
    named=content_types,
    high=st.one_of(st.none(), offsets),
    floor=st.one_of(st.none(), offsets),
    closed=st.booleans(),
    appended=st.booleans(),
    answered=st.booleans(),
)
def test_a_write_tells_the_tail_of_the_bytes_held_only_if_it_names_their_instance(
    held: str | None,
    named: str | None,
    high: str | None,
    floor: str | None,
    closed: bool,
    appended: bool,
    answered: bool,
) -> None:
    instance = StreamInstance(stream="/s", content_type=held)
    if high is not None:
        instance.reached(high, received=1)
        if closed:
            instance.closed_at = Mark(offset=high, received=1)
    write = StreamWrite(
        floor=floor, started=2, appended=appended, content_type=named, answered=answered,
        status=204,
    )  # fmt: skip
    judgement = judge_write(instance, write)
    # An append's body says its media type only (the origin takes any parameters); a PUT's
    # answer names the stream's whole Content-Type (case and spaces aside).
    compared = (
        (lambda t: t.replace(" ", "").lower()) if answered else (lambda t: t.split(";")[0].lower())
    )
    other_type = held is not None and named is not None and compared(held) != compared(named)
    if other_type or instance.closed_at is not None:
        assert judgement.another is not None
    if judgement.another is not None:
        assert not judgement.names_instance
    # Only a write that names the held instance's content type may graft its closure on them.
    assert judgement.names_instance == (
        judgement.another is None and held is not None and named is not None
    )


@given(
    held=content_types,
    high=st.one_of(st.none(), offsets),
    closed=st.booleans(),
    status=st.sampled_from([400, 401, 403, 404, 409, 410, 413, 500, 503]),
    answered=st.booleans(),
)
def test_a_write_answered_404_or_410_says_the_stream_is_gone_and_other_refusals_nothing(
    held: str | None, high: str | None, closed: bool, status: int, answered: bool
) -> None:
    """Issue 27: the one judge of writes takes every answer: a 404 (deleted) or 410 (deleted
    while it has forks: soft-deleted) is gone, whatever the edge held; another refusal says
    nothing about the instance (it neither forgets it nor tells its tail)."""
    instance = StreamInstance(stream="/s", content_type=held)
    if high is not None:
        instance.reached(high, received=1)
        if closed:
            instance.closed_at = Mark(offset=high, received=1)
    write = StreamWrite(
        floor=None, started=2, appended=True, content_type=held, answered=answered, status=status
    )
    judgement = judge_write(instance, write)
    assert judgement.gone == (status in (404, 410))
    assert judgement.another is None
    assert not judgement.names_instance
