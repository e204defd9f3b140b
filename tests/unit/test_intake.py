"""The one door for origin answers (``edge.log.intake``), checked with generated answers.

* Only a 200 identity answer with a well-formed next offset, of the current instance, in the
  stream's own content type, moving forward, can be kept; whatever else arrives keeps nothing.
* A kept segment is exactly the answer's bytes over ``[start, end)``.
* An answer fetched under a forgotten instance changes nothing at all (no action).
* A content type other than the stream's, or a tail the core finds impossible, forgets the
  instance and keeps nothing; nothing else forgets it.
* Catch-up and live answers go through the same tail judgement (``judge_tail``), and
  ``StreamLog.observe_tail`` is exactly ``judge_tail`` then ``believe``.
* The origin renewed a sliding TTL no later than the edge says: a fill's touch is when its
  request left, never when its body ended; a live batch's, when it arrived.
* A 404 or 410 says the stream is gone, whatever request it answered (a fill, a live read, an
  answer the edge only relays or asked for itself): ``GONE`` for the current instance, and
  nothing for a forgotten one (issue 27).
"""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.log.intake import (
    Arrival,
    BelieveTail,
    Bypass,
    Decision,
    Forget,
    ForgetScope,
    Keep,
    Touched,
    decide,
)
from edge.log.segment import is_json_array, media_type, streams_content_type
from edge.log.stream_log import (
    LogKey,
    Mark,
    StreamInstance,
    StreamLog,
    TailFact,
    TailVerdict,
    judge_tail,
    says_gone,
)

offsets = st.integers(min_value=0, max_value=40).map(lambda n: f"{n:04d}_{n * 3:04d}")
content_types = st.sampled_from(
    [
        "text/plain",
        "application/json",
        "Text/Plain; charset=utf-8",
        "text/plain;charset=UTF-8",
        "text/plain; charset=iso-8859-1",
        "application/octet-stream",
    ]
)
bodies = st.one_of(st.binary(max_size=6), st.sampled_from([b"[]", b"[1]", b"[1,2]", b"{}"]))


@st.composite
def instances(draw: st.DrawFn) -> StreamInstance:
    instance = StreamInstance(stream="/s")
    if draw(st.booleans()):
        instance.high = Mark(offset=draw(offsets), received=draw(st.integers(0, 20)))
    if draw(st.integers(0, 5)) == 0:
        instance.closed_at = Mark(offset=draw(offsets), received=draw(st.integers(0, 20)))
    instance.content_type = draw(st.one_of(st.none(), content_types))
    return instance


tails = st.one_of(
    st.none(),
    st.builds(
        TailFact, offset=offsets, closed=st.booleans(), authoritative=st.booleans(),
        observed_at=st.floats(0, 100),
    ),
)  # fmt: skip


@st.composite
def arrivals(draw: st.DrawFn) -> Arrival:
    headers: list[tuple[str, str]] = []
    status = draw(st.sampled_from([200, 200, 200, 404, 410, 204]))
    malformed = draw(st.integers(0, 5)) == 0
    end = draw(st.sampled_from(["", "not an offset", "../x"]) if malformed else offsets)
    headers.append(("Stream-Next-Offset", end))
    content_type = draw(content_types)
    headers.append(("Content-Type", content_type))
    if draw(st.booleans()):
        headers.append(("Stream-Up-To-Date", "true"))
    if draw(st.booleans()):
        headers.append(("Stream-Closed", "true"))
    if draw(st.integers(0, 9)) == 0:
        headers.append(("Cache-Control", draw(st.sampled_from(["no-store", "private, max-age=5"]))))
    if draw(st.integers(0, 9)) == 0:
        headers.append(("Content-Encoding", "gzip"))
    start, body = draw(offsets), draw(bodies)
    stamps = {
        "started": draw(st.integers(0, 30)),
        "received": draw(st.integers(0, 30)),
        "now": 50.0,
    }
    kind = draw(st.sampled_from(["fill", "live", "evidence"]))
    if kind == "fill":
        return Arrival.of_fill(start, status, tuple(headers), body, **stamps)  # type: ignore[arg-type]
    if kind == "evidence":
        live = draw(st.booleans())
        return Arrival.evidence(status, tuple(headers), live=live, **stamps)  # type: ignore[arg-type]
    live_status = draw(st.sampled_from([200, 200, 200, 404, 410]))
    return Arrival(
        live=True, start=start, status=live_status, end=end, body=body, headers=(),
        content_type=content_type, up_to_date=("Stream-Up-To-Date", "true") in headers,
        closed=("Stream-Closed", "true") in headers, **stamps,  # type: ignore[arg-type]
    )  # fmt: skip


