"""Knowledge that cannot be confirmed is trusted for a bounded time (``edge.log.trust``), driven
through the real ``Generations`` and ``Forgetter`` with a shared tier that cannot say and a clock
of the test's own."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from edge.config import Address, Settings
from edge.instances.forgetting import Forgetter
from edge.instances.generations import GENERATION_CHECK_SECONDS, Generations
from edge.log.segment import Segment
from edge.log.stream_log import LogKey
from edge.log.trust import (
    UNCONFIRMED_TRUST_SECONDS,
    Ending,
    Unconfirmed,
    origin_went_away,
    when_unconfirmed,
)
from edge.origin import OriginBroken, OriginError, OriginTimeout, OriginUnreachable
from edge.protocol.reads import PUBLIC_SCOPE
from edge.store.local import LocalTier

SETTINGS = Settings(
    origin="http://o",
    listen=Address(host="127.0.0.1", port=0),
    admin_listen=Address(host="127.0.0.1", port=0),
)
KEY = LogKey(stream="/s", scope=PUBLIC_SCOPE)
times = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(confirmed_at=times, now=times, holds=st.booleans())
def test_what_is_held_is_served_only_within_the_bound_of_its_last_confirmation(
    confirmed_at: float, now: float, holds: bool
) -> None:
    verdict = when_unconfirmed(confirmed_at=confirmed_at, now=now, holds=holds)
    if not holds:
        assert verdict is Unconfirmed.BEGIN
    elif now - confirmed_at < UNCONFIRMED_TRUST_SECONDS:
        assert verdict is Unconfirmed.SERVE
    else:
        assert verdict is Unconfirmed.FORGET


def test_the_bound_outlasts_a_missed_generation_check_or_two() -> None:
    assert 2 * GENERATION_CHECK_SECONDS < UNCONFIRMED_TRUST_SECONDS <= 5 * GENERATION_CHECK_SECONDS


def test_only_a_refused_or_broken_upstream_says_the_origin_went_away() -> None:
    assert {e for e in Ending if origin_went_away(e)} == {Ending.REFUSED, Ending.BROKEN}
    assert OriginUnreachable("x").ending is Ending.REFUSED
    assert OriginBroken("x").ending is Ending.BROKEN
    assert OriginError("x").ending is Ending.BROKEN
    assert OriginTimeout("x").ending is Ending.TIMED_OUT


class SilentTier:
    """A shared tier that cannot say (Redis stopped, its breaker open)."""

    def __init__(self) -> None:
        self.pending_purges: dict[str, str] = {}
        self.asked = 0

    async def generation(self, stream: str) -> str | None:
        self.asked += 1
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _offset(n: int) -> str:
    return f"{n:016d}_{n:016d}"


# Each step: how long passes before a read, and whether that read learns a segment from the
# origin (after checking the generation, as a read does).
steps = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=2.5), st.booleans()), min_size=1, max_size=30
)


@given(steps=steps, confirmed=st.booleans())
def test_while_the_tier_cannot_say_nothing_held_outlives_the_bound(
    steps: list[tuple[float, bool]], confirmed: bool
) -> None:
    """Reads check the generation against a tier that never answers. After each check, every
    segment still held was learned less than UNCONFIRMED_TRUST_SECONDS ago; and what is held is
    kept whole while its last confirmation (the tier's, or the instance beginning empty) is
    more recent than that."""

    async def run() -> None:
        clock = Clock()
        tier = SilentTier()
        local = LocalTier(1 << 20)
        forgetter = Forgetter(local, shared=tier, clock=clock)  # type: ignore[arg-type]
        generations = Generations(
            local, forgetter, itertools.count().__next__, shared=tier, clock=clock,  # type: ignore[arg-type]
        )  # fmt: skip
        instance = local.instance_for(KEY.stream)
        confirmed_at = float("-inf")
        if confirmed:  # the tier named the generation once, before it went away
            instance.generation, instance.verified_at = "g1", clock.now
            confirmed_at = clock.now
        learned: dict[str, float] = {}  # start of each segment held -> when it was learned
        for elapsed, learn in steps:
            clock.now += elapsed
            before = local.instance_for(KEY.stream)
            asked = tier.asked
            await generations.check_generation(KEY.stream)
            after = local.instance_for(KEY.stream)
            if after is not before:
                assert learned
                assert clock.now - confirmed_at >= UNCONFIRMED_TRUST_SECONDS
                learned, confirmed_at = {}, clock.now  # begun again: the read asks the origin
            elif tier.asked > asked and not learned:
                confirmed_at = clock.now  # began holding it now
            for start, at in learned.items():
                assert local.get(KEY, start) is not None  # kept whole
                assert clock.now - at < UNCONFIRMED_TRUST_SECONDS
            if learn:
                start = _offset(len(learned)) if learned else "-1"
                segment = Segment(start=start, end=_offset(len(learned) + 1), body=b"x")
                assert local.put(KEY, segment, after)
                learned[start] = clock.now

    asyncio.run(run())


def test_an_origin_seen_going_away_forgets_what_is_held_but_keeps_how_it_is_read() -> None:
    """What every stream holds is forgotten and told (a purge), its live followers are told to
    stay (not ended), how it is read (type, the origin's headers) carries over; told again,
    only what was learned since is forgotten again."""
    local = LocalTier(1 << 20)
    forgetter = Forgetter(local, clock=Clock())
    ended: list[str] = []
    stayed: list[str] = []
    told: list[tuple[str, str]] = []
    forgetter.on_forgotten_here.append(ended.append)
    forgetter.on_unconfirmed.append(stayed.append)
    forgetter.tellers.append(lambda forgetting: told.append((forgetting.stream, forgetting.reason)))
    held = local.instance_for(KEY.stream)
    log = local.log_for(KEY)
    log.content_type = "application/json"
    log.header_template = (("Access-Control-Allow-Origin", "*"),)
    assert local.put(KEY, Segment(start="-1", end=_offset(1), body=b"[1]"), held)
    known_only = local.instance_for("/other")  # an instance, nothing learned

    assert forgetter.origin_lost() == 1
    assert (ended, stayed, told) == ([], [KEY.stream], [(KEY.stream, "gone")])
    assert not local.current(held)
    assert local.get(KEY, "-1") is None
    begun = local.log(KEY)
    assert begun is not None
    assert begun.tail is None
    assert begun.content_type == "application/json"
    assert begun.header_template == (("Access-Control-Allow-Origin", "*"),)
    assert local.current(known_only)

    # A follower stands at its offset: not something learned, nothing to forget again.
    begun.followed_from(_offset(1))
    assert forgetter.origin_lost() == 0
    # What the follower records afterwards was learned since: forgotten at the next loss.
    assert local.put(KEY, Segment(start=_offset(1), end=_offset(2), body=b"[2]"))
    assert forgetter.origin_lost() == 1
    assert local.get(KEY, _offset(1)) is None
    assert ended == []
