"""Reads served by the connection protocol itself against the real origin: long-polls
(``edge.web.fast_polls``), SSE (``edge.web.fast_sse``) and catch-up misses
(``edge.web.fast_catchup``). The same bytes as the full path, no aiohttp handler entered, and
every way a read can end (released, timed out, closed stream, client gone, half-close, the
stream deleted, the viewer cap, a bypass) ends it.

The full path is an edge started with ``--fast-path off`` in front of the same origin; answers
are compared byte for byte but for ``Date`` and ``Age``'s value (``Raw.comparable``). Requests
carry no cursor, so both edges answer with the current interval (not a random jump); a test
that straddles a 20 s interval boundary would see two, so each comparison reads both edges in
one go.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from tests.integration.own_reads_support import (
    CORS_ORIGIN,
    MixedLoad,
    Raw,
    append,
    edge_pair,
    exchange,
    fast_path_answers,
    full_path_requests,
    host_port,
    long_poll,
    make_stream,
    poll,
    read_answers,
    request,
    sent_while_stopped,
    sse,
    tail_of,
)
from tests.integration.test_passthrough import call, metric_value

TIMEOUT_SECONDS = 2
ARGS = ("--workers", "1", "--long-poll-timeout", str(TIMEOUT_SECONDS))


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "own-polls", *ARGS) as pair:
        yield pair


def answered(edge: Edge, code: str) -> float:
    text = edge.metrics_text()
    return metric_value(text, "edge_requests_total", kind="long_poll", code=code)


async def followed(edge: Edge, path: str, offset: str, *headers: str) -> None:
    """A catch-up from the start and a first long-poll at the tail: the first fills the log,
    the second starts the stream's tail (each after a wait, in a task of the connection's),
    which then runs (and lingers) for the long-polls answered at once or parked."""
    await exchange(edge.url, request(f"{path}?offset=-1", *headers), ["GET"])
    answer = await poll(edge.url, path, offset, *headers)
    assert answer.status_line.split()[1] in (b"200", b"204"), answer


HEADER_SETS = {
    "plain": (),
    "cors": (CORS_ORIGIN,),
    "credential": ("Authorization: Bearer viewer-1",),
    "close": ("Connection: close",),
}


@pytest.mark.parametrize("headers", list(HEADER_SETS))
async def test_every_answer_is_the_full_paths_and_no_handler_is_entered(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    headers: str,
) -> None:
    fast, full = edges
    sent = HEADER_SETS[headers]
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", close=False)
    tail = await append(http, url, b"second")
    for edge in (fast, full):
        await followed(edge, stream_path, tail, *sent)
    entered = full_path_requests(fast)["long_poll"]

    # At the tail: parked, then released by an append.
    waiting = [asyncio.ensure_future(poll(e.url, stream_path, tail, *sent)) for e in edges]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiting)
    new_tail = await append(http, url, b"third")
    released = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert released[0].body == b"third"
    assert released[0].header(b"Stream-Next-Offset") == new_tail.encode()
    assert released[0].comparable() == released[1].comparable()

    # Behind the tail, where the tail's batch begins: answered at once from the log.
    behind = await asyncio.gather(*(poll(e.url, stream_path, tail, *sent) for e in edges))
    assert behind[0].status_line == b"HTTP/1.1 200 OK"
    assert behind[0].body == b"third"
    assert behind[0].comparable() == behind[1].comparable()
    # Asked again in the same second: the same answer (made once); once the tail moves on, the
    # same head gets the longer answer at once, never the remembered one.
    again = await poll(fast.url, stream_path, tail, *sent)
    assert again.body == b"third"
    new_tail = await append(http, url, b" fourth")
    for _ in range(50):
        longer = await poll(fast.url, stream_path, tail, *sent)
        if longer.body != b"third":
            break
        await asyncio.sleep(0.05)
    assert longer.body == b"third fourth"
    assert longer.header(b"Stream-Next-Offset") == new_tail.encode()
    for edge in edges:  # both edges know the new tail before the next comparison
        await poll(edge.url, stream_path, tail, *sent)

    # Nothing arrives: 204 at the timeout, at its own offset.
    timed_out = await asyncio.gather(*(poll(e.url, stream_path, new_tail, *sent) for e in edges))
    assert timed_out[0].status_line == b"HTTP/1.1 204 No Content"
    assert timed_out[0].comparable() == timed_out[1].comparable()

    # A closed stream at its tail: 204 with Stream-Closed, at once.
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    closed = await asyncio.gather(*(poll(e.url, stream_path, new_tail, *sent) for e in edges))
    assert closed[0].header(b"Stream-Closed") == b"true"
    assert closed[0].comparable() == closed[1].comparable()

    # The connection served all four itself (a CORS Origin is learnt on the first).
    assert full_path_requests(fast)["long_poll"] == entered
    assert full_path_requests(full)["long_poll"] > entered


async def test_pipelined_long_polls_and_catchups_are_answered_in_order(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"one ", close=False)
    middle = await tail_of(http, url)
    tail = await append(http, url, b"two")
    for edge in edges:
        await followed(edge, stream_path, tail)
    payload = (
        long_poll(stream_path, middle)
        + request(f"{stream_path}?offset=-1")
        + long_poll(stream_path, tail)
        + request(f"{stream_path}?offset={middle}")
    )
    methods = ["GET"] * 4
    answers = await asyncio.gather(*(exchange(e.url, payload, methods) for e in edges))
    bodies = [a.body for a in answers[0]]
    assert bodies == [b"two", b"one two", b"", b"two"]
    assert [a.status_line for a in answers[0]][2] == b"HTTP/1.1 204 No Content"
    assert [a.comparable() for a in answers[0]][:3:2] == [a.comparable() for a in answers[1]][:3:2]


async def wait_for_metric(edge: Edge, name: str, value: float, **labels: str) -> None:
    for _ in range(100):
        if metric_value(edge.metrics_text(), name, **labels) == value:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}{labels} never became {value}")


async def test_a_viewer_that_leaves_or_half_closes_is_taken_off_the_board(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x", close=False)
    tail = await tail_of(http, url)
    await followed(fast, stream_path, tail)
    await wait_for_metric(fast, "edge_long_polls_waiting", 0)

    # Leaves: its connection reset while it waits.
    _, writer = await asyncio.open_connection(*host_port(fast.url))
    writer.write(long_poll(stream_path, tail))
    await writer.drain()
    await wait_for_metric(fast, "edge_long_polls_waiting", 1)
    writer.transport.abort()
    await wait_for_metric(fast, "edge_long_polls_waiting", 0)

    # Half-closes: a live reader that ends its sending is taken as gone, as the origin does.
    sock = socket.create_connection(host_port(fast.url))
    try:
        sock.sendall(long_poll(stream_path, tail))
        await wait_for_metric(fast, "edge_long_polls_waiting", 1)
        sock.shutdown(socket.SHUT_WR)
        await wait_for_metric(fast, "edge_long_polls_waiting", 0)
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed, with nothing written
    finally:
        sock.close()

    # And the next viewer is released as ever.
    waiting = asyncio.ensure_future(poll(fast.url, stream_path, tail))
    await wait_for_metric(fast, "edge_long_polls_waiting", 1)
    await append(http, url, b"y")
    released = await asyncio.wait_for(waiting, 10)
    assert released.body == b"y"


async def test_a_waiter_whose_stream_is_deleted_looks_again_and_is_told_it_is_gone(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x", close=False)
    tail = await tail_of(http, url)
    await followed(fast, stream_path, tail)
    entered = full_path_requests(fast)["long_poll"]
    waiting = asyncio.ensure_future(poll(fast.url, stream_path, tail))
    await wait_for_metric(fast, "edge_long_polls_waiting", 1)
    status, _, _ = await call(http, "DELETE", fast.url + stream_path)
    assert status == 204
    answer = await asyncio.wait_for(waiting, 10)
    # Woken without an answer, it starts over as the full path would (the connection asks
    # the cache again; what the cache does not answer is relayed by the full path): the origin
    # says what the stream is now.
    assert answer.status_line.split()[1] == b"404", answer
    assert full_path_requests(fast)["long_poll"] <= entered + 1


async def test_past_the_viewer_cap_a_long_poll_is_refused_as_the_full_path_refuses_it(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x", close=False)
    start = await tail_of(http, url)
    tail = await append(http, url, b"y")
    with edge_pair(origin, logs_dir, "own-polls-cap", *ARGS, "--max-viewers", "1") as pair:
        answers: list[Raw] = []
        for edge in pair:
            await followed(edge, stream_path, tail)
            reader, writer = await asyncio.open_connection(*host_port(edge.url))
            writer.write(long_poll(stream_path, tail))
            await writer.drain()
            await wait_for_metric(edge, "edge_long_polls_waiting", 1)
            refused = await exchange(edge.url, long_poll(stream_path, tail, CORS_ORIGIN), ["GET"])
            answers.append(refused[0])
            # Behind the tail too: every long-poll is a live read, admitted first.
            behind = await exchange(edge.url, long_poll(stream_path, start), ["GET"])
            assert behind[0].status_line == b"HTTP/1.1 503 Service Unavailable", edge
            first = await asyncio.wait_for(read_answers(reader, ["GET"]), 10)
            assert first[0].status_line == b"HTTP/1.1 204 No Content"
            writer.close()
        fast, full = answers
        assert fast.status_line == b"HTTP/1.1 503 Service Unavailable"
        assert fast.header(b"Retry-After") == b"5"
        assert fast.header(b"Connection") == b"close"
        assert sorted(fast.comparable()[1]) == sorted(full.comparable()[1])
        assert fast.body == full.body
        assert answered(pair[0], "503") == answered(pair[1], "503") == 2


# --- SSE reads served by the connection itself (edge.web.fast_sse) ---


@pytest.mark.parametrize("headers", list(HEADER_SETS))
async def test_an_sse_read_is_the_full_paths_byte_for_byte_and_enters_no_handler(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    headers: str,
) -> None:
    fast, full = edges
    sent = HEADER_SETS[headers]
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", close=False)
    tail = await append(http, url, b"second")
    for edge in edges:
        await followed(edge, stream_path, tail, *sent)
    entered = full_path_requests(fast)["sse"]
    # Live: both follow the tail, get the next append, and end with the stream's closure.
    live = [
        asyncio.ensure_future(exchange(e.url, sse(stream_path, "-1", *sent), ["GET"]))
        for e in edges
    ]
    await asyncio.sleep(0.5)
    await append(http, url, b" third")
    await asyncio.sleep(0.3)
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    answers = [a[0] for a in await asyncio.wait_for(asyncio.gather(*live), 15)]
    assert answers[0].status_line == b"HTTP/1.1 200 OK"
    assert b"first second" in answers[0].body
    assert b" third" in answers[0].body
    assert b'"streamClosed":true' in answers[0].body
    assert answers[0].comparable()[1] == answers[1].comparable()[1]  # headers, in order
    # The closed stream read again, at once and whole, from the start and from the middle.
    for offset in ("-1", tail):
        again = await asyncio.gather(
            *(exchange(e.url, sse(stream_path, offset, *sent), ["GET"]) for e in edges)
        )
        assert again[0][0].comparable() == again[1][0].comparable(), offset
    assert full_path_requests(fast)["sse"] == entered
    assert full_path_requests(full)["sse"] > entered


async def test_an_sse_viewer_that_leaves_is_let_go_and_the_connection_goes_on_after_the_end(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x", close=False)
    tail = await tail_of(http, url)
    await followed(fast, stream_path, tail)
    await wait_for_metric(fast, "edge_sse_viewers", 0)
    _, writer = await asyncio.open_connection(*host_port(fast.url))
    writer.write(sse(stream_path, tail))
    await writer.drain()
    await wait_for_metric(fast, "edge_sse_viewers", 1)
    writer.transport.abort()
    await wait_for_metric(fast, "edge_sse_viewers", 0)
    # A closed stream's SSE ends its body; a request pipelined behind it is answered after.
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    await exchange(fast.url, request(f"{stream_path}?offset=-1"), ["GET"])  # learns the close
    payload = sse(stream_path, "-1") + request(f"{stream_path}?offset=-1")
    first, second = await exchange(fast.url, payload, ["GET", "GET"])
    assert b'"streamClosed":true' in first.body
    assert second.body == b"x"


# --- catch-up reads the stored hits do not answer (edge.web.fast_catchup) ---


@pytest.mark.parametrize("headers", list(HEADER_SETS))
async def test_a_catchup_miss_is_the_full_paths_answer_and_enters_no_handler(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    headers: str,
) -> None:
    fast, _ = edges
    sent = HEADER_SETS[headers]
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"one ", close=False)
    middle = await tail_of(http, url)
    await append(http, url, b"two")
    entered = full_path_requests(fast)["catchup"]
    for target in (f"{stream_path}?offset=-1", f"{stream_path}?offset={middle}", stream_path):
        answers = await asyncio.gather(
            *(exchange(e.url, request(target, *sent), ["GET"]) for e in edges)
        )
        assert answers[0][0].comparable() == answers[1][0].comparable(), target
    tag = answers[0][0].header(b"ETag")
    assert tag is not None
    revalidated = await asyncio.gather(
        *(
            exchange(e.url, request(stream_path, *sent, f"If-None-Match: {tag.decode()}"), ["GET"])
            for e in edges
        )
    )
    assert revalidated[0][0].comparable() == revalidated[1][0].comparable()
    assert full_path_requests(fast)["catchup"] == entered
    # offset=now is the origin's to answer: relayed by the connection itself, at once.
    now = await asyncio.gather(
        *(exchange(e.url, request(f"{stream_path}?offset=now", *sent), ["GET"]) for e in edges)
    )
    assert now[0][0].comparable() == now[1][0].comparable()
    assert full_path_requests(fast)["catchup"] == entered


async def test_a_read_the_cache_bypasses_after_asking_is_relayed_whole_by_the_connection(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """A body past ``--fill-buffer-bytes`` is found too large only while the cache fetches it
    (``Bypass``): nothing written, the connection relays the client's own request itself
    (``edge.web.own_relay``), byte for byte as the full path relays it."""
    body = bytes(range(256)) * 3072  # 768 KiB
    await make_stream(http, origin.url + stream_path, "application/octet-stream", body, close=True)
    with edge_pair(origin, logs_dir, "own-bypass", *ARGS, "--fill-buffer-bytes", "512KiB") as pair:
        fast, _ = pair
        entered = full_path_requests(fast)["catchup"]
        target = request(f"{stream_path}?offset=-1")
        answers = [(await exchange(e.url, target, ["GET"]))[0] for e in pair]
        assert answers[0].body == body
        assert b"fwd=bypass" in (answers[0].header(b"Cache-Status") or b"")
        assert answers[0].comparable() == answers[1].comparable()
        assert full_path_requests(fast)["catchup"] == entered


async def test_first_live_reads_of_a_stream_wait_in_the_connection_not_in_aiohttp(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """The edge holds nothing of the stream: the first long-poll (fill, then a tail started)
    and the first SSE read at ``now`` (a probe of the tail) wait in tasks of their
    connections, answered as the full path answers them, and enter no aiohttp handler."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"a", close=False)
    tail = await tail_of(http, url)
    before = (full_path_requests(fast)["long_poll"], full_path_requests(fast)["sse"])
    polls = await asyncio.gather(*(poll(e.url, stream_path, "-1") for e in edges))
    assert polls[0].body == b"a"
    assert polls[0].comparable() == polls[1].comparable()
    live = [asyncio.ensure_future(exchange(e.url, sse(stream_path, "now"), ["GET"])) for e in edges]
    await asyncio.sleep(0.5)
    await append(http, url, b"b")
    await asyncio.sleep(0.3)
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    answers = [a[0] for a in await asyncio.wait_for(asyncio.gather(*live), 15)]
    assert b"data:b\n" in answers[0].body
    assert answers[0].comparable()[1] == answers[1].comparable()[1]
    assert (full_path_requests(fast)["long_poll"], full_path_requests(fast)["sse"]) == before
    assert tail
    # The origin's refusal carries headers only the full path may rewrite (its Date): it
    # answers that one, nothing having been written.
    missing = await poll(fast.url, stream_path + "-never", "-1")
    assert missing.status_line.split()[1] == b"404"


