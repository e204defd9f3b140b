"""The origin's control API (``{stream-url}/__ds/…``, PROTOCOL.md 6) is one named outcome of the one
classification both paths make: ``control`` for the full path, no ``AnswerKey`` for the fast one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.protocol.answer_key import answer_key
from edge.protocol.paths import names_control, normalise_path
from edge.protocol.reads import PUBLIC_SCOPE, RequestKind, classify

METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "get")
QUERIES = ("", "offset=-1", "offset=-1&live=sse", "offset=0_5&live=long-poll&cursor=7", "x=1")


@pytest.mark.parametrize(
    "target",
    [
        "/v1/stream/__ds",
        "/v1/stream/__ds/",
        "/v1/stream/__ds/subscriptions/sub-1",
        "/v1/stream/__ds/subscriptions/sub-1/claim",
        "/v1/stream/__ds/subscriptions/sub-1/streams/events%2Fa",
        "/v1/stream/__ds/jwks.json",
        "/__ds/subscriptions/a",  # an origin whose stream root is /
        "/tenant/streams/__ds/jwks.json",  # one embedded under another root
        "/v1/stream/x/../__ds/subscriptions/a",  # as the origin resolves it
        "/v1/stream/./__ds/jwks.json",
        "/v1/stream\\__ds\\jwks.json",
        "/v1/stream/%5F%5Fds/jwks.json",  # a decoding origin (Go's r.URL.Path) routes it so
        "/v1/stream/_%5fds/subscriptions/a",
    ],
)
def test_every_method_and_query_of_a_control_path_is_control(target: str) -> None:
    stream = normalise_path(target)
    assert names_control(stream)
    for method in METHODS:
        for query in QUERIES:
            classified = classify(method, stream, query, [("Authorization", "Bearer t")])
            assert classified.kind is RequestKind.CONTROL, (method, query)
            assert classified.read is None  # nothing the cache could key on
    for head in (False, True):
        assert answer_key(stream, "offset=-1", PUBLIC_SCOPE, "gzip", None, False, head) is None


@pytest.mark.parametrize(
    "target",
    [
        "/v1/stream/notes__ds",  # __ds inside a segment is an ordinary stream name
        "/v1/stream/__ds_archive/a",
        "/v1/stream/x__ds/y",
        "/v1/stream/__DS/a",  # origins compare the segment case-sensitively
        "/v1/stream/__d/s",
        "/v1/stream/ds",
    ],
)
def test_a_stream_that_only_contains_the_letters_is_a_stream(target: str) -> None:
    stream = normalise_path(target)
    assert not names_control(stream)
    assert classify("GET", stream, "offset=-1", []).kind is RequestKind.CATCHUP
    assert classify("GET", stream, "offset=-1&live=sse", []).kind is RequestKind.SSE
    assert classify("HEAD", stream, "", []).kind is RequestKind.HEAD
    assert classify("PUT", stream, "", []).kind is RequestKind.WRITE
    assert answer_key(stream, "offset=-1", PUBLIC_SCOPE, None, None, False) is not None


SEGMENT = st.text(alphabet="abcdz_.-%25F", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)


@given(
    before=st.lists(SEGMENT, max_size=4),
    after=st.lists(SEGMENT, max_size=4),
    method=st.sampled_from(METHODS),
    query=st.sampled_from(QUERIES),
)
def test_a_ds_segment_anywhere_makes_any_request_control(
    before: list[str], after: list[str], method: str, query: str
) -> None:
    stream = normalise_path("/" + "/".join([*before, "__ds", *after]))
    assert classify(method, stream, query, []).kind is RequestKind.CONTROL
    assert answer_key(stream, query, PUBLIC_SCOPE, None, None, False) is None


@given(segments=st.lists(SEGMENT, min_size=1, max_size=6), method=st.sampled_from(METHODS))
def test_control_is_exactly_a_segment_that_decodes_to_ds(segments: list[str], method: str) -> None:
    stream = normalise_path("/" + "/".join(segments))
    decoded = {bytes.fromhex("5f5f6473").decode()}  # "__ds", spelt apart from the code's constant
    expected = any(_decode(segment) in decoded for segment in stream.split("/") if segment)
    kind = classify(method, stream, "offset=-1", []).kind
    assert (kind is RequestKind.CONTROL) == expected


def _decode(segment: str) -> str:
    from urllib.parse import unquote

    return unquote(segment, errors="replace")
