"""Resume routes attacked from outside (issue 30), real processes: the reference origin, one
edge, the raw SSE backend of ``devstack/mcp_upstream.py``.

Each test is an attack that once broke the edge: a forged ``Last-Event-ID`` (a real token of
the caller's own, a ``skip`` past the log) must not end a live answer for its other readers;
answers still running must not starve the next request of an upstream connection; an
upstream that never sends its headers must not hold a connection (and a task) for ever after
its client left."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from edge.protocol.sse import SseDecoder
from edge.resume.ids import ResumePoint, encode_id, parse_id
from tests.integration.resume_support import (
    CALL,
    MCP_HEADERS,
    RESULT,
    Backend,
    messages,
    sse_events,
    start_backend,
    until,
)

pytestmark = pytest.mark.timeout(120)

LEASE_SECONDS = 3


def one_process_edge(origin: Origin, backend: Backend, logs: Path, name: str, *flags: str) -> Edge:
    """An edge (one process) with the route ``/raw`` to ``backend`` and ``flags``."""
    route = backend.raw_route()
    return start_edge(origin.url, logs, *route, *flags, "--workers", "1", name=name)


@dataclass
class Stand:
    origin: Origin
    backend: Backend
    edge: Edge
    logs: Path

    def edge_of_its_own(self, name: str, *flags: str) -> Edge:
        """Another edge on the stand's route, with ``flags``; the test stops it."""
        return one_process_edge(self.origin, self.backend, self.logs, name, *flags)


