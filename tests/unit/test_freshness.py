"""How long each tier downstream may keep an answer, and the ``Age`` that keeps lag from
stacking (``edge.log.freshness``): the documented defaults, the bounds as properties, and the
lag invariant against a model of a chain of caches honouring ``max-age`` and ``Age``."""

from __future__ import annotations

import math

from hypothesis import assume, given
from hypothesis import strategies as st

from edge.log.freshness import (
    LONG_POLL_CDN_SECONDS,
    Lifetime,
    Reuse,
    Tiers,
    long_poll_empty_reuse,
    never_stored,
    reuse,
    served_until,
    tail_age_seconds,
)
from edge.log.policy import at_tail_holds
from edge.log.stream_log import LogKey, StreamInstance, StreamLog, TailFact
from edge.protocol.reads import PUBLIC_SCOPE

YEAR, DAY = 31_536_000, 86_400
END = "0000_0042"


def headers_of(verdict: Reuse) -> dict[str, str]:
    return dict(verdict.headers())


def test_the_documented_defaults() -> None:
    """docs/cdn.md "What the edge tells a CDN" lists these values."""
    plain, purged = Tiers(freshness_seconds=1), Tiers(freshness_seconds=1, cdn_purged=True)
    closed = headers_of(reuse(scope=PUBLIC_SCOPE, immutable=True, tiers=plain))
    assert closed == {
        "Cache-Control": "public, max-age=60, stale-if-error=60, immutable",
        "CDN-Cache-Control": "max-age=60, stale-if-error=60",
        "Surrogate-Control": "max-age=60, stale-if-error=60",
    }
    closed_purged = headers_of(reuse(scope=PUBLIC_SCOPE, immutable=True, tiers=purged))
    assert closed_purged["Cache-Control"] == closed["Cache-Control"]
    cdn = f"max-age={YEAR}, stale-while-revalidate={DAY}, stale-if-error={DAY}"
    assert closed_purged["CDN-Cache-Control"] == closed_purged["Surrogate-Control"] == cdn
    at_tail = reuse(scope=PUBLIC_SCOPE, immutable=False, tiers=purged)
    assert headers_of(at_tail) == {
        "Cache-Control": "public, max-age=1",
        "CDN-Cache-Control": "max-age=1",
        "Surrogate-Control": "max-age=1",
    }
    assert at_tail.at_tail
    unknown = reuse(scope=PUBLIC_SCOPE, immutable=True, tiers=purged, lifetime_known=False)
    assert headers_of(unknown)["Cache-Control"] == "public, max-age=1"
    assert not unknown.at_tail  # a range that never changes: no Age
    expiring = reuse(scope=PUBLIC_SCOPE, immutable=True, tiers=purged, remaining_seconds=30.9)
    assert headers_of(expiring) == {
        "Cache-Control": "public, max-age=30",
        "CDN-Cache-Control": "max-age=30",
        "Surrogate-Control": "max-age=30",
    }
    mine = reuse(scope="cred-x", immutable=True, tiers=purged)
    assert headers_of(mine) == {
        "Cache-Control": "private, max-age=60, stale-if-error=60, immutable"
    }
    assert headers_of(never_stored(shared=True)) == {"Cache-Control": "no-store"}
    assert headers_of(long_poll_empty_reuse(shared=True)) == {
        "Cache-Control": "no-store",
        "CDN-Cache-Control": f"max-age={LONG_POLL_CDN_SECONDS}",
        "Surrogate-Control": f"max-age={LONG_POLL_CDN_SECONDS}",
    }
    assert headers_of(long_poll_empty_reuse(shared=False)) == {"Cache-Control": "private, no-store"}
    browser_year = Tiers(freshness_seconds=1, browser_max_age_seconds=YEAR)
    assert headers_of(reuse(scope=PUBLIC_SCOPE, immutable=True, tiers=browser_year))[
        "Cache-Control"
    ] == (f"public, max-age={YEAR}, stale-if-error={DAY}, immutable")


def stale(lifetime: Lifetime) -> int:
    return lifetime.stale_while_revalidate_seconds + lifetime.stale_if_error_seconds


