from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.protocol.reads import (
    LIVE_MODES,
    PUBLIC_SCOPE,
    RequestKind,
    auth_scope,
    classify,
    kind_of_request_line,
    live_query,
    policy_scope,
    query_params,
    scope_credentials,
    speaks_for_the_stream,
)


@pytest.mark.parametrize(
    ("method", "query", "kind"),
    [
        ("GET", "offset=-1", RequestKind.CATCHUP),
        ("GET", "", RequestKind.CATCHUP),
        ("GET", "offset=now", RequestKind.CATCHUP),
        ("GET", "offset=0_5&live=long-poll&cursor=7", RequestKind.LONG_POLL),
        ("GET", "live=sse&offset=0_5", RequestKind.SSE),
        ("GET", "offset=0_5&live=bogus", RequestKind.OTHER),
        ("HEAD", "", RequestKind.HEAD),
        ("PUT", "", RequestKind.WRITE),
        ("POST", "", RequestKind.WRITE),
        ("DELETE", "", RequestKind.WRITE),
        ("OPTIONS", "", RequestKind.OTHER),
        ("PATCH", "", RequestKind.OTHER),
        ("get", "offset=1", RequestKind.CATCHUP),
    ],
)
def test_kind(method: str, query: str, kind: RequestKind) -> None:
    assert classify(method, "/s", query, []).kind is kind


def test_read_carries_what_the_cache_keys_on() -> None:
    classified = classify(
        "GET",
        "/streams/a",
        "cursor=9&live=long-poll&offset=0_5",
        [("Last-Event-ID", "0_7"), ("Authorization", "Bearer t")],
    )
    read = classified.read
    assert read is not None
    assert (read.stream, read.offset, read.live, read.cursor, read.last_event_id) == (
        "/streams/a",
        "0_5",
        "long-poll",
        "9",
        "0_7",
    )
    assert read.scope != PUBLIC_SCOPE


def test_parameter_order_does_not_matter() -> None:
    a = classify("GET", "/s", "offset=1&live=sse", []).read
    b = classify("GET", "/s", "live=sse&offset=1", []).read
    assert a == b


def test_first_repeated_parameter_wins_and_blanks_are_kept() -> None:
    assert query_params("offset=1&offset=2&cursor=") == {"offset": "1", "cursor": ""}


def test_scopes() -> None:
    assert auth_scope([("Accept", "*/*")]) == PUBLIC_SCOPE
    token_a = auth_scope([("Authorization", "Bearer a")])
    token_b = auth_scope([("authorization", "Bearer b")])
    cookie_a = auth_scope([("Cookie", "Bearer a")])
    assert len({token_a, token_b, cookie_a, PUBLIC_SCOPE}) == 4
    assert auth_scope([("AUTHORIZATION", "Bearer a")]) == token_a
    assert "Bearer" not in token_a


def test_an_auth_policys_scope_is_its_mode_and_origin_credential() -> None:
    edge = [("Authorization", "Bearer edge")]
    jwt = policy_scope("jwt", edge)
    scopes = {
        jwt,
        policy_scope("forward", edge),
        policy_scope("jwt", []),
        policy_scope("jwt", [("Authorization", "Bearer other")]),
        policy_scope("jwt", [*edge, ("X-Tenant", "a")]),
        auth_scope(edge),  # a client sending the edge's own credential
        PUBLIC_SCOPE,
    }
    assert len(scopes) == 7
    assert policy_scope("jwt", [("authorization", "Bearer edge")]) == jwt
    assert policy_scope("jwt", [("X-Tenant", "a"), *edge]) == policy_scope(
        "jwt", [*edge, ("X-Tenant", "a")]
    )
    assert "edge" not in jwt.removeprefix("auth-")
    assert speaks_for_the_stream(jwt)
    assert speaks_for_the_stream(PUBLIC_SCOPE)
    assert not speaks_for_the_stream(auth_scope(edge))


@pytest.mark.parametrize(
    ("query", "plain"),
    [
        ("offset=1", True),
        ("cursor=3&offset=1", True),
        ("", True),
        ("offset=1&offset=2", False),
        ("offset=1&x=2", False),
    ],
)
def test_only_plain_reads_may_be_cached(query: str, plain: bool) -> None:
    read = classify("GET", "/s", query, []).read
    assert read is not None
    assert read.plain is plain


