"""``make cluster ARGS=--tls`` (``python -m devstack.cluster --tls``) as a person runs it: its
JSON names an ``https_url`` that answers over HTTP/2 (and HTTP/1.1 to a client offering only
that) with the certificate made at start, for 127.0.0.1 and localhost."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from devstack.processes import REPO


@pytest.fixture(scope="module")
def described() -> Iterator[dict[str, Any]]:
    cluster = subprocess.Popen(
        [sys.executable, "-m", "devstack.cluster", "--tls", "--replicas", "1"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert cluster.stdout is not None
    try:
        lines: list[str] = []
        while not lines or lines[-1] != "}\n":  # the JSON object ends with a lone brace
            line = cluster.stdout.readline()
            assert line, f"the cluster exited before its JSON: {''.join(lines)}"
            lines.append(line)
        yield json.loads("".join(lines))
    finally:
        cluster.send_signal(signal.SIGINT)  # Ctrl-C: it stops everything it started
        assert cluster.wait(30) == 0
        cluster.stdout.close()


def handshake(https_url: str, context: ssl.SSLContext, name: str = "localhost") -> str | None:
    """A TLS handshake with the front as ``name``; the protocol it picked by ALPN."""
    address = urlsplit(https_url)
    assert address.hostname is not None
    assert address.port is not None
    with (
        socket.create_connection((address.hostname, address.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        return tls.selected_alpn_protocol()


def offering(*protocols: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # self-signed, made at start
    context.set_alpn_protocols(list(protocols))
    return context


def test_tls_prints_an_https_url_beside_the_others(described: dict[str, Any]) -> None:
    assert described["url"].startswith("http://127.0.0.1:")
    assert described["https_url"].startswith("https://127.0.0.1:")
    assert described["https_url"] != described["url"].replace("http:", "https:")


def test_its_https_url_speaks_http2_and_http1(described: dict[str, Any]) -> None:
    assert handshake(described["https_url"], offering("h2", "http/1.1")) == "h2"
    assert handshake(described["https_url"], offering("http/1.1")) == "http/1.1"


def test_its_certificate_is_for_localhost_and_127_0_0_1(described: dict[str, Any]) -> None:
    made = Path(described["logs"]) / "tls" / "localhost.pem"
    trusting = ssl.create_default_context(cafile=made)  # as a person who trusts it would
    for name in ("localhost", "127.0.0.1"):
        handshake(described["https_url"], trusting, name)  # raises unless valid for the name


def test_curl_reads_and_writes_a_stream_over_http2(described: dict[str, Any]) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed"
    stream = f"{described['https_url']}/v1/stream/over-https"

    def call(*args: str) -> list[str]:
        shown = "\\n%{http_version} %{http_code}"
        done = subprocess.run(
            [curl, "-sS", "-k", "--http2", "-o", "-", "-w", shown, *args],
            capture_output=True, text=True, timeout=20, check=True,
        )  # fmt: skip
        return done.stdout.rsplit("\n", 1)

    assert call("-X", "PUT", "-H", "Content-Type: text/plain", stream)[1] == "2 201"
    assert call("-X", "POST", "-H", "Content-Type: text/plain", "--data", "hello", stream)[1] == (
        "2 204"
    )
    assert call(f"{stream}?offset=-1") == ["hello", "2 200"]


def test_live_reads_pass_through_http2_as_they_happen(described: dict[str, Any]) -> None:
    """An SSE read and a long-poll over HTTP/2 get a write while they are open: nothing in
    front holds the answer back (the SSE connection is still open when its event arrives)."""
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed"
    stream = f"{described['https_url']}/v1/stream/live-over-https"
    secure = [curl, "-sS", "-k", "--http2"]
    text = ("-H", "Content-Type: text/plain")
    subprocess.run([*secure, "-X", "PUT", *text, stream], check=True, timeout=20)
    sse = subprocess.Popen(
        [*secure, "-N", f"{stream}?offset=-1&live=sse"], stdout=subprocess.PIPE, text=True
    )
    poll: subprocess.Popen[str] | None = None
    try:
        assert sse.stdout is not None
        # The SSE answer is open once its first control event (up to date, at the tail) is out.
        lines: list[str] = []
        while not lines or not lines[-1].startswith("data:{"):
            line = sse.stdout.readline()
            assert line, f"the SSE read ended before it was up to date: {lines}"
            lines.append(line.strip())
        tail = json.loads(lines[-1].removeprefix("data:"))["streamNextOffset"]
        # A long-poll at the tail: it waits for the write (or has it at once, if it comes later).
        poll = subprocess.Popen(
            [
                *secure,
                "-w",
                "\\n%{http_version} %{http_code}",
                f"{stream}?offset={tail}&live=long-poll",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        subprocess.run([*secure, "-X", "POST", *text, "--data", "now", stream], check=True)
        while "data:now" not in lines:
            line = sse.stdout.readline()
            assert line, f"the SSE read ended without the write: {lines}"
            lines.append(line.strip())
        assert sse.poll() is None  # delivered while open, not when the answer ended
        out, _ = poll.communicate(timeout=40)  # the long-poll's own limit is 30 s
        assert out.rsplit("\n", 1) == ["now", "2 200"]
    finally:
        for reader in (sse, poll):
            if reader is None:
                continue
            if reader.poll() is None:
                reader.terminate()
            reader.wait(10)
            assert reader.stdout is not None
            reader.stdout.close()