async def test_a_mixed_read_load_enters_no_aiohttp_handler(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Many clients read one run every way at once while an agent appends (``MixedLoad``).
    Every read is the connections' own: aiohttp's request handler sees none
    (``edge_full_path_requests_total``), and every follower gets every byte once, in order.
    HEADs and reads at ``now`` among them are relayed by the connections too."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"0;", close=False)
    before = full_path_requests(fast)

    def at(query: str, method: str) -> bytes:
        return request(f"{stream_path}?{query}" if query else stream_path, method=method)

    load = MixedLoad(http, fast, url, at)
    await load.run(first=b"0;", pollers=8, viewers=4, readers=3, rounds=20, appends=30)
    assert full_path_requests(fast) == before


async def test_requests_held_behind_a_parked_long_poll_are_read_after_it_wherever_it_ends(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Past 64 KiB pipelined behind a parked long-poll, the connection stops reading; however
    the long-poll ends (here: woken by its stream's deletion at the origin, so it starts over
    and its answer is the 404), reading resumes and every request behind it is answered."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"a;", close=False)
    tail = await tail_of(http, url)
    await followed(fast, stream_path, tail)
    behind = 2000  # about 100 KiB of catch-ups
    reader, writer = await asyncio.open_connection(*host_port(fast.url))
    try:
        writer.write(long_poll(stream_path, tail) + request(f"{stream_path}?offset=-1") * behind)
        await writer.drain()
        await wait_for_metric(fast, "edge_long_polls_waiting", 1)
        await wait_for_metric(fast, "edge_open_connections", 1, kind="long_poll")
        status, _, _ = await call(http, "DELETE", url)
        assert status == 204
        answers = await asyncio.wait_for(read_answers(reader, ["GET"] * (behind + 1)), 30)
    finally:
        writer.close()
    assert answers[0].status_line.split()[1] == b"404"
    assert len(answers) == behind + 1
    assert {a.status_line.split()[1] for a in answers[1:]} == {b"404"}
    await wait_for_metric(fast, "edge_open_connections", 0, kind="long_poll")


async def test_an_sse_answer_to_connection_close_is_flushed_whole_before_the_close(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """A closed stream's whole SSE answer to a reader that asked to close and reads late:
    every event, the closing control event and the last chunk arrive before the close (what
    the transport still holds is flushed, never dropped)."""
    fast, _ = edges
    url = origin.url + stream_path
    parts = [bytes([65 + i]) * (400 * 1024) for i in range(4)]
    await make_stream(http, url, "text/plain", *parts, close=True)
    await exchange(fast.url, request(f"{stream_path}?offset=-1"), ["GET"])  # the log, known
    entered = full_path_requests(fast)["sse"]
    reader, writer = await asyncio.open_connection(*host_port(fast.url), limit=1 << 24)
    try:
        writer.write(sse(stream_path, "-1", "Connection: close"))
        await writer.drain()
        await asyncio.sleep(1.0)  # the answer waits in the edge's buffers meanwhile
        answer = (await asyncio.wait_for(read_answers(reader, ["GET"]), 30))[0]
        assert await reader.read() == b""  # then the close
    finally:
        writer.close()
    data = b"".join(
        line[5:] for line in answer.body.split(b"\n")
        if line.startswith(b"data:") and not line.startswith(b"data:{")
    )  # fmt: skip
    assert data == b"".join(parts)
    assert b'"streamClosed":true' in answer.body
    assert full_path_requests(fast)["sse"] == entered


async def test_an_eventsource_resuming_by_last_event_id_is_served_by_the_connection(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """A browser EventSource reconnects to its original URL with ``Last-Event-ID``: it resumes
    exactly there (``LiveHub.start``'s rule), the same bytes as the full path, and enters no
    aiohttp handler; a resume point behind the URL's offset does not move it back."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"one;", close=False)
    middle = await append(http, url, b"two;")
    await append(http, url, b"three;")
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    for edge in edges:
        await exchange(edge.url, request(f"{stream_path}?offset=-1"), ["GET"])
        await exchange(edge.url, request(f"{stream_path}?offset={middle}"), ["GET"])
    entered = full_path_requests(fast)["sse"]
    for offset, resume in (("-1", middle), ("now", middle), (middle, "-1")):
        answers = await asyncio.gather(
            *(
                exchange(e.url, sse(stream_path, offset, f"Last-Event-ID: {resume}"), ["GET"])
                for e in edges
            )
        )
        assert answers[0][0].comparable() == answers[1][0].comparable(), (offset, resume)
        assert b"data:one;" not in answers[0][0].body
        assert b"data:three;" in answers[0][0].body
    assert full_path_requests(fast)["sse"] == entered


async def test_a_live_read_of_a_path_the_origin_normalises_is_the_connections(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """``/v1/x/../stream/s`` and ``/v1/stream/./s`` read ``/v1/stream/s`` (the path the origin
    routes to), long-polled and by SSE: the full path's answers, no handler entered."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", close=False)
    tail = await append(http, url, b"second")
    name = stream_path.rsplit("/", 1)[1]
    aliases = [f"/v1/x/../stream/{name}", f"/v1/stream/./{name}"]
    entered = (full_path_requests(fast)["long_poll"], full_path_requests(fast)["sse"])
    for alias in aliases:
        behind = await asyncio.gather(*(poll(e.url, alias, "-1") for e in edges))
        assert behind[0].status_line == b"HTTP/1.1 200 OK"
        assert behind[0].body == b"first second"
        assert behind[0].comparable() == behind[1].comparable(), alias
    await call(http, "POST", url, headers={"Stream-Closed": "true"})
    for alias in aliases:
        read = await asyncio.gather(
            *(
                exchange(e.url, sse(alias, tail, "Origin: https://app.example"), ["GET"])
                for e in edges
            )
        )
        assert b'"streamClosed":true' in read[0][0].body
        assert read[0][0].comparable() == read[1][0].comparable(), alias
    assert (full_path_requests(fast)["long_poll"], full_path_requests(fast)["sse"]) == entered


async def test_a_client_that_never_reads_holds_its_pipelined_long_polls_in_the_kernel(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Long-polls behind the tail, pipelined by a client that does not read: the connection
    answers until its writes back up and then reads no more heads, whatever wrote the answer
    that backed them up (the first is a wait, written in a task of the connection's, the rest
    stored answers written at once), so the edge holds a few answers, not every one. Read
    at last, all of them come, whole and in order. (The connection once paused only for a
    backup that began while it was reading heads: after the task's answer it wrote every
    stored answer into its own memory, a 200 KB answer times every head.)"""
    fast = edges[0]
    url = origin.url + stream_path
    body = b"z" * 200_000
    await make_stream(http, url, "text/plain", body, close=False)
    heads = 120
    before = answered(fast, "200")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(host_port(fast.url))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(long_poll(stream_path, "-1") * heads)
        await writer.drain()
        # Until the count stops moving: the connection has stopped answering.
        counts = [answered(fast, "200")]
        while len(counts) < 5 or len(set(counts[-5:])) > 1:
            await asyncio.sleep(0.2)
            counts.append(answered(fast, "200"))
            assert len(counts) < 100, counts
        assert counts[-1] - before < heads // 2, (before, counts[-1])
        answers = await asyncio.wait_for(read_answers(reader, ["GET"] * heads), 60)
    finally:
        writer.close()
    assert all(answer.body == body for answer in answers)
    assert answered(fast, "200") - before == heads


async def test_a_herd_after_the_tail_moved_is_answered_from_the_first_answer_stored(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Catch-ups from the start of a followed stream, arriving together just after the tail
    moved, find no stored answer: the first builds and stores it, and the rest, begun before
    it ran, are hits of it (``FastCatchup`` asks the fast path again), every answer the
    stream's bytes (the full path's answers are checked against them in the tests above)."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"a", close=False)
    herd, content = 200, b"a"
    target = request(f"{stream_path}?offset=-1")
    for rounds in range(3):
        # An SSE viewer keeps the edge's tail of the stream running: an append reaches its
        # log without a fill, and the stored at-tail answer no longer holds.
        viewer = asyncio.ensure_future(exchange(fast.url, sse(stream_path, "-1"), ["GET"]))
        opened = [await asyncio.open_connection(*host_port(fast.url)) for _ in range(herd)]
        await asyncio.sleep(0.3)
        await append(http, url, b"b%d" % rounds)
        await asyncio.sleep(0.3)
        answered_fast = fast_path_answers(fast)
        await sent_while_stopped(fast, [(writer, target) for _, writer in opened])
        answers = await asyncio.wait_for(
            asyncio.gather(*(read_answers(reader, ["GET"]) for reader, _ in opened)), 15
        )
        for _, writer in opened:
            writer.close()
        viewer.cancel()
        hits = fast_path_answers(fast) - answered_fast
        content += b"b%d" % rounds
        bodies = {a[0].body for a in answers}
        assert bodies == {content}, bodies
        assert len({a[0].header(b"ETag") for a in answers}) == 1  # one answer, given to all
        # One answer built (or a few, begun before any was stored and run together), nearly
        # every other one a hit of it (none is without the second try).
        assert hits >= herd * 9 // 10, (rounds, hits)
