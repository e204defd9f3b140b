"""The connection state machine of edge.web.connection_table: deadlines, eviction, the cap, who
is admitted at it by the kind of request (and the tracker's 503 refusal), and the descriptor
budget of edge.web.descriptors that sizes them. No sockets, no event loop: keys are strings and
the clock is a number."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edge.web.connection_table import (
    BODY_MIN_BYTES_PER_SECOND,
    ConnectionAdmission,
    ConnectionTable,
    Expiry,
    Limits,
    Phase,
    Refusal,
    body_deadline,
)
from edge.web.connection_tracker import REFUSAL
from edge.web.descriptors import (
    MIN_SHORT_RESERVE,
    PROCESS_DESCRIPTORS,
    UNLIMITED_DESCRIPTORS,
    budget,
    holds_line,
)

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
    assert t.admit("a", 0.0) == ConnectionAdmission(admitted=True)
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


BODY = 5.0


def body_table() -> ConnectionTable[str]:
    return ConnectionTable(
        Limits(
            header_timeout_seconds=HEADER,
            keepalive_timeout_seconds=KEEPALIVE,
            max_connections=100,
            body_timeout_seconds=BODY,
        )
    )


def test_a_body_that_trickles_is_cut_at_its_deadline() -> None:
    t = body_table()
    t.admit("slow", 0.0)
    t.request_started("slow")
    t.body_started("slow", 1.0)
    for _ in range(10):  # a byte now and then (slowloris with a whole head)
        t.body_received("slow", 1)
    assert t.body_deadline("slow") == 1.0 + BODY + 10 / BODY_MIN_BYTES_PER_SECOND
    assert t.expire(1.0 + BODY) == []
    assert t.expire(1.0 + BODY + 0.01) == [Expiry(key="slow", phase=Phase.BUSY)]
    assert t.phase("slow") is None


def test_a_body_that_keeps_its_rate_or_ends_is_not_cut() -> None:
    t = body_table()
    for key in ("upload", "done"):
        t.admit(key, 0.0)
        t.request_started(key)
        t.body_started(key, 0.0)
    t.body_received("upload", 60 * BODY_MIN_BYTES_PER_SECOND)  # a minute's more time earned
    t.body_ended("done")  # whole: the handler's own settings bound the rest of the request
    assert t.body_deadline("done") is None
    assert t.expire(BODY + 59) == []
    assert t.phase("upload") is t.phase("done") is Phase.BUSY
    t.request_finished("upload", BODY + 59)  # the request's end ends its body's deadline
    assert t.body_deadline("upload") is None
    # Its keep-alive timeout, nothing else.
    assert t.expire(10_000.0) == [Expiry(key="upload", phase=Phase.IDLE)]


def test_a_body_deadline_spares_an_answer_being_sent_and_needs_a_setting() -> None:
    t = body_table()
    t.admit("a", 0.0)
    t.request_started("a")
    t.body_started("a", 0.0)
    assert t.expire(BODY, flushing=lambda k: k == "a") == []
    assert t.body_deadline("a") == 2 * BODY  # its clock started again
    unset = table()
    unset.admit("a", 0.0)
    unset.request_started("a")
    unset.body_started("a", 0.0)
    assert (unset.body_deadline("a"), unset.expire(10_000.0)) == (None, [])


@given(
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0.001, max_value=1e4),
    st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=20),
)
def test_a_body_earns_time_by_what_it_delivers_and_only_by_that(
    started: float, timeout: float, chunks: list[int]
) -> None:
    """The deadline grows with every byte received, never shrinks, and never passes the base
    plus a second per BODY_MIN_BYTES_PER_SECOND: a trickle cannot buy more than it sends."""
    t = ConnectionTable(
        Limits(
            header_timeout_seconds=HEADER,
            keepalive_timeout_seconds=KEEPALIVE,
            max_connections=4,
            body_timeout_seconds=timeout,
        )
    )
    t.admit("a", started)
    t.request_started("a")
    t.body_started("a", started)
    received, last = 0, t.body_deadline("a")
    assert last == body_deadline(started, timeout, 0) == started + timeout
    for size in chunks:
        t.body_received("a", size)
        received += size
        deadline = t.body_deadline("a")
        assert deadline is not None
        assert last is not None
        assert deadline >= last
        assert deadline == body_deadline(started, timeout, received)
        last = deadline
    assert last is not None
    assert t.expire(last) == [Expiry(key="a", phase=Phase.BUSY)]


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
    assert t.admit("next", 3.0) == ConnectionAdmission(admitted=True, evict="old")
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
    assert admission == ConnectionAdmission(admitted=True, evict="idle")


def test_when_every_connection_is_busy_a_newcomer_is_refused() -> None:
    t = table(cap=2)
    for key in ("a", "b"):
        t.admit(key, 0.0)
        t.request_started(key)
    assert t.admit("c", 1.0) == ConnectionAdmission(admitted=False, refusal=Refusal.CONNECTIONS)
    assert len(t) == 2
    assert t.phase("c") is None
    t.request_finished("a", 2.0)
    assert t.admit("c", 3.0) == ConnectionAdmission(admitted=True, evict="a")


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


# -- admission by what a request holds -------------------------------------------------------


def admission_table(cap: int = 4, at_cap: int = 2, live: int = 2) -> ConnectionTable[str]:
    return ConnectionTable(
        Limits(
            header_timeout_seconds=HEADER,
            keepalive_timeout_seconds=KEEPALIVE,
            max_connections=cap,
            max_live=live,
            at_cap=at_cap,
        )
    )


def busy(t: ConnectionTable[str], key: str, now: float, *, live: bool) -> ConnectionAdmission[str]:
    t.admit(key, now)
    t.request_started(key)
    return t.request_kind(key, live=live)


def test_live_readers_past_their_cap_are_refused_and_short_requests_are_not() -> None:
    t = admission_table(cap=4, live=2)
    assert busy(t, "v1", 0.0, live=True) == ConnectionAdmission(admitted=True)
    assert busy(t, "v2", 0.0, live=True) == ConnectionAdmission(admitted=True)
    assert busy(t, "v3", 0.0, live=True) == ConnectionAdmission(
        admitted=False, refusal=Refusal.VIEWERS
    )
    assert t.live == 2
    assert busy(t, "write", 0.0, live=False) == ConnectionAdmission(admitted=True)
    t.live_ended("v1")  # a viewer leaves: the next one is in
    assert t.request_kind("v3", live=True) == ConnectionAdmission(admitted=True)
    assert t.live == 2


def test_past_the_cap_the_head_decides_and_idle_connections_go_first() -> None:
    t = admission_table(cap=4, at_cap=2, live=2)
    busy(t, "v1", 0.0, live=True)
    busy(t, "v2", 0.0, live=True)
    t.admit("idle", 1.0)
    t.request_started("idle")
    t.request_finished("idle", 2.0)
    t.admit("head", 3.0)  # connected, nothing sent yet
    # At the cap: the newcomer is let in without evicting anyone, to read its head.
    assert t.admit("writer", 4.0) == ConnectionAdmission(admitted=True)
    assert len(t) == 5
    t.request_started("writer")
    # A short request: the longest idle makes room, never a viewer.
    assert t.request_kind("writer", live=False) == ConnectionAdmission(admitted=True, evict="idle")
    assert len(t) == 4
    assert t.phase("v1") is Phase.BUSY
    assert t.phase("v2") is Phase.BUSY


def test_a_viewer_past_its_cap_evicts_nobody() -> None:
    t = admission_table(cap=3, at_cap=2, live=1)
    busy(t, "v1", 0.0, live=True)
    t.admit("idle1", 0.0)
    t.admit("idle2", 0.0)
    assert busy(t, "v2", 1.0, live=True) == ConnectionAdmission(
        admitted=False, refusal=Refusal.VIEWERS
    )
    assert {t.phase(k) for k in ("idle1", "idle2")} == {Phase.HEAD}


def test_when_every_connection_is_busy_short_requests_are_held_past_the_cap() -> None:
    t = admission_table(cap=3, at_cap=2, live=2)
    busy(t, "v1", 0.0, live=True)
    busy(t, "v2", 0.0, live=True)
    busy(t, "slow-upload", 0.0, live=False)
    # Every connection under the cap busy: two more are held to read their heads ...
    assert busy(t, "agent", 1.0, live=False) == ConnectionAdmission(admitted=True)
    assert busy(t, "stop", 1.0, live=False) == ConnectionAdmission(admitted=True)
    # ... and past them nothing can be read: refused at once (the tracker's plain 503).
    assert t.admit("late", 2.0) == ConnectionAdmission(admitted=False, refusal=Refusal.CONNECTIONS)
    assert t.live == 2
    t.request_finished("agent", 3.0)
    assert t.admit("late", 4.0) == ConnectionAdmission(admitted=True, evict="agent")


def test_a_live_request_ends_with_its_connections_busy_period() -> None:
    t = admission_table(cap=4, live=1)
    busy(t, "a", 0.0, live=True)
    t.request_finished("a", 1.0)
    assert t.live == 0
    busy(t, "b", 2.0, live=True)
    assert t.forget("b")
    assert t.live == 0
    # A key the table does not hold (a server without the connection hook) still counts.
    assert t.request_kind("untracked", live=True) == ConnectionAdmission(admitted=True)
    assert t.request_kind("other", live=True).refusal is Refusal.VIEWERS
    t.live_ended("untracked")
    assert t.live == 0


# -- the descriptor budget --------------------------------------------------------------------


def test_the_budget_splits_the_open_file_limit_by_what_each_kind_holds() -> None:
    each = budget(20_000)
    # This machine's limit: 15,859 viewers and 1,585 short requests beside them.
    assert (each.live, each.short_requests) == (15_859, 1_585)
    assert (each.clients, each.at_cap, each.origin) == (16_916, 528, 2_492)
    assert each.descriptors == 20_000 - 0  # every descriptor accounted for, none twice
    assert each.limited_by == "the open-file limit 20000"
    # Two workers of 20,000 each hold a 20,000-viewer fan-out with room to spare per worker.
    assert each.live > 10_000 * 1.5
    small = budget(1024)
    assert (small.live, small.short_requests, small.origin) == (765, 75, 120)
    unlimited = budget(-1)
    assert unlimited.clients == budget(UNLIMITED_DESCRIPTORS).clients
    assert unlimited.limited_by.startswith("no open-file limit")


def test_the_operators_settings_replace_what_they_name() -> None:
    assert budget(20_000, max_connections=300).live == 300 - 18  # a sixteenth kept back
    assert budget(20_000, max_connections=300).limited_by == "--max-connections 300"
    viewers = budget(20_000, max_viewers=100)
    assert (viewers.live, viewers.limited_by) == (100, "--max-viewers")
    assert viewers.short_reserve == viewers.clients - 100
    # More viewers than the connections leave: the reserve wins.
    assert budget(20_000, max_connections=300, max_viewers=1000).live == 282
    assert budget(20_000, upstream_max_connections=10).origin == 10
    assert not budget(1000, max_connections=5000).fits


@given(
    st.integers(min_value=-1, max_value=4 * UNLIMITED_DESCRIPTORS),
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=0, max_value=100_000),
)
def test_every_budget_keeps_the_short_reserve_from_live_readers(
    limit: int, max_connections: int, max_viewers: int
) -> None:
    each = budget(limit, max_connections=max_connections, max_viewers=max_viewers)
    assert 1 <= each.live <= each.clients
    if max_viewers:
        assert each.live <= max_viewers
    assert each.short_reserve == each.clients - each.live
    if each.clients >= 2 * MIN_SHORT_RESERVE:
        assert each.short_reserve >= MIN_SHORT_RESERVE
    if not max_connections and not max_viewers:
        # Each reserved short request can hold its origin connection.
        assert each.origin >= each.short_reserve
    if not max_connections and limit >= 2 * PROCESS_DESCRIPTORS:
        assert each.fits  # derived, it never asks for more than the limit
        assert each.descriptors <= (UNLIMITED_DESCRIPTORS if limit < 0 else limit)


def test_the_start_up_line_says_what_the_edge_holds_and_what_limits_it() -> None:
    assert holds_line(budget(20_000)).startswith(
        "stream listener holds 15859 viewers (SSE and long-poll) and 1585 short requests "
        "(writes, catch-up reads, HEAD); limited by the open-file limit 20000 ("
    )
    two = holds_line(budget(256), workers=2)
    assert two.startswith("stream listener holds 306 viewers (SSE and long-poll) and 30 short")
    assert ", 2 workers of 153 and 15; limited by the open-file limit 256 in each worker" in two


def test_the_refusal_is_a_complete_http_response() -> None:
    head, _, body = REFUSAL.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"Connection"] == b"close"
    assert headers[b"Retry-After"] == b"1"
    assert int(headers[b"Content-Length"]) == len(body)


# A generated check against a model: any sequence of events keeps the table within its cap and
# its heads read at the cap, keeps live readers within theirs, gives exactly the waiting
# connections a deadline, expires exactly what is past it, and makes room only from connections
# that are neither busy nor flushing: a live reader is never cut, whatever arrives.

CAP, AT_CAP, LIVE_CAP = 4, 2, 2


class ConnectionMachine(RuleBasedStateMachine):
    """Rules act on connections the model holds (``_pick``), so every step means something;
    a key the table does not hold is covered by ``test_unknown_and_closed_...``."""

    def __init__(self) -> None:
        super().__init__()
        self.table: ConnectionTable[str] = ConnectionTable(
            Limits(
                header_timeout_seconds=3.0,
                keepalive_timeout_seconds=7.0,
                max_connections=CAP,
                max_live=LIVE_CAP,
                at_cap=AT_CAP,
            )
        )
        self.now = 0.0
        self.model: dict[str, int] = {}  # key -> requests in progress
        self.kept_alive: set[str] = set()  # between requests (IDLE), not sending a head
        self.live: set[str] = set()  # keys whose request in progress is a live reader
        self.flushing: set[str] = set()  # still sending an answer: never cut
        self.made = 0

    def _pick(self, data: st.DataObject, *, busy: bool = False) -> str:
        keys = sorted(k for k, requests in self.model.items() if requests or not busy)
        return data.draw(st.sampled_from(keys))

    def _room(self, *, kept_alive_only: bool = False) -> bool:
        return any(
            not busy and k not in self.flushing and (k in self.kept_alive or not kept_alive_only)
            for k, busy in self.model.items()
        )

    def _made_room(self, evicted: str | None) -> None:
        if evicted is not None:
            assert evicted not in self.live, "cut a live reader"
            assert evicted not in self.flushing, "evicted a flushing connection"
            assert self.model.pop(evicted) == 0, "evicted a busy connection"
            self.kept_alive.discard(evicted)

    @rule()
    def connect(self) -> None:
        key = f"c{self.made}"
        self.made += 1
        full, room = len(self.model) >= CAP + AT_CAP, self._room()
        admission = self.table.admit(key, self.now, flushing=self.flushing.__contains__)
        if not admission.admitted:
            assert full
            assert not room
            assert admission.refusal is Refusal.CONNECTIONS
            return
        assert (admission.evict is not None) == full, "evicted below the cap and its heads"
        self._made_room(admission.evict)
        self.model[key] = 0

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def bytes_arrive(self, data: st.DataObject) -> None:
        key = self._pick(data)
        self.table.bytes_received(key, self.now)
        self.kept_alive.discard(key)  # a head is on its way

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def request_starts(self, data: st.DataObject) -> None:
        key = self._pick(data)
        self.table.request_started(key)
        self.model[key] += 1
        self.kept_alive.discard(key)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data(), live=st.booleans())
    def request_is_classified(self, data: st.DataObject, live: bool) -> None:
        key = self._pick(data, busy=True)
        past_cap, room = len(self.model) > CAP, self._room(kept_alive_only=True)
        already = key in self.live
        admission = self.table.request_kind(key, live=live, flushing=self.flushing.__contains__)
        if live and already:
            assert admission == ConnectionAdmission(admitted=True)  # told twice: nothing changes
            return
        if live and len(self.live) >= LIVE_CAP:
            assert admission == ConnectionAdmission(admitted=False, refusal=Refusal.VIEWERS)
            return
        assert admission.admitted
        if live:
            self.live.add(key)
        assert (admission.evict is not None) == (past_cap and room), "idle kept past the cap"
        assert admission.evict is None or admission.evict in self.kept_alive, "cut a head"
        self._made_room(admission.evict)

    @precondition(lambda self: not all(self.model.values()))
    @rule(data=st.data())
    def answered_at_once(self, data: st.DataObject) -> None:
        """The fast path's hit: a short request started and finished in one step."""
        key = data.draw(st.sampled_from(sorted(k for k, busy in self.model.items() if not busy)))
        self.kept_alive.discard(key)
        past_cap, room = len(self.model) > CAP, self._room(kept_alive_only=True)
        evicted = self.table.answered(key, self.now, flushing=self.flushing.__contains__)
        assert (evicted is not None) == (past_cap and room), "idle kept past the cap"
        assert evicted is None or evicted in self.kept_alive, "cut a head"
        self._made_room(evicted)
        self.kept_alive.add(key)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def request_finishes(self, data: st.DataObject) -> None:
        key = self._pick(data, busy=True)
        self.table.request_finished(key, self.now)
        self.model[key] -= 1
        if not self.model[key]:
            self.live.discard(key)
            self.kept_alive.add(key)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def live_request_ends(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.live)))
        self.table.live_ended(key)
        self.live.discard(key)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def client_closes(self, data: st.DataObject) -> None:
        key = self._pick(data)
        assert self.table.forget(key)
        del self.model[key]
        self.live.discard(key)
        self.flushing.discard(key)
        self.kept_alive.discard(key)
        assert not self.table.forget(key)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def answer_flushes_or_drains(self, data: st.DataObject) -> None:
        self.flushing ^= {self._pick(data)}

    @rule(step=st.one_of(st.floats(0.0, 1.0), st.floats(0.0, 30.0)))
    def time_passes(self, step: float) -> None:
        self.now += step
        for expiry in self.table.expire(self.now, flushing=self.flushing.__contains__):
            assert expiry.key not in self.flushing
            assert self.model.pop(expiry.key) == 0, "expired a busy connection"
            assert (expiry.phase is Phase.IDLE) == (expiry.key in self.kept_alive)
            self.kept_alive.discard(expiry.key)
        for key in self.model:
            deadline = self.table.deadline(key)
            assert deadline is None or deadline > self.now

    @invariant()
    def bounds_and_deadlines_hold(self) -> None:
        assert len(self.table) == len(self.model) <= CAP + AT_CAP
        assert self.table.live == len(self.live) <= LIVE_CAP
        # A live read answered at once is admitted exactly when request_kind would admit one.
        assert self.table.live_room() == (len(self.live) < LIVE_CAP)
        assert all(self.model.get(k) for k in self.live), "a live reader that is not busy"
        for key, requests in self.model.items():
            assert (self.table.deadline(key) is None) == bool(requests)
            phase = Phase.BUSY if requests else Phase.IDLE if key in self.kept_alive else Phase.HEAD
            assert self.table.phase(key) is phase


ConnectionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_generated_event_sequences_keep_the_invariants = ConnectionMachine.TestCase


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


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["bytes", "hit", "busy", "wait"])),
        max_size=40,
    )
)
def test_a_head_answered_as_it_arrives_needs_no_first_byte_step(
    events: list[tuple[str, str]],
) -> None:
    """The connection's remembered heads: ``answered`` alone leaves the table exactly as the
    head's first byte (``bytes_received``) and then ``answered`` do."""
    one, two = table(cap=3), table(cap=3)
    now = 0.0
    for key, what in events:
        now += 1.0
        if what == "bytes":
            one.bytes_received(key, now)
            two.bytes_received(key, now)
        elif what == "hit":
            two.bytes_received(key, now)
            assert one.answered(key, now) == two.answered(key, now)
        elif what == "busy":
            one.request_started(key)
            two.request_started(key)
        elif one.phase(key) is None:
            assert one.admit(key, now) == two.admit(key, now)
        assert [one.phase(k) for k in "abcd"] == [two.phase(k) for k in "abcd"]
        assert [one.deadline(k) for k in "abcd"] == [two.deadline(k) for k in "abcd"]
        assert len(one) == len(two)
    assert one.expire(now + 100) == two.expire(now + 100)
