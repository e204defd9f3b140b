"""How long each tier downstream of the edge may keep an answer, and the ``Age`` it is given.

Two kinds of cache stand between the edge and a reader (DESIGN.md "The tiers around the edge"):
a CDN, which the edge can purge when it forgets a stream (``--cdn-purge``), and browsers (and any
cache that knows nothing else), which nobody can purge. ``Cache-Control`` is theirs;
``CDN-Cache-Control`` (RFC 9213) and ``Surrogate-Control`` (Varnish through the shipped VCL,
Fastly) carry the CDN's own lifetime.

Rules this module owns:

* **Browsers get a bounded lifetime.** An answer that can never change (capped, or ending a
  closed stream whose lifetime is known to have no end) is ``immutable`` with ``max-age`` of
  ``--browser-max-age`` (60 s), and ``stale-if-error`` as long: nobody can purge a browser, so a
  deleted stream's bytes stay visible there that long and no longer (never extended by
  ``stale-while-revalidate``, which would serve them while nothing is wrong).
* **A CDN keeps closed ranges long only when it is purged.** With ``--cdn-purge`` its lifetime
  for such an answer is a year, with a day of ``stale-while-revalidate`` and ``stale-if-error``
  (the bytes of a range never change while the instance lives, and when it ends the CDN is
  purged); without, the CDN's lifetime is the browser's, never longer.
* **Stale only where it is correct.** An answer of a stream with a known end of life gets
  ``max-age`` no later than that end in every tier and nothing stale; an at-tail answer of an
  open stream is fresh for the freshness window and nothing more: no ``stale-*`` at all.
* **Lag does not stack** (``served_until``). An at-tail answer carries ``max-age`` of the
  freshness window (whole seconds, rounded down) and ``Age``: the whole seconds since the edge
  observed its tail (rounded down; 0 while a live upstream follows the tail, which is observed
  then). A downstream cache honouring ``max-age`` and ``Age`` (RFC 9111 §4.2.3, every cache in
  a chain adding its resident time) keeps it fresh until the moment it was sent plus
  ``max-age - Age``, which is never later than the tail's observation plus the freshness window
  plus one second (the rounding of ``Age``): however many caches are chained, a reader never gets
  a tail older than that. Answers that can never change carry no ``Age``: their lifetime is
  the edge's word at each serve, not a countdown.
* Answers private to a credential scope carry ``private`` and no CDN lifetime at all: a CDN that
  honours ``CDN-Cache-Control`` ignores ``Cache-Control`` and would share them.
* A long-poll 204 ("nothing new") is ``no-store`` for browsers and kept by a CDN for
  ``LONG_POLL_CDN_SECONDS`` under its cursor URL: the herd parked on that URL is released at
  once, and the cursor it gives moves the next round to another URL (PROTOCOL-NOTES trap 13).
* HEAD answers are ``no-store`` in every tier.

Pure: values in, header values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge.config import IMMUTABLE_MAX_AGE_SECONDS
from edge.log.stream_log import TailFact
from edge.protocol.reads import PUBLIC_SCOPE

DEFAULT_BROWSER_MAX_AGE_SECONDS = 60
# How long a purged CDN may serve a range that never changes while it revalidates it, or while
# the edge fails: a day covers an outage and a deploy; a purge still ends it at once.
PURGED_STALE_SECONDS = 86_400
# A long-poll 204 in a CDN: long enough to release a parked herd at once, short enough that a
# client polling the same URL again (it should not: the 204's cursor moves it) waits no longer.
LONG_POLL_CDN_SECONDS = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Lifetime:
    """How long one tier may keep an answer: fresh for ``max_age_seconds``, then served stale
    while it revalidates, or while the edge fails (RFC 5861)."""

    max_age_seconds: int
    stale_while_revalidate_seconds: int = 0
    stale_if_error_seconds: int = 0

    @property
    def directives(self) -> str:
        parts = [f"max-age={self.max_age_seconds}"]
        if self.stale_while_revalidate_seconds:
            parts.append(f"stale-while-revalidate={self.stale_while_revalidate_seconds}")
        if self.stale_if_error_seconds:
            parts.append(f"stale-if-error={self.stale_if_error_seconds}")
        return ", ".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class Tiers:
    """What the settings say of the tiers downstream (``--tail-freshness``,
    ``--browser-max-age``, whether ``--cdn-purge`` names any target)."""

    freshness_seconds: float
    browser_max_age_seconds: int = DEFAULT_BROWSER_MAX_AGE_SECONDS
    cdn_purged: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Reuse:
    """The policy's verdict on reusing an answer, made once when the answer is built: every
    later decision (the caching headers sent, whether the pre-serialised hit path may keep it)
    reads this value, never the header it produced."""

    shared: bool  # any client of the shared scope may be given it; else its scope's only
    immutable: bool  # the same bytes for as long as its stream instance lives
    browser: Lifetime  # Cache-Control: browsers, and any cache that knows nothing else
    # CDN-Cache-Control and Surrogate-Control, sent on shared answers only; None: none sent.
    cdn: Lifetime | None = None
    # Its freshness is its tail's: it carries ``Age`` (``tail_age_seconds``) wherever it is served.
    at_tail: bool = False
    no_store: bool = False  # no browser may keep it at all (the CDN only by its own lifetime)

    @property
    def max_age_seconds(self) -> int:
        return self.browser.max_age_seconds

    @property
    def cache_control(self) -> str:
        if self.no_store:
            # A credential's answer says private too: a cache that reads only "private" (nginx's
            # long-poll location) must not share it.
            return "no-store" if self.shared else "private, no-store"
        visibility = "public" if self.shared else "private"
        control = f"{visibility}, {self.browser.directives}"
        return control + ", immutable" if self.immutable else control

    def headers(self) -> list[tuple[str, str]]:
        """``Cache-Control``, then the CDN's lifetime where it has one of its own."""
        headers = [("Cache-Control", self.cache_control)]
        if self.cdn is not None and self.shared:
            directives = self.cdn.directives
            headers += [("CDN-Cache-Control", directives), ("Surrogate-Control", directives)]
        return headers


