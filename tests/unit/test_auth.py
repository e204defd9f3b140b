"""The pure authorization core: where tokens are found, what claims allow, which signatures
are good (edge/auth/credentials.py, policy.py, keys.py)."""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qsl, quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.auth.credentials import credential_digest, present, strip_token
from edge.auth.forward import lifetime_of
from edge.auth.keys import JwksError, KeyRing, UnknownKid
from edge.auth.policy import Access, ClaimRules, Grant, Refusal, access_of, check_claims, covers
from tests.auth_support import (
    claims_for,
    ec_key,
    ed_key,
    hs_key,
    jwks,
    key_confusion,
    rsa_key,
    sign,
    unsigned,
    with_header,
)

NOW = 1_800_000_000.0
RULES = ClaimRules(leeway_seconds=30)
STREAM = "/v1/stream/run-1"


# --- where the token is -------------------------------------------------------------------


def test_the_token_parameter_is_removed_and_the_rest_kept_as_sent() -> None:
    assert strip_token("offset=-1&token=abc&live=sse") == ("offset=-1&live=sse", ["abc"])
    assert strip_token("tok%65n=a%2Bb&x=%20") == ("x=%20", ["a+b"])
    assert strip_token("token") == ("", [""])
    assert strip_token("") == ("", [])


@given(
    st.lists(
        st.tuples(st.sampled_from(["offset", "live", "token", "cursor", "x"]), st.text()),
        max_size=6,
    )
)
def test_no_token_survives_stripping(params: list[tuple[str, str]]) -> None:
    query = "&".join(f"{quote(name)}={quote(value)}" for name, value in params)
    rest, tokens = strip_token(query)
    assert "token" not in {name for name, _ in parse_qsl(rest, keep_blank_values=True)}
    assert tokens == [value for name, value in params if name == "token"]
    others = [(n, v) for n, v in params if n != "token"]
    assert parse_qsl(rest, keep_blank_values=True) == others


def test_a_token_is_sent_once() -> None:
    header = [("Authorization", "Bearer abc")]
    assert present("offset=-1", header).token == "abc"
    assert not present("offset=-1", header).twice
    from_query = present("token=xyz", [])
    assert from_query.token == "xyz"
    assert from_query.from_query
    assert not from_query.twice
    assert present("token=xyz", header).twice
    assert present("token=a&token=b", []).twice
    assert present("", [*header, ("authorization", "Bearer other")]).twice
    basic = present("", [("Authorization", "Basic dTpw")])
    assert basic.token is None
    assert basic.other_scheme


@pytest.mark.parametrize(
    ("cache_control", "seconds"),
    [
        (None, 10.0),
        ("max-age=3", 3.0),
        ("max-age=3600", 10.0),  # never past --auth-cache-seconds: revocation waits no longer
        ("private, max-age=86400", 10.0),
        ("public", 10.0),
        ("no-store", 0.0),
        ("no-cache, max-age=60", 0.0),
        ("max-age=0", 0.0),
    ],
)
def test_a_verdict_lives_what_the_service_says_at_most_auth_cache_seconds(
    cache_control: str | None, seconds: float
) -> None:
    assert lifetime_of(cache_control, 10.0) == seconds


def test_credential_digests_ignore_order_and_case() -> None:
    one = credential_digest([("Cookie", "s=1"), ("Authorization", "Bearer x")])
    assert one == credential_digest([("authorization", "Bearer x"), ("cookie", "s=1")])
    assert one != credential_digest([("Cookie", "s=2"), ("Authorization", "Bearer x")])


# --- what claims allow ----------------------------------------------------------------------


def judge(claims: dict[str, object], access: Access = Access.READ, **rules: object) -> object:
    return check_claims(
        claims,
        stream=STREAM,
        access=access,
        rules=ClaimRules(**rules),
        now=NOW,  # type: ignore[arg-type]
    )


def refused(verdict: object, status: int, result: str) -> bool:
    return isinstance(verdict, Refusal) and verdict.status == status and verdict.result == result


def test_a_good_token_grants_until_exp_plus_leeway() -> None:
    verdict = judge(claims_for(STREAM, now=NOW, lifetime=60, sub="ann"))
    assert verdict == Grant(subject="ann", expires_at=NOW + 60 + 30)


