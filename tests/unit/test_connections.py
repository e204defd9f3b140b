"""The connection state machine of edge.web.connection_table: deadlines, eviction, the cap (and
the tracker's 503 refusal). No sockets, no event loop: keys are strings and the clock is a
number."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.web.connection_table import (
    Admission,
    ConnectionTable,
    Expiry,
    Limits,
    Phase,
    default_max_connections,
)
from edge.web.connection_tracker import REFUSAL

HEADER = 10.0
KEEPALIVE = 60.0


def table(cap: int = 100) -> ConnectionTable[str]:
    return ConnectionTable(
        Limits(
            header_timeout_seconds=HEADER, keepalive_timeout_seconds=KEEPALIVE, max_connections=cap
        )
    )


def test_a_new_connection_must_send_a_head_within_the_header_timeout() -> None:
    t = table()
    assert t.admit("a", 0.0) == Admission(admitted=True)
    assert (t.phase("a"), t.deadline("a")) == (Phase.HEAD, HEADER)
    assert t.expire(HEADER - 0.01) == []
    assert t.expire(HEADER) == [Expiry(key="a", phase=Phase.HEAD)]
    assert len(t) == 0
    assert t.phase("a") is None


def test_a_half_sent_head_does_not_extend_its_deadline() -> None:
    t = table()
    t.admit("slow", 0.0)
    for now in (1.0, 5.0, 9.0):  # a byte now and then (slowloris)
        t.bytes_received("slow", now)
    assert t.deadline("slow") == HEADER
    assert t.expire(HEADER) == [Expiry(key="slow", phase=Phase.HEAD)]


def test_a_busy_connection_has_no_deadline_and_idles_after_its_request() -> None:
    t = table()
    t.admit("a", 0.0)
    t.bytes_received("a", 0.5)
    t.request_started("a")
    assert (t.phase("a"), t.deadline("a")) == (Phase.BUSY, None)
    assert t.expire(10_000.0) == []  # an SSE viewer or a long-poll is not cut here
    t.request_finished("a", 10_000.0)
    assert (t.phase("a"), t.deadline("a")) == (Phase.IDLE, 10_000.0 + KEEPALIVE)
    assert t.expire(10_000.0 + KEEPALIVE) == [Expiry(key="a", phase=Phase.IDLE)]


def test_the_next_requests_first_byte_starts_its_header_deadline() -> None:
    t = table()
    t.admit("a", 0.0)
    t.request_started("a")
    t.request_finished("a", 1.0)
    t.bytes_received("a", 30.0)  # well within the keep-alive timeout
    assert (t.phase("a"), t.deadline("a")) == (Phase.HEAD, 30.0 + HEADER)
    t.bytes_received("a", 35.0)
    assert t.deadline("a") == 30.0 + HEADER
    assert t.expire(30.0 + HEADER) == [Expiry(key="a", phase=Phase.HEAD)]


def test_pipelined_requests_keep_a_connection_busy_until_the_last_ends() -> None:
    t = table()
    t.admit("a", 0.0)
    t.request_started("a")
    t.request_started("a")
    t.request_finished("a", 1.0)
    assert t.phase("a") is Phase.BUSY
    t.request_finished("a", 2.0)
    assert t.phase("a") is Phase.IDLE


def test_a_connection_still_sending_its_response_is_not_cut() -> None:
    t = table()
    t.admit("a", 0.0)
    t.admit("b", 0.0)
    for key in ("a", "b"):
        t.request_started(key)
        t.request_finished(key, 1.0)
    expired = t.expire(1.0 + KEEPALIVE, flushing=lambda key: key == "a")
    assert expired == [Expiry(key="b", phase=Phase.IDLE)]
    assert t.deadline("a") == 1.0 + 2 * KEEPALIVE  # its idle clock starts again
    assert t.expire(1.0 + 2 * KEEPALIVE) == [Expiry(key="a", phase=Phase.IDLE)]


def test_deadlines_expire_in_order_across_phases() -> None:
    t = table()
    t.admit("head", 0.0)
    t.admit("idle", 0.0)
    t.request_started("idle")
    t.request_finished("idle", 1.0)
    t.admit("late", 5.0)
    assert t.expire(HEADER + 1.0) == [Expiry(key="head", phase=Phase.HEAD)]
    assert t.expire(5.0 + HEADER) == [Expiry(key="late", phase=Phase.HEAD)]
    assert t.expire(1.0 + KEEPALIVE) == [Expiry(key="idle", phase=Phase.IDLE)]


def test_at_the_cap_the_longest_idle_connection_is_evicted() -> None:
    t = table(cap=3)
    t.admit("old", 0.0)
    t.admit("mid", 1.0)
    t.admit("new", 2.0)
    assert t.admit("next", 3.0) == Admission(admitted=True, evict="old")
    assert len(t) == 3
    assert t.phase("old") is None
    assert t.phase("next") is Phase.HEAD


def test_eviction_order_is_time_since_last_busy_not_since_connect() -> None:
    t = table(cap=3)
    t.admit("a", 0.0)
    t.admit("b", 1.0)
    t.admit("c", 2.0)
    t.request_started("a")
    t.request_finished("a", 5.0)  # a was busy until 5: now the most recently idle
    t.bytes_received("b", 6.0)  # b starting a request head keeps its place
    assert t.admit("d", 7.0).evict == "b"
    assert t.admit("e", 8.0).evict == "c"
    assert t.admit("f", 9.0).evict == "a"


def test_busy_and_flushing_connections_are_never_evicted() -> None:
    t = table(cap=3)
    for key in ("busy", "flushing", "idle"):
        t.admit(key, 0.0)
    t.request_started("busy")
    admission = t.admit("new", 1.0, flushing=lambda key: key == "flushing")
    assert admission == Admission(admitted=True, evict="idle")


def test_when_every_connection_is_busy_a_newcomer_is_refused() -> None:
    t = table(cap=2)
    for key in ("a", "b"):
        t.admit(key, 0.0)
        t.request_started(key)
    assert t.admit("c", 1.0) == Admission(admitted=False)
    assert len(t) == 2
    assert t.phase("c") is None
    t.request_finished("a", 2.0)
    assert t.admit("c", 3.0) == Admission(admitted=True, evict="a")


def test_unknown_and_closed_connections_are_ignored() -> None:
    t = table()
    t.admit("a", 0.0)
    assert t.forget("a") is True
    assert t.forget("a") is False
    t.bytes_received("a", 1.0)
    t.request_started("a")
    t.request_finished("a", 1.0)  # a handler ending after its client left
    assert len(t) == 0
    assert t.expire(1e9) == []


def test_default_cap_is_half_the_open_file_limit_after_a_reserve() -> None:
    assert default_max_connections(20_000) == 9_968
    assert default_max_connections(1024) == 480
    assert default_max_connections(10) == 1
    assert default_max_connections(-1) > 100_000  # RLIM_INFINITY


def test_the_refusal_is_a_complete_http_response() -> None:
    head, _, body = REFUSAL.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"Connection"] == b"close"
    assert headers[b"Retry-After"] == b"1"
    assert int(headers[b"Content-Length"]) == len(body)


# A generated check against a model: any sequence of events keeps the table within its cap,
# gives exactly the waiting connections a deadline, and expires exactly what is past it.

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "bytes", "start", "finish", "forget", "tick"]),
        st.integers(min_value=0, max_value=7),
        st.floats(min_value=0.0, max_value=30.0),
        st.booleans(),
    ),
    max_size=60,
)


@given(EVENTS)
def test_generated_event_sequences_keep_the_invariants(
    events: list[tuple[str, int, float, bool]],
) -> None:
    cap = 4
    t: ConnectionTable[str] = ConnectionTable(
        Limits(header_timeout_seconds=3.0, keepalive_timeout_seconds=7.0, max_connections=cap)
    )
    now = 0.0
    model: dict[str, int] = {}  # key -> requests in progress
    for op, n, step, flag in events:
        key = f"c{n}"
        now += step
        flushing = frozenset({key} if flag else ()).__contains__
        if op == "admit" and key not in model:
            full = len(model) >= cap
            admission = t.admit(key, now, flushing=flushing)
            if admission.admitted:
                model[key] = 0
                if admission.evict is not None:
                    assert full
                    assert model.pop(admission.evict) == 0, "evicted a busy connection"
            else:
                assert full
                assert all(busy for busy in model.values())
        elif op == "bytes":
            t.bytes_received(key, now)
        elif op == "start" and key in model:
            t.request_started(key)
            model[key] += 1
        elif op == "finish" and model.get(key):
            t.request_finished(key, now)
            model[key] -= 1
        elif op == "forget":
            assert t.forget(key) is (model.pop(key, None) is not None)
        elif op == "tick":
            for expiry in t.expire(now, flushing=flushing):
                assert model.pop(expiry.key) == 0, "expired a busy connection"
        assert len(t) == len(model) <= cap
        for k, busy in model.items():
            deadline = t.deadline(k)
            assert (deadline is None) == bool(busy)
            assert (t.phase(k) is Phase.BUSY) == bool(busy)
            if deadline is not None and op == "tick":
                assert deadline > now


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["bytes", "answered", "wait"])),
        max_size=40,
    )
)
def test_an_answer_at_once_is_a_request_started_and_finished(
    events: list[tuple[str, str]],
) -> None:
    """The fast path's one-step bookkeeping leaves the table exactly as the two steps do."""
    one, two = table(cap=3), table(cap=3)
    now = 0.0
    for key, what in events:
        now += 1.0
        if what == "bytes":
            one.bytes_received(key, now)
            two.bytes_received(key, now)
        elif what == "answered":
            one.answered(key, now)
            two.request_started(key)
            two.request_finished(key, now)
        elif one.phase(key) is None:  # a transport connects once
            assert one.admit(key, now) == two.admit(key, now)
        assert [one.phase(k) for k in "abcd"] == [two.phase(k) for k in "abcd"]
        assert [one.deadline(k) for k in "abcd"] == [two.deadline(k) for k in "abcd"]
    assert one.expire(now + 100) == two.expire(now + 100)
