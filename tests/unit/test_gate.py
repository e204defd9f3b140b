"""The gate's decision for one request, with a JWKS file and no network: what an allowed read
and write send upstream, and where the token goes (nowhere)."""

from __future__ import annotations

from pathlib import Path

from edge.auth.gate import Admission, Client, Gate
from edge.auth.policy import Refusal
from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.protocol.paths import parse_target
from tests.auth_support import claims_for, hs_key, jwks, sign

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
    return await gate.admit(
        Client(
            method=method,
            target=parse_target(raw, method),
            headers=headers,
            host="edge",
            scheme="http",
            address="127.0.0.1",
        )
    )


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
        assert isinstance(admitted, Admission)
        assert admitted.shared
        assert admitted.target.upstream == f"{STREAM}?offset=-1&live=sse"
        assert admitted.target.query == "offset=-1&live=sse"
        assert admitted.expires_at is not None
        relayed = admitted.relay_headers(
            [("Authorization", "Bearer x"), ("Cookie", "s=1"), ("X-Tenant", "t"), ("Accept", "a")]
        )
        assert relayed == [("Accept", "a"), ("Authorization", "Bearer edge")]

        write = sign(KEY, claims_for(STREAM, scope="write"))
        admitted = await decide(gate, "POST", f"{STREAM}?token={write}", [])
        assert isinstance(admitted, Admission)
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
        assert isinstance(preflight, Admission)
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
