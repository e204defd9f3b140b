import pytest

from edge.protocol.headers import (
    cors_headers,
    downstream_response_headers,
    filter_cookies,
    first_value,
    joined_value,
    repeated_singleton,
    repeated_text,
    strip_hop_by_hop,
    upstream_request_headers,
)


def names(headers: list[tuple[str, str]]) -> list[str]:
    return [name.lower() for name, _ in headers]


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    headers = [
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic x"),
        ("X-Secret-Hop", "1"),
        ("Stream-Seq", "42"),
    ]
    assert strip_hop_by_hop(headers) == [("Stream-Seq", "42")]


def test_upstream_headers_keep_order_and_repeats_and_drop_host() -> None:
    headers = [
        ("Host", "edge.example"),
        ("Producer-Id", "p1"),
        ("X-Custom", "a"),
        ("X-Custom", "b"),
        ("Content-Type", "text/plain"),
    ]
    out = upstream_request_headers(
        headers, client_address="10.0.0.7", scheme="http", host="edge.example"
    )
    assert "host" not in names(out)
    kept = [(n, v) for n, v in out if n.lower() in ("producer-id", "x-custom", "content-type")]
    assert kept == headers[1:]


def test_upstream_headers_add_only_the_forwarding_trail() -> None:
    out = upstream_request_headers([], client_address="10.0.0.7", scheme="https", host="e.x")
    assert sorted(names(out)) == ["forwarded", "via", "x-forwarded-for", "x-forwarded-proto"]
    assert first_value(out, "Forwarded") == 'for=10.0.0.7;proto=https;host="e.x"'
    assert first_value(out, "X-Forwarded-For") == "10.0.0.7"
    assert first_value(out, "X-Forwarded-Proto") == "https"
    assert first_value(out, "Via") == "1.1 edge"
    for never_added in ("content-type", "accept-encoding", "user-agent", "accept"):
        assert never_added not in names(out)


def test_forwarding_trail_is_appended_to_not_replaced() -> None:
    headers = [
        ("X-Forwarded-For", "1.2.3.4"),
        ("Forwarded", "for=1.2.3.4"),
        ("Via", "1.1 cdn"),
        ("X-Forwarded-Proto", "https"),
    ]
    out = upstream_request_headers(headers, client_address="::1", scheme="http", host=None)
    assert first_value(out, "X-Forwarded-For") == "1.2.3.4, ::1"
    assert first_value(out, "Forwarded") == 'for=1.2.3.4, for="[::1]";proto=http'
    assert first_value(out, "Via") == "1.1 cdn, 1.1 edge"
    assert [v for n, v in out if n.lower() == "x-forwarded-proto"] == ["https"]
    assert names(out).count("via") == 1


