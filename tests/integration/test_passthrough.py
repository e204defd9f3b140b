"""The edge in front of the real reference origin: what goes in comes out, verbatim."""

from __future__ import annotations

import asyncio
import base64
import gzip
import re
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from edge.protocol.sse import SseDecoder, SseEvent

Call = Callable[..., Awaitable[tuple[int, list[tuple[str, str]], bytes]]]

# Headers that legitimately differ between two answers: time, hop-by-hop, and this proxy's Via.
VOLATILE = {
    "date",
    "via",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "cache-status",
}
# Catch-up answers are the edge's own: its validators and caching headers differ by design.
# What the edge says itself of an answer it builds: its validator, and how each tier may keep it
# (edge.log.freshness) with the purge keys a CDN's copy goes by.
EDGE_CACHING = {"etag", "cache-control", "vary", "cdn-cache-control", "surrogate-control"}
EDGE_CACHING |= {"surrogate-key", "cache-tag", "age"}


def comparable(headers: list[tuple[str, str]], path: str, base: str) -> list[tuple[str, str]]:
    """Headers with the stream's own identity (URL, base64 path in ETag) masked out."""
    b64 = base64.b64encode(path.encode()).decode().rstrip("=")
    out = []
    for name, value in headers:
        if name.lower() in VOLATILE:
            continue
        value = value.replace(base, "<base>").replace(path, "<path>")
        out.append((name.lower(), re.sub(re.escape(b64) + "=*", "<b64>", value)))
    return out


async def call(
    http: aiohttp.ClientSession, method: str, url: str, **kwargs: object
) -> tuple[int, list[tuple[str, str]], bytes]:
    async with http.request(method, url, **kwargs) as response:  # type: ignore[arg-type]
        body = await response.read()
        return response.status, list(response.headers.items()), body


