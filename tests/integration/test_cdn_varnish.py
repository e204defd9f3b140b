"""The edge's ``--cdn-purge varnish=URL`` against real Debian varnishd (vmod xkey from
``varnish-modules``), with a minimal VCL of the CDN contract's purge: a DELETE through the edge
makes Varnish drop the stream's stored answers. The shipped VCL and the broad tests through it
are deploy/varnish/edge.vcl and tests/integration/test_cdn.py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, free_port, start_edge
from edge.protocol.purge_keys import stream_key
from tests.cdn_stand_ins import eventually
from tests.integration.test_passthrough import call, metric_value

TEXT = {"Content-Type": "text/plain"}

# Caches GETs by URL; PURGE with xkey-purge from loopback only (contract 2); answers are tagged
# in xkey with the edge's Surrogate-Key. An edge that does not name its keys yet (its answers
# carry no Surrogate-Key) is tagged with the key the test's reader names in X-Test-Keys, the
# key the edge purges by: what is tested is the purge, not the tagging.
VCL = """vcl 4.1;
import xkey;

backend edge { .host = "127.0.0.1"; .port = "%(edge_port)d"; }

acl purgers { "127.0.0.1"; }

sub vcl_recv {
    if (req.method == "PURGE") {
        if (client.ip !~ purgers) { return (synth(403, "Forbidden")); }
        if (!req.http.xkey-purge) { return (synth(400, "PURGE needs xkey-purge")); }
        return (synth(200, "Purged " + xkey.purge(req.http.xkey-purge)));
    }
    if (req.method != "GET") { return (pass); }
    return (hash);
}

sub vcl_backend_response {
    if (beresp.http.Surrogate-Key) {
        set beresp.http.xkey = beresp.http.Surrogate-Key;
    } elsif (bereq.http.X-Test-Keys) {
        set beresp.http.xkey = bereq.http.X-Test-Keys;
    }
    set beresp.grace = 0s;
}

sub vcl_deliver {
    if (obj.hits > 0) { set resp.http.X-Cache = "HIT"; } else { set resp.http.X-Cache = "MISS"; }
    unset resp.http.xkey;
}
"""


@dataclass
class Varnish:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_varnish(port: int, edge_port: int, workdir: Path) -> Varnish:
    binary = shutil.which("varnishd") or "/usr/sbin/varnishd"
    if not Path(binary).exists():
        pytest.fail("varnishd not found: install Debian's varnish and varnish-modules")
    workdir.mkdir(parents=True, exist_ok=True)
    vcl = workdir / "purge.vcl"
    vcl.write_text(VCL % {"edge_port": edge_port})
    argv = [
        binary, "-F", "-j", "none", "-a", f"127.0.0.1:{port}", "-f", str(vcl),
        "-n", str(workdir / "state"), "-s", "malloc,16m",
    ]  # fmt: skip
    with (workdir / "varnishd.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    varnish = Varnish(proc=proc, port=port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return varnish
        except OSError:
            time.sleep(0.1)
    varnish.stop()
    pytest.fail(f"varnishd did not start; see {workdir / 'varnishd.log'}")


@pytest.fixture(scope="module")
def edge_and_varnish(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Varnish]]:
    port = free_port()  # the edge must name Varnish before Varnish can name the edge
    edge = start_edge(
        origin.url, logs_dir, "--cdn-purge", f"varnish=http://127.0.0.1:{port}/",
        name="edge-varnish-purge",
    )  # fmt: skip
    varnish: Varnish | None = None
    try:
        edge_port = int(edge.url.rsplit(":", 1)[1])
        varnish = start_varnish(port, edge_port, logs_dir / "varnish-purge")
        yield edge, varnish
    finally:
        edge.stop()  # first: what it still owes Varnish goes while Varnish listens
        if varnish is not None:
            varnish.stop()


def purges_acknowledged(edge: Edge) -> float:
    return metric_value(edge.metrics_text(), "edge_cdn_purges_total", kind="varnish", result="ok")


async def test_a_delete_through_the_edge_makes_varnish_drop_the_streams_answers(
    http: aiohttp.ClientSession, edge_and_varnish: tuple[Edge, Varnish], stream_path: str
) -> None:
    edge, varnish = edge_and_varnish
    url = edge.url + stream_path
    # Created and closed through the edge: it knows the stream has no end, so the answer is
    # kept for a year (only a purge removes it). The creation's own purges go first.
    assert (await call(http, "PUT", url, headers=TEXT))[0] == 201
    assert (await call(http, "POST", url, headers=TEXT, data=b"the old bytes"))[0] == 204
    assert (await call(http, "POST", url, headers={"Stream-Closed": "true"}))[0] == 204
    assert await eventually(lambda: purges_acknowledged(edge) >= 2, 10)
    assert metric_value(edge.metrics_text(), "edge_cdn_purges_pending", kind="varnish") == 0

    reader = {"X-Test-Keys": stream_key(stream_path)}
    through = f"{varnish.url}{stream_path}?offset=-1"
    stored = []
    for _ in range(2):
        status, headers, body = await call(http, "GET", through, headers=reader)
        assert (status, body) == (200, b"the old bytes")
        stored.append(dict(headers)["X-Cache"])
    assert stored == ["MISS", "HIT"]  # Varnish keeps it: without a purge it would stay
    assert "immutable" in dict(headers).get("Cache-Control", "")

    before = purges_acknowledged(edge)
    deleted_at = time.monotonic()
    assert (await call(http, "DELETE", url))[0] == 204

    async def dropped() -> bool:
        status, headers, _ = await call(http, "GET", through, headers=reader)
        return status == 404 and dict(headers)["X-Cache"] == "MISS"

    while not await dropped():
        assert time.monotonic() - deleted_at < 2.0, "Varnish still served the deleted stream"
    assert purges_acknowledged(edge) > before

    # Recreated through the edge: readers through Varnish get the new stream's bytes.
    assert (await call(http, "PUT", url, headers=TEXT))[0] == 201
    assert (await call(http, "POST", url, headers=TEXT, data=b"new"))[0] == 204
    status, _, body = await call(http, "GET", through, headers=reader)
    assert (status, body) == (200, b"new")