@pytest.fixture(scope="module")
def stand(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    logs = tmp_path_factory.mktemp("resume-attacks")
    backend = start_backend(logs, name="attacked-upstream")
    lease = ("--resume-lease", str(LEASE_SECONDS))
    edge = one_process_edge(origin, backend, logs, "attacked-edge", *lease)
    yield Stand(origin=origin, backend=backend, edge=edge, logs=logs)
    edge.stop()
    backend.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=90)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def test_a_forged_skip_past_the_log_does_not_end_a_live_answer(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """The caller's own token with a ``skip`` past the log: that reader never sees the log
    move, and must not take the (alive) pump for lost, fence it, and end the answer with an
    error for its other readers (the tool finishes; the log would never hold its result)."""
    n = 8
    decoder = SseDecoder()
    url = f"{stand.edge.url}/raw/paced?n={n}&every=1&tag=forged-skip"
    async with client.post(url, json=CALL, headers=MCP_HEADERS) as answer:
        assert answer.status == 200
        first = await sse_events(answer, decoder, 1)
        assert first[0].id is not None
        point = parse_id(first[0].id)
        assert point is not None
        forged = encode_id(ResumePoint(token=point.token, offset=point.offset, skip=10**9))
        async with client.get(
            f"{stand.edge.url}/raw/paced", headers={"Last-Event-ID": forged}
        ) as resumed:
            forged_answer = asyncio.ensure_future(resumed.read())
            whole = first + await sse_events(answer, decoder)
            await asyncio.wait_for(forged_answer, 30)
    got = messages(whole)
    assert got[-1] == RESULT, got[-1]
    assert [m["params"]["progress"] for m in got[:-1]] == list(range(1, n + 1))
    # The forged reader was shown nothing: no event of the answer is past its point.
    assert b"data:" not in forged_answer.result()


async def test_answers_still_running_do_not_starve_the_next_call(
    stand: Stand, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """More answers running at once than an HTTP client's default pool (100), each well
    under ``--resume-max-pumps``: the next call still reaches the backend at once."""
    hold = tmp_path / "hold"
    running = 101
    opened: list[aiohttp.ClientResponse] = []

    async def open_one(index: int) -> None:
        url = f"{stand.edge.url}/raw/slow?tag=held-{index}&hold={hold}"
        answer = await client.post(url, json=CALL, headers=MCP_HEADERS)
        assert answer.status == 200
        opened.append(answer)
        await sse_events(answer, SseDecoder(), 1)

    try:
        await asyncio.wait_for(asyncio.gather(*(open_one(i) for i in range(running))), 60)
        decoder = SseDecoder()
        async with client.post(
            f"{stand.edge.url}/raw/paced?n=2&tag=next", json=CALL, headers=MCP_HEADERS
        ) as answer:
            assert answer.status == 200
            got = messages(await asyncio.wait_for(sse_events(answer, decoder), 30))
        assert got[-1] == RESULT
    finally:
        hold.touch()
        for answer in opened:
            answer.close()


@pytest.mark.parametrize("offset", ["zzzz", "0000000000000000_00000000000000zz", "-1x"])
async def test_a_forged_offset_is_not_found(
    stand: Stand, client: aiohttp.ClientSession, offset: str
) -> None:
    """The caller's own token with an offset the origin refuses (400): an id the edge did not
    mint, so the same 404 as an unknown one, not a 502 after retries."""
    async with client.post(
        f"{stand.edge.url}/raw/paced?n=2&tag=forged-offset", json=CALL, headers=MCP_HEADERS
    ) as answer:
        events = await sse_events(answer, SseDecoder())
    assert events[0].id is not None
    point = parse_id(events[0].id)
    assert point is not None
    forged = encode_id(ResumePoint(token=point.token, offset=offset, skip=0))
    assert parse_id(forged) is not None  # well-formed: only the origin can tell
    async with client.get(
        f"{stand.edge.url}/raw/paced", headers={"Last-Event-ID": forged}
    ) as resumed:
        assert resumed.status == 404
        assert await resumed.text() == "no such answer\n"


async def until_asked(stand: Stand, tag: str) -> None:
    """Until the backend has the request for ``/raw/hang?tag=tag``."""
    await until(
        lambda: any(
            line.get("path") == "/raw/hang" and line.get("query") == f"tag={tag}"
            for line in stand.backend.seen_lines()
        )
    )


async def test_an_upstream_that_never_answers_is_let_go_at_the_seconds_cap(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """No headers, ever: a client that left leaves nothing anyone can resume (no id was given),
    and one that waits gets a 504; either way the upstream request ends at
    ``--resume-max-seconds``, not never (each such request held a connection and a task)."""
    edge = stand.edge_of_its_own("capped-edge", "--resume-max-seconds", "2")
    try:
        leaving = asyncio.ensure_future(
            client.post(f"{edge.url}/raw/hang?tag=left", json=CALL, headers=MCP_HEADERS)
        )
        await until_asked(stand, "left")
        leaving.cancel()  # the client leaves before any answer began
        async with client.post(
            f"{edge.url}/raw/hang?tag=stayed", json=CALL, headers=MCP_HEADERS
        ) as waited:
            assert waited.status == 504

        def ended() -> set[str]:
            return {line["hang"] for line in stand.backend.seen_lines() if "hang" in line}

        # Both upstream requests ended by the edge.
        await until(lambda: ended() >= {"left", "stayed"}, seconds=30)
    finally:
        edge.stop()


async def test_requests_waiting_for_their_answer_count_against_the_pumps_cap(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """Requests whose clients left before any answer began (the upstream sends no headers)
    each held an upstream connection and a task, none counted: past ``--resume-max-pumps``
    such requests a new one is relayed as it is, without ids, as past the cap of answers."""
    # No drain: its requests to the backend never end, and would hold its stop for the whole
    # of one (10 s).
    edge = stand.edge_of_its_own(
        "pumps-capped-edge", "--resume-max-pumps", "2", "--drain-seconds", "0"
    )
    try:
        for index in range(2):
            leaving = asyncio.ensure_future(
                client.post(
                    f"{edge.url}/raw/hang?tag=capped-{index}", json=CALL, headers=MCP_HEADERS
                )
            )
            await until_asked(stand, f"capped-{index}")  # the edge is waiting for its answer
            leaving.cancel()
        async with client.post(
            f"{edge.url}/raw/paced?n=2&tag=past-cap", json=CALL, headers=MCP_HEADERS
        ) as answer:
            assert answer.status == 200
            assert "Edge-Resume-Stream" not in answer.headers
            events = await sse_events(answer, SseDecoder())
        assert messages(events)[-1] == RESULT
        # As the backend sent it: none of the edge's ids.
        assert all(event.id is None or parse_id(event.id) is None for event in events)
        assert 'edge_resume_unkept_total{reason="pumps"} 1.0' in edge.metrics_text()
    finally:
        edge.stop()


async def test_nobody_writes_an_answers_stream_through_the_edge(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """The answers' streams are the edge's (its pumps write them to the origin directly):
    through its listener they can be followed, never written. Anyone holding the path
    (``Edge-Resume-Stream``) could append a forged result that every reader then got with one
    of the edge's ids, or delete the answer."""
    forged = [{"event": "message", "data": json.dumps({**RESULT, "result": {"forged": True}})}]
    url = f"{stand.edge.url}/raw/paced?n=4&every=0.3&tag=injected"
    alice = {**MCP_HEADERS, "Authorization": "Bearer alice"}
    async with client.post(url, json=CALL, headers=alice) as answer:
        path = answer.headers["Edge-Resume-Stream"]
        decoder = SseDecoder()
        first = await sse_events(answer, decoder, 1)
        for who in ("Bearer mallory", "Bearer alice"):
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                async with client.request(
                    method, f"{stand.edge.url}{path}", data=json.dumps(forged),
                    headers={"Content-Type": "application/json", "Authorization": who},
                ) as write:  # fmt: skip
                    assert write.status == 403, (who, method, write.status)
        async with client.get(
            f"{stand.edge.url}{path}?offset=-1", headers={"Authorization": "Bearer alice"}
        ) as follow:
            assert follow.status == 200  # followed as an ordinary stream, as before
        whole = first + await sse_events(answer, decoder)
    got = messages(whole)
    assert got[-1] == RESULT
    assert [m["params"]["progress"] for m in got[:-1]] == [1, 2, 3, 4]


async def test_a_byte_that_is_not_utf8_costs_a_character_not_the_answer(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """One bad byte in an upstream event killed the pump (its decoder raised): the answer's
    client waited a lease, then got the JSON-RPC error, though the backend sent the result."""
    async with client.post(
        f"{stand.edge.url}/raw/invalid-utf8", json=CALL, headers=MCP_HEADERS
    ) as answer:
        assert answer.status == 200
        events = await sse_events(answer, SseDecoder())
    got = messages(events)
    assert got[0]["params"]["message"] == "\ufffd"
    assert got[-1] == RESULT


async def test_json_nested_too_deep_is_relayed_never_an_error(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    """JSON nested past the parser's recursion: in an upstream event it killed the pump (the
    client got the JSON-RPC error, not the result); as a request body it was a 500."""
    async with client.post(f"{stand.edge.url}/raw/deep", json=CALL, headers=MCP_HEADERS) as answer:
        assert answer.status == 200
        events = await sse_events(answer, SseDecoder())
    assert events[0].data.startswith("[[[")
    assert json.loads(events[-1].data) == RESULT
    deep = b"[" * 100_000 + b"]" * 100_000
    async with client.post(
        f"{stand.edge.url}/raw/paced?n=1&tag=deep-body", data=deep, headers=MCP_HEADERS
    ) as answer:
        assert answer.status == 200
        assert messages(await sse_events(answer, SseDecoder()))[-1] == RESULT


async def test_an_upstream_line_that_never_ends_is_let_go_at_the_bytes_cap(
    stand: Stand, origin: Origin, client: aiohttp.ClientSession
) -> None:
    """One event, then a ``data:`` line that never ends: the edge holds at most about
    ``--resume-max-bytes`` of it, then lets the upstream go; the answer's log ends (the kept
    event, then the owed error and the close) and its client's answer ends, rather than the
    edge buffering the line without bound for as long as the upstream sends it."""
    edge = stand.edge_of_its_own("endless-line-edge", "--resume-max-bytes", "1MiB")
    try:
        async with client.post(
            f"{edge.url}/raw/endless-line?tag=capped", json=CALL, headers=MCP_HEADERS
        ) as answer:
            assert answer.status == 200
            path = answer.headers["Edge-Resume-Stream"]
            got = messages(await sse_events(answer, SseDecoder()))  # ends: never the whole line
        assert got[0]["params"]["progress"] == 1
        await until(  # the edge let the upstream go
            lambda: any(line.get("endless") == "capped" for line in stand.backend.seen_lines()),
            seconds=30,
        )
        async with client.get(f"{origin.url}{path}?offset=-1") as kept:
            log = await kept.json()
            assert kept.headers.get("Stream-Closed") == "true"
        assert any("error" in json.dumps(message) for message in log[1:]), log
    finally:
        edge.stop()
