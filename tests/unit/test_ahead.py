"""Refresh-ahead in the pure core (``edge.log.ahead``, ``edge.log.policy``): when an at-tail hit
asks for a refill, that at most one runs per log, and, against a small model of an origin whose
tail moves, that no answer given is older than the freshness window and that a steady reader
never waits once warm. Also the cap of a fill's answer (``fill_coverage``): a reader sharing
another's fill gets what its own would have given it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from edge.log.ahead import REFRESH_FRACTION, Refresh, Refreshing, due_after, refresh_of
from edge.log.policy import Coverage, Fetch, Hit, cover, fill_coverage, plan_catchup
from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamLog, TailFact
from edge.protocol.reads import START
from edge.store.local import LocalTier

KEY = LogKey(stream="/s", scope="public")
KEYS = [LogKey(stream=s, scope=c) for s in ("/a", "/b") for c in ("public", "alice")]
MiB = 1024 * 1024


def tail(
    observed_at: float = 100.0, *, authoritative: bool = False, closed: bool = False
) -> TailFact:
    return TailFact(offset="5", closed=closed, authoritative=authoritative, observed_at=observed_at)


# --- the rule ---


def test_only_the_last_tenth_of_the_window_is_due() -> None:
    fact = tail(100.0)
    due = [refresh_of(fact, now=100.0 + age, freshness_seconds=1.0) for age in (
        0.0, 0.5, 0.89, 0.9, 0.95, 0.999, 1.0, 1.5,
    )]  # fmt: skip
    none, yes = Refresh.NONE, Refresh.DUE
    assert due == [none, none, none, yes, yes, yes, none, none]


def test_a_tail_followed_live_or_closed_is_never_refreshed() -> None:
    """A live upstream moves the tail itself; a closed tail never moves."""
    for fact in (tail(authoritative=True), tail(closed=True)):
        assert refresh_of(fact, now=100.95, freshness_seconds=1.0) is Refresh.NONE


def test_no_window_no_refresh() -> None:
    assert refresh_of(tail(100.0), now=100.0, freshness_seconds=0.0) is Refresh.NONE


@given(
    freshness=st.floats(min_value=0.0, max_value=3600.0),
    age=st.floats(min_value=-10.0, max_value=7200.0),
    authoritative=st.booleans(),
    closed=st.booleans(),
)
def test_due_exactly_while_still_fresh_and_late(
    freshness: float, age: float, authoritative: bool, closed: bool
) -> None:
    fact = tail(1000.0, authoritative=authoritative, closed=closed)
    now = 1000.0 + age
    age = now - fact.observed_at  # as the freshness rule counts it (StreamLog.tail_trusted)
    due = refresh_of(fact, now=now, freshness_seconds=freshness) is Refresh.DUE
    late = freshness * (1 - REFRESH_FRACTION) <= age < freshness
    assert due == (late and not authoritative and not closed)
    if due:
        assert now - fact.observed_at >= due_after(freshness)  # the hit path's first test


def test_the_plan_names_a_refresh_only_for_an_at_tail_hit_late_in_its_window() -> None:
    local = LocalTier(MiB)
    log = started_log(local)
    early = plan(local, log, now=100.5)
    late = plan(local, log, now=100.95)
    lapsed = plan(local, log, now=101.0)
    assert isinstance(early, Hit)
    assert early.refresh is Refresh.NONE
    assert isinstance(late, Hit)
    assert late.refresh is Refresh.DUE
    assert late.up_to_date
    assert isinstance(lapsed, Fetch)


# --- the book: one refill per log ---

OPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "end"]),
        st.integers(min_value=0, max_value=len(KEYS) - 1),
        st.sampled_from(list(Refresh)),
    ),
    max_size=80,
)


@given(ops=OPS)
def test_at_most_one_refill_per_log_at_once(ops: list[tuple[str, int, Refresh]]) -> None:
    """Against a model: a read starts a refill iff it is due and none of its log is running;
    an end frees that log only."""
    book = Refreshing()
    running: set[LogKey] = set()
    for op, index, refresh in ops:
        key = KEYS[index]
        if op == "end":
            book.ended(key)
            running.discard(key)
        else:
            expected = refresh is Refresh.DUE and key not in running
            assert book.start(key, refresh) is expected
            if expected:
                running.add(key)
        assert {k for k in KEYS if book.running(k)} == running
        assert len(book) == len(running)


# --- the cap of a fill's answer ---


def chain(sizes: list[int]) -> list[Segment]:
    offsets = [START, *(f"{n:08d}" for n in range(1, len(sizes) + 1))]
    return [
        Segment(start=offsets[i], end=offsets[i + 1], body=b"x" * size)
        for i, size in enumerate(sizes)
    ]


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=8),
    read_from=st.integers(min_value=0, max_value=7),
    max_bytes=st.integers(min_value=1, max_value=1200),
)
def test_a_fills_answer_is_what_the_plan_gives_once_it_is_stored(
    sizes: list[int], read_from: int, max_bytes: int
) -> None:
    """A reader whose chain stops before the last segment asks a fill for it (that fill may be
    another reader's, or a refill of the tail, with another prefix). Its answer is capped by
    its own prefix: exactly what the plan gives the same read once the segment is stored."""
    segments = chain(sizes)
    read_from = min(read_from, len(segments) - 1)
    offset = segments[read_from].start
    held = LocalTier(MiB)
    for segment in segments[:-1]:
        held.put(KEY, segment)
    prefix = cover(held.get, KEY, offset, max_bytes=max_bytes)
    if prefix.capped:
        return  # the plan answers from what is held: no fill
    last = segments[-1]
    assert prefix.end == last.start
    answered = fill_coverage(prefix, last, last.end, max_bytes=max_bytes)
    held.put(KEY, last)
    assert answered == cover(held.get, KEY, offset, max_bytes=max_bytes)
    body = sum(s.size for s in answered.segments)
    assert body <= max_bytes or len(answered.segments) == 1


def test_an_empty_fill_answers_the_prefix_at_its_end() -> None:
    segments = chain([10])
    prefix = Coverage(segments=(segments[0],), end=segments[0].end, capped=False)
    assert fill_coverage(prefix, None, segments[0].end, max_bytes=1) == prefix


# --- a steady reader against a model origin ---


@dataclass
class Origin:
    """The stream at the origin: its tail after each append, and when."""

    tails: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 1)])

    def append(self, now: float) -> None:
        self.tails.append((now, self.tails[-1][1] + 1))

    def tail_at(self, when: float) -> int:
        return max(t for at, t in self.tails if at <= when)

    def superseded_at(self, tail: int) -> float:
        """Until when the origin's tail was ``tail``."""
        return next((at for at, t in self.tails if t > tail), float("inf"))


def offset(n: int) -> str:
    return f"{n:08d}"


@dataclass
class Edge:
    """The edge's log of the stream, filled and refilled from the model origin. A fill's tail
    is observed as of when its request left (``edge.log.intake``: ``Arrival.touched_at``)."""

    local: LocalTier
    log: StreamLog
    origin: Origin
    tickets: int = 0
    refills: list[tuple[float, int, float]] = field(default_factory=list)  # (asked, ticket, done)
    book: Refreshing = field(default_factory=Refreshing)

    def fill(self, asked_at: float, started: int) -> None:
        """An origin answer to a request that left at ``asked_at`` arrives now."""
        end = self.origin.tail_at(asked_at)
        for n in range(1, end + 1):
            start = START if n == 1 else offset(n - 1)
            self.local.put(KEY, Segment(start=start, end=offset(n), body=b"x"))
        self.tickets += 1
        self.log.observe_tail(
            offset(end), closed=False, now=asked_at, started=started, received=self.tickets
        )

    def ticket(self) -> int:
        self.tickets += 1
        return self.tickets


def started_log(local: LocalTier) -> StreamLog:
    local.put(KEY, Segment(start=START, end=offset(1), body=b"x"))
    log = local.log_for(KEY)
    log.content_type = "text/plain"
    log.observe_tail(offset(1), closed=False, now=100.0, started=0, received=1)
    log.instance.touched_origin(100.0)
    return log


def plan(local: LocalTier, log: StreamLog, *, now: float, freshness: float = 1.0) -> Hit | Fetch:
    return plan_catchup(
        log, local.get, KEY, START, now=now, freshness_seconds=freshness, max_bytes=MiB
    )


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "read", "read", "append", "tick"]),
        st.floats(min_value=0.0, max_value=0.3),  # seconds that pass first
        st.floats(min_value=0.0, max_value=0.3),  # how long a refill started then takes
    ),
    max_size=120,
)


