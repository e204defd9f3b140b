"""Live reads through real edge processes in front of the real origin."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from devstack.processes import (
    ORIGIN_DIR,
    Edge,
    Origin,
    start_edge,
    start_origin,
    workers_under_test,
)
from edge.protocol.purge_keys import purge_keys
from edge.protocol.sse import SseDecoder
from tests.cdn_stand_ins import eventually
from tests.integration.live_support import View, append_all, slow_phone, view_sse
from tests.integration.test_passthrough import call, metric_value

TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}


def tokens(count: int, prefix: str = "") -> list[bytes]:
    # Leading spaces on purpose: LLM tokens look like this, and SSE framing must keep them.
    return [f" {prefix}tok{i}".encode() for i in range(count)]


def live_requests(origin: Origin, path: str) -> int:
    return sum(e["count"] for e in origin.counts(path)["requests"] if e["live"] is not None)


@pytest.mark.parametrize(
    ("content_type", "max_live_requests"),
    # JSON streams are followed over one upstream SSE connection; text streams over a long-poll
    # loop (one request per batch, never two at once), since the origin's SSE framing of text
    # drops a leading space.
    [("application/json", 3), ("text/plain", None)],
)
async def test_two_thousand_viewers_get_every_byte_once(
    crowd: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    stream_path: str,
    content_type: str,
    max_live_requests: int | None,
) -> None:
    url = edge.url + stream_path
    json_stream = content_type == "application/json"
    await call(crowd, "PUT", url, headers={"Content-Type": content_type})
    if json_stream:
        parts = [json.dumps([{"i": i, "t": f" tok{i}"}]).encode() for i in range(60)]
    else:
        parts = tokens(60)
    early = [asyncio.create_task(view_sse(crowd, url)) for _ in range(1000)]
    await asyncio.sleep(1.0)
    writer = asyncio.create_task(
        append_all(crowd, url, parts, content_type=content_type, rate_per_second=30)
    )
    await asyncio.sleep(1.0)  # half way: the rest join late, from the start
    late = [asyncio.create_task(view_sse(crowd, url)) for _ in range(1000)]
    await writer
    views = await asyncio.wait_for(asyncio.gather(*early, *late), timeout=90)

    if json_stream:
        expected_items = [item for part in parts for item in json.loads(part)]
        assert all(v.items == expected_items and v.closed for v in views)
    else:
        written = b"".join(parts)
        assert all(bytes(v.body) == written and v.closed for v in views)
    # One upstream tail per stream per worker process (one process by default).
    workers = int(workers_under_test())
    counts = origin.counts(stream_path)
    assert counts["peak_open_live"] <= workers
    if max_live_requests is not None:
        assert live_requests(origin, stream_path) <= max_live_requests * workers
    else:
        assert live_requests(origin, stream_path) <= (len(parts) + 5) * workers


async def test_long_polls_at_one_offset_cost_one_live_request(
    crowd: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    _, headers, _ = await call(crowd, "PUT", url, headers=JSON)
    tail = CIMultiDict(headers)["Stream-Next-Offset"]
    _, headers, _ = await call(crowd, "GET", f"{url}?offset={tail}&live=long-poll")
    cursor = CIMultiDict(headers)["Stream-Cursor"]
    before = live_requests(origin, stream_path)
    polls = [
        asyncio.create_task(
            call(crowd, "GET", f"{url}?offset={tail}&live=long-poll&cursor={cursor}")
        )
        for _ in range(300)
    ]
    await asyncio.sleep(0.5)
    await call(crowd, "POST", url, headers=JSON, data=b'[{"news":1}]')
    answers = await asyncio.wait_for(asyncio.gather(*polls), timeout=30)
    assert {(status, body) for status, _, body in answers} == {(200, b'[{"news":1}]')}
    cursors = {CIMultiDict(h)["Stream-Cursor"] for _, h, _ in answers}
    assert cursor not in cursors  # never the client's own cursor back (§10.1)
    assert live_requests(origin, stream_path) - before <= int(
        workers_under_test()
    )  # one per worker


async def test_long_poll_at_a_closed_tail_answers_at_once(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await call(http, "PUT", url, headers=TEXT)
    _, headers, _ = await call(
        http, "POST", url, headers={**TEXT, "Stream-Closed": "true"}, data=b"x"
    )
    tail = CIMultiDict(headers)["Stream-Next-Offset"]
    started = time.monotonic()
    status, headers, _ = await call(http, "GET", f"{url}?offset={tail}&live=long-poll")
    assert status == 204
    assert time.monotonic() - started < 1.0
    h = CIMultiDict(headers)
    assert h["Stream-Closed"] == "true"
    assert h["Stream-Up-To-Date"] == "true"
    assert h["Cache-Control"] == "no-store"  # never a browser's
    assert h["CDN-Cache-Control"] == h["Surrogate-Control"] == "max-age=1"  # a CDN's, a second
    assert h["Surrogate-Key"] == purge_keys(stream_path).surrogate_key


async def test_sse_frames_and_headers(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await call(http, "PUT", url, headers={"Content-Type": "application/octet-stream"})
    await call(
        http,
        "POST",
        url,
        headers={"Content-Type": "application/octet-stream"},
        data=bytes(range(256)),
    )
    await call(http, "POST", url, headers={"Stream-Closed": "true"})
    async with http.get(url + "?offset=-1&live=sse") as response:
        raw = await response.read()
        h = response.headers
    assert h["Content-Type"] == "text/event-stream"
    assert h["Cache-Control"] == "no-cache, no-store, no-transform"
    assert h["X-Accel-Buffering"] == "no"
    assert h["stream-sse-data-encoding"] == "base64"
    assert raw.startswith(b"retry: ")
    view = await view_sse(http, url)
    assert bytes(view.body) == bytes(range(256))
    assert view.closed


async def test_resume_on_another_replica_by_last_event_id(
    crowd: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    a = start_edge(origin.url, logs_dir, name="edge-resume-a")
    b = start_edge(origin.url, logs_dir, name="edge-resume-b")
    try:
        await call(crowd, "PUT", a.url + stream_path, headers=TEXT)
        parts = tokens(40)
        writer = asyncio.create_task(
            append_all(crowd, a.url + stream_path, parts, rate_per_second=40)
        )
        first = await view_sse(crowd, a.url + stream_path, stop_after_events=5, resume=False)
        assert not first.closed
        assert first.last_event_id is not None
        await writer
        # A browser EventSource reconnects to its original URL (offset=-1) with Last-Event-ID.
        second = await view_sse(
            crowd, b.url + stream_path, headers={"Last-Event-ID": first.last_event_id}
        )
        assert second.closed
        assert bytes(first.body) + bytes(second.body) == b"".join(parts)
    finally:
        a.stop()
        b.stop()


class Cuttable:
    """A TCP relay between the edge and the origin that can cut every connection at once."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def cut(self) -> int:
        cut = 0
        for writer in list(self.writers):
            if not writer.transport.is_closing():
                cut += 1
            writer.transport.abort()
        self.writers.clear()
        return cut

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
async def test_upstream_cut_mid_stream_loses_and_doubles_nothing(
    crowd: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    content_type: str,
) -> None:
    relay = Cuttable(int(origin.url.rsplit(":", 1)[1]))
    port = await relay.start()
    edge = start_edge(f"http://127.0.0.1:{port}", logs_dir, name="edge-cut")
    try:
        url = edge.url + stream_path
        await call(crowd, "PUT", url, headers={"Content-Type": content_type})
        if content_type == "application/json":
            parts = [json.dumps([{"i": i}]).encode() for i in range(40)]
        else:
            parts = tokens(40)
        viewers = [asyncio.create_task(view_sse(crowd, url)) for _ in range(50)]
        writer = asyncio.create_task(
            append_all(crowd, url, parts, content_type=content_type, rate_per_second=40)
        )
        cut = 0
        for _ in range(3):
            await asyncio.sleep(0.3)
            cut += relay.cut()  # every upstream connection, the tail's included, dies mid-stream
        assert cut >= 3
        await writer
        views: list[View] = await asyncio.wait_for(asyncio.gather(*viewers), timeout=60)
        if content_type == "application/json":
            expected = [item for part in parts for item in json.loads(part)]
            assert all(v.items == expected and v.closed for v in views)
        else:
            assert all(bytes(v.body) == b"".join(parts) and v.closed for v in views)
        if content_type == "application/json":
            # An SSE upstream cut mid-body is a reconnect the tail counts; a cut long-poll is
            # retried by the HTTP client itself before the tail sees it.
            text = edge.metrics_text()
            reconnects = sum(
                metric_value(text, "edge_tail_reconnects_total", reason=r)
                for r in ("closed_by_origin", "connect", "reset", "protocol", "timeout")
            )
            assert reconnects >= 1
    finally:
        edge.stop()
        await relay.close()