def reuse(
    *,
    scope: str,
    immutable: bool,
    tiers: Tiers,
    lifetime_known: bool = True,
    remaining_seconds: float | None = None,
) -> Reuse:
    """The verdict on an answer of a stream in ``scope`` that can never change (``immutable``)
    or ends at the tail of an open stream. ``remaining_seconds``: how long the stream is known
    to live (None: no known end); ``lifetime_known``: whether the edge knows that yet."""
    shared = scope == PUBLIC_SCOPE
    fresh = max(0, math.floor(tiers.freshness_seconds))
    if immutable and lifetime_known:
        browser_max = tiers.browser_max_age_seconds
        cdn_max = IMMUTABLE_MAX_AGE_SECONDS if tiers.cdn_purged else browser_max
        if remaining_seconds is None:
            browser = Lifetime(
                max_age_seconds=browser_max,
                stale_if_error_seconds=min(browser_max, PURGED_STALE_SECONDS),
            )
            cdn = (
                Lifetime(
                    max_age_seconds=cdn_max,
                    stale_while_revalidate_seconds=PURGED_STALE_SECONDS,
                    stale_if_error_seconds=PURGED_STALE_SECONDS,
                )
                if tiers.cdn_purged
                else browser
            )
            return Reuse(shared=shared, immutable=True, browser=browser, cdn=cdn)
        remaining = max(0, math.floor(remaining_seconds))
        return Reuse(
            shared=shared, immutable=False,
            browser=Lifetime(max_age_seconds=min(browser_max, remaining)),
            cdn=Lifetime(max_age_seconds=min(cdn_max, remaining)),
        )  # fmt: skip
    if remaining_seconds is not None:
        fresh = min(fresh, max(0, math.floor(remaining_seconds)))
    window = Lifetime(max_age_seconds=fresh)
    # Not immutable: at the tail of an open stream, or a range whose lifetime is still unknown.
    return Reuse(shared=shared, immutable=False, browser=window, cdn=window, at_tail=not immutable)


def never_stored(*, shared: bool) -> Reuse:
    """A HEAD's verdict: it reports the tail now, which no tier may keep."""
    return Reuse(shared=shared, immutable=False, browser=Lifetime(max_age_seconds=0), no_store=True)


def long_poll_empty_reuse(*, shared: bool) -> Reuse:
    """A long-poll 204's verdict: never a browser's, a CDN's for ``LONG_POLL_CDN_SECONDS``."""
    return Reuse(
        shared=shared, immutable=False, browser=Lifetime(max_age_seconds=0),
        cdn=Lifetime(max_age_seconds=LONG_POLL_CDN_SECONDS), no_store=True,
    )  # fmt: skip


def tail_age_seconds(tail: TailFact, now: float) -> int:
    """The ``Age`` of an at-tail answer given at ``now``: whole seconds since the edge observed
    its tail, rounded down; 0 while a live upstream follows it (observed now) or once closed
    (a closed tail never moves)."""
    if tail.authoritative or tail.closed:
        return 0
    elapsed = now - tail.observed_at
    if not elapsed > 0:
        return 0
    return min(math.floor(elapsed), IMMUTABLE_MAX_AGE_SECONDS) if math.isfinite(elapsed) else 0


def served_until(*, sent_at: float, max_age_seconds: int, age_seconds: int) -> float:
    """The last moment a downstream cache honouring ``max-age`` and ``Age`` may give an answer
    sent at ``sent_at`` as fresh (RFC 9111 §4.2: fresh while its current age, ``Age`` plus the
    time it has been held, is below ``max-age``). Chaining caches changes nothing: each adds
    its resident time to ``Age``. For an at-tail answer this is never later than its tail's
    observation plus the freshness window plus one second (see the module rules)."""
    return sent_at + max_age_seconds - age_seconds
