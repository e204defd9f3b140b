"""The gate's decision for one request, with a JWKS file and no network: what an allowed read
and write send upstream, and where the token goes (nowhere); and, for generated targets in both
modes, that what the JWT policy or the auth service judges is exactly the stream served."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from edge.auth.credentials import strip_token
from edge.auth.gate import Client, Gate, RequestAdmission
from edge.auth.policy import Refusal
from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.protocol.paths import BadTarget, Target, parse_target
from edge.protocol.reads import PUBLIC_SCOPE
from tests.auth_support import claims_for, hs_key, jwks, sign
from tests.integration.auth_services import AuthService

STREAM = "/v1/stream/run"
KEY = hs_key("k1")


def settings(jwks_path: Path, **extra: object) -> Settings:
    return Settings(
        origin="http://origin:1",
        listen=Address(host="127.0.0.1", port=0),
        admin_listen=Address(host="127.0.0.1", port=0),
        auth_mode="jwt",
        jwt_jwks=str(jwks_path),
        origin_headers=(("Authorization", "Bearer edge"),),
        **extra,  # type: ignore[arg-type]
    )


async def decide(gate: Gate, method: str, raw: str, headers: list[tuple[str, str]]) -> object:
    return await gate.admit(client(method, raw, headers))


async def test_an_allowed_read_is_shared_and_carries_the_edges_credential(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_bytes(jwks(KEY))
    metrics = Metrics()
    # Even when --scope-headers does not name them, a reader's credentials never go upstream.
    gate = Gate(settings(tmp_path / "jwks.json", scope_headers=("x-tenant",)), metrics)
    await gate.start()
    try:
        grant = sign(KEY, claims_for(STREAM))
        admitted = await decide(
            gate,
            "GET",
            f"{STREAM}?offset=-1&token={grant}&live=sse",
            [("Cookie", "s=1"), ("X-Tenant", "t"), ("Accept", "*/*")],
        )
        assert isinstance(admitted, RequestAdmission)
        assert admitted.shared
        assert admitted.target.upstream == f"{STREAM}?offset=-1&live=sse"
        assert admitted.target.query == "offset=-1&live=sse"
        assert admitted.expires_at is not None
        assert admitted.scope == gate.scope != PUBLIC_SCOPE
        relayed = admitted.relay_headers(
            [("Authorization", "Bearer x"), ("Cookie", "s=1"), ("X-Tenant", "t"), ("Accept", "a")]
        )
        assert relayed == [("Accept", "a"), ("Authorization", "Bearer edge")]

        write = sign(KEY, claims_for(STREAM, scope="write"))
        admitted = await decide(gate, "POST", f"{STREAM}?token={write}", [])
        assert isinstance(admitted, RequestAdmission)
        assert not admitted.shared
        assert admitted.target.upstream == STREAM
        assert admitted.relay_headers([("Content-Type", "text/plain")]) == [
            ("Content-Type", "text/plain"),
            ("Authorization", f"Bearer {write}"),
        ]

        refused = await decide(gate, "GET", f"{STREAM}?offset=-1", [])
        assert isinstance(refused, Refusal)
        assert refused.status == 401
        preflight = await decide(gate, "OPTIONS", STREAM, [])
        assert isinstance(preflight, RequestAdmission)
        assert not preflight.shared
        text = metrics.render().decode()
        assert 'edge_auth_decisions_total{mode="jwt",result="allowed"} 3.0' in text
        assert 'edge_auth_decisions_total{mode="jwt",result="missing"} 1.0' in text
        assert "edge_auth_keys 1.0" in text
    finally:
        await gate.close()


async def test_no_key_set_means_503_not_401(tmp_path: Path) -> None:
    gate = Gate(settings(tmp_path / "missing.json"), Metrics())
    await gate.start()
    try:
        refused = await decide(
            gate, "GET", f"{STREAM}?offset=-1&token={sign(KEY, claims_for(STREAM))}", []
        )
        assert isinstance(refused, Refusal)
        assert refused.status == 503
    finally:
        await gate.close()


# --- what is judged is what is served ------------------------------------------------------

T = TypeVar("T")
NOW = 1_800_000_000.0
PREFIX = "/v1/stream/alice/"
SEGMENTS = st.sampled_from(
    [
        "alice", "bob", "secret", "Alice", "ALICE", "alice%2f..%2fbob", "a%2Fb",
        ".", "..", "%2e", "%2E", "%2e%2e", "%2E%2E", ".%2e", "%2E.", "...", "", "x.", ".x",
    ]
)  # fmt: skip
SEPARATORS = st.sampled_from(["/", "/", "/", "//", "\\", "/./", "/../"])
# "TOKEN" stands for the bearer token; the JWT mode sends it there when the query names it.
QUERY_PIECES = st.sampled_from(
    [
        "offset=-1", "offset=now", "live=sse", "x=/../", "x=/../bob/secret", "cursor=..%2f",
        "token=TOKEN", "%74oken=TOKEN", "tok%65n=TOKEN", "a=%2e%2e", "", "offset=-1&x=..",
    ]
)  # fmt: skip
METHODS = st.sampled_from(["GET", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"])


@st.composite
def raw_targets(draw: st.DrawFn) -> str:
    """Targets near the alice/bob boundary, spelt every way the origin's parser reads alike."""
    head = draw(st.sampled_from(["/v1/stream/", "/v1/stream/alice/", "/v1\\stream/alice/"]))
    parts = draw(st.lists(st.tuples(SEGMENTS, SEPARATORS), min_size=1, max_size=5))
    path = head + "".join(segment + separator for segment, separator in parts)
    if draw(st.booleans()):
        path = path.rstrip("/\\")
    pieces = draw(st.lists(QUERY_PIECES, max_size=3))
    tokens = [piece for piece in pieces if "TOKEN" in piece]
    pieces = [piece for piece in pieces if "TOKEN" not in piece] + tokens[:1]  # at most one
    query = "&".join(draw(st.permutations(pieces)))
    return path + (f"?{query}" if draw(st.booleans()) or query else "")


