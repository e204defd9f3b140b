"""Where resume routes go behind balancers, with real processes: the shipped HAProxy config's
way of keeping a stateful MCP upstream's sessions on one process (``backend mcp_servers`` of
``deploy/haproxy/haproxy.cfg``: sticky on ``Mcp-Session-Id``, learnt from the answer that
minted it), in front of two of the official SDK's servers with their sessions in memory, and an
edge whose resume route goes through it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.cluster import DEPLOYED_HAPROXY
from devstack.mcp_client import CallLog, call, count_call, text_of
from devstack.processes import Origin, Process, free_port, start_edge, start_mcp_upstream

pytestmark = pytest.mark.timeout(120)

# What routes a session to its process, copied from the shipped config as it is.
STICKY_DIRECTIVES = ("balance", "stick-table", "stick")


def deployed_mcp_routing() -> list[str]:
    lines: list[str] = []
    in_backend = False
    for line in DEPLOYED_HAPROXY.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if line and not line[0].isspace():
            in_backend = words[:2] == ["backend", "mcp_servers"]
        elif in_backend and words[:1] and words[0] in STICKY_DIRECTIVES:
            lines.append(" ".join(words))
    return lines


def _until_listening(port: int, haproxy: subprocess.Popen[bytes]) -> None:
    """HAProxy's start is waited for (a process's doing), never timed."""
    while True:
        assert haproxy.poll() is None, "haproxy exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)


@pytest.fixture
def balanced_upstreams(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """Two stateful SDK servers behind HAProxy routed as shipped; its URL and their seen files."""
    seen = [tmp_path / f"seen-{i}.jsonl" for i in (1, 2)]
    upstreams: list[Process] = []
    for i, file in enumerate(seen, 1):
        file.touch()
        upstreams.append(start_mcp_upstream(tmp_path, file, name=f"mcp-{i}", stateful=True))
    routing = deployed_mcp_routing()
    assert any(line.startswith("stick on ") for line in routing), routing
    port = free_port()
    servers = "\n".join(
        f"    server mcp-{i} {str(up.ready['url']).removeprefix('http://').removesuffix('/mcp')}"
        for i, up in enumerate(upstreams, 1)
    )
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n"
        "    timeout server 60s\n"
        f"frontend mcp_upstreams\n    bind 127.0.0.1:{port}\n    default_backend mcp_servers\n"
        "backend mcp_servers\n" + "".join(f"    {line}\n" for line in routing) + servers + "\n"
    )
    haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"
    with (tmp_path / "haproxy.log").open("ab") as out:
        haproxy = subprocess.Popen(
            [haproxy_bin, "-db", "-f", str(config)], stdout=out, stderr=out,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        _until_listening(port, haproxy)
        yield f"http://127.0.0.1:{port}/mcp", seen
    finally:
        haproxy.terminate()
        haproxy.wait(10)
        for upstream in upstreams:
            upstream.stop()


async def test_a_stateful_upstreams_sessions_stay_on_their_process(
    origin: Origin, tmp_path: Path, balanced_upstreams: tuple[str, list[Path]]
) -> None:
    # Round-robin alone would send a session's second request to the process that never saw
    # it (the SDK answers 404 "Session not found"); sticky on Mcp-Session-Id, every call works.
    url, seen = balanced_upstreams
    edge = start_edge(origin.url, tmp_path, "--resume-route", f"/mcp={url}", name="edge-sticky")
    try:
        for _ in range(4):
            heard = CallLog()
            result = await call(edge.url + "/mcp", count_call(3, 0.05), heard)
            assert text_of(result) == "counted 3"
            assert heard.steps() == [1.0, 2.0, 3.0]
    finally:
        edge.stop()
    # Both processes had sessions: the balancer did spread them.
    assert all('"tool": "count"' in file.read_text() for file in seen)
