"""Resume routes end to end, with real processes: the official MCP SDK's server (stateless, no
event store: alone, a dropped call is lost) and its client, the reference origin, two edges.

A call dropped on one edge resumes on the other: what was missed is replayed, then the rest
comes live, then the result; nothing twice. Two sessions never see each other's events; another
credential finds nothing; no ``Last-Event-ID`` reaches the upstream."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from devstack.mcp_client import CallLog, call, count_call, text_of
from devstack.processes import Edge, Origin, start_edge
from edge.protocol.sse import SseDecoder
from edge.resume.ids import parse_id
from tests.integration.resume_support import (
    CALL,
    MCP_HEADERS,
    Backend,
    RestartableOrigin,
    answers_heard,
    dropped_call,
    kept_at,
    kept_so_far,
    messages,
    read_resume,
    slow_ended,
    sse_events,
    start_backend,
    steps_and_end,
    two_edges,
    until,
    until_kept,
)

pytestmark = pytest.mark.timeout(120)


@dataclass
class Stand:
    backend: Backend
    a: Edge
    b: Edge


@pytest.fixture(scope="module")
def stand(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    logs = tmp_path_factory.mktemp("resume")
    backend = start_backend(logs)
    routes = (*backend.mcp_route(), *backend.raw_route())
    with two_edges(origin.url, logs, ("edge-a", "edge-b"), *routes) as (a, b):
        yield Stand(backend=backend, a=a, b=b)
    backend.stop()


async def test_a_call_dropped_on_one_edge_resumes_on_the_other(
    stand: Stand, origin: Origin
) -> None:
    calls_before = sum(1 for line in stand.backend.seen_lines() if line.get("tool") == "count")
    # The lift: the client's connection to edge A is gone mid-call.
    first = await dropped_call(stand.a.url + "/mcp", count_call(8, 0.4), 3)
    point = parse_id(first.tokens[2])
    assert point is not None
    # The call goes on without its client: wait until two events it missed are kept, so the
    # resume replays them and hears the rest live.
    await until_kept(origin, point.token, 5)
    second = CallLog()
    resume_from = first.tokens[2]
    result = await call(stand.b.url + "/mcp", count_call(8, 0.3), second, resume_from=resume_from)
    assert text_of(result) == "counted 8"
    # Everything after the third event, once each, in order (4 and 5 replayed, the rest live),
    # then the result.
    assert second.steps() == [4.0, 5.0, 6.0, 7.0, 8.0]
    kept, closed = await kept_so_far(origin, point.token)
    assert closed
    assert len(kept) == 9  # 8 progress notifications and the result, each kept once
    assert all(parse_id(token) is not None for token in [*first.tokens, *second.tokens])
    seen = stand.backend.seen_lines()
    assert sum(1 for line in seen if line.get("tool") == "count") == calls_before + 1
    assert all(line.get("last_event_id") is None for line in seen if "method" in line)


async def test_sixteen_sessions_never_see_each_others_events(stand: Stand) -> None:
    sessions = 16
    heard = [CallLog() for _ in range(sessions)]
    steps = [3 + index % 4 for index in range(sessions)]
    results = await asyncio.gather(
        *(
            call(
                (stand.a if index % 2 else stand.b).url + "/mcp",
                count_call(steps[index], 0.05),
                heard[index],
            )
            for index in range(sessions)
        )
    )
    for index, result in enumerate(results):
        assert text_of(result) == f"counted {steps[index]}"
        assert heard[index].steps() == [float(step) for step in range(1, steps[index] + 1)]
    answers = answers_heard(heard)
    assert all(len(own) == 1 for own in answers)  # each session heard its own answer only
    assert len(set().union(*answers)) == sessions


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def test_another_credential_finds_nothing(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    alice = {**MCP_HEADERS, "Authorization": "Bearer alice"}
    async with client.post(stand.a.url + "/mcp", json=CALL, headers=alice) as answer:
        assert answer.status == 200
        assert answer.headers["Edge-Resume-Stream"].startswith("/_edge/resume/")
        events = await sse_events(answer, SseDecoder())
    assert [message.get("id") for message in messages(events)][-1] == 42
    first_id = events[0].id
    assert first_id is not None
    assert parse_id(first_id) is not None
    for who in ({"Authorization": "Bearer mallory"}, {}):
        async with client.get(
            stand.b.url + "/mcp", headers={**who, "Last-Event-ID": first_id}
        ) as refused:
            assert refused.status == 404
    # Every alias of the route's path is the route's, on the fast path as on the full one.
    for alias in ("/./mcp", "/x/../mcp", "/%2e/mcp"):
        async with client.get(
            URL(stand.b.url + alias, encoded=True), headers={"Last-Event-ID": first_id}
        ) as aliased:
            assert aliased.status == 404
            assert await aliased.text() == "no such answer\n"
    tampered = "A" * 24 + first_id[24:]
    async with client.get(
        stand.b.url + "/mcp", headers={"Authorization": "Bearer alice", "Last-Event-ID": tampered}
    ) as unknown:
        assert unknown.status == 404
    async with client.get(
        stand.b.url + "/mcp", headers={"Authorization": "Bearer alice", "Last-Event-ID": first_id}
    ) as resumed:
        # The call's one event was its result: after it, the end (a 204).
        assert [message.get("id") for message in messages(events)] == [42]
        assert resumed.status == 204
    counted = stand.b.metrics_text()
    assert re.search(r'^edge_resumes_total\{result="served"\} [1-9]', counted, re.MULTILINE)
    assert re.search(r'^edge_resumes_total\{result="not_found"\} [1-9]', counted, re.MULTILINE)
    assert all(line.get("last_event_id") is None for line in stand.backend.seen_lines())


async def test_an_upstream_that_ends_early_owes_an_error_and_keeps_its_ids(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    async with client.post(
        stand.a.url + "/raw/ends-early", json=CALL, headers=MCP_HEADERS
    ) as answer:
        assert answer.status == 200
        events = await sse_events(answer, SseDecoder())
    progress, error = messages(events)
    assert progress["method"] == "notifications/progress"
    assert error["id"] == 42
    assert error["error"]["code"] == -32000
    # The upstream's own ids and its priming event never reach the client.
    assert all(e.id is not None and parse_id(e.id) is not None for e in events)
    assert all(e.data != "" for e in events)


async def test_what_is_relayed_as_it_is(stand: Stand, client: aiohttp.ClientSession) -> None:
    modern = {**MCP_HEADERS, "MCP-Protocol-Version": "2026-07-28"}
    async with client.post(stand.a.url + "/raw/ends-early", json=CALL, headers=modern) as answer:
        assert "Edge-Resume-Stream" not in answer.headers
        events = await sse_events(answer, SseDecoder())
    assert [e.id for e in events] == ["up-0", "up-1"]  # the upstream's, untouched
    async with client.post(stand.a.url + "/raw/json", json=CALL, headers=MCP_HEADERS) as plain:
        assert plain.status == 200
        assert "Edge-Resume-Stream" not in plain.headers
        assert await plain.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
    # A GET that declares MCP opens MCP's standalone stream (which the SDK's stateless server
    # holds open): it is relayed, never pumped, since it has no end of its own (a browser's GET
    # is kept: test_a_browsers_get_is_kept...). A DELETE is relayed as it is.
    async with client.get(stand.a.url + "/mcp", headers=MCP_HEADERS) as standalone:
        assert standalone.status == 200
        assert standalone.headers["Content-Type"].startswith("text/event-stream")
        assert "Edge-Resume-Stream" not in standalone.headers
    # Its client gone, the relay ends (and with it the backend's request).
    gone = re.compile(r'^edge_clients_gone_total\{kind="other"\} [1-9]', re.MULTILINE)
    await until(lambda: gone.search(stand.a.metrics_text()) is not None)
    async with client.delete(stand.a.url + "/mcp", headers=MCP_HEADERS) as deleted:
        assert "Edge-Resume-Stream" not in deleted.headers
    methods = [line["method"] for line in stand.backend.seen_lines() if "method" in line]
    assert methods[-2:] == ["GET", "DELETE"]
    assert "edge_resume_pumps 0.0" in stand.a.metrics_text()


async def test_a_browsers_get_is_kept_and_resumed_with_the_edges_cors(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    # A GET without an id that declares nothing of MCP (a browser's EventSource can send no
    # header of its own) is kept like a POST: its answer resumes on any replica.
    page = {"Origin": "http://page.example", "Accept": "text/event-stream"}
    async with client.get(stand.a.url + "/raw/slow?tag=get", headers=page) as answer:
        assert answer.status == 200
        assert answer.headers["Access-Control-Allow-Origin"] == "*"  # the origin's grant
        exposed = answer.headers["Access-Control-Expose-Headers"].lower()
        assert "edge-resume-stream" in exposed
        events = await sse_events(answer, SseDecoder(), 5)
    assert events[4].id is not None
    async with client.get(
        stand.b.url + "/raw/slow?tag=get", headers={**page, "Last-Event-ID": events[4].id}
    ) as resumed:
        assert resumed.status == 200
        assert resumed.headers["Access-Control-Allow-Origin"] == "*"
        rest = await sse_events(resumed, SseDecoder())
    steps, final = steps_and_end(rest)
    assert steps == list(range(6, 21))
    assert final["id"] == 42
    assert await slow_ended(stand.backend, "get") == "finished"  # its client left; the pump did not
    # At the end, a resume finds nothing more: 204, where an EventSource stops (an empty 200
    # would have it reconnect for ever).
    last = rest[-1].id
    assert last is not None
    async with client.get(
        stand.a.url + "/raw/slow", headers={**page, "Last-Event-ID": last}
    ) as ended:
        assert ended.status == 204
        assert ended.headers["Access-Control-Allow-Origin"] == "*"
    # The edge's 404 and its preflight answers carry the same CORS.
    forged = last.replace(last[0], "A" if last[0] != "A" else "B", 1)
    async with client.get(
        stand.b.url + "/raw/slow", headers={**page, "Last-Event-ID": forged}
    ) as unknown:
        assert unknown.status == 404
        assert unknown.headers["Access-Control-Allow-Origin"] == "*"
    asking = {
        "Origin": "http://page.example",
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "last-event-id",
    }
    methods_before = [line["method"] for line in stand.backend.seen_lines() if "method" in line]
    async with client.options(stand.b.url + "/raw/slow", headers=asking) as preflight:
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == "*"
        allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
        assert "last-event-id" in allowed
        assert "GET" in preflight.headers["Access-Control-Allow-Methods"]
    methods = [line["method"] for line in stand.backend.seen_lines() if "method" in line]
    assert methods == methods_before  # the preflight is the edge's: nothing went upstream
    paths = [line["path"] for line in stand.backend.seen_lines() if line.get("method") == "GET"]
    assert paths.count("/raw/slow") == 1  # the resumes never reached the upstream


@pytest.fixture
def own_edge(
    origin: Origin, stand: Stand, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Edge]]:
    """Edges of the test's own, on the stand's routes, which it may stop."""
    started: list[Edge] = []

    def start(*extra: str) -> Edge:
        logs = tmp_path_factory.mktemp("own-edge")
        edge = start_edge(origin.url, logs, *stand.backend.mcp_route(), *extra, name="edge-own")
        started.append(edge)
        return edge

    yield start
    for edge in started:
        if edge.process.alive():
            edge.stop()


async def test_a_stopped_edge_ends_its_answers_with_what_they_owe(
    stand: Stand, own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    relaying = own_edge("--drain-seconds", "0")
    alice = {**MCP_HEADERS, "Authorization": "Bearer alice"}
    async with client.post(relaying.url + "/mcp", json=long_call(40, 0.1), headers=alice) as answer:
        events = await sse_events(answer, SseDecoder(), 2)
    relaying.stop()  # SIGTERM while the call is still running
    assert events[1].id is not None
    rest = await read_resume(
        client, stand.b.url + "/mcp", events[1].id, {"Authorization": "Bearer alice"}
    )
    steps, ending = steps_and_end(rest)
    assert steps == list(range(3, 3 + len(steps)))  # what was kept, none twice, none missing
    assert len(steps) < 38  # the call was cut short by the stop
    assert ending["id"] == 42
    assert ending["error"]["code"] == -32000


async def test_an_answer_expires_after_its_retention(
    own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    edge = own_edge("--resume-retention", "1s")
    async with client.post(edge.url + "/mcp", json=CALL, headers=MCP_HEADERS) as answer:
        events = await sse_events(answer, SseDecoder())
    last_id = events[-1].id
    assert last_id is not None
    async with client.get(edge.url + "/mcp", headers={"Last-Event-ID": last_id}) as kept:
        assert kept.status == 204  # kept, and nothing after its last event: the end
    await asyncio.sleep(2.5)  # past the retention (a wait, not a measurement)
    async with client.get(edge.url + "/mcp", headers={"Last-Event-ID": last_id}) as expired:
        assert expired.status == 404


async def test_an_answer_outlives_the_edges_sse_rotation(
    own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    # The answer is read through the edge's own SSE viewers, which end every --sse-max-seconds:
    # the reader goes on from where the last one stopped, nothing lost or doubled.
    edge = own_edge("--sse-max-seconds", "5")
    async with client.post(
        edge.url + "/mcp", json=long_call(13, 0.5), headers=MCP_HEADERS
    ) as answer:
        events = await sse_events(answer, SseDecoder())
    steps, result = steps_and_end(events)
    assert steps == list(range(1, 14))
    assert result["id"] == 42
    assert result["result"]["content"][0]["text"] == "counted 13"
    assert len({event.id for event in events}) == len(events)
    sse_reads = re.search(
        r'^edge_requests_total\{code="200",kind="sse"\} (\S+)$', edge.metrics_text(), re.MULTILINE
    )
    assert sse_reads is not None
    assert float(sse_reads.group(1)) >= 2  # it did cross a rotation


async def test_a_client_that_leaves_cancels_only_what_is_not_kept(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    # MCP 2026-07-28: a closed response stream is the client's cancellation, relayed upstream,
    # and the answer carries the backend's own ids.
    modern = {**MCP_HEADERS, "MCP-Protocol-Version": "2026-07-28"}
    url = stand.a.url + "/raw/slow?tag="
    async with client.post(url + "modern", json=CALL, headers=modern) as answer:
        assert "Edge-Resume-Stream" not in answer.headers
        events = await sse_events(answer, SseDecoder(), 2)
        answer.close()
    assert [event.id for event in events[:2]] == ["up-1", "up-2"]
    assert await slow_ended(stand.backend, "modern") == "disconnected"
    # 2025-11-25: leaving is not a cancellation; the upstream answer is kept to its end.
    async with client.post(url + "kept", json=CALL, headers=MCP_HEADERS) as answer:
        assert "Edge-Resume-Stream" in answer.headers
        events = await sse_events(answer, SseDecoder(), 2)
        answer.close()
    assert all(parse_id(event.id) is not None for event in events)  # type: ignore[arg-type]
    assert await slow_ended(stand.backend, "kept") == "finished"


async def test_without_its_origin_an_answer_is_relayed_without_ids(
    stand: Stand, own_origin: Origin, tmp_path: Path, client: aiohttp.ClientSession
) -> None:
    edge = start_edge(own_origin.url, tmp_path, *stand.backend.raw_route(), name="edge-x")
    try:
        own_origin.stop()  # the stream cannot be created: the answer still works, unresumable
        async with client.post(
            edge.url + "/raw/slow?tag=unkept", json=CALL, headers=MCP_HEADERS
        ) as answer:
            assert answer.status == 200
            assert "Edge-Resume-Stream" not in answer.headers
            events = await sse_events(answer, SseDecoder())
        assert [event.id for event in events[:20]] == [f"up-{step}" for step in range(1, 21)]
        assert messages(events)[-1]["id"] == 42
        assert 'edge_resume_unkept_total{reason="origin"} 1.0' in edge.metrics_text()
    finally:
        edge.stop()


@contextmanager
def edge_on_its_own_origin(
    stand: Stand, logs: Path, origin_name: str, edge_name: str
) -> Iterator[tuple[RestartableOrigin, Edge]]:
    """An edge on the stand's ``/raw`` route, in front of an origin of its own that the test
    stops and starts again."""
    away = RestartableOrigin(logs, origin_name)
    edge = start_edge(away.url, logs, *stand.backend.raw_route(), name=edge_name)
    try:
        yield away, edge
    finally:
        edge.stop()
        away.stop()


async def left_as_the_origin_goes(
    client: aiohttp.ClientSession, edge: Edge, away: RestartableOrigin, tag: str, hold: Path
) -> tuple[str, str]:
    """A call whose backend holds its third event until ``hold`` exists, which is once the
    origin is down, so the pump's next writes meet no origin however slowly this machine runs:
    its client reads two events and leaves, the origin stops, the backend goes on. The
    answer's stream and its second event's id."""
    async with client.post(
        edge.url + f"/raw/slow?tag={tag}&hold={hold}", json=CALL, headers=MCP_HEADERS
    ) as answer:
        path = answer.headers["Edge-Resume-Stream"]
        seen = await sse_events(answer, SseDecoder(), 2)
        answer.close()
    away.stop()
    hold.touch()  # noqa: ASYNC240 (a local file)
    assert seen[1].id is not None
    return path, seen[1].id


async def test_an_origin_restart_while_pumping_loses_and_doubles_nothing(
    stand: Stand, tmp_path: Path, client: aiohttp.ClientSession
) -> None:
    # The origin goes away mid-answer; the pump's writes wait for it (and are sent again once
    # it is back).
    hold = tmp_path / "origin-is-down"
    with edge_on_its_own_origin(stand, tmp_path, "restarted-origin", "edge-r") as (away, edge):
        path, last_id = await left_as_the_origin_goes(client, edge, away, "restart", hold)
        away.start_again()
        assert await slow_ended(stand.backend, "restart") == "finished"
        steps, final = steps_and_end(await read_resume(client, edge.url + "/raw", last_id))
        assert steps == list(range(3, 21))
        assert final["id"] == 42
        kept, _ = await kept_at(away.origin, path)
        assert len(kept) == 21  # each event once, though writes were sent again


def long_call(n: int, delay: float) -> dict[str, Any]:
    return {
        **CALL,
        "params": {
            "name": "count",
            "arguments": {"n": n, "delay": delay},
            "_meta": {"progressToken": "t"},
        },
    }


async def test_a_pump_the_origin_refuses_ends_its_readers_with_the_error(
    origin: Origin, own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    # The origin refuses the pump's writes for good: another writer took the answer's producer
    # to a higher epoch, so every write of the pump (epoch 0) and of a reader ending it (epoch
    # 1) is refused. Nothing more can be logged; readers still end, with the error.
    edge = own_edge("--resume-lease", "2")
    async with client.post(
        edge.url + "/mcp", json=long_call(40, 0.2), headers=MCP_HEADERS
    ) as answer:
        path = answer.headers["Edge-Resume-Stream"]
        decoder = SseDecoder()
        events = await sse_events(answer, decoder, 2)
        async with client.post(
            origin.url + path,
            data=b'[{"outsider":true}]',
            headers={
                "Content-Type": "application/json",
                "Producer-Id": path.rsplit("/", 1)[-1],
                "Producer-Epoch": "5",
                "Producer-Seq": "0",
            },
        ) as taken_over:
            assert taken_over.status == 200
        events += await sse_events(answer, decoder)
    steps, ending = steps_and_end(events)
    assert steps == list(range(1, 1 + len(steps)))
    assert len(steps) < 40
    assert ending["id"] == 42
    assert ending["error"]["code"] == -32000
    # A resume of it ends the same way, though its stream stays open at the origin.
    last_id = events[-2].id
    assert last_id is not None
    again = messages(await read_resume(client, edge.url + "/mcp", last_id, MCP_HEADERS))
    assert [message["id"] for message in again] == [42]
    _, closed = await kept_at(origin, path)
    assert not closed
    assert 'edge_resume_lapsed_total{result="unwritable"} 2.0' in edge.metrics_text()


async def test_a_killed_pumping_edge_is_noticed_and_its_answer_ended_elsewhere(
    origin: Origin, own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    relaying = own_edge("--resume-lease", "2")
    other = own_edge("--resume-lease", "2")
    alice = {**MCP_HEADERS, "Authorization": "Bearer alice"}
    async with client.post(relaying.url + "/mcp", json=long_call(40, 0.2), headers=alice) as answer:
        path = answer.headers["Edge-Resume-Stream"]
        events = await sse_events(answer, SseDecoder(), 2)
    relaying.process.kill()  # SIGKILL mid-call: no drain, no goodbye
    assert events[1].id is not None
    as_alice = {"Authorization": "Bearer alice"}
    rest = await read_resume(client, other.url + "/mcp", events[1].id, as_alice)
    steps, ending = steps_and_end(rest)
    assert steps == list(range(3, 3 + len(steps)))  # what was logged, none twice, none missing
    assert len(steps) < 38
    assert ending["id"] == 42
    assert ending["error"]["code"] == -32000
    kept, closed = await kept_at(origin, path)
    assert closed  # ended for every reader, the dead pump fenced off
    errors = [message for message in kept if "error" in message.get("data", "")]
    assert len(errors) == 1
    assert 'edge_resume_lapsed_total{result="fenced"} 1.0' in other.metrics_text()
    # A second resume reads the same end from the log.
    again = await read_resume(client, other.url + "/mcp", events[1].id, as_alice)
    assert [event.data for event in again] == [event.data for event in rest]


@pytest.mark.parametrize(
    ("flags", "n", "delay", "reason"),
    [
        (("--resume-max-bytes", "1000"), 20, 0.1, "bytes"),
        (("--resume-max-seconds", "1"), 20, 0.1, "seconds"),
        # Reached while the upstream is silent (the pump's lease tick, 1 s after the first
        # event), its read of the upstream waiting: the hand-over reads on from there.
        (("--resume-max-seconds", "2", "--resume-lease", "3"), 3, 1.5, "seconds"),
    ],
)
async def test_an_answer_past_a_cap_works_unkept(
    stand: Stand,
    own_edge: Callable[..., Edge],
    client: aiohttp.ClientSession,
    flags: tuple[str, ...],
    n: int,
    delay: float,
    reason: str,
) -> None:
    # Past a cap the answer is kept no further: its own client gets the rest directly, without
    # ids (it works, it is not resumable), and a resume elsewhere ends with the error.
    edge = own_edge(*flags)
    async with client.post(
        edge.url + "/mcp", json=long_call(n, delay), headers=MCP_HEADERS
    ) as answer:
        events = await sse_events(answer, SseDecoder())
    steps, ending = steps_and_end(events)
    assert steps == list(range(1, n + 1))
    assert ending["id"] == 42
    assert ending["result"]["content"][0]["text"] == f"counted {n}"
    ids = [event.id for event in events]
    kept = [event_id for event_id in ids if event_id is not None]
    assert 0 < len(kept) < len(ids)
    assert ids[: len(kept)] == kept  # ids up to the cap, none after
    assert all(parse_id(event_id) is not None for event_id in kept)
    assert f'edge_resume_unkept_total{{reason="{reason}"}} 1.0' in edge.metrics_text()
    rest = messages(await read_resume(client, stand.b.url + "/mcp", kept[-1]))
    assert [(message["id"], message["error"]["code"]) for message in rest] == [(42, -32000)]


async def test_past_the_pumps_cap_an_answer_is_relayed_without_ids(
    own_edge: Callable[..., Edge], client: aiohttp.ClientSession
) -> None:
    edge = own_edge("--resume-max-pumps", "0")
    async with client.post(
        edge.url + "/mcp", json=long_call(3, 0.05), headers=MCP_HEADERS
    ) as answer:
        assert "Edge-Resume-Stream" not in answer.headers
        events = await sse_events(answer, SseDecoder())
    assert messages(events)[-1]["result"]["content"][0]["text"] == "counted 3"
    assert all(event.id is None or parse_id(event.id) is None for event in events)
    assert 'edge_resume_unkept_total{reason="pumps"} 1.0' in edge.metrics_text()


async def test_a_pump_that_gives_up_on_its_origin_ends_the_answer_when_it_can(
    stand: Stand, tmp_path: Path, client: aiohttp.ClientSession
) -> None:
    # The origin stays away past the pump's write retries: the pump gives up on the upstream
    # answer, and ends the log (what it still had to write, the owed error, the close) once the
    # origin is back, so a resume gets what was kept, then the error, then the end.
    hold = tmp_path / "origin-is-down"
    with edge_on_its_own_origin(stand, tmp_path, "away-origin", "edge-g") as (away, edge):
        path, last_id = await left_as_the_origin_goes(client, edge, away, "gives-up", hold)
        await until(lambda: "answered a write 0" in edge.process.log.read_text())  # gave up
        away.start_again()
        steps, ending = steps_and_end(await read_resume(client, edge.url + "/raw", last_id))
        assert steps == list(range(3, 3 + len(steps)))
        assert len(steps) < 18
        assert ending["id"] == 42
        assert ending["error"]["code"] == -32000
        _, closed = await kept_at(away.origin, path)
        assert closed
        assert 'edge_resume_lapsed_total{result="fenced"}' not in edge.metrics_text()


async def test_a_kept_get_whose_page_left_ends_at_the_seconds_cap(
    stand: Stand, own_edge: Callable[..., Edge], client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # A browser's GET is kept detached from its page, like a POST; what bounds an upstream
    # feed with no end of its own, once its page has left, is --resume-max-seconds: then the
    # answer is kept no further and, its own client gone, the upstream answer is closed.
    edge = own_edge(*stand.backend.raw_route(), "--resume-max-seconds", "2", "--resume-lease", "3")
    never = tmp_path / "never"  # the upstream holds after its second event, for ever
    async with client.get(edge.url + f"/raw/slow?tag=left&hold={never}") as answer:
        assert answer.status == 200
        events = await sse_events(answer, SseDecoder(), 2)  # then the page leaves
    assert await slow_ended(stand.backend, "left") == "disconnected"
    assert 'edge_resume_unkept_total{reason="seconds"} 1.0' in edge.metrics_text()
    last = events[1].id
    assert last is not None
    async with client.get(edge.url + "/raw/slow", headers={"Last-Event-ID": last}) as resumed:
        assert resumed.status == 204  # what was kept, then the end
