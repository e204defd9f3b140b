"""What a stored answer is keyed by: the one classification both the fast path and the full
path make of a request head, so one can only find what the other stored for the same request.

Rules this module owns:

* ``answer_key`` is the only function that turns request values into an ``AnswerKey``; the
  full path calls it when it stores an answer, the pre-serialised hit path when it looks one
  up, with values each read from the same head (``edge.protocol.http1`` for the fast path,
  aiohttp's request for the full one) by the same functions (``auth_scope``,
  ``accepts_gzip``, ``normalise_path``).
* The key holds everything an answer to a plain catch-up ``GET`` depends on: the stream (the
  origin's normalised path) and the query exactly as sent, the credential scope, the
  representation (gzip or identity), and the request's ``Origin`` when the origin's CORS
  varies by it (``cors_varies``). Two requests with the same key get the same answer.
* A target that is not the stream's normalised path as sent (an alias: ``./``, ``%2e``, a
  backslash) or that is not ASCII has no key: it is answered by the full path every time. So has
  one of the origin's control API (``names_control``): the full path classifies it ``control``
  and only relays it, so no answer to it is ever stored or found.
* The representation is chosen by ``accepts_gzip`` alone (RFC 9110 §12.5.3), on both paths, so
  both choose the same one for the same head: gzip is acceptable when ``Accept-Encoding`` names
  it, or ``*`` when it does not, with a non-zero ``q``; an unreadable ``q`` is 0; no header
  accepts nothing but identity.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import NamedTuple

from edge.protocol.paths import MEMO_ENTRIES, BadTarget, names_control, normalise_path
from edge.protocol.reads import (
    DEFAULT_SCOPE_COOKIES,
    DEFAULT_SCOPE_HEADERS,
    PUBLIC_SCOPE,
    auth_scope,
)


class AnswerKey(NamedTuple):
    """A named tuple, not a dataclass: it is hashed and compared on every fast-path hit (a
    tuple does both in C; a dataclass's generated methods cost more than the hit itself)."""

    stream: str
    query: str
    scope: str
    gzip: bool
    # Whether the origin's CORS varies by Origin, and the request's Origin only where it does:
    # an answer stored before the policy was seen to vary is never found after.
    cors_varies: bool = False
    origin: str | None = None
    head: bool = False  # the answer to a HEAD: the stream's metadata, no body


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Does ``Accept-Encoding`` allow gzip (explicitly, or by ``*``) with a non-zero q?"""
    if not accept_encoding:
        return False
    allowed: dict[str, float] = {}
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        allowed[name.strip().lower()] = q
    if "gzip" in allowed:
        return allowed["gzip"] > 0
    return allowed.get("*", 0.0) > 0


# A pure function of a few header values, asked on every fast-path hit (which passes them by
# position: the cache's key is then one flat tuple): the same values give the same key object.
@functools.lru_cache(maxsize=MEMO_ENTRIES)
def answer_key(
    path: str,
    query: str,
    scope: str,
    accept_encoding: str | None,
    origin: str | None,
    cors_varies: bool,
    head: bool = False,
) -> AnswerKey | None:
    """The key of the answer to a plain catch-up ``GET`` (or, ``head``, a ``HEAD``) of
    ``path?query`` (as sent)."""
    if not (path.isascii() and query.isascii()):
        return None
    try:
        if normalise_path(path) != path or names_control(path):
            return None
    except BadTarget:
        return None
    return AnswerKey(
        stream=path,
        query=query,
        scope=scope,
        gzip=accepts_gzip(accept_encoding),
        cors_varies=cors_varies,
        origin=origin if cors_varies else None,
        head=head,
    )


def scope_of(
    credentials: Sequence[tuple[str, str]],
    *,
    scope_headers: Collection[str] = DEFAULT_SCOPE_HEADERS,
    scope_cookies: Collection[str] = DEFAULT_SCOPE_COOKIES,
) -> str:
    """The scope of a head whose credential headers (those named in ``scope_headers``, as
    sent) are ``credentials``: exactly what ``classify`` gives the full path."""
    if not credentials:
        return PUBLIC_SCOPE
    return auth_scope(credentials, scope_headers=scope_headers, scope_cookies=scope_cookies)
