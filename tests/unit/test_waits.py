"""Every wait has an end, in the real code without sockets: the fill's deadline and its waiters'
bound (``CatchupCache`` over the in-process fake origin, ``SingleFlight.join``), and the rule
that keeps a tail on SSE through a passing failure (``edge.live.upstream_mode``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.answer import Answer, Bypass, Why
from edge.coalesce import Joined, Led, Overdue, SingleFlight
from edge.config import Address, Settings
from edge.fill_budget import FILL_MIN_BYTES_PER_SECOND, fill_deadline_seconds
from edge.live.upstream_mode import (
    REFUSING,
    SSE_ATTEMPTS,
    SSE_REST_SECONDS,
    SseOn,
    SseRefused,
    SseResting,
    SseState,
    after_sse_batch,
    after_sse_failure,
    sse_current,
)
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.origin import OriginTimeout
from edge.protocol.reads import PUBLIC_SCOPE, Read
from edge.web.wiring import CatchupParts, build_catchup
from tests.model.fake_origin import FakeOrigin, FakeResponse
from tests.model.origin_model import OriginModel

PATH = "/v1/stream/waits"
BODY = b'[{"i":0},{"i":1},{"i":2},{"i":3},{"i":4},{"i":5},{"i":6},{"i":7},{"i":8}]'
TRICKLE_SECONDS = 0.05  # per one-byte chunk: the whole BODY takes seconds


class Trickle:
    """A body that arrives one chunk at a time, never idle long (``--upstream-read-timeout``
    never fires), and far slower than any deadline here."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def iter_any(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner.iter_any():
            await asyncio.sleep(TRICKLE_SECONDS)
            yield chunk

    def at_eof(self) -> bool:
        return bool(self._inner.at_eof())


class TricklingOrigin(FakeOrigin):
    """The fake origin; while ``trickling``, every body trickles. Keeps what it answered."""

    def __init__(self, model: OriginModel) -> None:
        super().__init__(model, chunk_bytes=1)
        self.trickling = True
        self.responses: list[FakeResponse] = []
        self.answered = asyncio.Event()

    async def open(self, *args: Any, **kwargs: Any) -> FakeResponse:
        response = await super().open(*args, **kwargs)
        if self.trickling:
            response.content = Trickle(response.content)  # type: ignore[assignment]
        self.responses.append(response)
        self.answered.set()
        return response


def stream_origin() -> TricklingOrigin:
    model = OriginModel()
    created = model.handle("PUT", PATH, "", [("Content-Type", "application/json")], BODY)
    assert created.status == 201
    return TricklingOrigin(model)


def cache_on(origin: TricklingOrigin) -> CatchupParts:
    settings = Settings(
        origin="http://origin.invalid",
        listen=Address.parse("127.0.0.1:0"),
        admin_listen=Address.parse("127.0.0.1:0"),
        fill_deadline_seconds=0.5,
        fill_wait_seconds=0.1,
    )
    return build_catchup(settings, origin, Metrics())  # type: ignore[arg-type]


READ = Read(
    stream=PATH, offset="-1", live=None, cursor=None, last_event_id=None, scope=PUBLIC_SCOPE
)


async def read(cache: CatchupParts) -> bytes:
    answer = await cache.catchup.read(
        READ, credentials=(), if_none_match=None, accept_encoding=None
    )
    assert isinstance(answer, Answer)
    if answer.hold is not None:
        answer.hold.release()  # written, as the web layer would
    assert answer.status == 200
    return answer.body


async def test_a_trickling_fill_is_abandoned_at_its_deadline_and_leaves_nothing() -> None:
    origin = stream_origin()
    cache = cache_on(origin)
    with pytest.raises(OriginTimeout):
        await read(cache)
    # Its connection is closed, its share of the fill budget given back, nothing stored.
    assert [response.closed for response in origin.responses] == [True]
    assert cache.fill_budget.used == 0
    held = cache.local.log(LogKey(stream=PATH, scope=PUBLIC_SCOPE))
    assert held is None or not held.segments
    origin.trickling = False
    assert await read(cache) == BODY
    assert await read(cache) == BODY
    # The second whole answer was stored, and served again (the edge asks only its lifetime).
    assert [served.method for served in origin.served if served.method == "GET"] == ["GET"] * 2