def served(raw: str, method: str) -> Target:
    """The stream the origin routes this target to: what the edge serves."""
    try:
        return parse_target(raw, method)
    except BadTarget:
        assume(False)  # the edge answers 400 before any gate is asked
        raise


def client(method: str, raw: str, headers: list[tuple[str, str]]) -> Client:
    return Client(
        method=method,
        target=parse_target(raw, method),
        headers=headers,
        host="edge",
        scheme="http",
        address="127.0.0.1",
    )


class Loop:
    """One event loop for a whole generated test (Hypothesis calls a plain function)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        self.loop.close()


GENERATED = hypothesis_settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_the_jwt_policy_judges_the_stream_that_is_served(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_bytes(jwks(KEY))
    gate = Gate(settings(tmp_path / "jwks.json"), Metrics(), clock=lambda: NOW)
    loop = Loop()
    loop.run(gate.start())

    def admit(method: str, raw: str, grant: str) -> RequestAdmission | Refusal:
        if "TOKEN" in raw:
            return loop.run(gate.admit(client(method, raw.replace("TOKEN", grant), [])))
        return loop.run(gate.admit(client(method, raw, [("Authorization", f"Bearer {grant}")])))

    @GENERATED
    @given(raw=raw_targets(), method=METHODS)
    def check(raw: str, method: str) -> None:
        stream = served(raw, method).stream
        scope = "read" if method in ("GET", "HEAD") else "write"

        def token_for(streams: list[str]) -> str:
            claims = claims_for("", scope=scope, now=NOW) | {"streams": streams}
            return sign(KEY, claims)

        under_prefix = admit(method, raw, token_for([PREFIX]))
        exact = admit(method, raw, token_for([stream]))
        if method == "OPTIONS":  # a preflight carries no credential and is not judged
            assert isinstance(under_prefix, RequestAdmission)
            assert not under_prefix.shared
            return
        assert isinstance(exact, RequestAdmission), (raw, stream, exact)
        assert exact.target.stream == stream
        assert isinstance(under_prefix, RequestAdmission) == stream.startswith(PREFIX), (
            raw,
            stream,
        )
        raw_path = raw.partition("?")[0]
        if raw_path != stream and not stream.startswith(raw_path):
            # A token for the path as the client spelt it does not cover the stream served.
            assert isinstance(admit(method, raw, token_for([raw_path])), Refusal), raw

    try:
        check()
    finally:
        loop.run(gate.close())
        loop.close()


@st.composite
def question_runs(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """A few requests (target, method, session) to one gate: two generated targets and the plain
    spelling of the first one's stream, so verdicts kept for one spelling meet the others."""
    first, second = draw(raw_targets()), draw(raw_targets())
    plain = served(first, "GET").stream
    spellings = [first, second, plain + ("?offset=-1" if draw(st.booleans()) else "")]
    return draw(
        st.lists(
            st.tuples(st.sampled_from(spellings), METHODS, st.sampled_from(["alice", "reader"])),
            min_size=1,
            max_size=6,
        )
    )


