"""The one authorization decision per request: a refusal, or how the request goes on.

Rules this module owns:

* ``--auth none``: no gate; requests go on exactly as before.
* In ``jwt`` and ``forward`` mode every request but a CORS preflight needs the edge's yes
  first; a refusal costs the origin nothing.
* What is judged is what is served: the JWT policy and the auth service are asked about the
  ``Target`` the request goes on with (``RequestAdmission.target``: its normalised stream, its query
  without ``token`` parameters), never about the raw path the client sent.
* An allowed read is the stream's, not the reader's: it is served from the one scope of this
  policy (``policy_scope``: the mode and ``--origin-header``, so replicas with another policy
  never share it), and every origin request made for it, cache fill, live tail or relayed read,
  carries ``--origin-header`` and none of the client's credential headers.
* An allowed write carries the client's own credentials to the origin (a ``token`` parameter
  as ``Authorization: Bearer``): the origin stays the authority for writes.
* ``token`` query parameters never go further than this decision (``edge.auth.credentials``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from edge.auth.credentials import present
from edge.auth.forward import ForwardAuth, Question
from edge.auth.jwks import JwksSource
from edge.auth.keys import UNKNOWN_KEY, KeyRing, UnknownKid, token_header
from edge.auth.policy import (
    MALFORMED,
    MISSING,
    TWICE,
    UNAVAILABLE,
    Access,
    ClaimRules,
    Grant,
    Refusal,
    access_of,
    check_claims,
)
from edge.config import Settings
from edge.metrics import Metrics
from edge.protocol.headers import AUTHORIZATION, COOKIE
from edge.protocol.paths import Target
from edge.protocol.reads import policy_scope, scope_credentials

Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestAdmission:
    """How a request the gate allowed goes on (a connection's place is
    ``edge.web.connection_table.ConnectionAdmission``'s)."""

    target: Target  # without token parameters
    # An authorized read: the policy's scope (``policy_scope``), the edge's credential upstream.
    scope: str | None = None
    # Shared: the edge's --origin-header. A write: the query token as Authorization.
    upstream: tuple[tuple[str, str], ...] = ()
    drop: frozenset[str] = frozenset()  # client headers (lower-case) never sent upstream
    expires_at: float | None = None  # wall clock: live reads end by then
    # Who the credential names (a JWT's ``sub``), when the gate can tell: what a resume route
    # binds its answers to, so the same principal with a fresh credential resumes them.
    principal: str | None = None

    @property
    def shared(self) -> bool:
        """An authorized read, served from the policy's scope."""
        return self.scope is not None

    def relay_headers(self, client_headers: Headers) -> list[tuple[str, str]]:
        """The client's headers as a pass-through sends them upstream."""
        kept = [(name, value) for name, value in client_headers if name.lower() not in self.drop]
        return [*kept, *self.upstream]


@dataclass(frozen=True, kw_only=True, slots=True)
class Client:
    method: str
    target: Target
    headers: Headers
    host: str | None
    scheme: str
    address: str | None


class Gate:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = settings.auth_mode
        # Every read this gate allows is served from (and shares keys under) this scope.
        self.scope = policy_scope(settings.auth_mode, settings.origin_headers)
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._rules = ClaimRules(
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            leeway_seconds=settings.jwt_leeway_seconds,
        )
        self.jwks: JwksSource | None = None
        self.forward: ForwardAuth | None = None
        if self.mode == "jwt":
            assert settings.jwt_jwks is not None
            self.jwks = JwksSource(
                settings.jwt_jwks,
                metrics,
                timeout_seconds=settings.auth_timeout_seconds,
                min_refresh_seconds=settings.jwks_min_refresh_seconds,
            )
        else:
            assert settings.auth_url is not None
            self.forward = ForwardAuth(
                settings.auth_url,
                metrics,
                timeout_seconds=settings.auth_timeout_seconds,
                cache_seconds=settings.auth_cache_seconds,
                subject_header=settings.auth_subject_header,
            )
        # Bounded in bytes, not only in count: each holds its target, which a reader chooses.
        self._admissions: LRUCache[AdmissionKey, _KeptAdmission] = LRUCache(
            maxsize=MAX_KEPT_ADMISSION_BYTES, getsizeof=_KeptAdmission.cost
        )
        # Never relayed on a shared read: whatever names a reader, the bearer token included
        # even when --scope-headers does not list it.
        self._credential_headers = frozenset({AUTHORIZATION, COOKIE, *settings.scope_headers})

    async def start(self) -> None:
        if self.jwks is not None:
            await self.jwks.start()
        if self.forward is not None:
            await self.forward.start()

    async def close(self) -> None:
        if self.jwks is not None:
            await self.jwks.close()
        if self.forward is not None:
            await self.forward.close()

    async def admit(self, client: Client) -> RequestAdmission | Refusal:
        prepared = self._prepare(client)  # once: what the decision now and the wait start from
        if isinstance(prepared, _Prepared):
            judged = self._judge_now(client, prepared)
            decision = (
                judged.decision if judged is not None else await self._decide(client, prepared)
            )
        else:
            decision = prepared
        self.count(decision)
        return decision

    def count(self, decision: RequestAdmission | Refusal) -> None:
        result = decision.result if isinstance(decision, Refusal) else "allowed"
        self._metrics.auth_decisions.labels(mode=self.mode, result=result).inc()

    def decide_now(
        self, client: Client, *, remember: bool = False
    ) -> RequestAdmission | Refusal | None:
        """The decision, when it needs no waiting (a token whose key the edge holds, a verdict
        the service gave and the edge still keeps); None: only ``admit`` can make it. The
        pre-serialised hit path asks this, so both paths decide by the same code.

        ``remember`` (the hit path, whose heads carry only the headers the gate reads): an
        admission is kept for the same method, target and headers, with what it was derived
        from, and reused only while that holds: the key set that checked the token is still
        the current one and the grant has not expired (``exp`` + leeway), or the service's
        verdict is still within its lifetime. Refusals are never kept; what is kept is bounded
        in bytes (``MAX_KEPT_ADMISSION_BYTES``), since a reader chooses its targets."""
        key: AdmissionKey | None = None
        if remember:
            target = client.target
            key = (client.method.upper(), target.upstream, target.stream, tuple(client.headers))
            kept = self._admissions.get(key)
            if kept is not None:
                if self._still_holds(kept):
                    return kept.admission
                del self._admissions[key]
        prepared = self._prepare(client)
        if not isinstance(prepared, _Prepared):
            return prepared
        judged = self._judge_now(client, prepared)
        if judged is None:
            return None
        decision = judged.decision
        if key is not None and isinstance(decision, RequestAdmission) and judged.until is not None:
            kept_now = _KeptAdmission(
                admission=decision, ring=judged.ring, until=judged.until,
                size=_bytes_of(key, decision),
            )  # fmt: skip
            if kept_now.size <= MAX_KEPT_ADMISSION_BYTES // 64:  # never one that evicts many
                self._admissions[key] = kept_now
        return decision

    def _judge_now(self, client: Client, prepared: _Prepared) -> _JudgedNow | None:
        """The decision from what the edge holds (the key set, a kept verdict), with what it
        holds until; None when only a wait (fetching keys, asking the service) can make it."""
        until: float | None = None
        ring: KeyRing | None = None
        verdict: Grant | Refusal
        if self.mode == "jwt":
            judged = self._verify_now(prepared.token, prepared.target.stream, prepared.access)
            if judged is None:
                return None
            verdict, ring = judged
            if isinstance(verdict, Grant):
                until = verdict.expires_at
        else:
            assert self.forward is not None
            remembered = self.forward.remembered_until(prepared.question(client))
            if remembered is None:
                return None
            until, verdict = remembered
        return _JudgedNow(decision=self._admission(prepared, verdict), until=until, ring=ring)

    def _still_holds(self, kept: _KeptAdmission) -> bool:
        if self.mode == "jwt":
            assert self.jwks is not None
            self.jwks.reload_if_old()
            return kept.ring is self.jwks.ring and self._clock() < kept.until
        assert self.forward is not None
        return self.forward.now() < kept.until

    async def _decide(self, client: Client, prepared: _Prepared) -> RequestAdmission | Refusal:
        verdict: Grant | Refusal
        if self.mode == "jwt":
            verdict = await self._verify(prepared.token, prepared.target.stream, prepared.access)
        else:
            assert self.forward is not None
            verdict = await self.forward.verdict(prepared.question(client))
        return self._admission(prepared, verdict)

    def _prepare(self, client: Client) -> _Prepared | RequestAdmission | Refusal:
        """What every decision starts from: the one target everything below judges and the
        request goes on with, the access asked for, and the credentials presented."""
        presented = present(client.target.query, client.headers)
        path = client.target.upstream.partition("?")[0]
        target = Target(
            upstream=path + ("?" + presented.query if presented.query else ""),
            query=presented.query,
            stream=client.target.stream,
        )
        access = access_of(client.method)
        if access is None:
            return RequestAdmission(target=target)
        if presented.twice:
            return TWICE
        credentials: list[tuple[str, str]] = []
        if self.mode == "jwt":
            if presented.token is None:
                return MISSING
        else:
            credentials = scope_credentials(
                client.headers,
                scope_headers=self._settings.scope_headers,
                scope_cookies=self._settings.scope_cookies,
            )
            if presented.from_query and presented.token is not None:
                credentials.append(("Authorization", f"Bearer {presented.token}"))
        return _Prepared(
            target=target, access=access, token=presented.token or "",
            from_query=presented.from_query, credentials=tuple(credentials),
        )  # fmt: skip

    def _admission(
        self, prepared: _Prepared, verdict: Grant | Refusal
    ) -> RequestAdmission | Refusal:
        if isinstance(verdict, Refusal):
            return verdict
        target = prepared.target
        if prepared.access is Access.READ:
            return RequestAdmission(
                target=target,
                scope=self.scope,
                upstream=self._settings.origin_headers,
                drop=self._credential_headers,
                expires_at=verdict.expires_at,
                principal=verdict.subject,
            )
        upstream: tuple[tuple[str, str], ...] = ()
        if prepared.from_query and prepared.token:
            upstream = (("Authorization", f"Bearer {prepared.token}"),)
        return RequestAdmission(target=target, upstream=upstream, principal=verdict.subject)

    def _verify_now(
        self, token: str, stream: str, access: Access
    ) -> tuple[Grant | Refusal, KeyRing | None] | None:
        """``_verify`` when the key set in hand knows the token's key (a signature checked
        once per token string and key set: ``KeyRing`` remembers it), with that key set;
        None: it must wait."""
        assert self.jwks is not None
        kid = _kid_of(token)
        if isinstance(kid, Refusal):
            return kid, None
        ring = self.jwks.ring_now(kid)
        if ring is None:
            return None
        return self._judge(ring, token, stream, access), ring

    async def _verify(self, token: str, stream: str, access: Access) -> Grant | Refusal:
        assert self.jwks is not None
        kid = _kid_of(token)
        if isinstance(kid, Refusal):
            return kid
        ring: KeyRing | None = await self.jwks.ring_for(kid)
        if ring is None:
            return UNAVAILABLE  # no key set loaded yet: the edge cannot judge any token
        return self._judge(ring, token, stream, access)

    def _judge(self, ring: KeyRing, token: str, stream: str, access: Access) -> Grant | Refusal:
        claims = ring.verify(token)
        if isinstance(claims, UnknownKid):
            return UNKNOWN_KEY
        if isinstance(claims, Refusal):
            return claims
        return check_claims(
            claims, stream=stream, access=access, rules=self._rules, now=self._clock()
        )


def _kid_of(token: str) -> str | Refusal | None:
    """The key id a token names (None: none named), or why it cannot be judged."""
    header = token_header(token)
    if header is None:
        return MALFORMED
    kid = header.get("kid")
    return kid if isinstance(kid, str) else None


# The hit path's heads: (method, target as sent, its stream, the headers the gate reads as sent).
AdmissionKey = tuple[str, str, str, tuple[tuple[str, str], ...]]
# What the kept admissions may hold, their keys and targets counted (``_bytes_of``): past it
# the oldest are judged again. About 55,000 of the common ones (a short target and a 200-byte
# JWT are accounted 1.2 KB; tracemalloc measures ~0.7 KB beside the head's own strings); a
# reader who sends 8 KiB targets gets fewer kept, never gigabytes outside ``--cache-bytes``.
MAX_KEPT_ADMISSION_BYTES = 64 * 1024 * 1024
# The key tuple, the LRU's slots, the admission, its target and the record (measured ~700).
KEPT_ADMISSION_OVERHEAD_BYTES = 900


def _bytes_of(key: AdmissionKey, admission: RequestAdmission) -> int:
    """What keeping ``admission`` under ``key`` costs: the strings it holds, and overhead."""
    method, upstream, stream, headers = key
    target = admission.target
    return (
        KEPT_ADMISSION_OVERHEAD_BYTES
        + len(method) + len(upstream) + len(stream)
        + sum(len(name) + len(value) for name, value in headers)
        + len(target.upstream) + len(target.query)  # its stream is the key's
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class _JudgedNow:
    decision: RequestAdmission | Refusal
    until: float | None  # what a kept admission may last: exp + leeway, or the verdict's lifetime
    ring: KeyRing | None  # jwt: the key set that checked the token


@dataclass(frozen=True, kw_only=True, slots=True)
class _KeptAdmission:
    admission: RequestAdmission
    ring: KeyRing | None  # jwt: the key set that checked the token
    until: float  # jwt: wall clock (exp + leeway); forward: the verdict's, on its clock
    size: int  # what keeping it costs (``_bytes_of``)

    def cost(self) -> int:
        return self.size


@dataclass(frozen=True, kw_only=True, slots=True)
class _Prepared:
    target: Target
    access: Access
    token: str  # jwt mode: the bearer token ("" in forward mode without one)
    from_query: bool
    credentials: tuple[tuple[str, str], ...]  # forward mode: what the service is shown

    def question(self, client: Client) -> Question:
        return Question(
            method=client.method.upper(),
            target=self.target,
            credentials=self.credentials,
            host=client.host,
            scheme=client.scheme,
            client=client.address,
        )