async def test_origin_restart_with_a_data_dir_loses_and_doubles_nothing(
    crowd: aiohttp.ClientSession, logs_dir: Path, tmp_path: Path, stream_path: str
) -> None:
    data_dir = tmp_path / "origin-data"
    origin = start_origin(
        logs_dir, long_poll_timeout_ms=3000, data_dir=data_dir, name="durable-origin"
    )
    port = int(origin.url.rsplit(":", 1)[1])
    edge = start_edge(origin.url, logs_dir, name="edge-restart")
    try:
        url = edge.url + stream_path
        await call(crowd, "PUT", url, headers=JSON)
        parts = [json.dumps([{"i": i}]).encode() for i in range(40)]
        following = [View() for _ in range(50)]
        viewers = [asyncio.create_task(view_sse(crowd, url, view=view)) for view in following]
        writer = asyncio.create_task(
            append_all(crowd, url, parts, content_type="application/json", rate_per_second=20)
        )
        await asyncio.sleep(1.0)
        # Every viewer is following when the origin goes: one that only arrives while it is
        # down is answered 502 (the edge vouches for nothing of an origin that went away).
        assert await eventually(lambda: all(view.progress for view in following), within=30)
        origin.stop()
        await asyncio.sleep(0.5)
        origin = start_origin(
            logs_dir, long_poll_timeout_ms=3000, data_dir=data_dir, port=port, name="durable-origin"
        )
        await writer
        views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=60)
        expected = [item for part in parts for item in json.loads(part)]
        assert all(v.items == expected and v.closed for v in views)
    finally:
        edge.stop()
        origin.stop()