@given(steps=STEPS, freshness=st.sampled_from([0.2, 0.5, 1.0]))
def test_no_answer_is_older_than_the_window_and_one_refill_at_once(
    steps: list[tuple[str, float, float]], freshness: float
) -> None:
    """Reads, appends at the origin and refills that take any time, in any order: every
    at-tail answer the plan gives says a tail the origin had within the window, and at most one
    refill of the log is in flight."""
    local = LocalTier(MiB)
    log = started_log(local)
    origin = Origin([(0.0, 1)])
    edge = Edge(local=local, log=log, origin=origin)
    now = 100.0
    for op, elapsed, latency in steps:
        now += elapsed
        for asked, started, done in [r for r in edge.refills if r[2] <= now]:
            edge.refills.remove((asked, started, done))
            edge.fill(asked, started)
            edge.book.ended(KEY)
        if op == "append":
            origin.append(now)
        elif op == "read":
            planned = plan(local, log, now=now, freshness=freshness)
            if isinstance(planned, Fetch):
                edge.fill(now, edge.ticket())  # the reader's own fill
                continue
            assert planned.up_to_date
            end = int(planned.coverage.end)
            # The origin's tail was still there less than the window ago.
            assert origin.superseded_at(end) > now - freshness
            if edge.book.start(KEY, planned.refresh):
                edge.refills.append((now, edge.ticket(), now + latency))
        assert len(edge.refills) <= 1


@given(
    # At least two windows of reads: 100 reads at least a fiftieth of the window apart.
    gaps=st.lists(st.floats(min_value=0.02, max_value=0.05), min_size=100, max_size=200),
    latency=st.floats(min_value=0.0, max_value=0.0499),
    appends=st.sets(st.integers(min_value=0, max_value=199)),
)
def test_a_steady_reader_never_waits_once_warm(
    gaps: list[float], latency: float, appends: set[int]
) -> None:
    """A reader that reads at least every twentieth of the window, against an origin that
    answers within a twentieth: every read is answered from the log (a ``Hit``), across
    windows, while the origin's tail moves."""
    freshness = 1.0
    local = LocalTier(MiB)
    log = started_log(local)
    origin = Origin([(0.0, 1)])
    edge = Edge(local=local, log=log, origin=origin)
    now = 100.0
    for step, gap in enumerate(gaps):
        now += gap
        for asked, started, done in [r for r in edge.refills if r[2] <= now]:
            edge.refills.remove((asked, started, done))
            edge.fill(asked, started)
            edge.book.ended(KEY)
        if step in appends:
            origin.append(now)
        planned = plan(local, log, now=now, freshness=freshness)
        assert isinstance(planned, Hit), (step, now)
        if edge.book.start(KEY, planned.refresh):
            edge.refills.append((now, edge.ticket(), now + latency))
