"""``make demo`` as people use it: the summary, the ``watch`` line, and with ``--keep-running``
a page a person opens to take the run over and stop it."""

from __future__ import annotations

import asyncio
import os
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
        assert f"people wrote  4 messages; the run stopped by {me}:3" in seen, "\n".join(seen)
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