def _kept(intake_actions: tuple[object, ...]) -> list[Keep]:
    return [a for a in intake_actions if isinstance(a, Keep)]


@settings(max_examples=500)
@given(arrival=arrivals(), instance=instances(), tail=tails, current=st.booleans())
def test_only_a_forward_answer_of_the_current_instance_in_its_type_is_kept(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, current: bool
) -> None:
    before = copy.deepcopy(instance)
    intake = decide(arrival, instance, tail, current=current)
    # Deciding changes nothing: the instance is as it was.
    assert repr(instance) == repr(before)
    keeps = _kept(intake.actions)
    if intake.decision is Decision.STORE:
        assert current
        assert arrival.status == 200
        assert arrival.end is not None
        assert arrival.end >= arrival.start
        assert len(keeps) == 1
        assert keeps[0].segment is intake.segment
        if not arrival.live:
            assert not any(n.lower() == "content-encoding" for n, _ in arrival.headers)
            known = instance.content_type
            assert known is None or streams_content_type(known) == streams_content_type(
                arrival.content_type
            )
        if intake.segment is not None:
            segment = intake.segment
            assert (segment.start, segment.end) == (arrival.start, arrival.end)
            assert segment.end > segment.start
            if media_type(arrival.content_type) == "application/json":
                assert is_json_array(arrival.body)
                assert arrival.body not in (b"[]",)
            else:
                assert segment.body == arrival.body
    else:
        assert not keeps
        assert intake.segment is None
    if not current:
        assert intake.decision in (Decision.STALE, Decision.RELAY)
        # A forgotten instance's answer may only make the stream relayed (no-store: about the
        # path, whatever the instance) and never forgets or believes anything.
        assert all(isinstance(a, Bypass) for a in intake.actions)


@given(arrival=arrivals(), instance=instances(), tail=tails)
def test_only_a_contradiction_forgets_the_instance(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None
) -> None:
    intake = decide(arrival, instance, tail, current=True)
    forgets = [a for a in intake.actions if isinstance(a, Forget)]
    assert bool(forgets) == (intake.decision is Decision.NEW_INSTANCE)
    if intake.decision is Decision.NEW_INSTANCE:
        assert arrival.end is not None
        changed_type = (
            not arrival.live
            and instance.content_type is not None
            and streams_content_type(instance.content_type)
            != streams_content_type(arrival.content_type)
        )
        went_back = arrival.live and arrival.end < arrival.start
        closed = arrival.closed and (arrival.live or arrival.up_to_date)
        impossible = instance.contradicts(arrival.end, closed=closed, started=arrival.started)
        assert changed_type or went_back or impossible
    assert any(isinstance(a, ForgetScope) for a in intake.actions) == (
        intake.decision is Decision.GONE
    )
    # What is believed about the tail is the core's judgement, the same for both kinds.
    for action in intake.actions:
        if isinstance(action, BelieveTail):
            assert action.judgement.verdict is not TailVerdict.NEW_INSTANCE


