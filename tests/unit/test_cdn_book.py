"""The purge book (edge.cdn.book) against a model of what each forgetting is owed: no sockets,
no event loop; time and randomness are the test's."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from edge.cdn.book import Backoff, Booked, PurgeBook

DOUBLE = 2.0
CAP = 3
GIVE_UP = 60.0
LIMIT = 2
STREAMS = ("/a", "/b", "/c", "/d", "/e")


def _book(cap: int = CAP) -> PurgeBook:
    return PurgeBook(cap=cap, double_after_seconds=DOUBLE, give_up_seconds=GIVE_UP)


@dataclass
class Need:
    """One forgetting the model follows: in effect at ``r``; what it has been sent."""

    stream: str
    r: float | None = None
    first: bool = False  # a successful send started at or after r
    final: bool = False  # ... and one at or after the double purge's time
    gone: bool = False  # dropped or given up: owed nothing any more


@dataclass
class Flight:
    streams: list[str]
    started: float


class BookMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.book = _book()
        self.now = 0.0
        self.needs: list[Need] = []
        self.flights: list[Flight] = []
        self.drained_at: float | None = None
        self.paused_until = float("-inf")  # the latest Retry-After: nothing goes before it

    def _threshold(self, need: Need) -> float:
        """When the need's last send may start at the earliest (a drain collapses it)."""
        assert need.r is not None
        if self.drained_at is None:
            return need.r + DOUBLE
        return min(need.r + DOUBLE, max(need.r, self.drained_at))

    def _in_flight(self) -> set[str]:
        return {s for f in self.flights for s in f.streams}

    @rule(stream=st.sampled_from(STREAMS))
    def forget(self, stream: str) -> None:
        owed_before = stream in self.book
        full = len(self.book) >= CAP
        booked = self.book.forgot(stream, "deleted")
        if owed_before:
            assert booked is Booked.COALESCED
        elif full:
            assert booked is Booked.DROPPED
        else:
            assert booked is Booked.NEW
        self.needs.append(Need(stream=stream, gone=booked is Booked.DROPPED))

    @rule(stream=st.sampled_from(STREAMS))
    def settle(self, stream: str) -> None:
        waiting = [n for n in self.needs if n.stream == stream and n.r is None and not n.gone]
        if not waiting:
            return
        self.book.in_effect(stream, self.now, settled=len(waiting))
        for need in waiting:
            need.r = self.now
        owed = self.book.get(stream)
        assert owed is not None
        if stream not in self._in_flight() and owed.failures == 0:
            # As soon as possible: due at once (or when the target's rate limit ends).
            wake = self.book.next_wake()
            assert wake is not None
            assert wake <= max(self.now, self.paused_until)

    @rule(seconds=st.sampled_from((0.1, 0.5, 1.0, 2.0, 5.0, 30.0)))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def start_send(self) -> None:
        due = self.book.due(self.now, LIMIT)
        assert len(due) <= LIMIT
        if self.now < self.paused_until:
            assert due == [], "sent while the target asked to wait (Retry-After)"
        streams = [o.stream for o in due]
        assert len(set(streams)) == len(streams)
        assert not set(streams) & self._in_flight(), "a send in flight was handed out again"
        for owed in due:
            assert owed.next_at is not None
            assert owed.next_at <= self.now
        if streams:
            self.flights.append(Flight(streams=streams, started=self.now))

    @precondition(lambda self: self.flights)
    @rule(data=st.data(), ok=st.booleans(), retry_after=st.sampled_from((None, 0.0, 10.0)))
    def finish_send(self, data: st.DataObject, ok: bool, retry_after: float | None) -> None:
        flight = self.flights.pop(data.draw(st.integers(0, len(self.flights) - 1)))
        if ok:
            self.book.sent(flight.streams)
            for need in self.needs:
                if need.stream in flight.streams and need.r is not None and not need.gone:
                    if flight.started >= need.r:
                        need.first = True
                    if flight.started >= self._threshold(need):
                        need.final = True
            return
        uniform = data.draw(st.floats(0, 0.999))
        given_up = self.book.failed(
            flight.streams, self.now, uniform=uniform, retry_after_seconds=retry_after
        )
        if retry_after is not None:
            self.paused_until = max(self.paused_until, self.now + retry_after)
        for stream in flight.streams:
            owed = self.book.get(stream)
            if stream in given_up:
                for need in self.needs:
                    if need.stream == stream and need.r is not None:
                        need.gone = True
            elif owed is not None and retry_after is not None:
                assert owed.next_at is not None
                assert owed.next_at >= self.now + retry_after

    @precondition(lambda self: self.drained_at is None)
    @rule()
    def drain(self) -> None:
        self.book.drain(self.now)
        self.drained_at = self.now

    @invariant()
    def bounded(self) -> None:
        assert len(self.book) <= CAP

    @invariant()
    def every_unmet_need_is_owed(self) -> None:
        in_flight = self._in_flight()
        for need in self.needs:
            if need.gone or (need.first and need.final):
                continue
            owed = self.book.get(need.stream)
            assert owed is not None, f"{need} is owed nothing"
            if need.r is None:
                assert owed.waiting > 0
                continue
            assert owed.next_at is not None or need.stream in in_flight
            if not need.first and owed.failures == 0 and need.stream not in in_flight:
                assert owed.next_at is not None
                assert owed.next_at <= need.r
            assert owed.final_at >= self._threshold(need) or owed.failures > 0

    def teardown(self) -> None:
        # Everything in effect, every send answered and then succeeding: every need is met.
        for stream in STREAMS:
            self.settle(stream)
        while self.flights:
            flight = self.flights.pop()
            self.book.sent(flight.streams)
            self._met(flight)
        for _ in range(100):
            wake = self.book.next_wake()
            if wake is None:
                break
            self.now = max(self.now, wake)
            flight = Flight(
                streams=[o.stream for o in self.book.due(self.now, LIMIT)], started=self.now
            )
            self.book.sent(flight.streams)
            self._met(flight)
        assert len(self.book) == 0
        unmet = [n for n in self.needs if not n.gone and not (n.first and n.final)]
        assert not unmet

    def _met(self, flight: Flight) -> None:
        for need in self.needs:
            if need.stream in flight.streams and need.r is not None:
                need.first |= flight.started >= need.r
                need.final |= flight.started >= self._threshold(need)


