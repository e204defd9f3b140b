"""The watch page's server: the page with its config, the viewer count from the edge."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp.test_utils import TestClient, TestServer

from devstack.processes import Edge
from devstack.reach import local_url, machine_addresses, shown_host, url_at
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


async def test_a_public_page_reads_the_edge_at_the_host_the_visitor_used(edge: Edge) -> None:
    """``make demo ARGS=--public``: a phone that opened the page at this machine's LAN address
    reads the edge there too (the edge's port, the visitor's host); only headers are sent."""
    wildcard = url_at(edge.url, "0.0.0.0")
    port = edge.url.rsplit(":", 1)[1]
    app = create_watch_app(wildcard, edge.admin_url, public=True)
    async with TestClient(TestServer(app)) as client:
        for host, seen in (
            ("192.0.2.50:8080", "192.0.2.50"),
            ("laptop.local", "laptop.local"),
            ("[fd00::1]:8080", "[fd00::1]"),
        ):
            response = await client.get("/run/demo-run-1", headers={"Host": host})
            assert response.status == 200, host
            assert embedded_config(await response.text())["edge"] == f"http://{seen}:{port}"
        bad = await client.get("/run/demo-run-1", headers={"Host": "a b"})
        assert bad.status == 400
    # Not public: the configured edge, whatever the Host.
    async with watch_client(edge.url, edge.admin_url) as client:
        response = await client.get("/run/demo-run-1", headers={"Host": "192.0.2.50:8080"})
        assert embedded_config(await response.text())["edge"] == edge.url


async def test_the_page_has_a_favicon(edge: Edge) -> None:
    async with watch_client(edge.url, edge.admin_url) as client:
        html = await (await client.get("/run/demo-run-1")).text()
        found = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)">', html)
        assert found is not None
        for path in (found.group(1), "/favicon.ico"):
            icon = await client.get(path)
            assert icon.status == 200, path
            assert icon.headers["Content-Type"] == "image/svg+xml"
            assert (await icon.text()).startswith("<svg")


def test_a_server_on_every_interface_is_reached_on_loopback_here_and_at_an_address_elsewhere() -> (
    None
):
    assert local_url("http://0.0.0.0:8080") == "http://127.0.0.1:8080"
    assert local_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert url_at("http://0.0.0.0:8080/run/x", "192.0.2.7") == "http://192.0.2.7:8080/run/x"
    addresses = machine_addresses()
    assert addresses
    assert not any(a.startswith("127.") for a in addresses)
    assert shown_host("0.0.0.0") == addresses[0]
    assert shown_host("127.0.0.1") == "127.0.0.1"
