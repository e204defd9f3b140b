"""``make demo`` as people use it: the summary, the ``watch`` line, and with ``--keep-running``
a page a person opens to take the run over and stop it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import pytest
from playwright.async_api import Browser

from devstack.processes import REPO
from tests.browser.conftest import open_page

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.usefixtures("pages_closed")]


async def start_demo(*args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devstack.demo",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )


async def line_starting(demo: asyncio.subprocess.Process, prefix: str, seen: list[str]) -> str:
    assert demo.stdout is not None
    while True:
        raw = await asyncio.wait_for(demo.stdout.readline(), timeout=60)
        assert raw, f"the demo ended before printing {prefix!r}: {seen}"
        line = raw.decode().rstrip("\n")
        seen.append(line)
        if line.startswith(prefix):
            return line


async def test_demo_prints_the_watch_url_and_its_summary_and_exits_0() -> None:
    demo = await start_demo("--viewers", "5", "--tokens", "40", "--rate", "100")
    seen: list[str] = []
    watch = await line_starting(demo, "watch ", seen)
    assert watch.startswith("watch http://127.0.0.1:")
    assert "/run/demo-run-" in watch
    result = await line_starting(demo, "RESULT", seen)
    assert result == "RESULT        ok"
    assert any(line.startswith("exact copies  5/5") for line in seen)
    # Each figure says what it counts: the 2 readers beyond the 5 viewers are the agents.
    assert any(line.startswith("viewers       5 bots reading by SSE") for line in seen), seen
    assert any(
        line.endswith("for 7 readers at the edge (5 viewers + 2 agents following the run)")
        for line in seen
    ), seen
    assert any(
        line.startswith("origin        ") and "writes (every append" in line for line in seen
    )
    await asyncio.wait_for(demo.communicate(), timeout=30)
    assert demo.returncode == 0


# With --auth jwt the page's token covers its run alone (tests/integration/test_demo_auth.py):
# every control it writes still lands.
@pytest.mark.parametrize("auth", [(), ("--auth", "jwt")], ids=["open", "jwt"])
async def test_keep_running_a_person_takes_over_and_stops_the_run(
    browser: Browser, auth: tuple[str, ...]
) -> None:
    demo = await start_demo("--viewers", "3", "--tokens", "300", "--keep-running", *auth)
    seen: list[str] = []
    try:
        url = (await line_starting(demo, "watch ", seen)).split(" ", 1)[1]
        page = await open_page(browser, url)
        await page.until("w.messages.some((m) => m.type === 'token')")
        await page.page.click("#take")
        await page.until("w.messages.some((m) => m.type === 'status' && m.state === 'yielded')")
        await page.page.fill("#say", "a person was here")
        await page.page.click("#send")
        await page.until("w.messages.some((m) => m.type === 'human')")
        await page.page.click("#release")
        await page.until("w.messages.some((m) => m.type === 'status' && m.state === 'resumed')")
        await page.page.click("#stop")
        result = await line_starting(demo, "RESULT", seen)
        assert result == "RESULT        ok"
        me = await page.watch("w.me")
        shown = await page.watch("w.nameOf(w.me)")
        assert shown != me  # a first name, as every page shows it
        assert (
            f"people wrote  4 messages from watch pages; the run stopped by {shown} ({me}:3)"
            in seen
        ), "\n".join(seen)
        await page.until("w.ended")
        assert await page.page.locator(".state-stopped").count() == 1
        await line_starting(demo, "still running", seen)
        # Still up: a late joiner gets the whole run.
        late = await open_page(browser, url)
        await late.until("w.ended")
        assert await late.transcript() == await page.transcript()
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)
        await asyncio.wait_for(demo.communicate(), timeout=30)
    assert demo.returncode == 0


async def test_keep_running_starts_a_new_run_after_each_ends_for_people_who_come_late(
    browser: Browser,
) -> None:
    """A person who opens the page after the first run ended finds a live one: ``/run/latest``
    leads to the newest run, which the agents write while the page watches."""
    demo = await start_demo(
        "--viewers", "1", "--tokens", "20", "--rate", "40", "--keep-running",
        "--next-run-pause", "1",
    )  # fmt: skip
    seen: list[str] = []
    try:
        first = (await line_starting(demo, "watch ", seen)).split(" ", 1)[1]
        assert (await line_starting(demo, "RESULT", seen)) == "RESULT        ok"
        still = await line_starting(demo, "still running", seen)
        latest = re.search(r"open (http://\S+/run/latest) ", still)
        assert latest is not None, still
        second = (await line_starting(demo, "next run: watch ", seen)).split(" ", 3)[3]
        assert second != first
        page = await open_page(browser, latest.group(1))
        assert page.page.url == second  # the redirect
        await page.until("w.messages.some((m) => m.type === 'token')")
        await page.until("w.ended")
        assert await page.page.locator(".state-done").count() == 1
        assert (await line_starting(demo, "run 2 ended", seen)) == "run 2 ended"
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)
        await asyncio.wait_for(demo.communicate(), timeout=30)
    assert demo.returncode == 0


async def test_public_binds_the_page_and_the_edge_where_asked_and_says_so(browser: Browser) -> None:
    """``--public ADDRESS`` (the default, every interface, is what a person uses; tests stay on
    loopback): the page and the edge listen there, the summary says so, and the page reads
    the edge at the host it was opened by."""
    demo = await start_demo(
        "--public", "127.0.0.1", "--viewers", "2", "--tokens", "30", "--rate", "60",
        "--keep-running",
    )  # fmt: skip
    seen: list[str] = []
    try:
        public = await line_starting(demo, "public: ", seen)
        found = re.search(r"listen on 127\.0\.0\.1 \(page port (\d+), edge port (\d+)\)", public)
        assert found is not None, public
        page_port, edge_port = found.groups()
        assert "the metrics stay on 127.0.0.1" in public
        url = (await line_starting(demo, "watch ", seen)).split(" ", 1)[1]
        assert url.startswith(f"http://127.0.0.1:{page_port}/run/demo-run-")
        page = await open_page(browser, url)
        assert await page.page.evaluate("JSON.parse(config.textContent).edge") == (
            f"http://127.0.0.1:{edge_port}"
        )
        await page.until("w.ended")
        assert (await line_starting(demo, "RESULT", seen)) == "RESULT        ok"
        still = await line_starting(demo, "still running", seen)
        assert f"point clients at http://127.0.0.1:{edge_port} " in still
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)
        await asyncio.wait_for(demo.communicate(), timeout=30)
    assert demo.returncode == 0