TestBook = BookMachine.TestCase
# EDGE_PROPERTY_EXAMPLES (as for tests/unit/test_properties.py) hunts longer.
EXAMPLES = int(os.environ.get("EDGE_PROPERTY_EXAMPLES", "200"))
TestBook.settings = settings(max_examples=EXAMPLES, stateful_step_count=40, deadline=None)


def test_a_forgetting_is_sent_at_once_then_once_more_after_the_double_purge_window() -> None:
    book = _book()
    assert book.forgot("/s", "deleted") is Booked.NEW
    assert book.next_wake() is None  # not in effect yet: nothing may be sent
    book.in_effect("/s", 10.0)
    assert [o.stream for o in book.due(10.0, LIMIT)] == ["/s"]
    assert book.sent(["/s"]) == []  # the double purge is still owed
    assert book.next_wake() == 10.0 + DOUBLE
    assert book.due(11.0, LIMIT) == []
    assert [o.stream for o in book.due(12.0, LIMIT)] == ["/s"]
    assert book.sent(["/s"]) == ["/s"]
    assert len(book) == 0


def test_a_need_arriving_during_a_send_is_not_met_by_it() -> None:
    book = _book()
    book.forgot("/s", "deleted")
    book.in_effect("/s", 0.0)
    book.due(0.0, LIMIT)
    book.forgot("/s", "created")  # coalesced while the first send is out
    book.in_effect("/s", 0.5)
    book.sent(["/s"])
    owed = book.get("/s")
    assert owed is not None
    assert owed.next_at == 0.5  # due at once, not at the first forgetting's double purge
    assert owed.reason == "created"


def test_failures_back_off_with_jitter_and_are_given_up() -> None:
    backoff = Backoff(first_seconds=0.5, most_seconds=30.0)
    assert [backoff.delay(n, 0.0) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert backoff.delay(1, 0.999) < 0.5
    assert backoff.delay(20, 0.0) == 15.0
    book = _book()
    book.forgot("/s", "deleted")
    book.in_effect("/s", 0.0)
    now = 0.0
    while True:
        assert book.due(now, LIMIT)
        given_up = book.failed(["/s"], now, uniform=0.5)
        if given_up:
            break
        wake = book.next_wake()
        assert wake is not None
        assert wake - now <= 30.0
        now = wake
    assert given_up == ["/s"]
    assert now >= GIVE_UP
    assert len(book) == 0


def test_past_the_cap_new_streams_are_dropped_but_coalescing_is_not() -> None:
    book = _book(cap=1)
    assert book.forgot("/a", "deleted") is Booked.NEW
    assert book.forgot("/b", "deleted") is Booked.DROPPED
    assert book.forgot("/a", "deleted") is Booked.COALESCED
    assert book.confirmed("/b", "deleted", 0.0) is Booked.DROPPED


def test_a_durability_learned_later_owes_one_more_send_even_when_all_was_sent() -> None:
    book = _book()
    book.forgot("/s", "deleted")
    book.in_effect("/s", 0.0)
    for now in (0.0, DOUBLE):
        book.due(now, LIMIT)
        book.sent(["/s"])
    assert "/s" not in book
    assert book.confirmed("/s", "deleted", 100.0) is Booked.NEW
    assert book.next_wake() == 100.0 + DOUBLE


def test_draining_makes_everything_due_at_once_double_purge_included() -> None:
    book = _book()
    book.forgot("/s", "deleted")
    book.in_effect("/s", 0.0)
    book.due(0.0, LIMIT)
    book.sent(["/s"])
    book.drain(0.5)
    assert [o.stream for o in book.due(0.5, LIMIT)] == ["/s"]
    assert book.sent(["/s"]) == ["/s"]
    book.forgot("/t", "deleted")
    book.in_effect("/t", 0.6)
    assert [o.stream for o in book.due(0.6, LIMIT)] == ["/t"]
    assert book.sent(["/t"]) == ["/t"]


@given(count=st.integers(0, 200), limit=st.sampled_from((1, 30, 100, 256)))
def test_due_batches_stay_within_the_limit_and_cover_each_stream_once(
    count: int, limit: int
) -> None:
    book = PurgeBook(cap=1000, double_after_seconds=DOUBLE, give_up_seconds=GIVE_UP)
    streams = [f"/s{i}" for i in range(count)]
    for stream in streams:
        book.forgot(stream, "deleted")
        book.in_effect(stream, 0.0)
    seen: list[str] = []
    while batch := book.due(0.0, limit):
        assert len(batch) <= limit
        seen += [o.stream for o in batch]
    assert sorted(seen) == sorted(streams)
