"""The watch page in headless Chromium, reading and writing a shared run through the edge.

What a person would check: every open page (late joiners too) ends with the transcript the
origin holds, byte for byte, and shows it as a chat: each run of one author's messages one
bubble (a token run one growing text), status and control messages in plain words, every
message once and in order (``chat``, a model of the grouping, says what each page must show);
Stop on one device stops the agent and every page shows it; a human's messages appear on every
page in order, once; the edge dying or the page going offline costs nothing. Figures (Stop
click to acknowledgement, reconnects) are printed, not asserted.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Route

from devstack import session
from devstack.agents import Run, create_session, start_run
from devstack.demo import tokens
from tests.browser.conftest import Stack, WatchPage, open_page

pytestmark = pytest.mark.asyncio(loop_scope="session")
# Tests never write tracked files: the screenshot goes to a temporary file unless
# EDGE_SCREENSHOT names where to keep it (`EDGE_SCREENSHOT=docs/watch-page.png pytest -k take_over`
# refreshes the README's picture).
SCREENSHOT_TO = os.environ.get("EDGE_SCREENSHOT")
_names = iter(range(1_000_000))


def run_name(label: str) -> str:
    return f"browser-{label}-{int(time.time() * 1000)}-{next(_names)}"


async def start(
    stack: Stack, http: aiohttp.ClientSession, name: str, count: int, rate: float
) -> Run:
    """Start the agents on session ``name``, creating it unless it exists."""
    url = stack.stream_url(name)
    async with http.head(url) as response:
        exists = response.status == 200
    if not exists:
        await create_session(http, url)
    return await start_run(http, url, tokens(count, seed=11), rate)


async def open_pages(
    stack: Stack, browser: Browser, http: aiohttp.ClientSession, name: str, count: int
) -> list[WatchPage]:
    """``count`` pages on a session that exists already (they see no 404 first)."""
    await create_session(http, stack.stream_url(name))
    return [await open_page(browser, stack.page_url(name)) for _ in range(count)]


async def origin_transcript(stack: Stack, http: aiohttp.ClientSession, name: str) -> bytes:
    async with http.get(f"{stack.origin_stream_url(name)}?offset=-1") as response:
        assert response.status == 200
        return await response.read()


def _describe(message: dict[str, Any]) -> str:
    if message["type"] == "tool_call":
        return f"calls {message['name']}({session.encode(message['args']).decode()})"
    if message["type"] == "tool_result":
        result = message["result"]
        return f"→ {result if isinstance(result, str) else session.encode(result).decode()}"
    text = message.get("text")
    return text if isinstance(text, str) else session.encode(message).decode()


def chat(items: list[Any]) -> str:
    """What ``WatchPage.shown`` must be for ``items``: one bubble per run of messages from one
    author (consecutive tokens one text), status and control messages lines of their own, raw
    values shown whole; nothing left out, nothing twice, stream order."""
    lines: list[str] = []
    turn: dict[str, Any] | None = None
    for m in items:
        if not isinstance(m, dict):
            lines.append(f"raw | {session.encode(m).decode()}")  # type: ignore[arg-type]
            turn = None
        elif m["type"] in ("status", "control"):
            after = f" (after {m['ref']})" if m.get("ref") else ""
            lines.append(f"event {m['from']}:{m['seq']}{after}")
            turn = None
        else:
            if turn is None or turn["from"] != m["from"]:
                turn = {"from": m["from"], "parts": [], "line": len(lines), "text": False}
                lines.append("")
            if m["type"] == "token" and turn["text"]:
                turn["parts"][-1] += m["text"]
            else:
                turn["parts"].append(m["text"] if m["type"] == "token" else _describe(m))
            turn["text"] = m["type"] == "token"
            lines[turn["line"]] = f"turn {turn['from']} | " + " ¦ ".join(turn["parts"])
    return "\n".join(lines)


async def assert_exact(
    stack: Stack, http: aiohttp.ClientSession, name: str, run: Run, pages: list[WatchPage]
) -> list[session.Message]:
    """Every page holds the origin's transcript byte for byte, and each agent's messages in it
    are exactly the ones it wrote, in order, once."""
    stored = await origin_transcript(stack, http, name)
    items: list[session.Message] = json.loads(stored)
    for producer in run.producers:
        assert [m for m in items if m["from"] == producer.producer_id] == producer.written
    for page in pages:
        assert (await page.transcript()).encode() == stored
        assert page.errors == []
    shown = {await page.shown() for page in pages}
    assert shown == {chat(items)}, "every page shows the transcript as the chat model does"
    return items


async def assert_position(page: WatchPage) -> None:
    """Messages and bytes received in words; the raw offset on hover."""
    count = await page.watch("w.messages.length")
    position = await page.page.inner_text("#position")
    assert re.fullmatch(rf"{count:,} messages · [\d.]+ (B|KB|MB) received", position), position
    assert (
        await page.page.get_attribute("#position", "title")
        == f"offset {await page.watch('w.offset')}"
    )


async def viewers_reach(stack: Stack, count: int) -> None:
    for _ in range(100):
        if f"edge_sse_viewers {count}.0" in stack.edge.metrics_text():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the edge never had {count} viewers")


async def count_tokens(page: WatchPage) -> int:
    return int(await page.watch("w.messages.filter((m) => m.type === 'token').length"))


async def test_three_pages_one_late_end_with_the_origins_transcript(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    name = run_name("three")
    page_a = await open_page(browser, stack.page_url(name))
    page_b = await open_page(browser, stack.page_url(name))
    run = await start(stack, agents_http, name, count=80, rate=25)
    await page_a.until("w.messages.filter((m) => m.type === 'token').length >= 35")
    page_c = await open_page(browser, stack.page_url(name))  # joins mid-run: history, then live
    await page_a.until("w.viewers !== null && w.viewers >= 3", within=10)
    await run.wait(60)
    for page in (page_a, page_b, page_c):
        await page.until("w.ended")
        assert await page.watch("w.state") == "ended"
    items = await assert_exact(stack, agents_http, name, run, [page_a, page_b, page_c])
    # Who wrote what is on the page, each name once per bubble, in plain words.
    for role in ("user", "worker", "reviewer"):
        assert await page_c.page.locator(f".from-{role}").count() >= 1
    assert await page_c.page.locator(".type-tool_call").count() == 1
    reads = await page_c.reads()
    assert reads[0] == "User: Explain how the edge keeps every viewer exact."
    assert reads[1] == "The worker started"
    assert reads[2].startswith("Worker: ")
    assert reads[-2:] == ["The worker finished", "The reviewer signed off"]
    assert {line.split(":")[0] for line in reads if ": " in line} == {"User", "Worker", "Reviewer"}
    is_token = [m["type"] == "token" for m in items]
    runs = sum(1 for i, token in enumerate(is_token) if token and not (i and is_token[i - 1]))
    assert await page_c.page.locator(".type-token").count() == runs
    assert runs < sum(is_token) / 4, "tokens are grouped into growing texts, not a card each"
    await assert_position(page_a)
    page_d = await open_page(browser, stack.page_url(name))  # after the end: same transcript
    await page_d.until("w.ended")
    await assert_exact(stack, agents_http, name, run, [page_a, page_d])
    stored = await origin_transcript(stack, agents_http, name)
    print(f"\n[three pages] {len(items)} messages, {len(stored)} transcript bytes on 4 pages")


async def test_stop_on_one_page_stops_the_agent_everywhere(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    name = run_name("stop")
    pages = await open_pages(stack, browser, agents_http, name, 3)
    page_a, page_b, page_c = pages
    run = await start(stack, agents_http, name, count=400, rate=20)
    await page_b.until("w.messages.filter((m) => m.type === 'token').length >= 10")
    await page_b.page.click("#stop")
    await run.wait(30)
    for page in pages:
        await page.until("w.ended")
    items = await assert_exact(stack, agents_http, name, run, pages)
    me_b = await page_b.watch("w.me")
    stop = next(m for m in items if m["type"] == "control" and m["action"] == "stop")
    assert stop["from"] == me_b
    # The agent's acknowledgement names the stop, and is the last thing it wrote.
    assert run.worker.written[-1] == {
        "type": "status",
        "from": "worker",
        "seq": run.worker.written[-1]["seq"],
        "state": "stopped",
        "ref": session.name(stop),
    }
    ack_index = items.index(run.worker.written[-1])
    assert all(m["from"] != "worker" for m in items[ack_index + 1 :])
    assert items.index(stop) < ack_index
    worker_tokens = sum(1 for m in run.worker.written if m["type"] == "token")
    assert worker_tokens < 400
    name_b = await page_a.name_of(me_b)
    for page in (page_a, page_c):
        assert await page.page.locator(".state-stopped").count() == 1
        assert await page.page.is_disabled("#stop")
        reads = await page.reads()
        assert f"{name_b} pressed Stop" in reads
        assert f"The worker was stopped by {name_b}" in reads
    assert {"You pressed Stop", "The worker was stopped by you"} <= set(await page_b.reads())
    clicked_ms, shown_ms = await page_b.watch("[w.stopClickedAt, w.stopAckSeenAt]")
    seen, acked = run.report.stop_seen_at, run.report.stop_acked_at
    assert seen is not None
    assert acked is not None
    print(
        f"\n[stop] from the click on page B: the agent saw the stop after "
        f"{1000 * seen - clicked_ms:.0f} ms, its ack was appended after "
        f"{1000 * acked - clicked_ms:.0f} ms, page B showed it after {shown_ms - clicked_ms} ms; "
        f"tokens between the stop control and the ack: "
        f"{sum(1 for m in items[items.index(stop) :] if m['type'] == 'token')}"
    )


async def say(page: WatchPage, text: str) -> None:
    await page.page.fill("#say", text)
    await page.page.click("#send")


async def test_take_over_two_peoples_messages_appear_everywhere_in_order_once(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    name = run_name("human")
    pages = await open_pages(stack, browser, agents_http, name, 3)
    page_a, page_b, page_c = pages
    me_a, me_b = await page_a.watch("w.me"), await page_b.watch("w.me")
    run = await start(stack, agents_http, name, count=60, rate=20)
    await page_a.until("w.messages.filter((m) => m.type === 'token').length >= 5")
    await page_a.page.click("#take")
    for page in pages:
        await page.until("w.messages.some((m) => m.type === 'status' && m.state === 'yielded')")
    name_a = await page_b.name_of(me_a)
    for page in (page_b, page_c):
        assert await page.page.is_hidden("#say-form"), "only the holder types"
        assert await page.page.inner_text("#holder") == name_a
        assert await page.page.get_attribute("#holder", "title") == me_a
    assert await page_a.page.inner_text("#holder") == "you"
    # The second message's first answer is lost on the way back (the append landed): the page
    # retries with the same Producer-Seq and the origin does not append it twice.
    lost: list[str] = []

    async def lose_first_answer(route: Route) -> None:
        body = route.request.post_data or ""
        if route.request.method == "POST" and "second" in body and not lost:
            answer = await route.fetch()
            lost.append(f"{answer.status}")
            await route.abort("connectionreset")
            return
        await route.continue_()

    await page_a.page.route("**/v1/stream/**", lose_first_answer)
    said_a = ["first, from a human", " second: with a leading space", "third ✓ ünïcode"]
    for text in said_a:
        await say(page_a, text)
    await page_a.until("w.sent.filter((r) => r.type === 'human' && r.done).length === 3")
    await page_a.page.unroute("**/v1/stream/**")
    # A second person takes it from the first, says one thing and hands it back to the agent.
    await page_b.page.click("#take")
    await page_a.until(f"w.messages.some((m) => m.from === '{me_b}' && m.type === 'control')")
    assert await page_a.page.is_hidden("#say-form")
    await page_b.until("!document.getElementById('say-form').hidden")
    said_b = ["fourth, from a second person"]
    await say(page_b, said_b[0])
    await page_b.page.click("#release")
    # The picture of the page (docs/session.md): a third person's view once the agent resumed.
    await page_c.page.set_viewport_size({"width": 1000, "height": 900})
    await page_c.until(
        "(() => { const i = w.messages.findIndex((m) => m.state === 'resumed');"
        " return i >= 0 && w.messages.slice(i).filter((m) => m.type === 'token').length >= 6; })()"
    )
    screenshot = Path(SCREENSHOT_TO) if SCREENSHOT_TO else tmp_path / "watch-page.png"
    await page_c.page.screenshot(path=str(screenshot))
    assert screenshot.stat().st_size > 10_000
    await run.wait(30)
    for page in pages:
        await page.until("w.ended")
    items = await assert_exact(stack, agents_http, name, run, pages)
    humans = [m for m in items if m["type"] == "human"]
    assert [(m["from"], m["text"]) for m in humans] == [(me_a, t) for t in said_a] + [
        (me_b, t) for t in said_b
    ]
    assert lost == ["200"]
    attempts = await page_a.watch("w.sent.filter((r) => r.type === 'human').map((r) => r.attempts)")
    assert attempts[1] >= 2
    assert await page_a.watch("w.sent.filter((r) => r.type === 'human').map((r) => r.status)") == [
        200,
        204,
        200,
    ]
    # The agent wrote nothing while a human held the session, and resumed on the release.
    kinds = [(m["from"], m["type"], m.get("state") or m.get("action")) for m in items]
    yielded = kinds.index(("worker", "status", "yielded"))
    resumed = kinds.index(("worker", "status", "resumed"))
    assert kinds.index((me_a, "control", "take_over")) < yielded
    assert all(items.index(h) in range(yielded, resumed) for h in humans)
    assert kinds.index((me_b, "control", "release")) < resumed
    assert items[resumed]["ref"] == session.name(items[kinds.index((me_b, "control", "release"))])
    assert all(m["from"] != "worker" for m in items[yielded + 1 : resumed])
    assert kinds[-2:] == [("worker", "status", "done"), ("reviewer", "status", "signed_off")]
    name_b = await page_a.name_of(me_b)
    for page in pages:
        assert await page.page.locator(".type-human").count() == len(humans)
        assert await page.name_of(me_a) == name_a, "every page names a writer alike"
    # In plain words, each person by name (or "you"), each bubble's author named once.
    reads_a, reads_b, reads_c = [await page.reads() for page in pages]
    for opening in (f"{name_a}: {said_a[0]}", f"{name_b}: {said_b[0]}"):
        assert any(line.startswith(opening) for line in reads_c), (opening, reads_c)
    for line in (
        f"{name_a} took over",
        f"The worker paused for {name_a}",
        f"{name_b} took over",
        f"{name_b} handed the run back",
        "The worker resumed",
    ):
        assert line in reads_c, (line, reads_c)
    assert "You took over" in reads_a
    assert any(line.startswith(f"You: {said_a[0]}") for line in reads_a)
    assert "You handed the run back" in reads_b
    # Bubbles are labelled by a name alone (no "HUMAN PAGE-… (YOU) · HUMAN").
    names = {"User", "Worker", "Reviewer", name_a, name_b}
    for lines, mine in ((reads_a, name_a), (reads_b, name_b), (reads_c, None)):
        labels = {line.split(": ", 1)[0] for line in lines if ": " in line}
        assert labels <= (names - {mine}) | ({"You"} if mine else set()), labels


async def test_pages_resume_after_the_edge_is_killed_and_restarted(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    name = run_name("kill")
    pages = await open_pages(stack, browser, agents_http, name, 3)
    run = await start(stack, agents_http, name, count=200, rate=25)
    await pages[0].until("w.messages.filter((m) => m.type === 'token').length >= 20")
    stack.edge.process.kill()
    for page in pages:
        await page.until("w.state !== 'live'", within=10)
    await asyncio.sleep(0.5)
    # It comes back full first (one viewer slot, which an agent's follower takes): the pages'
    # EventSources meet a real 503 and give up; the pages reopen them themselves.
    stack.restart_edge("--max-viewers", "1")
    refused = "w.errors.some((e) => e.includes('HTTP 503'))"
    for page in pages:
        await page.until(f"w.state === 'live' || {refused}", within=15)
    met_503 = [page for page in pages if await page.watch(refused)]
    assert met_503, "a page met the full edge's 503"
    stack.edge.process.kill()
    stack.restart_edge()
    await run.wait(60)
    for page in pages:
        await page.until("w.ended")
    items = await assert_exact(stack, agents_http, name, run, pages)
    for page in met_503:
        assert await page.watch("w.reopens") >= 1, "the page reopened its EventSource itself"
    opens = [await page.watch("w.connections") for page in pages]
    states = await met_503[0].watch("w.states")
    print(
        f"\n[edge SIGKILL x2] {len(items)} messages exact on {len(pages)} pages; "
        f"{len(met_503)} met a 503; EventSources opened per page {opens}; states {states}; "
        f"agent append retries {[p.retries for p in run.producers]}"
    )


async def test_a_page_cut_off_offline_resumes_without_gap_or_duplicate(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    name = run_name("offline")
    pages = await open_pages(stack, browser, agents_http, name, 3)
    run = await start(stack, agents_http, name, count=120, rate=25)
    await pages[1].until("w.messages.filter((m) => m.type === 'token').length >= 20")
    await pages[1].page.context.set_offline(True)
    await pages[1].until("w.state !== 'live'", within=10)
    before = await count_tokens(pages[1])
    await asyncio.sleep(2.0)
    assert await count_tokens(pages[1]) == before, "an offline page receives nothing"
    await pages[1].page.context.set_offline(False)
    await run.wait(60)
    for page in pages:
        await page.until("w.ended")
    items = await assert_exact(stack, agents_http, name, run, pages)
    states = await pages[1].watch("w.states")
    assert "reconnecting" in states or "error" in states
    print(
        f"\n[offline] {len(items)} messages exact on {len(pages)} pages; page B offline 2 s: "
        f"states {states}, EventSources opened {await pages[1].watch('w.connections')}"
    )


# --max-viewers is the edge's total, split over its workers: one process makes "full" exact.
@pytest.mark.parametrize("edge_args", [("--max-viewers", "3", "--workers", "1")])
async def test_an_error_answer_is_shown_and_retried_with_backoff(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    name = run_name("full")
    run = await start(stack, agents_http, name, count=60, rate=20)  # its two followers: 2 viewers
    async with agents_http.get(f"{stack.stream_url(name)}?offset=-1&live=sse") as third:
        assert third.status == 200
        await viewers_reach(stack, 3)
        page = await open_page(browser, stack.page_url(name))
        await page.until("w.errors.length >= 1", within=15)
        assert await page.page.is_visible("#error")
        assert "HTTP 503" in await page.page.inner_text("#error")
        assert await page.watch("w.messages.length") == 0
    await page.until("w.state === 'live' || w.ended", within=20)
    await run.wait(30)
    await page.until("w.ended")
    await assert_exact(stack, agents_http, name, run, [page])
    assert await page.watch("w.reopens") >= 1


async def test_values_that_are_not_messages_are_shown_raw_and_the_page_goes_on(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    name = run_name("raw")
    [page] = await open_pages(stack, browser, agents_http, name, 1)
    await page.until("w.state === 'live'", within=10)
    after = {"type": "human", "from": "someone", "seq": 0, "text": "still shown"}
    take = {"type": "control", "from": "someone", "seq": 1, "action": "take_over"}
    # One append each; an array body appends its items, so [[1]] appends the array [1].
    for body in (b"null", b"3", b'"x"', b"[[1]]", json.dumps(after).encode()):
        async with agents_http.post(
            stack.stream_url(name), data=body, headers={"Content-Type": session.JSON}
        ) as response:
            assert response.status in (200, 204), await response.text()
        await asyncio.sleep(0.05)  # separate data events, as separate writers would send them
    async with agents_http.post(
        stack.stream_url(name), data=json.dumps(take), headers={"Content-Type": session.JSON}
    ) as response:
        assert response.status in (200, 204)
    await page.until("w.messages.length === 6")
    stored = await origin_transcript(stack, agents_http, name)
    assert json.loads(stored) == [None, 3, "x", [1], after, take]
    assert (await page.transcript()).encode() == stored
    assert page.errors == []
    shown = (await page.shown()).splitlines()
    assert shown == [
        *(f"raw | {raw}" for raw in ("null", "3", '"x"', "[1]")),
        "turn someone | still shown",
        "event someone:1",
    ]
    assert (await page.reads())[4:] == ["Someone: still shown", "Someone took over"]
    # The fold skipped the values: the take-over after them counts.
    assert await page.page.inner_text("#holder") == "Someone"
    async with agents_http.head(stack.stream_url(name)) as response:
        tail = response.headers["Stream-Next-Offset"]
    assert await page.watch("w.offset") == tail
    assert await page.page.get_attribute("#position", "data-offset") == tail
    await assert_position(page)


async def test_on_a_phone_the_stats_wrap_without_a_gap_and_nothing_overflows(
    stack: Stack, browser: Browser, agents_http: aiohttp.ClientSession
) -> None:
    """A 375 px phone: the status row may wrap, but its lines sit as close as lines of text
    (the row gap is not the column gap), and nothing is wider than the screen, the message
    box included once a person takes the run over."""
    name = run_name("phone")
    page = await open_page(browser, stack.page_url(name))
    await page.page.set_viewport_size({"width": 375, "height": 740})
    run = await start(stack, agents_http, name, count=20, rate=40)
    await page.until("w.viewers !== null")
    await page.page.click("#take")
    await page.until("w.messages.some((m) => m.type === 'status' && m.state === 'yielded')")
    lines = await page.page.evaluate(
        """() => {
          const tops = [...document.querySelectorAll('.status > span:not([hidden])')]
            .map((e) => e.getBoundingClientRect())
            .map((r) => [Math.round(r.top), Math.round(r.bottom)]);
          return tops;
        }"""
    )
    rows = sorted(dict(lines).items())  # one (top, bottom) per line of the row
    for (_, bottom), (next_top, _) in itertools.pairwise(rows):
        assert next_top - bottom <= 4, rows  # was 1.4rem (~21 px) between wrapped lines
    wide = await page.page.evaluate(
        "() => [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert wide[0] <= wide[1], wide
    await page.page.click("#release")
    await run.wait(60)
    await page.until("w.ended")