async def test_every_method_round_trips_with_headers_intact(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """The same conversation, once directly and once through the edge, looks the same."""
    transcripts = []
    for base, path in ((origin.url, stream_path + "-direct"), (edge.url, stream_path + "-edge")):
        url = base + path
        steps = [
            ("PUT", url, {"headers": {"Content-Type": "text/plain", "Stream-TTL": "3600"}}),
            ("POST", url, {"headers": {"Content-Type": "text/plain"}, "data": b"hello "}),
            ("POST", url, {"headers": {"Content-Type": "text/plain"}, "data": b"world"}),
            ("GET", url + "?offset=-1", {}),
            ("GET", url + "?offset=0000000000000000_0000000000000006", {}),
            ("HEAD", url, {}),
            ("OPTIONS", url, {}),
            ("POST", url, {"headers": {"Content-Type": "text/plain", "Stream-Closed": "true"}}),
            ("GET", url + "?offset=-1", {}),
            ("DELETE", url, {}),
            ("GET", url + "?offset=-1", {}),
            ("HEAD", url, {}),
        ]
        transcript = []
        for method, target, kwargs in steps:
            status, headers, body = await call(http, method, target, **kwargs)
            shown = comparable(headers, path, base)
            if method == "GET" and status == 200:
                shown = [(n, v) for n, v in shown if n not in EDGE_CACHING]
            transcript.append((method, status, shown, body))
        transcripts.append(transcript)
    direct, through_edge = transcripts
    assert [t[1] for t in through_edge] == [
        201,
        204,
        204,
        200,
        200,
        200,
        204,
        204,
        200,
        204,
        404,
        404,
    ]
    for step_direct, step_edge in zip(direct, through_edge, strict=True):
        assert step_edge[:2] == step_direct[:2]
        method, _, edge_headers, _ = step_edge
        if (
            method in ("GET", "HEAD")
            and step_edge[1] == 404
            and "cache-control" not in dict(step_direct[2])
        ):
            # Where the origin says nothing, the edge says no cache may keep a read's answer.
            assert dict(edge_headers).get("cache-control") == "no-store", step_edge
            edge_headers = [(n, v) for n, v in edge_headers if n != "cache-control"]
            step_edge = (method, step_edge[1], edge_headers, step_edge[3])
        assert dict(step_edge[2]) == dict(step_direct[2]), step_edge[0]
        assert step_edge == step_direct
    assert through_edge[3][3] == b"hello world"


async def test_responses_carry_via(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    status, headers, _ = await call(http, "PUT", edge.url + stream_path)
    assert status == 201
    assert {n.lower(): v for n, v in headers}["via"] == "1.1 edge"


async def test_a_request_back_round_a_loop_is_refused_and_never_relayed(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """A CDN whose backend leads back to itself, in front of the edge: the request comes back
    naming the edge in ``Via``. It gets 508 at once, on the hit path's heads too."""
    status, _, _ = await call(
        http, "PUT", origin.url + stream_path, headers={"Content-Type": "text/plain"}
    )
    assert status == 201
    before = origin.counts(stream_path)["total"]
    for method, via in (
        ("PUT", "1.1 edge, 1.1 varnish"),
        ("POST", "1.1 varnish, 1.1 edge"),
        ("GET", "HTTP/1.1 cdn, 1.1 edge (comment)"),
    ):
        status, headers, body = await call(
            http, method, f"{edge.url}{stream_path}?offset=-1", headers={"Via": via}
        )
        assert status == 508, (method, via)
        assert b"loop" in body
        assert dict(headers).get("Cache-Control") == "no-store"
    assert origin.counts(stream_path)["total"] == before
    # A Via that names another proxy is a request like any other.
    status, _, _ = await call(
        http, "GET", f"{edge.url}{stream_path}?offset=-1", headers={"Via": "1.1 varnish"}
    )
    assert status == 200


async def test_every_relayed_read_answer_says_how_it_may_be_cached(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """The origin sends no Cache-Control on a 404 or on a read the edge relays (an unknown
    parameter); a cache in front must not keep them by heuristics."""
    missing = await call(http, "GET", f"{edge.url}{stream_path}-missing?offset=-1")
    assert missing[0] == 404
    assert dict(missing[1]).get("Cache-Control") == "no-store"
    status, _, _ = await call(
        http, "PUT", origin.url + stream_path, headers={"Content-Type": "text/plain"}
    )
    assert status == 201
    relayed = await call(http, "GET", f"{edge.url}{stream_path}?offset=-1&_=1")
    assert relayed[0] == 200
    assert dict(relayed[1]).get("Cache-Control") == "no-store"
    credentialed = await call(
        http, "GET", f"{edge.url}{stream_path}?offset=-1&_=2", headers={"Cookie": "s=1"}
    )
    assert dict(credentialed[1]).get("Cache-Control") == "private, no-store"
    head = await call(http, "HEAD", f"{edge.url}{stream_path}-missing")
    assert dict(head[1]).get("Cache-Control") == "no-store"
    # A long-poll relayed for its extra parameter (a CDN's cache-buster): its 204 is no
    # tier's to keep, a CDN's included (the edge's own long-polls are, for a second).
    _, headers, _ = await call(http, "GET", f"{edge.url}{stream_path}?offset=-1")
    tail = dict(headers)["Stream-Next-Offset"]
    polled = await call(http, "GET", f"{edge.url}{stream_path}?offset={tail}&live=long-poll&_=1")
    assert polled[0] == 204
    assert dict(polled[1]).get("Cache-Control") == "no-store"
    assert not {"cdn-cache-control", "surrogate-control"} & {n.lower() for n, _ in polled[1]}
    now = await call(http, "GET", f"{edge.url}{stream_path}?offset=now")
    assert [v for n, v in now[1] if n.lower() == "cache-control"] == ["no-store"]


async def test_idempotent_producer_answers_are_relayed_verbatim(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    def producer(epoch: int, seq: int) -> dict[str, object]:
        return {
            "headers": {
                "Content-Type": "application/json",
                "Producer-Id": "agent-1",
                "Producer-Epoch": str(epoch),
                "Producer-Seq": str(seq),
            },
            "data": b'{"token":"hi"}',
        }

    results = []
    for base, path in ((origin.url, stream_path + "-direct"), (edge.url, stream_path + "-edge")):
        url = base + path
        await call(http, "PUT", url, headers={"Content-Type": "application/json"})
        answers = []
        for epoch, seq in ((0, 0), (0, 0), (0, 5), (1, 0), (0, 1)):
            status, headers, body = await call(http, "POST", url, **producer(epoch, seq))
            answers.append((status, comparable(headers, path, base), body))
        results.append(answers)
    direct, through_edge = results
    assert [a[0] for a in through_edge] == [200, 204, 409, 200, 403]
    assert through_edge == direct
    producer_headers = {n for _, headers, _ in through_edge for n, _ in headers}
    assert {"producer-epoch", "producer-seq", "producer-expected-seq"} <= producer_headers


async def test_bad_requests_get_the_origins_4xx(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    status, _, _ = await call(http, "GET", url + "?offset=not-an-offset")
    assert status == 400
    status, _, _ = await call(
        http, "PUT", url, headers={"Stream-TTL": "1", "Stream-Expires-At": "x"}
    )
    assert status in (400, 409)
    status, _, _ = await call(http, "GET", edge.url + stream_path + "-missing?offset=-1")
    assert status == 404


async def test_compressed_answers_pass_through_untouched(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    payload = b"token " * 2000
    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    await call(http, "POST", url, headers={"Content-Type": "text/plain"}, data=payload)
    status, headers, body = await call(
        http, "GET", url + "?offset=-1", headers={"Accept-Encoding": "gzip"}
    )
    assert status == 200
    assert {n.lower(): v for n, v in headers}["content-encoding"] == "gzip"
    assert gzip.decompress(body) == payload
    _, _, identity = await call(http, "GET", url + "?offset=-1")
    assert identity == payload


async def test_large_request_and_response_bodies_stream_through(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB, binary

    async def chunks() -> object:
        for start in range(0, len(payload), 100_000):
            yield payload[start : start + 100_000]

    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "application/octet-stream"})
    status, _, _ = await call(
        http, "POST", url, headers={"Content-Type": "application/octet-stream"}, data=chunks()
    )
    assert status == 204
    status, _, body = await call(http, "GET", url + "?offset=-1")
    assert status == 200
    assert body == payload


async def read_sse(
    response: aiohttp.ClientResponse, decoder: SseDecoder, until: Callable[[SseEvent], bool]
) -> list[SseEvent]:
    events: list[SseEvent] = []
    async for chunk in response.content.iter_any():
        events += decoder.feed(chunk)
        if any(until(e) for e in events):
            return events
    raise AssertionError(f"SSE ended before the expected event; got {events}")


async def test_sse_events_arrive_as_they_are_appended(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    await call(http, "POST", url, headers={"Content-Type": "text/plain"}, data=b"first")
    decoder = SseDecoder()
    async with http.get(url + "?offset=-1&live=sse") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = await asyncio.wait_for(
            read_sse(response, decoder, lambda e: e.event == "data" and "first" in e.data), 10
        )
        assert [e.data for e in first if e.event == "data"] == ["first"]
        for word in ("second", "third"):
            await call(
                http, "POST", url, headers={"Content-Type": "text/plain"}, data=word.encode()
            )
            # Each append must reach the viewer while the connection stays open, before the next.
            await asyncio.wait_for(
                read_sse(response, decoder, lambda e, w=word: e.event == "data" and w in e.data), 5
            )
            assert not response.content.at_eof()


async def test_long_poll_waits_and_relays_the_timeout_and_the_data(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    status, headers, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    tail = dict(headers)["Stream-Next-Offset"]
    status, headers, _ = await call(http, "GET", f"{url}?offset={tail}&live=long-poll")
    assert status == 204
    names = {n.lower() for n, _ in headers}
    assert {"stream-next-offset", "stream-up-to-date", "stream-cursor"} <= names

    waiting = asyncio.create_task(call(http, "GET", f"{url}?offset={tail}&live=long-poll"))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await call(http, "POST", url, headers={"Content-Type": "text/plain"}, data=b"news")
    status, _, body = await asyncio.wait_for(waiting, 5)
    assert (status, body) == (200, b"news")


async def wait_until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def open_live(origin: Origin, mode: str) -> int:
    return int(origin.counts()["open"][mode])


@pytest.mark.parametrize("mode", ["sse", "long-poll"])
async def test_client_gone_cancels_the_upstream_request(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str, mode: str
) -> None:
    url = edge.url + stream_path
    _, headers, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    tail = dict(headers)["Stream-Next-Offset"]
    before = open_live(origin, mode)

    async def watch() -> bytes:
        async with (
            aiohttp.ClientSession() as viewer,
            # An extra parameter makes the edge relay it rather than answer from its own tail.
            viewer.get(f"{url}?offset={tail}&live={mode}&via=relay") as response,
        ):
            return await response.read()

    watcher = asyncio.create_task(watch())
    # The origin's own count of open live requests proves the edge's upstream exists...
    await wait_until(lambda: open_live(origin, mode) == before + 1)
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    # ...and then that it went away with the client, well before the origin would end it (3 s).
    await wait_until(lambda: open_live(origin, mode) == before, within=1.5)


def metric_value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_by_kind(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    before = edge.metrics_text()
    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    await call(http, "GET", url + "?offset=-1")
    await call(http, "HEAD", url)
    after = edge.metrics_text()
    for kind, code in (("write", "201"), ("catchup", "200"), ("head", "200")):
        assert (
            metric_value(after, "edge_requests_total", kind=kind, code=code)
            - metric_value(before, "edge_requests_total", kind=kind, code=code)
            == 1
        )
        assert metric_value(after, "edge_origin_requests_total", kind=kind, code=code) >= 1
    for name in (
        "edge_request_duration_seconds_bucket",
        "edge_open_connections",
        "edge_origin_errors_total",
    ):
        assert name in after
