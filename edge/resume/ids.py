"""The edge's own event ids on resume routes, and the durable stream each answer is kept in.

Rules this module owns:

* An answer is named by a token minted with ``secrets`` (``TOKEN_BYTES`` of randomness): nothing
  about it can be guessed from another answer, a clock or a counter.
* The stream holding an answer is derived from the token *and* the credential scope of the
  request that made it (``stream_name``): an id presented with another credential (or none)
  names a stream that does not exist, so it finds nothing: the same 404 as an unknown or expired
  id, and nothing to tell them apart.
* With ``--auth``, the scope is who the gate says the request is (``principal_scope``: the mode
  and a JWT's ``sub``), not the credential: the same principal with a fresh token resumes, any
  other finds nothing. A credential that names no principal binds by the credential itself
  (``credential_scope``: the headers ``--scope-headers``/``--scope-cookies`` name and a
  ``token`` query parameter), as without ``--auth``.
* An id is ``<token>.<offset>.<skip>``: read the stream from ``offset`` and the event is the
  ``skip``-th message read there (``skip`` 0: the offset itself is the point after the event).
  Offsets are opaque, so they travel base64url-encoded; messages of a JSON stream are atomic, so
  "from ``offset``, past ``skip`` messages" names one point, however a later read batches them.
* Anything else in a ``Last-Event-ID`` is not one of the edge's ids (``parse_id`` is None).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

TOKEN_BYTES = 18  # 144 bits: unguessable, and a whole number of base64 characters (24)
TOKEN_CHARS = 24
_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
# Offsets of the real origins are tens of characters; a longer one is not the edge's.
MAX_OFFSET_CHARS = 256
MAX_SKIP = 10**9


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePoint:
    """Where an event id says the reader is: after ``skip`` messages read from ``offset``."""

    token: str
    offset: str
    skip: int


def mint_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def stream_name(token: str, scope: str) -> str:
    """The stream's last path segment: bound to the token and the scope that made it."""
    digest = hashlib.sha256(f"edge-resume\0{scope}\0{token}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:40]


def principal_scope(mode: str, principal: str) -> str:
    """The scope of the answers of ``principal`` as the ``--auth mode`` gate names it."""
    return f"principal\0{mode}\0{principal}"


def credential_scope(credentials: Sequence[tuple[str, str]]) -> str:
    """The scope of the answers of a request presenting ``credentials`` and no principal
    (order and name case do not matter; none at all is one scope, ``public``)."""
    if not credentials:
        return "public"
    digest = hashlib.sha256()
    for name, value in sorted((name.lower(), value) for name, value in credentials):
        digest.update(f"{name}\0{value}\0".encode("utf-8", "surrogateescape"))
    return "credential\0" + digest.hexdigest()


def encode_id(point: ResumePoint) -> str:
    return f"{point.token}.{encode_offset(point.offset)}.{point.skip}"


def parse_id(text: str | None) -> ResumePoint | None:
    """The point a ``Last-Event-ID`` names, or None when it is not one of the edge's ids."""
    if text is None:
        return None
    parts = text.strip().split(".")
    if len(parts) != 3:
        return None
    token, encoded, skip_text = parts
    if len(token) != TOKEN_CHARS or not set(token) <= _URLSAFE:
        return None
    if not skip_text.isascii() or not skip_text.isdigit() or len(skip_text) > 10:
        return None
    skip = int(skip_text)
    if skip > MAX_SKIP or not set(encoded) <= _URLSAFE or len(encoded) > MAX_OFFSET_CHARS:
        return None
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        offset = raw.decode("ascii")
    except (binascii.Error, ValueError):
        return None
    if not offset or not offset.isprintable() or encode_offset(offset) != encoded:
        return None
    return ResumePoint(token=token, offset=offset, skip=skip)


def encode_offset(offset: str) -> str:
    return base64.urlsafe_b64encode(offset.encode()).decode().rstrip("=")
