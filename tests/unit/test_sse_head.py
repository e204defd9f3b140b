"""The SSE head the connection writes is remembered per kind of answer (``sse_head_start``):
whatever the origin's CORS policy and a stream's headers become, each open gets the bytes a
fresh serialisation of the full path's headers (``sse_head_headers``) gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.log.stream_log import LogKey, StreamInstance, StreamLog
from edge.protocol.http1 import serialise
from edge.web.fast_sse import sse_head_headers, sse_head_start
from edge.web.proxy import OriginCors

ORIGINS = st.sampled_from([None, "https://a.example", "https://b.example"])
GRANTS = st.sampled_from(
    [
        [("Access-Control-Allow-Origin", "*")],
        [("Access-Control-Allow-Origin", "https://a.example"), ("Vary", "Origin")],
        [("Access-Control-Allow-Origin", "https://b.example")],
        [("Access-Control-Allow-Origin", "*"), ("X-Content-Type-Options", "nosniff")],
        [("Content-Type", "text/plain")],  # no CORS: teaches nothing
    ]
)
TEMPLATES = st.sampled_from(
    [(), (("X-Content-Type-Options", "nosniff"),), (("Vary", "Origin"), ("X-Custom", "1"))]
)
TYPES = st.sampled_from([None, "text/plain", "application/json", "application/octet-stream"])
STEP = st.one_of(
    st.tuples(st.just("learn"), ORIGINS, GRANTS),
    st.tuples(st.just("template"), TEMPLATES, TYPES),
    st.tuples(st.just("open"), ORIGINS, st.booleans()),
)


def fresh(log: StreamLog, cors: OriginCors, origin: str | None, chunked: bool) -> bytes:
    headers = sse_head_headers(log, cors, origin)
    return serialise(200, list(headers.items()), 0, chunked=chunked, close_delimited=not chunked)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=30))
def test_a_remembered_head_is_always_the_fresh_one(steps: list[tuple[object, ...]]) -> None:
    cors = OriginCors()
    log = StreamLog(key=LogKey(stream="/v1/stream/s", scope="public"))
    log.instance = StreamInstance(stream="/v1/stream/s", content_type="text/plain")
    for step in steps:
        match step:
            case ("learn", origin, grant):
                cors.remember(origin, grant)
            case ("template", template, content_type):
                log.header_template = template
                log.instance = StreamInstance(stream="/v1/stream/s", content_type=content_type)
            case ("open", origin, chunked):
                remembered = sse_head_start(
                    cors.grant(origin),
                    cors.varies,
                    log.header_template,
                    log.content_type,
                    chunked,
                )
                assert remembered == fresh(log, cors, origin, chunked)
            case _:
                raise AssertionError(step)


def test_a_changed_policy_changes_the_head() -> None:
    cors = OriginCors()
    log = StreamLog(key=LogKey(stream="/v1/stream/s", scope="public"))
    cors.remember(None, [("Access-Control-Allow-Origin", "*")])
    before = sse_head_start(cors.grant(None), cors.varies, (), "text/plain", True)
    cors.remember("https://a.example", [("Access-Control-Allow-Origin", "https://a.example")])
    after = sse_head_start(
        cors.grant("https://a.example"), cors.varies, log.header_template, "text/plain", True
    )
    assert b"access-control-allow-origin: *" in before.lower()
    assert b"access-control-allow-origin: https://a.example" in after.lower()
    assert b"vary: origin" in after.lower()
