"""A browser's ``EventSource`` on a resume route, across an edge restart (headless Chromium).

A page served from another origin opens ``new EventSource(url)`` on a GET resume route: the
upstream's SSE answer is kept like a POST's. The edge serving it is stopped mid-answer (SIGTERM:
it cuts its readers short and drains, its pump going on) and another edge takes its port. The
browser reconnects by itself with ``Last-Event-ID`` and gets the rest: every event once, in
order, then the end (a ``204``, where an ``EventSource`` stops). Nothing of it is asked of the
page's code: what a person would write for any SSE endpoint works as it is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from playwright.async_api import Browser

from devstack.processes import (
    Edge,
    Origin,
    free_port,
    port_listening,
    start_edge,
    start_mcp_upstream,
)
from edge.resume.ids import parse_id

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

# The page: whatever a person writes for an SSE endpoint, and a record of what it saw.
PAGE = """<!doctype html><meta charset="utf-8"><title>resume</title>
<script>
window.seen = {events: [], opens: 0, errors: 0, closed: false};
const source = new EventSource(new URLSearchParams(location.search).get("src"));
source.onopen = () => { seen.opens += 1; };
source.onmessage = (event) => { seen.events.push({id: event.lastEventId, data: event.data}); };
source.onerror = () => {
  seen.errors += 1;
  if (source.readyState === EventSource.CLOSED) seen.closed = true;
};
</script>"""


async def until(check: Callable[[], Any], seconds: float = 60) -> None:
    """Wait until ``check()`` (or what it awaits to) is true, failing after ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not (await found if inspect.isawaitable(found := check()) else found):
        assert asyncio.get_running_loop().time() < deadline, f"not seen in {seconds} s"
        await asyncio.sleep(0.05)


async def test_an_event_source_resumes_across_an_edge_restart(
    origin: Origin, logs_dir: Path, browser: Browser, tmp_path: Path
) -> None:
    seen_file, hold = tmp_path / "seen.jsonl", tmp_path / "go-on"
    seen_file.touch()
    upstream = start_mcp_upstream(logs_dir, seen_file, name="resume-page-upstream")
    raw_url = str(upstream.ready["url"]).removesuffix("/mcp") + "/raw"
    port = free_port()
    # One process (no supervisor holding the port through its drain): the next edge binds the
    # port as soon as the stopped one stops listening.
    args = ("--resume-route", f"/raw={raw_url}", "--drain-seconds", "60", "--workers", "1")
    edges: list[Edge] = []
    page_app = web.Application()
    page_app.router.add_get("/", _page)
    runner = web.AppRunner(page_app)
    await runner.setup()
    try:
        first = start_edge(
            origin.url, logs_dir, *args, name="resume-page-edge", listen=f"127.0.0.1:{port}"
        )
        edges.append(first)
        site = web.TCPSite(runner, "127.0.0.1", free_port())  # another origin than the edge's
        await site.start()
        # The upstream sends two events, then holds the rest until the test lets it go on.
        source = f"{first.url}/raw/slow?tag=page&hold={quote(str(hold), safe='')}"
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(f"{site.name}/?src={quote(source, safe='')}")

        async def count(expression: str) -> Any:
            return await page.evaluate(
                f"(() => {{ const s = window.seen; return {expression}; }})()"
            )

        await until(lambda: count("s.events.length >= 2"))
        first.process.signal(signal.SIGTERM)  # a rolling restart: the edge drains
        await until(lambda: not port_listening(port))
        second = start_edge(
            origin.url, logs_dir, *args, name="resume-page-edge-2", listen=f"127.0.0.1:{port}"
        )
        edges.append(second)
        await until(lambda: count("s.opens >= 2"))  # the browser is back, on the second edge
        hold.touch()
        await until(lambda: count("s.closed"))
        seen = await count("s")
        steps = [json.loads(event["data"]) for event in seen["events"]]
        *progress, final = steps
        assert [message["params"]["progress"] for message in progress] == list(range(1, 21))
        assert final == {"jsonrpc": "2.0", "id": 42, "result": {}}
        ids = [event["id"] for event in seen["events"]]
        assert all(parse_id(each) is not None for each in ids)
        assert len(set(ids)) == len(ids)
        # The upstream was asked once, never with a Last-Event-ID, and answered to its end.
        lines = [json.loads(line) for line in seen_file.read_text().splitlines()]
        assert [line["path"] for line in lines if "method" in line] == ["/raw/slow"]
        assert all(line["last_event_id"] is None for line in lines if "method" in line)
        assert [line["end"] for line in lines if "slow" in line] == ["finished"]
        assert first.process.stop(60) == 0  # its drain ended when the pump did
        metrics = second.metrics_text()
        assert 'edge_resumes_total{result="served"}' in metrics
        await context.close()
    finally:
        await runner.cleanup()
        for edge in edges:
            if edge.process.alive():
                edge.stop()
        upstream.stop()


async def _page(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")