async def test_a_reader_behind_another_readers_trickling_fill_is_sent_on_its_own() -> None:
    origin = stream_origin()
    cache = cache_on(origin)
    first = asyncio.ensure_future(read(cache))
    await origin.answered.wait()  # the first reader's fill is trickling
    # The web layer relays its own request.
    overdue = await cache.catchup.read(
        READ, credentials=(), if_none_match=None, accept_encoding=None
    )
    assert isinstance(overdue, Bypass)
    assert overdue.why is Why.FILL_OVERDUE
    assert not first.done()  # the fill it left goes on, for its own reader, to its deadline
    with pytest.raises(OriginTimeout):
        await first
    assert cache.fill_budget.used == 0


async def test_single_flight_join_bounds_only_the_callers_that_joined() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 7

    leader = asyncio.ensure_future(flights.join("k", work, wait_seconds=0.01))
    await asyncio.sleep(0)
    assert await flights.join("k", work, wait_seconds=0.05) == Overdue(waited_seconds=0.05)
    assert flights.in_flight("k")
    assert not leader.done()
    joined = asyncio.ensure_future(flights.join("k", work, wait_seconds=5.0))
    await asyncio.sleep(0)
    release.set()
    assert await leader == Led(7)
    assert await joined == Joined(7)
    assert not flights.in_flight("k")


# --- the tail's SSE mode ---------------------------------------------------------------------

ANSWERED_FAILURES = st.sampled_from([401, 403, 408, 429, 500, 502, 503, 504])


@given(failures=st.lists(st.one_of(st.none(), ANSWERED_FAILURES), max_size=SSE_ATTEMPTS - 1))
def test_failures_short_of_the_limit_keep_a_tail_on_sse(failures: list[int | None]) -> None:
    state: SseState = SseOn()
    for status in failures:
        state = after_sse_failure(state, status, now=0.0)
    assert isinstance(state, SseOn)


@given(
    runs=st.lists(
        st.lists(st.one_of(st.none(), ANSWERED_FAILURES), max_size=SSE_ATTEMPTS - 1), max_size=8
    )
)
def test_a_batch_between_failures_clears_them(runs: list[list[int | None]]) -> None:
    state: SseState = SseOn()
    for run in runs:
        for status in run:
            state = after_sse_failure(state, status, now=0.0)
        state = after_sse_batch(state)
    assert state == SseOn()


@given(status=st.sampled_from(sorted(REFUSING)), before=st.integers(0, SSE_ATTEMPTS - 1))
def test_a_refusal_of_sse_moves_the_tail_to_long_poll_for_its_life(
    status: int, before: int
) -> None:
    state = after_sse_failure(SseOn(failures=before), status, now=0.0)
    assert state == SseRefused(status=status)
    assert sse_current(state, now=1e9) == state
    assert after_sse_batch(state) == state


def test_sse_failing_again_and_again_rests_then_is_tried_once_more() -> None:
    state: SseState = SseOn()
    for _ in range(SSE_ATTEMPTS):
        state = after_sse_failure(state, 502, now=100.0)
    assert state == SseResting(until=100.0 + SSE_REST_SECONDS)
    assert sse_current(state, now=100.0 + SSE_REST_SECONDS - 1) == state
    state = sse_current(state, now=100.0 + SSE_REST_SECONDS)
    assert isinstance(state, SseOn)
    # One more failure after the rest sends it back; a batch would have cleared it.
    assert isinstance(after_sse_failure(state, 500, now=200.0), SseResting)
    assert after_sse_batch(state) == SseOn()


@given(
    base=st.floats(0.5, 120),
    rate=st.floats(FILL_MIN_BYTES_PER_SECOND, 1e9),
    elapsed=st.floats(0, 3600),
)
def test_a_fill_that_keeps_moving_earns_its_time(base: float, rate: float, elapsed: float) -> None:
    """A body arriving at least at the minimum rate is never cut, however long it is."""
    received = int(rate * elapsed)
    assert fill_deadline_seconds(base, received) > elapsed - 1.0


@given(base=st.floats(0.5, 120), rate=st.floats(0, 64))
def test_a_trickle_is_cut_near_the_base_deadline(base: float, rate: float) -> None:
    """The 1 byte every 0.2 s of issue 27 (5 B/s), or anything like it, earns next to nothing:
    the first moment its deadline is passed comes within a second of the base."""
    elapsed = base
    while fill_deadline_seconds(base, int(rate * elapsed)) > elapsed:
        elapsed += 0.25
    assert elapsed <= base + 1.0