@given(
    instance=instances(), tail=tails, offset=offsets, closed=st.booleans(),
    started=st.integers(0, 30), received=st.integers(0, 30), authoritative=st.booleans(),
)  # fmt: skip
def test_observing_a_tail_is_judging_it_then_believing_it(
    instance: StreamInstance,
    tail: TailFact | None,
    offset: str,
    closed: bool,
    started: int,
    received: int,
    authoritative: bool,
) -> None:
    judged = copy.deepcopy(instance)
    judgement = judge_tail(
        judged, tail, offset, closed=closed, now=7.0, started=started, received=received,
        authoritative=authoritative,
    )  # fmt: skip
    assert repr(judged) == repr(instance)  # judging is pure
    log = StreamLog(key=LogKey(stream="/s", scope="public"), instance=judged, tail=tail)
    log.believe(judgement)
    observed = StreamLog(key=LogKey(stream="/s", scope="public"), instance=instance, tail=tail)
    verdict = observed.observe_tail(
        offset, closed=closed, now=7.0, started=started, received=received,
        authoritative=authoritative,
    )  # fmt: skip
    assert verdict is judgement.verdict
    assert observed.tail == log.tail
    assert repr(observed.instance) == repr(log.instance)


@given(
    arrival=arrivals(),
    instance=instances(),
    tail=tails,
    asked=st.floats(0, 50),
)
def test_the_origin_is_said_to_have_renewed_a_ttl_when_the_request_left(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, asked: float
) -> None:
    arrival = replace(arrival, asked_at=None if arrival.live else asked)
    intake = decide(arrival, instance, tail, current=True)
    for action in intake.actions:
        if isinstance(action, Touched):
            assert action.now == (arrival.now if arrival.live else asked)
            assert action.now <= arrival.now


# An origin answer that reached the tail at 0000_0005.
AT_THE_TAIL = (
    ("Content-Type", "text/plain"),
    ("Stream-Next-Offset", "0000_0005"),
    ("Stream-Up-To-Date", "true"),
)


def test_a_slow_fill_renews_the_ttl_when_it_was_asked_not_when_its_body_ended() -> None:
    arrival = Arrival.of_fill(
        "-1", 200, AT_THE_TAIL, b"hello", started=1, received=2, now=130.0, asked_at=10.0
    )
    intake = decide(arrival, StreamInstance(stream="/s"), None, current=True)
    assert intake.decision is Decision.STORE
    assert [a for a in intake.actions if isinstance(a, Touched)] == [Touched(10.0)]


def test_a_fills_tail_is_observed_when_its_request_left_not_when_it_arrived() -> None:
    """Issue 29: the origin said where its tail was at some moment after the request left, so
    the freshness window counts from then (a refill answered late in its window, or a slow
    fill, gives no reader a tail older than ``--tail-freshness``)."""
    arrival = Arrival.of_fill(
        "-1", 200, AT_THE_TAIL, b"hello", started=1, received=2, now=130.0, asked_at=129.5
    )
    intake = decide(arrival, StreamInstance(stream="/s"), None, current=True)
    believed = [a.judgement.fact for a in intake.actions if isinstance(a, BelieveTail)]
    assert [fact.observed_at for fact in believed if fact is not None] == [129.5]


@settings(max_examples=300)
@given(arrival=arrivals(), instance=instances(), tail=tails, current=st.booleans())
def test_a_404_or_410_to_any_request_is_gone(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, current: bool
) -> None:
    """Issue 27: whatever the request (a fill, a live read, a relayed read, HEAD or DELETE, a
    probe), a 404 or 410 forgets the scope's stream; nothing else does without contradicting
    the instance; about a forgotten instance it says nothing. An answer the edge never stores
    keeps nothing and forgets nothing else."""
    intake = decide(arrival, instance, tail, current=current)
    gone = says_gone(arrival.status)
    assert (intake.decision is Decision.GONE) == (gone and current)
    if intake.decision is Decision.GONE:
        assert intake.actions == (ForgetScope(),)
    if gone and not current:
        assert intake.actions == ()
    if arrival.evidence_only:
        assert intake.decision in (Decision.GONE, Decision.RELAY, Decision.STALE)
        assert all(isinstance(a, ForgetScope) for a in intake.actions)
    assert says_gone(404)
    assert says_gone(410)
    assert not any(says_gone(s) for s in (200, 204, 304, 400, 401, 403, 409, 500))
