"""Browser tests: Debian's chromium, headless, driven by Playwright (its Python package ships its
own driver, so nothing is downloaded; ``playwright install`` is never needed).

One browser serves every test (each test and its async fixtures run in the session's event
loop, where the browser lives). Each test gets its own edge (so it may kill it and restart it
on the same ports), the watch page's server, and pages in separate browser contexts: separate
"devices", each with its own network (``set_offline``) and cookies, closed after the test.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from devstack.processes import Edge, Origin, start_edge
from devstack.watch import STREAM_PREFIX, serve_watch, watch_path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FOUND = Path(CHROMIUM).exists()


@dataclass
class Stack:
    origin: Origin
    edge: Edge
    watch_url: str
    logs_dir: Path
    edge_args: tuple[str, ...] = ()

    def stream_url(self, name: str) -> str:
        return f"{self.edge.url}{STREAM_PREFIX}{name}"

    def origin_stream_url(self, name: str) -> str:
        return f"{self.origin.url}{STREAM_PREFIX}{name}"

    def page_url(self, name: str) -> str:
        return f"{self.watch_url}{watch_path(name)}"

    def restart_edge(self, *extra_args: str) -> None:
        """Start the edge again on the ports it had (after a kill)."""
        listen = self.edge.url.removeprefix("http://")
        admin = self.edge.admin_url.removeprefix("http://")
        self.edge = start_edge(
            self.origin.url,
            self.logs_dir,
            *self.edge_args,
            *extra_args,
            name="browser-edge",
            listen=listen,
            admin_listen=admin,
        )


@pytest.fixture
def edge_args() -> tuple[str, ...]:
    return ()


@pytest.fixture
def own_edge(origin: Origin, logs_dir: Path, edge_args: tuple[str, ...]) -> Iterator[Edge]:
    started = start_edge(origin.url, logs_dir, *edge_args, name="browser-edge")
    yield started
    started.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def stack(
    origin: Origin, own_edge: Edge, logs_dir: Path, edge_args: tuple[str, ...], browser: Browser
) -> AsyncIterator[Stack]:
    runner: web.AppRunner
    runner, url = await serve_watch(own_edge.url, own_edge.admin_url)
    made = Stack(
        origin=origin, edge=own_edge, watch_url=url, logs_dir=logs_dir, edge_args=edge_args
    )
    yield made
    await close_pages(browser)  # before the edge and the page's server go
    await runner.cleanup()
    if made.edge is not own_edge:
        made.edge.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM_FOUND:
        pytest.fail("chromium not found: `make bootstrap` installs Debian's chromium")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        await launched.close()


@pytest_asyncio.fixture(loop_scope="session")
async def agents_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@dataclass
class WatchPage:
    """One open watch page and the JavaScript errors it raised."""

    page: Page
    errors: list[str]

    async def watch(self, expression: str) -> Any:
        """The value of ``expression`` over the page's ``window.watch`` state (as ``w``)."""
        return await self.page.evaluate(
            f"(() => {{ const w = window.watch; return {expression}; }})()"
        )

    async def transcript(self) -> str:
        """The messages the page holds, serialised as the origin serves a JSON stream."""
        return str(await self.watch("JSON.stringify(w.messages)"))

    async def until(self, expression: str, within: float = 30.0) -> None:
        """Wait until ``expression`` (over ``w``, the page's state) is true."""
        await self.page.wait_for_function(
            f"(() => {{ const w = window.watch; return {expression}; }})()", timeout=within * 1000
        )

    async def shown(self) -> str:
        """What the transcript shows, one line per bubble or event line, the same on every page
        (authors and events by producer id, not by the name or "you" a page calls them):
        ``turn <from> | <part> ¦ <part>`` (a token run is one part), ``event <from>:<seq>
        [(after <ref>)]``, ``raw | <json>``."""
        return str(
            await self.page.evaluate(
                """Array.from(document.querySelectorAll("#transcript .msg")).map((b) => {
                  if (b.classList.contains("event")) return "event " + b.title;
                  if (b.classList.contains("raw"))
                    return "raw | " + b.querySelector(".body").textContent;
                  const parts = Array.from(b.querySelectorAll(".part"), (p) => p.textContent);
                  return "turn " + b.querySelector(".who").title + " | " + parts.join(" ¦ ");
                }).join("\\n")"""
            )
        )

    async def reads(self) -> list[str]:
        """What a person reads, one line per bubble (``<name>: <text>``) or event (its words)."""
        lines = await self.page.evaluate(
            """Array.from(document.querySelectorAll("#transcript .msg"), (b) => {
              const who = b.querySelector(".who").textContent;
              const body = b.querySelector(".body").textContent;
              return who ? who + ": " + body : body;
            })"""
        )
        return [str(line) for line in lines]

    async def name_of(self, producer_id: str) -> str:
        """The name this page shows for a writer (a page's id becomes a first name)."""
        return str(await self.watch(f"w.nameOf({json.dumps(producer_id)})"))


@pytest_asyncio.fixture(loop_scope="session")
async def pages_closed(browser: Browser) -> AsyncIterator[None]:
    """Every page a test opened is closed after it, so none outlives its edge."""
    yield
    await close_pages(browser)


async def close_pages(browser: Browser) -> None:
    for context in browser.contexts:
        await context.close()


async def open_page(browser: Browser, url: str) -> WatchPage:
    """A page in a browser context of its own: another device."""
    context = await browser.new_context(viewport={"width": 1000, "height": 720})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(url)
    await page.wait_for_function("window.watch !== undefined")
    return WatchPage(page=page, errors=errors)
