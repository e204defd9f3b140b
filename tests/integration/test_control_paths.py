"""The origin's control API (subscriptions under ``{stream-url}/__ds/…``, PROTOCOL.md 6 and 7)
through the edge, against the real reference origin (0.3.7 routes ``/v1/stream/__ds/…``): every
request is relayed as sent and answered as the origin alone answers it; none is stored,
collapsed or fanned out, and none changes what the edge holds of any stream."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import aiohttp

from devstack.processes import Edge, Origin

CONTROL = "/v1/stream/__ds"
RELAYED = "edge; fwd=bypass; detail=control"
# Headers that legitimately differ between two answers: time, hop-by-hop, this proxy's own.
VOLATILE = {"date", "via", "connection", "keep-alive", "transfer-encoding", "cache-status"}

Step = tuple[str, str, dict[str, object]]
Seen = tuple[str, str, int, dict[str, str], bytes]


def json_body(value: object) -> dict[str, object]:
    return {"data": json.dumps(value), "headers": {"Content-Type": "application/json"}}


def conversation(name: str) -> list[Step]:
    """A subscription's life, as a worker and its operator see it: ``name`` tells apart two
    conversations with the one origin."""
    sub = f"{CONTROL}/subscriptions/{name}"
    events, wake = f"events/{name}", f"wake/{name}"
    pull = {"type": "pull-wake", "streams": [events], "wake_stream": wake, "lease_ttl_ms": 5000}
    return [
        ("PUT", f"/v1/stream/{events}", {"headers": {"Content-Type": "application/json"}}),
        ("PUT", f"/v1/stream/{wake}", {"headers": {"Content-Type": "application/json"}}),
        ("GET", sub, {}),  # not yet: 404
        ("PUT", sub, json_body(pull)),  # 201
        ("PUT", sub, json_body(pull)),  # the same again: 200
        ("PUT", sub, json_body({**pull, "lease_ttl_ms": 6000})),  # another: 409
        (
            "PUT",
            f"{CONTROL}/subscriptions/{name}-hook",
            json_body(
                {
                    "type": "webhook",
                    "pattern": "x/*",
                    "webhook": {"url": "https://worker.example/h"},
                }
            ),
        ),
        ("GET", sub, {}),
        ("GET", sub + "?offset=-1", {}),
        ("GET", sub + "?offset=-1&live=sse", {}),
        ("GET", sub + "?offset=-1&live=long-poll&cursor=1", {}),
        ("GET", sub, {"headers": {"If-None-Match": '"x"'}}),
        ("HEAD", sub, {}),
        ("OPTIONS", sub, {}),
        ("POST", sub + "/streams", json_body({"streams": [f"events/{name}-b"]})),
        ("POST", sub + "/claim", json_body({"worker": "w1"})),  # nothing pending: 409
        ("POST", sub + "/ack", json_body({})),  # no token: 401
        ("DELETE", sub + "/streams/" + quote(f"events/{name}-b", safe=""), {}),
        ("GET", f"{CONTROL}/jwks.json", {}),
        ("POST", f"{CONTROL}/jwks.json", {}),
        ("GET", f"{CONTROL}/elsewhere?offset=-1", {}),
        ("GET", CONTROL, {}),
        ("DELETE", sub, {}),
        ("GET", sub, {}),
    ]


async def run(http: aiohttp.ClientSession, base: str, name: str) -> list[Seen]:
    seen: list[Seen] = []
    for method, target, kwargs in conversation(name):
        async with http.request(method, base + target, **kwargs) as answer:  # type: ignore[arg-type]
            body = await answer.read()
            headers = {n.lower(): v for n, v in answer.headers.items()}
        seen.append((method, target, answer.status, headers, body))
    return seen


def comparable(seen: Seen, name: str) -> tuple[str, str, int, dict[str, str], bytes]:
    method, target, status, headers, body = seen
    body = re.sub(rb'"created_at":"[^"]*"', b'"created_at":"<t>"', body).replace(
        name.encode(), b"<name>"
    )
    kept = {n: v for n, v in headers.items() if n not in VOLATILE and n != "content-length"}
    return method, target.replace(name, "<name>"), status, kept, body


async def test_the_subscription_api_answers_through_the_edge_as_the_origin_alone(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    tag = stream_path.rsplit("/", 1)[-1]
    direct = await run(http, origin.url, tag + "-o")
    through = await run(http, edge.url, tag + "-e")
    assert [s[2] for s in through[2:]] == [
        404, 201, 200, 409, 400, 200, 200, 200, 200, 200, 405, 204,
        204, 409, 401, 204, 200, 405, 404, 404, 204, 404,
    ]  # fmt: skip
    for mine, theirs in zip(through, direct, strict=True):
        if not mine[1].startswith(CONTROL):
            continue
        assert mine[3]["cache-status"] == RELAYED, mine[:3]
        ours = comparable(mine, tag + "-e")
        alone = comparable(theirs, tag + "-o")
        if mine[0] in ("GET", "HEAD") and "cache-control" not in alone[3]:
            # Where the origin says nothing, no cache may keep a relayed read's answer.
            assert ours[3].pop("cache-control") == "no-store", ours
        assert ours == alone
    jwks = next(s for s in through if s[1].endswith("/jwks.json") and s[0] == "GET")
    assert jwks[3]["cache-control"] == "public, max-age=300"  # the origin's word, kept


async def test_every_control_read_reaches_the_origin_as_sent_and_none_is_stored(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    name = stream_path.rsplit("/", 1)[-1]
    sub = f"{CONTROL}/subscriptions/{name}"
    async with http.put(
        edge.url + f"/v1/stream/wake/{name}", headers={"Content-Type": "application/json"}
    ):
        pass
    pull = {"type": "pull-wake", "pattern": f"events/{name}/*", "wake_stream": f"wake/{name}"}
    async with http.put(edge.url + sub, **json_body(pull)) as created:  # type: ignore[arg-type]
        assert created.status == 201
    origin.reset_counts()
    targets = ["", "", "?offset=-1", "?offset=-1", "?offset=-1&live=sse", "?offset=-1&live=sse"]
    targets += ["?offset=-1&live=long-poll&cursor=5"] * 2
    bodies = []
    for query in targets:
        async with http.get(edge.url + sub + query) as answer:
            assert answer.status == 200
            assert answer.headers["Cache-Status"] == RELAYED
            assert "ETag" not in answer.headers  # the origin gives none; the edge makes none
            bodies.append(await answer.read())
        # Even asked with what a stored answer would be validated by, the origin answers.
        async with http.get(edge.url + sub + query, headers={"If-None-Match": "*"}) as again:
            assert again.status == 200
            assert again.headers["Cache-Status"] == RELAYED
    assert len(set(bodies)) == 1
    jwks = f"{CONTROL}/jwks.json"
    for _ in range(3):
        async with http.get(edge.url + jwks) as answer:
            assert answer.status == 200
            assert answer.headers["Cache-Status"] == RELAYED
    asked = origin.counts(sub)["requests"]
    # Each read reached the origin once, with the query the client sent (none added).
    sent = {(request["offset"], request["live"]): request["count"] for request in asked}
    assert sent == {(None, None): 4, ("-1", None): 4, ("-1", "sse"): 4, ("-1", "long-poll"): 4}
    assert origin.counts(jwks)["total"] == 3
    metrics = edge.metrics_text()
    assert 'edge_requests_total{code="200",kind="control"}' in metrics


async def test_control_requests_leave_what_the_edge_holds_of_streams_alone(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """A stream the edge serves from its cache stays served from it across a subscription's
    whole life, its own path and the control paths that name it included."""
    name = stream_path.rsplit("/", 1)[-1]
    stream = f"/v1/stream/events/{name}"
    sub = f"{CONTROL}/subscriptions/{name}"
    async with http.put(
        edge.url + stream, data=b'{"a":1}', headers={"Content-Type": "application/json"}
    ):
        pass
    for _ in range(2):
        async with http.get(edge.url + stream + "?offset=-1") as read:
            assert read.status == 200
            etag = read.headers["ETag"]
    steps: list[Step] = [
        ("PUT", f"/v1/stream/wake/{name}", {"headers": {"Content-Type": "application/json"}}),
        (
            "PUT",
            sub,
            json_body(
                {"type": "pull-wake", "streams": [f"events/{name}"], "wake_stream": f"wake/{name}"}
            ),
        ),
        ("POST", sub + "/streams", json_body({"streams": [f"events/{name}"]})),
        ("GET", sub + "/streams/" + quote(f"events/{name}", safe="") + "?offset=-1", {}),
        ("DELETE", sub + "/streams/" + quote(f"events/{name}", safe=""), {}),
        ("DELETE", sub, {}),
        ("GET", sub, {}),  # 404: no such subscription, which says nothing of a stream
        ("DELETE", sub, {}),
    ]
    for method, target, kwargs in steps:
        async with http.request(method, edge.url + target, **kwargs) as answer:  # type: ignore[arg-type]
            await answer.read()
    origin.reset_counts()
    async with http.get(edge.url + stream + "?offset=-1") as read:
        assert read.status == 200
        assert read.headers["Cache-Status"] == "edge; hit"
        assert read.headers["ETag"] == etag
        assert await read.read() == b'[{"a":1}]'
    assert origin.counts(stream)["total"] == 0


async def test_a_stream_named_with_ds_is_what_the_origin_makes_of_it(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """``__ds`` inside a segment names an ordinary stream, cached as any; a ``__ds`` segment
    below the reference origin's reserved one is a stream there, and the edge, which cannot know
    the origin's stream root, relays it: every answer is the origin's own."""
    name = stream_path.rsplit("/", 1)[-1]
    inside = f"/v1/stream/notes__ds-{name}"
    async with http.put(edge.url + inside, data=b"hi", headers={"Content-Type": "text/plain"}):
        pass
    statuses = []
    for _ in range(2):
        async with http.get(edge.url + inside + "?offset=-1") as read:
            statuses.append(read.headers["Cache-Status"])
            assert await read.read() == b"hi"
    assert statuses[-1] == "edge; hit"

    transcripts = []
    for base, path in (
        (origin.url, f"/v1/stream/{name}/__ds/o"),
        (edge.url, f"/v1/stream/{name}/__ds/e"),
    ):
        steps: list[Step] = [
            ("PUT", path, {"headers": {"Content-Type": "text/plain"}, "data": b"abc"}),
            ("POST", path, {"headers": {"Content-Type": "text/plain"}, "data": b"def"}),
            ("GET", path + "?offset=-1", {}),
            ("GET", path + "?offset=-1", {}),
            ("HEAD", path, {}),
            ("DELETE", path, {}),
            ("GET", path + "?offset=-1", {}),
        ]
        transcript = []
        for method, target, kwargs in steps:
            async with http.request(method, base + target, **kwargs) as answer:  # type: ignore[arg-type]
                body = await answer.read()
                headers = {n.lower(): v for n, v in answer.headers.items()}
            if base == edge.url:
                assert headers.pop("cache-status") == RELAYED
            kept = {
                n: v.replace(base, "<base>").replace(path, "<path>")
                for n, v in headers.items()
                if n not in VOLATILE and n not in ("etag", "content-length")
            }
            transcript.append((method, answer.status, kept, body))
        transcripts.append(transcript)
    for ours, alone in zip(transcripts[1], transcripts[0], strict=True):
        if ours[0] in ("GET", "HEAD") and "cache-control" not in alone[2]:
            assert ours[2].pop("cache-control") == "no-store"  # where the origin said none
        assert ours == alone
    assert [t[1] for t in transcripts[1]] == [201, 204, 200, 200, 200, 204, 404]
