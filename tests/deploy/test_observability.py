"""The observability deploy files (deploy/prometheus, deploy/grafana, docs/metrics.md) against
the real tools and a live edge: promtool accepts them, every metric they name is one the edge
exports, and a real Prometheus scrapes a running edge and evaluates the rules without error."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from devstack.processes import Edge, free_port
from edge.protocol.sse import SseDecoder

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
GRAFANA_DIR = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "edge.json"
DATASOURCE = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"
METRICS_DOC = REPO / "docs" / "metrics.md"

RECORDING_RULE = "edge:origin_requests_per_client_request:ratio_rate1m"

# Metric names as written in PromQL. Recording rules (``edge:...``) have a colon right after
# ``edge``, so they never match; ``\b`` keeps words such as ``knowledge_x`` out.
METRIC_NAME = re.compile(r"\bedge_[a-z_]+")

# How a family named in a ``# TYPE`` line shows up in queries, when it has no sample yet (a
# labelled counter nothing has touched exports only its HELP and TYPE lines).
SERIES_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}

TEXT = {"Content-Type": "text/plain"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # Not a skip: without the tool these files would go unchecked and nobody would notice.
        pytest.fail(f"{name} not found on PATH: install Debian's `prometheus` package")
    return path


def exported_names(metrics_text: str) -> set[str]:
    """Every series name a query may use against this exposition: the sample names, plus what
    each ``# TYPE`` family is queried as (counters by their ``_total`` name, histograms by their
    ``_bucket``/``_sum``/``_count`` series)."""
    names: set[str] = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            if kind == "counter" and not family.endswith("_total"):
                family += "_total"
            names.update(family + suffix for suffix in SERIES_SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def documented_families(metrics_text: str) -> set[str]:
    """The families a reader queries (``_created`` gauges are prometheus_client bookkeeping)."""
    return {
        line.split()[2]
        for line in metrics_text.splitlines()
        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")
    }


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def names_in_rules() -> set[str]:
    # Every ``edge_*`` token in the file, expressions and annotations alike: a name in an
    # annotation that the edge does not export would mislead the person paged.
    return set(METRIC_NAME.findall(ALERTS.read_text()))


def names_in_dashboard() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {name for text in _strings(dashboard) for name in METRIC_NAME.findall(text)}


async def _call(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> int:
    async with session.request(method, url, **kwargs) as response:
        await response.read()
        return response.status


async def _first_control_event(response: aiohttp.ClientResponse) -> None:
    """Read an SSE response until its first control event (the data before it was delivered)."""
    decoder = SseDecoder()
    async with asyncio.timeout(15):
        while True:
            chunk = await response.content.readany()
            assert chunk, "the SSE response ended before its first control event"
            if any(event.event == "control" for event in decoder.feed(chunk)):
                return


async def _traffic(session: aiohttp.ClientSession, url: str) -> None:
    """Create, write, catch up on and HEAD a stream, so that the labelled series exist."""
    assert await _call(session, "PUT", url, headers=TEXT) == 201
    assert await _call(session, "POST", url, headers=TEXT, data=b"hello") in (200, 204)
    assert await _call(session, "GET", url + "?offset=-1") == 200
    assert await _call(session, "HEAD", url) == 200


@pytest.fixture
async def client() -> Any:
    # No total timeout: the SSE viewer stays connected while Prometheus scrapes.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


# --- the files, checked by the real tools ------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "path"), [("config", PROMETHEUS_CONFIG), ("rules", ALERTS)], ids=["config", "rules"]
)
def test_promtool_accepts(check: str, path: Path) -> None:
    result = subprocess.run(
        [_tool("promtool"), "check", check, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"promtool check {check} {path}:\n{result.stdout}{result.stderr}"


def test_dashboard_uses_the_provisioned_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert (dashboard["uid"], dashboard["title"]) == ("edge", "edge")
    match = re.search(r"^\s*uid:\s*(\S+)\s*$", DATASOURCE.read_text(), re.MULTILINE)
    assert match, f"no datasource uid in {DATASOURCE}"
    provisioned = match.group(1).strip("'\"")

    def references(node: Any) -> Iterator[dict[str, str]]:
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and source.get("type") == "prometheus":
                yield source
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    found = list(references(dashboard))
    assert found, "the dashboard names no Prometheus datasource"
    assert {source["uid"] for source in found} == {provisioned}
    assert all(
        target.get("expr") for panel in dashboard["panels"] for target in panel.get("targets", [])
    )


# --- the files against a live edge -------------------------------------------------------------


async def test_every_metric_named_is_exported_and_documented(
    client: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await _traffic(client, url)
    async with client.get(f"{url}?offset=-1&live=sse") as viewer:
        assert viewer.status == 200
        await _first_control_event(viewer)
        text = edge.metrics_text()  # a local admin read, instant
    exported = exported_names(text)

    # The traffic above made these series real samples, not just TYPE lines.
    for name in ("edge_requests_total", "edge_origin_requests_total", "edge_sse_events_sent_total"):
        assert re.search(rf"^{name}[{{ ]", text, re.MULTILINE), f"no {name} sample after traffic"

    for source, used in (("alerts.yml", names_in_rules()), ("edge.json", names_in_dashboard())):
        assert used, f"{source} names no edge metric"
        missing = sorted(used - exported)
        assert not missing, f"{source} uses metrics the edge does not export: {missing}"

    doc = METRICS_DOC.read_text()
    undocumented = sorted(f for f in documented_families(text) if f not in doc)
    assert not undocumented, f"docs/metrics.md does not describe: {undocumented}"


# --- a real Prometheus scraping a live edge ----------------------------------------------------

SCRAPE_CONFIG = """\
# Written by tests/deploy/test_observability.py: deploy/prometheus/prometheus.yml, but scraping
# the test's edge every second so that the test is quick.
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: edge
    static_configs:
      - targets: ["{target}"]
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ready(proc: subprocess.Popen[bytes], url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


@pytest.fixture
def prometheus(edge: Edge, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping the session edge's admin listener, with the real alerts.yml.
    Yields its URL; stopped by its own pid."""
    binary = _tool("prometheus")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    config = tmp_path / "prometheus.yml"
    config.write_text(SCRAPE_CONFIG.format(target=urlsplit(edge.admin_url).netloc))
    log = tmp_path / "prometheus.log"
    # A free port can be taken between the probe and Prometheus binding it: try again then.
    for _ in range(3):
        url = f"http://127.0.0.1:{free_port()}"
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={urlsplit(url).netloc}",
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        if _ready(proc, url, timeout=30):
            break
        _stop(proc)
    else:
        pytest.fail(f"prometheus did not start:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        yield url
    finally:
        _stop(proc)


async def _poll(
    session: aiohttp.ClientSession,
    url: str,
    done: Callable[[Any], bool],
    *,
    seconds: float,
    params: dict[str, str] | None = None,
) -> Any:
    """GET a Prometheus API URL until ``done(data)``; returns the last ``data`` either way."""
    data: Any = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        async with session.get(url, params=params) as response:
            body = await response.json()
        assert body["status"] == "success", body
        data = body["data"]
        if done(data):
            break
        await asyncio.sleep(0.5)
    return data


async def test_prometheus_scrapes_the_edge_and_evaluates_the_rules(
    client: aiohttp.ClientSession, edge: Edge, prometheus: str, stream_path: str
) -> None:
    query = f"{prometheus}/api/v1/query"
    url = edge.url + stream_path
    await _traffic(client, url)

    def a_viewer(data: Any) -> bool:
        return any(float(sample["value"][1]) >= 1 for sample in data["result"])

    async with client.get(f"{url}?offset=-1&live=sse") as viewer:
        assert viewer.status == 200
        await _first_control_event(viewer)
        # The viewer is still connected: Prometheus must see it through the admin listener.
        data = await _poll(
            client, query, a_viewer, seconds=20, params={"query": "edge_sse_viewers"}
        )
        if not a_viewer(data):
            async with client.get(f"{prometheus}/api/v1/targets") as response:
                targets = await response.json()
            pytest.fail(f"edge_sse_viewers never showed the viewer: {data}\ntargets: {targets}")

    # The recording rule needs two scrapes of both sides of its ratio; with 1 s scrapes and
    # evaluations that takes seconds, so the bound is generous.
    data = await _poll(
        client, query, lambda d: bool(d["result"]), seconds=30, params={"query": RECORDING_RULE}
    )
    assert data["result"], f"{RECORDING_RULE} was never recorded"
    assert {sample["metric"].get("kind") for sample in data["result"]} >= {"write"}

    # Every rule has been evaluated at least once, and none failed (a many-to-many match or a
    # bad label set only shows at evaluation time, not in promtool).
    def rules(data: Any) -> list[dict[str, Any]]:
        return [rule for group in data["groups"] for rule in group["rules"]]

    data = await _poll(
        client,
        f"{prometheus}/api/v1/rules",
        lambda d: bool(rules(d)) and all(r["health"] != "unknown" for r in rules(d)),
        seconds=20,
    )
    broken = {
        r["name"]: (r["health"], r.get("lastError")) for r in rules(data) if r["health"] != "ok"
    }
    assert not broken, f"rules that did not evaluate cleanly: {broken}"
    assert len(rules(data)) == ALERTS.read_text().count("- alert:") + ALERTS.read_text().count(
        "- record:"
    )
