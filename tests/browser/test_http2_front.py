"""Twelve live readers of one stream in one browser page: through HAProxy's HTTPS front (ALPN
``h2,http/1.1``, ``make cluster --tls``) every one receives every event once; through the plain
HTTP/1.1 front the same page stalls at six, the browser's connections per host (docs/tls.md).

Real processes throughout: the reference origin, two edges sharing Redis, HAProxy as
``devstack.cluster`` configures it, Debian's chromium. The page is served by a tiny aiohttp app
on another port: its ``EventSource``s are cross-origin, allowed by the ``Access-Control-Allow-
Origin: *`` the origin answers and the edge relays.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, Page
from playwright.async_api import TimeoutError as PlaywrightTimeout

from devstack.cluster import Cluster, start_cluster
from devstack.tls import make_certificate

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.usefixtures("pages_closed")]

READERS = 12
HTTP1_CONNECTIONS_PER_HOST = 6  # Chromium's (and every major browser's) limit
EVENTS = 20

# Readers the test drives from Python: open(url, n) starts n EventSources; each keeps the
# messages of its "data" events (a JSON stream's SSE data is an array of messages) and whether
# its connection opened.
PAGE = """<!doctype html><meta charset="utf-8"><title>twelve readers</title>
<script>
window.readers = [];
window.open_readers = (url, count) => {
  for (let i = 0; i < count; i++) {
    const reader = { opened: false, messages: [], source: new EventSource(url) };
    reader.source.addEventListener("open", () => { reader.opened = true; });
    reader.source.addEventListener("data", (e) => reader.messages.push(...JSON.parse(e.data)));
    window.readers.push(reader);
  }
};
window.summary = () => window.readers.map((r) => ({ opened: r.opened, messages: r.messages }));
</script>"""


@pytest.fixture(scope="module")
def cluster(logs_dir: Path) -> Iterator[Cluster]:
    here = logs_dir / "http2-front"
    # A certificate given, as `--tls-cert` gives one (`--tls` alone makes its own: its test is
    # tests/integration/test_cluster_tls.py).
    started = start_cluster(here, tls_cert=make_certificate(here / "given.pem"))
    yield started
    started.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def page_url() -> AsyncIterator[str]:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/"
    await runner.cleanup()


async def open_page(browser: Browser, url: str) -> Page:
    context = await browser.new_context(ignore_https_errors=True)  # the self-signed front
    page = await context.new_page()
    await page.goto(url)
    return page


async def responses_from(page: Page, front: str) -> list[dict[str, Any]]:
    """The responses the page receives from ``front`` as Chromium records them (protocol and
    connection included), from now on. Resource Timing hides a cross-origin answer's protocol
    (no ``Timing-Allow-Origin``); the DevTools protocol does not."""
    received: list[dict[str, Any]] = []
    devtools = await page.context.new_cdp_session(page)

    def keep(event: dict[str, Any]) -> None:
        if event["response"]["url"].startswith(front):
            received.append(event["response"])

    devtools.on("Network.responseReceived", keep)
    await devtools.send("Network.enable")
    return received


async def make_stream(cluster: Cluster, name: str) -> str:
    path = f"/v1/stream/{name}"
    async with (
        aiohttp.ClientSession() as http,
        http.put(cluster.url + path, headers={"Content-Type": "application/json"}) as put,
    ):
        assert put.status == 201, await put.text()
    return path


async def write_events(cluster: Cluster, path: str) -> list[dict[str, int]]:
    written = [{"n": n} for n in range(EVENTS)]
    async with aiohttp.ClientSession() as http:
        for message in written:
            async with http.post(
                cluster.url + path,
                data=json.dumps(message),
                headers={"Content-Type": "application/json"},
            ) as post:
                assert post.status in (200, 204), await post.text()
    return written


async def readers(page: Page) -> list[dict[str, Any]]:
    return list(await page.evaluate("window.summary()"))


async def until(page: Page, condition: str) -> None:
    """Wait until ``condition`` over ``rs`` (the page's readers) holds (up to 20 s)."""
    try:
        await page.wait_for_function(
            f"(() => {{ const rs = window.readers; return {condition}; }})()", timeout=20_000
        )
    except PlaywrightTimeout:
        shown = [(r["opened"], len(r["messages"])) for r in await readers(page)]
        raise AssertionError(f"never {condition}: (opened, messages) {shown}") from None


async def test_twelve_event_sources_all_live_through_the_https_front(
    browser: Browser, cluster: Cluster, page_url: str
) -> None:
    assert cluster.https_url is not None
    path = await make_stream(cluster, "twelve-over-h2")
    page = await open_page(browser, page_url)
    answers = await responses_from(page, cluster.https_url)
    live = f"{cluster.https_url}{path}?offset=-1&live=sse"
    await page.evaluate("([url, n]) => window.open_readers(url, n)", [live, READERS])
    await until(page, f"rs.filter((r) => r.opened).length === {READERS}")

    written = await write_events(cluster, path)
    await until(page, f"rs.every((r) => r.messages.length >= {EVENTS})")
    # Every reader, every event, once, in order.
    assert [r["messages"] for r in await readers(page)] == [written] * READERS

    # The browser spoke HTTP/2 to the front: one connection carried all twelve.
    assert [(r["protocol"], r["connectionId"]) for r in answers] == [
        ("h2", answers[0]["connectionId"])
    ] * READERS


async def test_the_same_page_over_plain_http1_stalls_at_six(
    browser: Browser, cluster: Cluster, page_url: str
) -> None:
    path = await make_stream(cluster, "twelve-over-http1")
    page = await open_page(browser, page_url)
    answers = await responses_from(page, cluster.url)
    live = f"{cluster.url}{path}?offset=-1&live=sse"
    await page.evaluate("([url, n]) => window.open_readers(url, n)", [live, READERS])
    six = HTTP1_CONNECTIONS_PER_HOST
    await until(page, f"rs.filter((r) => r.opened).length === {six}")

    written = await write_events(cluster, path)
    await until(page, f"rs.filter((r) => r.messages.length >= {EVENTS}).length === {six}")
    # While six hold the browser's six connections, the seventh to twelfth get nothing.
    stalled = [r for r in await readers(page) if not r["opened"]]
    assert len(stalled) == READERS - six
    assert all(r["messages"] == [] for r in stalled)
    # Six answers so far, each on a connection of its own.
    assert [r["protocol"] for r in answers] == ["http/1.1"] * six
    assert len({r["connectionId"] for r in answers}) == six

    # They were queued, not failed: once the six close, the others connect and catch up.
    await page.evaluate(
        "(n) => window.readers.filter((r) => r.opened).slice(0, n)"
        ".forEach((r) => r.source.close())",
        six,
    )
    await until(page, f"rs.every((r) => r.messages.length >= {EVENTS})")
    assert [r["messages"] for r in await readers(page)] == [written] * READERS
