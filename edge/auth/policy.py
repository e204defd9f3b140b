"""What a verified token allows (pure: the clock is an argument).

Rules this module owns (the contract operators and tests rely on):

* ``exp`` is required; ``nbf`` is honoured; both with ``leeway_seconds`` of clock skew. A grant
  lasts until ``exp + leeway``: the instant the edge would refuse the same token, so a live
  read ends then and a reconnect with the same token is refused rather than accepted and cut.
* ``iss`` must equal ``--jwt-issuer`` when one is set. ``aud`` (a string or a list) must name
  ``--jwt-audience`` when one is set; a token with an audience is refused when none is set
  (RFC 7519 §4.1.3: a recipient that is not named must reject it).
* ``scope`` is a space-separated string: reads need ``read``, writes need ``write`` (neither
  implies the other).
* ``streams`` is a list of stream paths, compared with the request's normalised stream path;
  an entry ending in ``/`` is a prefix. A token without ``streams`` reads nothing: to cover
  every stream a token says ``["/"]``.
* A refusal says 401 (no usable token: missing, malformed, bad signature, unknown key,
  expired, wrong issuer or audience) or 403 (a good token that does not cover this request),
  with the RFC 6750 error code for ``WWW-Authenticate`` and a short reason that names no key,
  claim value or address.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REALM = "edge"

# edge_auth_decisions_total{result}: a closed set.
AUTH_RESULTS = (
    "allowed",
    "missing",
    "malformed",
    "invalid",
    "expired",
    "not_yet_valid",
    "forbidden",
    "denied",
    "unavailable",
)


class Access(enum.StrEnum):
    READ = "read"
    WRITE = "write"


def access_of(method: str) -> Access | None:
    """What a method does to a stream; None for CORS preflights, which carry no credentials."""
    method = method.upper()
    if method == "OPTIONS":
        return None
    return Access.READ if method in ("GET", "HEAD") else Access.WRITE


@dataclass(frozen=True, kw_only=True, slots=True)
class Grant:
    subject: str | None = None
    # Wall-clock seconds after which the credential is no longer accepted (live reads end).
    expires_at: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    status: int  # 401, 403 or 503
    reason: str  # for the client: short, names nothing secret
    result: str  # one of AUTH_RESULTS
    error: str | None = None  # RFC 6750 error code
    # Forward mode relays the auth service's own answer.
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None

    def www_authenticate(self) -> str | None:
        if self.status != 401 and self.error != "insufficient_scope":
            return None
        value = f'Bearer realm="{REALM}"'
        if self.error:
            value += f', error="{self.error}", error_description="{self.reason}"'
        return value


def unauthorized(reason: str, result: str, error: str | None = "invalid_token") -> Refusal:
    return Refusal(status=401, reason=reason, result=result, error=error)


def forbidden(reason: str) -> Refusal:
    return Refusal(status=403, reason=reason, result="forbidden", error="insufficient_scope")


MISSING = unauthorized("a bearer token is required", "missing", error=None)
TWICE = unauthorized("send the token once", "malformed", error="invalid_request")
MALFORMED = unauthorized("malformed token", "malformed")
UNAVAILABLE = Refusal(status=503, reason="authorization is unavailable", result="unavailable")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimRules:
    audience: str | None = None
    issuer: str | None = None
    leeway_seconds: float = 30.0


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def covers(streams: Sequence[str], stream: str) -> bool:
    """Does a ``streams`` claim cover ``stream``? Exact paths, or prefixes ending in ``/``."""
    return any(
        entry == stream or (entry.endswith("/") and stream.startswith(entry)) for entry in streams
    )


def check_claims(
    claims: Mapping[str, object], *, stream: str, access: Access, rules: ClaimRules, now: float
) -> Grant | Refusal:
    """The grant these (signature-verified) claims give for ``access`` to ``stream`` at ``now``."""
    leeway = rules.leeway_seconds
    exp = _number(claims.get("exp"))
    if exp is None:
        return unauthorized("token has no valid expiry", "invalid")
    if now > exp + leeway:
        return unauthorized("token expired", "expired")
    if "nbf" in claims:
        nbf = _number(claims["nbf"])
        if nbf is None:
            return unauthorized("token has an invalid nbf", "invalid")
        if now + leeway < nbf:
            return unauthorized("token not yet valid", "not_yet_valid")
    if rules.issuer is not None and claims.get("iss") != rules.issuer:
        return unauthorized("token issuer not accepted", "invalid")
    if "aud" in claims or rules.audience is not None:
        aud = claims.get("aud")
        named = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if rules.audience is None or rules.audience not in named:
            return unauthorized("token audience not accepted", "invalid")
    scope = claims.get("scope")
    if not isinstance(scope, str) or access.value not in scope.split():
        return forbidden(f"token lacks {access.value} scope")
    streams = claims.get("streams")
    if not isinstance(streams, list) or not all(isinstance(s, str) for s in streams):
        return forbidden("token names no streams")
    if not covers(streams, stream):
        return forbidden("token does not cover this stream")
    subject = claims.get("sub")
    return Grant(subject=subject if isinstance(subject, str) else None, expires_at=exp + leeway)