def test_response_headers_relayed_verbatim_with_via() -> None:
    headers = [
        ("Stream-Next-Offset", "0_5"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("ETag", '"x:-1:0_5"'),
        ("Content-Encoding", "gzip"),
        ("Connection", "keep-alive"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
    ]
    out = downstream_response_headers(headers, origin_base="http://o:1", public_base="http://e")
    assert out[:5] == headers[:5]
    assert out[5:] == [("Via", "1.1 edge")]


def test_location_at_the_origin_is_rebased_to_the_edge() -> None:
    def location(value: str) -> str | None:
        out = downstream_response_headers(
            [("Location", value)], origin_base="http://o:1/base", public_base="https://edge.example"
        )
        return first_value(out, "location")

    assert location("http://o:1/base/v1/s") == "https://edge.example/v1/s"
    assert location("http://o:1/based/x") == "http://o:1/based/x"
    assert location("https://elsewhere/x") == "https://elsewhere/x"


@pytest.mark.parametrize(
    ("cookie", "kept"),
    [
        ("session=s1; _ga=GA1.2.3", "session=s1"),
        ("_ga=GA1.2.3; session=s1", "session=s1"),
        ("_ga=1", None),
        ("", None),
        ("session=s1;_ga=1;csrf=x", "session=s1; csrf=x"),
        ("  session = s1 ;  csrf=x  ", "session = s1; csrf=x"),
        ('session="a b"; _ga=1', 'session="a b"'),
        ("session=a=b; _ga=1", "session=a=b"),  # the value is everything after the first =
        ("session=; _ga=1", "session="),
        ("session; _ga=1", None),  # no "=": no cookie named session
        ("Session=s1", None),  # names are case-sensitive
        ("session=s1; session=s2", "session=s1; session=s2"),  # repeats, in order
        ("_session=1; sessions=2", None),
    ],
)
def test_cookie_header_cut_to_named_cookies(cookie: str, kept: str | None) -> None:
    assert filter_cookies(cookie, {"session", "csrf"}) == kept


def test_cors_headers_are_picked_out_in_order() -> None:
    answer = [
        ("content-type", "text/plain"),
        ("access-control-allow-origin", "*"),
        ("Access-Control-Expose-Headers", "Stream-Next-Offset"),
        ("x-content-type-options", "nosniff"),
        ("cross-origin-resource-policy", "cross-origin"),
        ("stream-next-offset", "0_5"),
    ]
    assert cors_headers(answer) == tuple(answer[1:5])
    assert cors_headers([("content-type", "text/plain")]) == ()


def test_a_via_naming_the_edge_is_a_loop_and_no_other_is() -> None:
    from edge.protocol.headers import names_this_proxy

    assert names_this_proxy(["1.1 edge"])
    assert names_this_proxy(["1.1 varnish, 1.1 edge"])
    assert names_this_proxy(["1.0 cdn", "HTTP/1.1 edge (a comment)"])
    assert not names_this_proxy([])
    assert not names_this_proxy(["1.1 varnish", "1.1 edge-cdn", "1.1 myedge"])
    assert not names_this_proxy(["edge"])  # no protocol: not an element naming a proxy


def test_a_read_without_cache_control_gets_no_store() -> None:
    from edge.protocol.headers import default_cache_control

    assert default_cache_control([], method="GET", private=False) == "no-store"
    assert default_cache_control([], method="HEAD", private=True) == "private, no-store"
    assert (
        default_cache_control([("cache-control", "max-age=5")], method="GET", private=False) is None
    )
    assert default_cache_control([], method="POST", private=False) is None


def test_a_relayed_read_is_no_tiers_to_keep_whatever_the_origin_said() -> None:
    """No validator, never checked against the stream instance, unreachable by a purge: a
    relayed read's answer gets ``no-store`` in place of any lifetime it had, a CDN's included;
    an event stream keeps what it says (``no-cache, no-transform``); writes are left alone."""
    from edge.protocol.headers import relayed_read_cache_control, with_cache_control

    origin_said = [
        ("Content-Type", "text/plain"),
        ("Cache-Control", "public, max-age=60"),
        ("Surrogate-Control", "max-age=3600"),
        ("ETag", '"t"'),
        ("CDN-Cache-Control", "max-age=3600"),
        ("cache-control", "stale-while-revalidate=300"),
    ]
    for method in ("GET", "HEAD", "get"):
        control = relayed_read_cache_control(origin_said, method=method, private=False)
        assert control == "no-store"
    assert relayed_read_cache_control([], method="GET", private=True) == "private, no-store"
    assert relayed_read_cache_control(origin_said, method="POST", private=False) is None
    sse = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache, no-transform")]
    assert relayed_read_cache_control(sse, method="GET", private=False, event_stream=True) is None
    assert (
        relayed_read_cache_control(sse[:1], method="GET", private=False, event_stream=True)
        == "no-store"
    )
    # In the place of the first Cache-Control, every other lifetime gone.
    assert with_cache_control(origin_said, "no-store") == [
        ("Content-Type", "text/plain"),
        ("Cache-Control", "no-store"),
        ("ETag", '"t"'),
    ]
    assert with_cache_control([("ETag", '"t"')], "no-store") == [
        ("ETag", '"t"'),
        ("Cache-Control", "no-store"),
    ]


def test_a_list_fields_lines_are_one_value() -> None:
    """RFC 9110 §5.3: field lines of a list field are one comma-separated list; an empty line
    adds no element; both paths read ``If-None-Match`` and ``Accept-Encoding`` so."""
    headers = [("If-None-Match", '"a"'), ("Host", "h"), ("if-none-match", '"b", "c"')]
    assert joined_value(headers, "If-None-Match") == '"a", "b", "c"'
    assert (
        joined_value([("Accept-Encoding", ""), ("Accept-Encoding", "gzip")], "accept-encoding")
        == "gzip"
    )
    assert joined_value([("Accept-Encoding", "")], "accept-encoding") == ""
    assert joined_value(headers, "accept-encoding") is None


def test_a_repeated_field_whose_one_value_changes_the_answer_is_named() -> None:
    assert repeated_singleton([("Origin", "https://a"), ("X", "1")]) is None
    assert repeated_singleton([("Origin", "https://a"), ("origin", "https://b")]) == "origin"
    twice = [("Last-Event-ID", "1"), ("Origin", "o"), ("last-event-id", "2"), ("Origin", "p")]
    assert repeated_singleton(twice) == "last-event-id"
    assert repeated_singleton([("Via", "1.1 a"), ("Via", "1.1 b")]) is None  # a list field
    assert repeated_text("origin") == "the Origin header may be sent only once"