@pytest.mark.parametrize(
    ("claims", "status", "result"),
    [
        ({"scope": "read", "streams": [STREAM]}, 401, "invalid"),  # no exp
        (claims_for(STREAM, now=NOW, lifetime=-31), 401, "expired"),
        (claims_for(STREAM, now=NOW, nbf=NOW + 31), 401, "not_yet_valid"),
        (claims_for(STREAM, now=NOW, nbf="soon"), 401, "invalid"),
        (claims_for(STREAM, now=NOW, exp=True), 401, "invalid"),
        (claims_for(STREAM, now=NOW, scope="write"), 403, "forbidden"),
        (claims_for(STREAM, now=NOW, scope=["read"]), 403, "forbidden"),
        (claims_for("/v1/stream/other", now=NOW), 403, "forbidden"),
        (claims_for(STREAM, now=NOW, streams="/v1/stream/"), 403, "forbidden"),
        (claims_for(STREAM, now=NOW, aud="someone"), 401, "invalid"),  # no audience set
    ],
)
def test_claims_that_refuse(claims: dict[str, object], status: int, result: str) -> None:
    assert refused(judge(claims), status, result)


def test_leeway_both_ways() -> None:
    assert isinstance(judge(claims_for(STREAM, now=NOW, lifetime=-29)), Grant)
    assert isinstance(judge(claims_for(STREAM, now=NOW, nbf=NOW + 29)), Grant)


def test_audience_and_issuer() -> None:
    claims = claims_for(STREAM, now=NOW, aud=["a", "viewers"], iss="https://idp")
    assert isinstance(judge(claims, audience="viewers", issuer="https://idp"), Grant)
    assert refused(judge(claims, audience="other"), 401, "invalid")
    assert refused(judge(claims, audience="viewers", issuer="https://evil"), 401, "invalid")
    assert refused(judge(claims_for(STREAM, now=NOW), audience="viewers"), 401, "invalid")


def test_scopes_are_separate() -> None:
    both = claims_for(STREAM, now=NOW, scope="read write")
    assert isinstance(judge(both, Access.WRITE), Grant)
    assert refused(judge(claims_for(STREAM, now=NOW), Access.WRITE), 403, "forbidden")


def test_stream_prefixes() -> None:
    assert covers(["/v1/stream/"], "/v1/stream/run-1")
    assert covers(["/v1/stream/run-1"], "/v1/stream/run-1")
    assert not covers(["/v1/stream/run"], "/v1/stream/run-1")
    assert not covers(["/v1/stream/run-1/"], "/v1/stream/run-1")
    assert covers(["/"], "/anything")


@given(st.lists(st.text(alphabet="/ab", max_size=6), max_size=4), st.text(alphabet="/ab"))
def test_a_prefix_entry_covers_only_paths_under_it(entries: list[str], stream: str) -> None:
    if covers(entries, stream):
        assert any(e == stream or (e.endswith("/") and stream.startswith(e)) for e in entries)
    else:
        assert stream not in entries


@given(st.floats(min_value=-1e6, max_value=1e6), st.floats(min_value=0, max_value=100))
def test_expiry_is_monotonic_in_time(lifetime: float, later: float) -> None:
    """Once refused as expired, a token is refused at every later instant."""
    claims = claims_for(STREAM, now=NOW, lifetime=lifetime)
    first = check_claims(claims, stream=STREAM, access=Access.READ, rules=RULES, now=NOW)
    second = check_claims(claims, stream=STREAM, access=Access.READ, rules=RULES, now=NOW + later)
    if refused(first, 401, "expired"):
        assert refused(second, 401, "expired")
    if isinstance(second, Grant):
        assert isinstance(first, Grant)
        assert second.expires_at == first.expires_at


def test_access_of_methods() -> None:
    assert access_of("GET") is Access.READ
    assert access_of("head") is Access.READ
    assert access_of("POST") is Access.WRITE
    assert access_of("DELETE") is Access.WRITE
    assert access_of("OPTIONS") is None


def test_www_authenticate() -> None:
    assert refused_header(judge(claims_for(STREAM, now=NOW, lifetime=-60))) == (
        'Bearer realm="edge", error="invalid_token", error_description="token expired"'
    )
    assert "insufficient_scope" in refused_header(judge(claims_for("/x", now=NOW)))


def refused_header(verdict: object) -> str:
    assert isinstance(verdict, Refusal)
    header = verdict.www_authenticate()
    assert header is not None
    return header