def test_the_auth_service_judges_the_stream_that_is_served() -> None:
    auth = AuthService(
        sessions={"alice": PREFIX, "reader": PREFIX}, writers={"alice"}, max_age=3600
    ).start()
    forward = Settings(
        origin="http://origin:1",
        listen=Address(host="127.0.0.1", port=0),
        admin_listen=Address(host="127.0.0.1", port=0),
        auth_mode="forward",
        auth_url=auth.url,
        origin_headers=(("Authorization", "Bearer edge"),),
    )
    loop = Loop()

    def judge(gate: Gate, raw: str, method: str, who: str, judged: set[object]) -> None:
        raw = raw.replace("TOKEN", "opaque")
        target = served(raw, method)
        query, tokens = strip_token(target.query)
        asked = len(auth.asked)
        decision = loop.run(gate.admit(client(method, raw, [("Cookie", f"session={who}")])))
        questions = auth.asked[asked:]
        if method == "OPTIONS":  # a preflight carries no credential and is not judged
            assert isinstance(decision, RequestAdmission)
            assert not questions
            return
        reading = method in ("GET", "HEAD")
        allowed = target.stream.startswith(PREFIX) and (reading or who == "alice")
        assert isinstance(decision, RequestAdmission) == allowed, (raw, target.stream, decision)
        if isinstance(decision, RequestAdmission):
            assert decision.target.stream == target.stream
            assert decision.shared == reading
        # The service was asked about the stream served, its query without the token, and the
        # method; or an answer it gave about exactly those (and these credentials) was reused.
        key = (who, bool(tokens), target.stream, method)
        if questions:
            assert questions == [(who, method, target.stream + (f"?{query}" if query else ""))]
            judged.add(key)
        else:
            assert key in judged, (raw, key)

    @GENERATED
    @given(run=question_runs())
    def check(run: list[tuple[str, str, str]]) -> None:
        gate = Gate(forward, Metrics())  # verdicts kept by this run only
        loop.run(gate.start())
        try:
            judged: set[object] = set()
            for raw, method, who in run:
                judge(gate, raw, method, who, judged)
        finally:
            loop.run(gate.close())

    try:
        check()
    finally:
        loop.close()
        assert auth.server is not None
        auth.server.close()


async def test_a_kept_admission_holds_only_while_what_it_was_derived_from_does(
    tmp_path: Path,
) -> None:
    """The hit path's kept admissions: the same decision ``admit`` makes, ended by the token's
    expiry and by a new key set, and refusals are never kept."""
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(KEY))
    now = [NOW]
    gate = Gate(settings(keys, jwt_leeway_seconds=0), Metrics(), clock=lambda: now[0])
    await gate.start()
    try:
        grant = sign(KEY, claims_for(STREAM, now=NOW, lifetime=10))
        head = client("GET", f"{STREAM}?offset=-1", [("Authorization", f"Bearer {grant}")])
        kept = gate.decide_now(head, remember=True)
        assert isinstance(kept, RequestAdmission)
        assert kept == await gate.admit(head)
        assert gate.decide_now(head, remember=True) is kept  # kept, not judged again
        # Another stream's read with the same token is its own decision: refused, not kept.
        other = client("GET", "/v1/stream/other?offset=-1", list(head.headers))
        for _ in range(2):
            assert isinstance(gate.decide_now(other, remember=True), Refusal)
        # A new key set (rotation): judged again, by the new set.
        assert gate.jwks is not None
        await gate.jwks._load()
        again = gate.decide_now(head, remember=True)
        assert isinstance(again, RequestAdmission)
        assert again is not kept
        # Past exp (leeway 0): refused, by the hit path as by the full path.
        now[0] = NOW + 10.5
        assert isinstance(gate.decide_now(head, remember=True), Refusal)
        assert isinstance(await gate.admit(head), Refusal)
    finally:
        await gate.close()


async def test_kept_admissions_are_bounded_in_bytes_whatever_the_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One reader with one good token (a prefix claim) reading many distinct, long targets:
    each admission the hit path keeps holds its target (twice: as sent, and as served), so a
    count alone lets them grow to gigabytes outside ``--cache-bytes`` (65,536 heads of 8 KiB).
    What is kept is bounded in bytes (``MAX_KEPT_ADMISSION_BYTES``)."""
    import tracemalloc

    import edge.auth.gate

    bound = 1024 * 1024  # small, so the test is cheap; the rule is the same at any size
    monkeypatch.setattr(edge.auth.gate, "MAX_KEPT_ADMISSION_BYTES", bound, raising=False)
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(KEY))
    gate = Gate(settings(keys), Metrics())
    await gate.start()
    try:
        grant = [("Authorization", f"Bearer {sign(KEY, claims_for('/v1/stream/'))}")]
        long_name = "x" * 7000
        count = 2 * bound // 7000 + 1  # twice the bound in targets alone
        heads = [
            client("GET", f"/v1/stream/{i}-{long_name}?offset=-1", grant) for i in range(count)
        ]  # made first: only what the gate keeps is measured
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for head in heads:
                assert isinstance(gate.decide_now(head, remember=True), RequestAdmission)
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert kept < 1.5 * bound, kept
        # The common admission (a short target) is still kept: the LRU still does its job.
        short = client("GET", f"{STREAM}?offset=-1", grant)
        assert gate.decide_now(short, remember=True) is gate.decide_now(short, remember=True)
    finally:
        await gate.close()