async def test_slow_viewers_do_not_hold_back_the_others(
    crowd: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    edge = start_edge(origin.url, logs_dir, "--sse-buffer-bytes", "16KiB", name="edge-slow")
    try:
        url = edge.url + stream_path
        await call(crowd, "PUT", url, headers=TEXT)
        parts = [f"{i:05d}".encode() + b"." * 8187 for i in range(60)]  # 8 KiB each, 480 KiB
        written = b"".join(parts)
        # 20 appends/s = 160 KiB/s; the slow ones take 4 KiB every 0.25 s = 16 KiB/s.
        slow = [
            asyncio.create_task(slow_phone(edge.url, stream_path, seconds=6, read_every=0.25))
            for _ in range(200)
        ]
        fast = [asyncio.create_task(view_sse(crowd, url)) for _ in range(20)]
        await asyncio.sleep(0.5)
        write_times: list[float] = []
        lagging_seen = 0.0
        for part in parts:
            await call(crowd, "POST", url, headers=TEXT, data=part)
            write_times.append(time.monotonic())
            await asyncio.sleep(0.05)
        await call(crowd, "POST", url, headers={"Stream-Closed": "true"})
        fast_views = await asyncio.wait_for(asyncio.gather(*fast), timeout=30)
        for _ in range(10):
            lagging_seen = max(
                lagging_seen, metric_value(edge.metrics_text(), "edge_viewers_lagging")
            )
            await asyncio.sleep(0.2)
        for view in fast_views:
            assert bytes(view.body) == written
            # every append reached every fast viewer within a second
            for index, written_at in enumerate(write_times):
                needed = (index + 1) * 8192
                arrived = next(t for t, size in view.progress if size >= needed)
                assert arrived - written_at < 1.0, (index, arrived - written_at)
        slow_bodies = await asyncio.gather(*slow)
        for body in slow_bodies:
            assert written.startswith(body)  # behind, but never a gap
        assert all(len(body) < len(written) for body in slow_bodies)
        assert lagging_seen > 0
    finally:
        edge.stop()


async def test_max_viewers_and_tail_lifecycle(
    crowd: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    # One process: the exact cap and the one tail are each worker's own (with workers, the
    # kernel picks which worker a viewer reaches, and each has its share of the cap).
    edge = start_edge(
        origin.url,
        logs_dir,
        "--workers",
        "1",
        "--max-viewers",
        "2",
        "--tail-linger",
        "0.5",
        name="edge-limits",
    )
    try:
        url = edge.url + stream_path
        await call(crowd, "PUT", url, headers=JSON)
        responses = [await crowd.get(url + "?offset=-1&live=sse") for _ in range(3)]
        assert [r.status for r in responses] == [200, 200, 503]
        assert responses[2].headers["Retry-After"] == "5"
        await asyncio.sleep(0.3)
        text = edge.metrics_text()
        assert metric_value(text, "edge_sse_viewers") == 2
        assert metric_value(text, "edge_live_tails") == 1
        for response in responses:
            response.close()
        await asyncio.sleep(1.5)
        text = edge.metrics_text()
        assert metric_value(text, "edge_sse_viewers") == 0
        assert metric_value(text, "edge_live_tails") == 0
        assert origin.counts(stream_path)["open"]["sse"] == 0
    finally:
        edge.stop()


async def test_sigterm_ends_viewers_cleanly_and_they_resume_elsewhere(
    crowd: aiohttp.ClientSession, origin: Origin, edge: Edge, logs_dir: Path, stream_path: str
) -> None:
    doomed = start_edge(origin.url, logs_dir, "--drain-seconds", "3", name="edge-doomed")
    url_doomed = doomed.url + stream_path
    await call(crowd, "PUT", url_doomed, headers=TEXT)
    parts = tokens(40)
    first_parts = [
        asyncio.create_task(view_sse(crowd, url_doomed, resume=False)) for _ in range(20)
    ]
    writer = asyncio.create_task(
        append_all(crowd, edge.url + stream_path, parts, rate_per_second=20)
    )
    await asyncio.sleep(0.8)
    started = time.monotonic()
    doomed.process.signal(signal.SIGTERM)
    code = await asyncio.get_running_loop().run_in_executor(None, doomed.process.proc.wait, 10)
    doomed.stop()  # already gone; releases its pipes
    assert code == 0
    assert time.monotonic() - started < 3.5
    firsts = await asyncio.gather(*first_parts)
    await writer
    for view in firsts:
        assert not view.closed
        assert view.next_offset is not None
        rest = await view_sse(crowd, edge.url + stream_path, offset=view.next_offset)
        assert bytes(view.body) + bytes(rest.body) == b"".join(parts)


async def run_node(*args: str, limit_seconds: float = 90) -> tuple[int, list[dict[str, Any]]]:
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node",
        str(ORIGIN_DIR / "official-client.mjs"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), limit_seconds)
    lines = [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]
    assert proc.returncode is not None
    if proc.returncode != 0:
        print(stderr.decode()[-2000:])
    return proc.returncode, lines


async def test_the_official_client_reads_through_the_edge(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    count = 60
    await call(http, "PUT", url, headers=JSON)
    before = edge.metrics_text()
    producer = asyncio.create_task(
        run_node("produce", "--url", url, "--count", str(count), "--rate-per-second", "30")
    )
    await asyncio.sleep(0.5)
    readers = [
        asyncio.create_task(run_node("read", "--url", url, "--live", mode, "--timeout-ms", "60000"))
        for mode in ("sse", "long-poll")
    ]
    code, lines = await producer
    assert code == 0, lines
    assert lines[-1] == {"produced": count}
    expected = [{"seq": i, "text": f"token-{i}"} for i in range(count)]
    for code, lines in await asyncio.gather(*readers):
        assert code == 0, lines[-3:]
        assert [line["item"] for line in lines if "item" in line] == expected
        assert lines[-1] == {"done": True, "items": count, "closed": True}
    after = edge.metrics_text()
    for kind in ("sse", "long_poll"):
        served = metric_value(after, "edge_requests_total", kind=kind, code="200") - metric_value(
            before, "edge_requests_total", kind=kind, code="200"
        )
        assert served >= 1, kind  # each reader really went live through the edge


async def test_idle_viewers_get_heartbeats_and_connections_rotate(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    edge = start_edge(
        origin.url, logs_dir, "--sse-heartbeat", "0.5", "--sse-max-seconds", "5", name="edge-rotate"
    )
    try:
        url = edge.url + stream_path
        await call(http, "PUT", url, headers=TEXT)
        await call(http, "POST", url, headers=TEXT, data=b" before")
        started = time.monotonic()
        async with http.get(url + "?offset=-1&live=sse") as response:
            raw = await asyncio.wait_for(response.read(), 15)  # ends by itself: rotation
        lasted = time.monotonic() - started
        assert 5 <= lasted < 8
        assert raw.count(b": keep-alive") >= 5  # every ~0.5 s while idle
        # A clean end after a control event: the client resumes from its streamNextOffset.
        decoded = SseDecoder().feed(raw)
        assert decoded[-1].event == "control"
        resume_at = json.loads(decoded[-1].data)["streamNextOffset"]
        await call(http, "POST", url, headers=TEXT, data=b" after")
        await call(http, "POST", url, headers={"Stream-Closed": "true"})
        rest = await view_sse(http, url, offset=resume_at)
        assert bytes(rest.body) == b" after"
    finally:
        edge.stop()


async def test_an_eventsource_opened_at_now_resumes_from_its_last_event_id(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await call(http, "PUT", url, headers=TEXT)
    _, headers, _ = await call(http, "POST", url, headers=TEXT, data=b" seen")
    last_seen = CIMultiDict(headers)["Stream-Next-Offset"]
    await call(http, "POST", url, headers=TEXT, data=b" missed while away")
    await call(http, "POST", url, headers={"Stream-Closed": "true"})
    # The browser reconnects to its original URL (offset=now) with only Last-Event-ID.
    view = await view_sse(http, url, offset="now", headers={"Last-Event-ID": last_seen})
    assert bytes(view.body) == b" missed while away"
    assert view.closed
