"""The watch page's server: the page with its config, the viewer count from the edge."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp.test_utils import TestClient, TestServer

from devstack.processes import Edge
from devstack.watch import create_watch_app
from tests.integration.test_faults import closed_port


@asynccontextmanager
async def watch_client(edge_url: str, admin_url: str) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with TestClient(TestServer(create_watch_app(edge_url, admin_url))) as client:
        yield client


def embedded_config(html: str) -> dict[str, str]:
    found = re.search(r'<script id="config" type="application/json">(.*?)</script>', html, re.S)
    assert found is not None
    config: dict[str, str] = json.loads(found.group(1))
    return config


async def test_the_page_names_the_edge_and_the_stream(edge: Edge) -> None:
    async with watch_client(edge.url, edge.admin_url) as client:
        response = await client.get("/run/demo-run-1")
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-store"
        config = embedded_config(await response.text())
        assert config == {
            "edge": edge.url,
            "path": "/v1/stream/demo-run-1",
            "stream": "demo-run-1",
            "viewers": "/api/viewers",
        }
        script = await client.get("/static/watch.js")
        assert script.status == 200
        assert "EventSource" in await script.text()


async def test_names_that_are_not_plain_stream_names_are_404(edge: Edge) -> None:
    async with watch_client(edge.url, edge.admin_url) as client:
        for bad in ("/run/a%20b", "/run/%3C%2Fscript%3E", "/run/" + "x" * 201):
            response = await client.get(bad)
            assert response.status == 404, bad


async def test_viewers_come_from_the_edges_metrics(edge: Edge) -> None:
    async with watch_client(edge.url, edge.admin_url) as client:
        response = await client.get("/api/viewers")
        assert response.status == 200
        answer = await response.json()
        assert isinstance(answer["viewers"], int)
        assert answer["viewers"] >= 0


async def test_an_unreachable_edge_admin_is_502_with_no_count(edge: Edge) -> None:
    gone = f"http://127.0.0.1:{closed_port()}"
    async with watch_client(edge.url, gone) as client:
        response = await client.get("/api/viewers")
        assert response.status == 502
        assert await response.json() == {"viewers": None}


async def test_with_tokens_a_page_is_served_only_for_a_hosted_run_with_that_runs_token(
    edge: Edge,
) -> None:
    asked: list[tuple[str, str]] = []

    def mint(sub: str, stream: str) -> str | None:
        asked.append((sub, stream))
        return f"token-for-{stream}" if stream == "/v1/stream/hosted" else None

    app = create_watch_app(edge.url, edge.admin_url, mint)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/run/hosted")
        assert response.status == 200
        assert embedded_config(await response.text())["token"] == "token-for-/v1/stream/hosted"
        assert (await client.get("/run/elsewhere")).status == 404
    assert [stream for _, stream in asked] == ["/v1/stream/hosted", "/v1/stream/elsewhere"]
    assert all(sub.startswith("page-") for sub, _ in asked)
