"""When a read starts a refresh-ahead of an at-tail answer (edge.log.ahead): pure, no loop."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.log.ahead import REFRESH_FRACTION, Refreshing, due_after, refresh_due
from edge.log.stream_log import LogKey, TailFact

KEYS = [LogKey(stream=s, scope=c) for s in ("/a", "/b") for c in ("public", "alice")]


def tail(
    observed_at: float = 100.0, *, authoritative: bool = False, closed: bool = False
) -> TailFact:
    return TailFact(offset="5", closed=closed, authoritative=authoritative, observed_at=observed_at)


def test_only_the_last_tenth_of_the_window_is_due() -> None:
    fact = tail(100.0)
    due = [refresh_due(fact, now=100.0 + age, freshness_seconds=1.0) for age in (
        0.0, 0.5, 0.89, 0.9, 0.95, 0.999, 1.0, 1.5,
    )]  # fmt: skip
    assert due == [False, False, False, True, True, True, False, False]


def test_a_tail_followed_live_or_closed_is_never_refreshed() -> None:
    for fact in (tail(authoritative=True), tail(closed=True)):
        assert not refresh_due(fact, now=100.95, freshness_seconds=1.0)


def test_no_window_no_refresh() -> None:
    assert not refresh_due(tail(100.0), now=100.0, freshness_seconds=0.0)


@given(
    freshness=st.floats(min_value=0.0, max_value=3600.0),
    age=st.floats(min_value=-10.0, max_value=7200.0),
    authoritative=st.booleans(),
    closed=st.booleans(),
)
def test_due_exactly_while_still_fresh_and_late(
    freshness: float, age: float, authoritative: bool, closed: bool
) -> None:
    """Due only while the answer is still given as fresh (age below the window), late in it,
    and only for a tail the edge observed itself, open."""
    fact = tail(1000.0, authoritative=authoritative, closed=closed)
    now = 1000.0 + age
    age = now - fact.observed_at  # as the freshness rule counts it (StreamLog.tail_trusted)
    due = refresh_due(fact, now=now, freshness_seconds=freshness)
    if due:
        assert not authoritative
        assert not closed
        assert age < freshness
        assert age >= freshness * (1 - REFRESH_FRACTION)
        assert now - fact.observed_at >= due_after(freshness)  # the hit path's first test
    elif not authoritative and not closed and freshness > 0:
        assert not (freshness * (1 - REFRESH_FRACTION) <= age < freshness)


@given(
    freshness=st.floats(min_value=0.01, max_value=60.0),
    gaps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=200),
)
def test_readers_steadier_than_a_tenth_always_start_one_before_the_lapse(
    freshness: float, gaps: list[float]
) -> None:
    """Readers that never leave more than a tenth of the window between them (the gaps, in
    tenths) reach the last tenth before the window ends: one of them starts the refresh."""
    book = Refreshing()
    key = KEYS[0]
    fact = tail(0.0)
    now = 0.0
    started: list[float] = []
    for gap in gaps:
        now += gap * freshness * REFRESH_FRACTION * 0.999
        if now >= freshness:
            break
        if book.start(key, fact, now=now, freshness_seconds=freshness):
            started.append(now)
    if now >= freshness:
        assert len(started) == 1
    assert len(started) <= 1


Op = tuple[str, int, float]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "end"]),
        st.integers(min_value=0, max_value=len(KEYS) - 1),
        st.floats(min_value=0.0, max_value=2.0),
    ),
    max_size=80,
)


@given(ops=OPS, freshness=st.sampled_from([0.0, 0.5, 1.0, 2.5]))
def test_at_most_one_refresh_per_log_at_once(ops: list[Op], freshness: float) -> None:
    """Against a model: a read starts a refresh iff it is due and none of its log is running;
    an end frees that log only; never two running for one log."""
    book = Refreshing()
    running: set[LogKey] = set()
    observed = {key: tail(0.0) for key in KEYS}
    for op, index, now in ops:
        key = KEYS[index]
        if op == "end":
            book.ended(key)
            running.discard(key)
        else:
            expected = key not in running and refresh_due(
                observed[key], now=now, freshness_seconds=freshness
            )
            assert book.start(key, observed[key], now=now, freshness_seconds=freshness) is expected
            if expected:
                running.add(key)
        assert {k for k in KEYS if book.running(k)} == running
        assert len(book) == len(running)
