"""Where a bearer token is found, and the request as it goes on without it (pure).

Rules this module owns:

* A token comes from ``Authorization: Bearer <token>`` or from a ``token`` query parameter (a
  browser ``EventSource`` cannot set headers). Sent more than once (two headers, two
  parameters, or both) is a malformed request, never "pick one" (RFC 6750 §2).
* Every ``token`` parameter is removed from the query before the request goes anywhere (cache
  keys, the origin, the auth service, logs); the rest of the query stays byte for byte as sent.
* A forward-auth verdict is keyed by a digest of the credentials, never the credentials.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote_plus

from edge.protocol.headers import AUTHORIZATION

TOKEN_PARAM = "token"
# Longer than any sane JWT (a few hundred bytes to a few KiB); past it, refused unread.
MAX_TOKEN_CHARS = 16 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class Presented:
    """What a request presents: its query without ``token`` parameters, and its bearer token."""

    query: str
    token: str | None
    from_query: bool
    twice: bool  # a token sent more than once
    other_scheme: bool  # an Authorization header that is not Bearer


def strip_token(query: str) -> tuple[str, list[str]]:
    """``query`` without its ``token`` parameters (however their name is encoded), and their
    values, decoded as the origin's URL parser would."""
    kept: list[str] = []
    tokens: list[str] = []
    for piece in query.split("&") if query else ():
        name, _, value = piece.partition("=")
        if unquote_plus(name) == TOKEN_PARAM:
            tokens.append(unquote_plus(value))
        else:
            kept.append(piece)
    return "&".join(kept), tokens


def present(query: str, headers: Iterable[tuple[str, str]]) -> Presented:
    rest, from_query = strip_token(query)
    authorizations = [value for name, value in headers if name.lower() == AUTHORIZATION]
    bearer: list[str] = []
    other_scheme = False
    for value in authorizations:
        scheme, _, credentials = value.strip().partition(" ")
        if scheme.lower() == "bearer":
            bearer.append(credentials.strip())
        else:
            other_scheme = True
    found = bearer + from_query
    return Presented(
        query=rest,
        token=found[0] if found else None,
        from_query=bool(from_query) and not bearer,
        twice=len(found) + (1 if other_scheme and found else 0) > 1 or len(authorizations) > 1,
        other_scheme=other_scheme,
    )


def credential_digest(credentials: Sequence[tuple[str, str]]) -> str:
    """A stable name for a set of credential headers (order and name case do not matter)."""
    digest = hashlib.sha256()
    for name, value in sorted((name.lower(), value) for name, value in credentials):
        digest.update(f"{name}\0{value}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