# --- signatures -----------------------------------------------------------------------------


def test_every_key_type_verifies_its_own_tokens() -> None:
    keys = [hs_key("h"), rsa_key("r"), ec_key("e"), ed_key("o")]
    ring = KeyRing.from_jwks(jwks(*keys))
    assert len(ring) == 4
    for key in keys:
        claims = claims_for(STREAM, sub=key.kid or "")
        assert ring.verify(sign(key, claims)) == claims
    ed = keys[3]
    assert ring.verify(sign(ed, claims_for(STREAM), alg="Ed25519")) == claims_for(STREAM)


def test_public_jwks_verifies_asymmetric_tokens() -> None:
    rsa = rsa_key("r")
    ring = KeyRing.from_jwks(jwks(rsa))  # public parts only
    claims = claims_for(STREAM)
    assert ring.verify(sign(rsa, claims)) == claims


def verdict_of(ring: KeyRing, token: str) -> str:
    result = ring.verify(token)
    if isinstance(result, UnknownKid):
        return "unknown"
    assert isinstance(result, Refusal), result
    assert result.status == 401
    return result.reason


def test_tokens_that_never_verify() -> None:
    hs, rsa = hs_key("h"), rsa_key("r")
    ring = KeyRing.from_jwks(jwks(hs, rsa))
    claims = claims_for(STREAM)
    good = sign(hs, claims)
    assert verdict_of(ring, unsigned(claims)) == "unsupported token algorithm"
    assert verdict_of(ring, unsigned(claims, kid="h")) == "unsupported token algorithm"
    assert verdict_of(ring, key_confusion(rsa, claims)) == "token algorithm does not match its key"
    assert verdict_of(ring, sign(hs, claims, alg="HS256", kid="r")) == (
        "token algorithm does not match its key"
    )
    assert verdict_of(ring, with_header(good, crit=["exp"])) == "unsupported token algorithm"
    assert verdict_of(ring, good[:-5]) == "bad token signature"
    assert verdict_of(ring, good.rsplit(".", 1)[0]) == "malformed token"
    assert verdict_of(ring, "not-a-token") == "malformed token"
    assert verdict_of(ring, sign(hs_key("h"), claims)) == "bad token signature"  # same kid
    assert verdict_of(ring, sign(hs_key("new"), claims)) == "unknown"
    assert verdict_of(ring, sign(hs, claims, kid=None)) == "unknown"  # two keys: kid needed


def test_the_curve_must_match_too() -> None:
    p384 = ec_key("e")
    ring = KeyRing.from_jwks(jwks(p384))
    assert verdict_of(ring, with_header(sign(p384, claims_for(STREAM)), alg="ES384")) == (
        "token algorithm does not match its key"
    )


def test_a_single_key_ring_takes_tokens_without_kid() -> None:
    hs = hs_key("h")
    ring = KeyRing.from_jwks(jwks(hs))
    claims = claims_for(STREAM)  # once: its exp is the clock's second when made
    assert ring.verify(sign(hs, claims, kid=None)) == claims


@pytest.mark.parametrize(
    "document",
    [b"nope", b"[]", b'{"keys": {}}', b'{"keys": []}', b'{"keys": [{"kty": "XYZ"}]}'],
)
def test_unusable_jwks_documents(document: bytes) -> None:
    with pytest.raises(JwksError):
        KeyRing.from_jwks(document)


def test_encryption_keys_are_left_out() -> None:
    enc = json.loads(jwks(hs_key("e")))["keys"][0] | {"use": "enc"}
    sig = json.loads(jwks(hs_key("s")))["keys"][0]
    ring = KeyRing.from_jwks(json.dumps({"keys": [enc, sig]}).encode())
    assert len(ring) == 1
    assert ring.has("s")
    assert not ring.has("e")


def test_a_header_nested_too_deep_is_a_malformed_token_not_an_error() -> None:
    """Before any signature, a token's header is parsed: JSON nested past the parser's
    recursion raised RecursionError (no ValueError), a 500 for an unauthenticated request."""
    ring = KeyRing.from_jwks(jwks(hs_key("h")))
    deep = base64.urlsafe_b64encode(b"[" * 3000 + b"]" * 3000).decode().rstrip("=")
    assert verdict_of(ring, f"{deep}.e30.c2ln") == "malformed token"