@given(
    shared=st.booleans(),
    immutable=st.booleans(),
    freshness=st.floats(min_value=0, max_value=600, allow_nan=False),
    browser_max_age=st.integers(min_value=0, max_value=YEAR),
    purged=st.booleans(),
    lifetime_known=st.booleans(),
    remaining=st.none() | st.floats(min_value=0, max_value=2 * YEAR, allow_nan=False),
)
def test_no_tier_is_told_to_keep_an_answer_longer_than_it_may(
    shared: bool,
    immutable: bool,
    freshness: float,
    browser_max_age: int,
    purged: bool,
    lifetime_known: bool,
    remaining: float | None,
) -> None:
    tiers = Tiers(
        freshness_seconds=freshness, browser_max_age_seconds=browser_max_age, cdn_purged=purged
    )
    verdict = reuse(
        scope=PUBLIC_SCOPE if shared else "cred-x", immutable=immutable, tiers=tiers,
        lifetime_known=lifetime_known, remaining_seconds=remaining,
    )  # fmt: skip
    tiers_told = [verdict.browser] + ([verdict.cdn] if verdict.cdn is not None else [])
    headers = headers_of(verdict)
    # A credential's answer is its reader's: private, and nothing a CDN would take over it.
    assert headers["Cache-Control"].startswith("public, " if shared else "private, ")
    assert ("CDN-Cache-Control" in headers) == ("Surrogate-Control" in headers) == shared
    never_changes = immutable and lifetime_known and remaining is None
    assert verdict.immutable == never_changes
    for lifetime in tiers_told:
        if remaining is not None:  # never past the stream's known end, and nothing stale then
            assert lifetime.max_age_seconds <= math.floor(remaining)
        if not never_changes:
            assert stale(lifetime) == 0
            if not (immutable and lifetime_known):  # at the tail, or a lifetime still unknown
                assert lifetime.max_age_seconds <= math.floor(freshness)
    assert verdict.browser.max_age_seconds <= max(browser_max_age, math.floor(freshness))
    assert verdict.browser.stale_while_revalidate_seconds == 0  # nobody can purge a browser
    if verdict.cdn is not None and not purged:  # nobody can purge the CDN either
        assert verdict.cdn.max_age_seconds <= verdict.browser.max_age_seconds
        assert stale(verdict.cdn) <= stale(verdict.browser)
    assert verdict.at_tail == (not immutable)


@given(
    freshness=st.floats(min_value=0, max_value=120, allow_nan=False),
    observed_at=st.floats(min_value=0, max_value=1e9, allow_nan=False),
    elapsed=st.floats(min_value=0, max_value=300, allow_nan=False),
    authoritative=st.booleans(),
    remaining=st.none() | st.floats(min_value=0, max_value=600, allow_nan=False),
    purged=st.booleans(),
    holds=st.lists(st.floats(min_value=0, max_value=300, allow_nan=False), max_size=4),
)
def test_lag_does_not_stack_in_caches_downstream(
    freshness: float,
    observed_at: float,
    elapsed: float,
    authoritative: bool,
    remaining: float | None,
    purged: bool,
    holds: list[float],
) -> None:
    """An at-tail answer given whenever the edge gives one (``at_tail_holds``, the rule of
    both paths), with the verdict and ``Age`` both paths give it: a chain of caches honouring
    ``max-age`` and ``Age`` (each keeping it while fresh, then passing it on with its resident
    time added to ``Age``) never serves it later than the tail's observation plus the
    freshness window plus a second (a live tail is observed whenever the edge answers)."""
    instance = StreamInstance(stream="/s", lifetime_known=True)
    tail = TailFact(offset=END, closed=False, authoritative=authoritative, observed_at=observed_at)
    log = StreamLog(key=LogKey(stream="/s", scope=PUBLIC_SCOPE), instance=instance, tail=tail)
    sent_at = observed_at + elapsed
    assume(at_tail_holds(log, END, False, now=sent_at, freshness_seconds=freshness))
    tiers = Tiers(freshness_seconds=freshness, cdn_purged=purged)
    verdict = reuse(scope=PUBLIC_SCOPE, immutable=False, tiers=tiers, remaining_seconds=remaining)
    age = tail_age_seconds(tail, sent_at)
    observed = sent_at if authoritative else observed_at
    assert verdict.cdn is not None
    for lifetime in (verdict.browser, verdict.cdn):
        max_age = lifetime.max_age_seconds
        last = served_until(sent_at=sent_at, max_age_seconds=max_age, age_seconds=age)
        assert last <= observed + freshness + 1
        # The model: each cache serves it while its current age is below max-age.
        moment, carried = sent_at, float(age)
        for hold in holds:
            if carried + hold >= max_age:
                break
            moment, carried = moment + hold, carried + hold
            assert moment - observed <= freshness + 1, (moment, observed)
        assert moment <= max(last, sent_at)


@given(observed_at=st.floats(allow_nan=False), now=st.floats(allow_nan=False))
def test_age_is_whole_seconds_and_never_negative(observed_at: float, now: float) -> None:
    tail = TailFact(offset=END, closed=False, authoritative=False, observed_at=observed_at)
    age = tail_age_seconds(tail, now)
    assert age >= 0
    if math.isfinite(now - observed_at) and now >= observed_at:
        assert age <= now - observed_at < age + 1 or age == YEAR
    live = TailFact(offset=END, closed=False, authoritative=True, observed_at=observed_at)
    assert tail_age_seconds(live, now) == 0


def test_a_credentials_long_poll_204_is_private_as_well_as_no_store() -> None:
    """Found by an outside attack: nginx's long-poll location refuses only "private", and a
    credential's 204 said plain "no-store", so nginx shared it with anonymous readers."""
    assert long_poll_empty_reuse(shared=False).cache_control == "private, no-store"
    assert long_poll_empty_reuse(shared=True).cache_control == "no-store"
