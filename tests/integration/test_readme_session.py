"""The README's "Five minutes by hand", followed as written against the real origin and one
edge process: each console block's output is what the edge answers (header values that vary
from run to run, the cursor, compared by shape), and its closing metrics lines are exactly what
``/metrics`` then says, so the saving the README shows is one a faithful run shows."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import REPO, Edge, Origin, start_edge
from edge.protocol.sse import SseDecoder

README = REPO / "README.md"
TEXT = {"Content-Type": "text/plain"}
# A person types the next command more than --tail-freshness (1 s) after the last one answered:
# what the edge held at the tail is then looked at again, as in a session by hand.
PACE_SECONDS = 1.5


def console_output(command: str) -> list[str]:
    """The lines the README shows after the console line ``$ {command}``, up to the next
    command or the block's end."""
    lines = README.read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    out = []
    for line in lines[start:]:
        if line.startswith(("$ ", "```")):
            break
        out.append(line)
    return out


@pytest.fixture
def readme_edge(own_origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    # ``make serve``: one worker, every other flag at its default.
    edge = start_edge(own_origin.url, logs_dir / "readme", "--workers", "1", name="readme")
    yield edge
    edge.stop()


def header_lines(response: aiohttp.ClientResponse, pattern: str) -> list[str]:
    """The answer's headers whose names match, as curl shows them (names in the README's case:
    the client folds them)."""
    wanted = re.compile(pattern, re.I)
    return [f"{named(n)}: {v}" for n, v in response.headers.items() if wanted.match(n)]


def named(name: str) -> str:
    return "ETag" if name.lower() == "etag" else name


async def test_the_readme_session_shows_what_the_edge_answers(
    readme_edge: Edge, http: aiohttp.ClientSession
) -> None:
    stream = f"{readme_edge.url}/v1/stream/hello"
    async with http.put(stream, headers=TEXT) as created:
        assert created.status == 201
    for part in (b"hello, ", b"world"):
        async with http.post(stream, data=part, headers=TEXT) as appended:
            assert appended.status == 204

    grep = "grep -Ei '^(stream-|etag|cache-control|cache-status)|world'"
    first = console_output(f'curl -s -D - "$S?offset=-1" | {grep}')
    async with http.get(f"{stream}?offset=-1") as response:
        shown = header_lines(response, r"^(stream-|etag|cache-control|cache-status)")
        body = await response.text()
    assert sorted(shown) == sorted(first[:-1]), (shown, first)
    assert body == first[-1] == "hello, world"
    again = console_output('curl -s -D - "$S?offset=-1" | grep -i cache-status')  # at once
    async with http.get(f"{stream}?offset=-1") as response:
        assert header_lines(response, "^cache-status$") == again

    await asyncio.sleep(PACE_SECONDS)
    offset = "0000000000000000_0000000000000022"
    console_output(f'curl -s -D - "$S?offset={offset}&live=long-poll" &')  # shown as a step
    # The waiting long-poll's answer shows after the write that releases it.
    waited = console_output("curl -s -X POST -H 'Content-Type: text/plain' --data-binary '!' $S")
    waited_lines = [line.split("  ")[0].strip() for line in waited[1:] if line]
    poll = asyncio.create_task(http.get(f"{stream}?offset={offset}&live=long-poll"))
    await asyncio.sleep(0.5)  # the long-poll waits at the tail before the write
    async with http.post(stream, data=b"!", headers=TEXT) as appended:
        assert appended.status == 204
    async with await poll as response:
        assert f"HTTP/1.1 {response.status} {response.reason}" == waited[0].split("  ")[0]
        got = header_lines(response, r"^(stream-next-offset|stream-cursor|cache-status)$")
        assert await response.text() == waited_lines[-1] == "!"
    for expected, actual in zip(waited_lines[:-1], got, strict=True):
        if expected.startswith("Stream-Cursor:"):
            assert re.fullmatch(r"Stream-Cursor: \d+", actual), actual
        else:
            assert actual == expected

    await asyncio.sleep(PACE_SECONDS)
    # ``curl -sN`` until the control event shows, then Ctrl-C.
    events = console_output('curl -sN "$S?offset=-1&live=sse"')
    decoder, seen = SseDecoder(), []
    async with http.get(f"{stream}?offset=-1&live=sse") as response:
        while not any(event.event == "control" for event in seen):
            seen += decoder.feed(await response.content.readany())
    data = next(event for event in seen if event.event == "data")
    assert f"data:{data.data}" in events
    assert f"id: {data.id}" in events

    await asyncio.sleep(PACE_SECONDS)
    assert (
        console_output("curl -s -X POST -H 'Content-Type: text/plain' -H 'Stream-Closed: true' $S")
        == []
    )
    assert (
        console_output(
            'for i in 1 2 3 4 5 6 7 8 9 10; do curl -s -o /dev/null "$S?offset=-1"; done'
        )
        == []
    )
    async with http.post(stream, headers={**TEXT, "Stream-Closed": "true"}) as closed:
        assert closed.status == 204
    await asyncio.sleep(PACE_SECONDS)
    for _ in range(10):
        async with http.get(f"{stream}?offset=-1") as response:
            assert (response.status, await response.read()) == (200, b"hello, world!")
    await asyncio.sleep(PACE_SECONDS)
    shown_metrics = [line for line in console_output(
        "curl -s http://127.0.0.1:9090/metrics | grep -E "
        "'^edge_(requests|origin_requests|cache_requests)_total'"
    ) if line.startswith("edge_")]  # fmt: skip
    assert shown_metrics, "the README shows no metrics lines"
    metrics = (await (await http.get(f"{readme_edge.admin_url}/metrics")).text()).splitlines()
    counted = [
        m for m in metrics if re.match(r"edge_(requests|origin_requests|cache_requests)_total", m)
    ]
    for line in shown_metrics:
        assert line in metrics, (line, counted)
    # What the README says of the stopped SSE read.
    assert 'edge_clients_gone_total{kind="sse"} 1.0' in metrics
    assert not any(
        line.startswith('edge_requests_total{code="200",kind="sse"}') for line in metrics
    )