def test_any_configured_header_splits_scopes() -> None:
    keyed = ("authorization", "cookie", "x-api-key")
    a = auth_scope([("X-Api-Key", "a")], scope_headers=keyed)
    b = auth_scope([("x-api-key", "b")], scope_headers=keyed)
    assert len({a, b, PUBLIC_SCOPE}) == 3
    # Not configured: just another header, and the read is public.
    assert auth_scope([("X-Api-Key", "a")]) == PUBLIC_SCOPE
    # Configured without Authorization: that header no longer names a scope.
    assert auth_scope([("Authorization", "Bearer t")], scope_headers=("x-api-key",)) == (
        PUBLIC_SCOPE
    )


def test_only_the_configured_cookies_split_scopes() -> None:
    def scope(cookie: str) -> str:
        return auth_scope([("Cookie", cookie)], scope_cookies=("session",))

    assert scope("session=s1; _ga=GA1.1") == scope("_ga=GA1.2; session=s1")
    assert scope("session=s1") != scope("session=s2")
    assert scope("_ga=GA1.1") == PUBLIC_SCOPE
    # Every cookie counts when no names are configured.
    assert auth_scope([("Cookie", "session=s1; _ga=1")]) != auth_scope(
        [("Cookie", "session=s1; _ga=2")]
    )


def test_scope_credentials_are_what_travels_upstream() -> None:
    headers = [
        ("Accept", "*/*"),
        ("Cookie", "_ga=1; session=s1; theme=dark"),
        ("X-Api-Key", "k"),
        ("Authorization", "Bearer t"),
        ("Last-Event-ID", "0_5"),
    ]
    assert scope_credentials(
        headers, scope_headers=("authorization", "cookie", "x-api-key"), scope_cookies=("session",)
    ) == [("Cookie", "session=s1"), ("X-Api-Key", "k"), ("Authorization", "Bearer t")]
    assert scope_credentials([("Cookie", "_ga=1")], scope_cookies=("session",)) == []
    assert scope_credentials(headers) == [headers[1], headers[3]]


def test_classify_scopes_with_the_configuration() -> None:
    read = classify(
        "GET", "/s", "offset=-1", [("X-Api-Key", "k")], scope_headers=("x-api-key",)
    ).read
    assert read is not None
    assert read.scope == auth_scope([("x-api-key", "k")], scope_headers=("x-api-key",))
    assert read.scope != PUBLIC_SCOPE


def test_a_bare_request_line_has_the_kind_of_its_request() -> None:
    """What a connection refused at the cap sends is read only this far, to count by kind."""
    assert kind_of_request_line(b"GET /s?offset=-1&live=sse HTTP/1.1\r\nHo") is RequestKind.SSE
    assert kind_of_request_line(b"GET /s?live=long-poll&offset=1 HTTP/1.1\r\n") is (
        RequestKind.LONG_POLL
    )
    assert kind_of_request_line(b"POST /s HTTP/1.1\r\n") is RequestKind.WRITE
    assert kind_of_request_line(b"head /s HTTP/1.1\r\n") is RequestKind.HEAD
    assert kind_of_request_line(b"GET http://edge/s?offset=-1 HTTP/1.1\r\n") is (
        RequestKind.CATCHUP
    )
    assert kind_of_request_line(b"GET /s?offset=-1 HTTP/1.1") is None  # not whole yet
    assert kind_of_request_line(b"\x16\x03\x01 tls\r\n") is RequestKind.OTHER
    assert kind_of_request_line(b"GET /s\r\n") is RequestKind.OTHER


# --- live_query: the live fields ``classify`` reads, memoised per query string ---

_PARAM_NAMES = st.sampled_from(["offset", "live", "cursor", "other", "Live", ""])
_PARAM_VALUES = st.sampled_from(["-1", "now", "0_5", "long-poll", "sse", "", "a b", "%2D1", "1&x"])


@given(st.lists(st.tuples(_PARAM_NAMES, _PARAM_VALUES), max_size=5))
def test_live_query_reads_what_classify_reads(params: list[tuple[str, str]]) -> None:
    query = urlencode(params)
    classified = classify("GET", "/v1/stream/s", query, ())
    live = live_query(query)
    read = classified.read
    if live is None:
        assert read is None or read.live is None
        return
    if live.live not in LIVE_MODES:
        assert classified.kind is RequestKind.OTHER
        return
    assert read is not None
    assert (read.live, read.offset, read.cursor, read.plain) == (
        live.live, live.offset, live.cursor, live.plain,
    )  # fmt: skip
