"""``make demo ARGS='--auth jwt'`` runs end to end and prints a viewer URL whose token the
demo's edge accepts; every token it hands out (viewer URL, watch page) covers its run alone."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from edge.auth.keys import KeyRing
from edge.auth.policy import Access, ClaimRules, Grant, Refusal, check_claims
from tests.integration.test_watch_server import embedded_config

REPO = Path(__file__).resolve().parents[2]
TEXT = {"Content-Type": "text/plain"}


def test_the_demo_runs_with_jwt_auth_and_prints_a_viewer_url() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devstack.demo", "--auth", "jwt", "--viewers", "20",
         "--tokens", "30", "--rate", "100"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RESULT        ok" in run.stdout
    assert "each with its own JWT" in run.stdout
    logs = Path(re.search(r"logs in (\S+)", run.stdout).group(1))  # type: ignore[union-attr]
    url = re.search(r"^viewer\s+(\S+)$", run.stdout, re.MULTILINE).group(1)  # type: ignore[union-attr]
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert query["live"] == ["sse"]
    claims = KeyRing.from_jwks((logs / "demo-jwks.json").read_bytes()).verify(query["token"][0])
    assert isinstance(claims, dict)
    grant = check_claims(
        claims, stream=parts.path, access=Access.READ, rules=ClaimRules(), now=time.time()
    )
    assert isinstance(grant, Grant)
    for stream, access in [(parts.path, Access.WRITE), ("/v1/stream/another", Access.READ)]:
        refusal = check_claims(
            claims, stream=stream, access=access, rules=ClaimRules(), now=time.time()
        )
        assert isinstance(refusal, Refusal)
        assert refusal.status == 403


def _call(
    method: str, url: str, token: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Authorization": f"Bearer {token}", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def _line(demo: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    assert demo.stdout is not None
    seen = []
    for line in demo.stdout:
        seen.append(line)
        if found := re.search(pattern, line):
            return found
    raise AssertionError(f"the demo never printed {pattern!r}: {''.join(seen)}")


def test_the_watch_pages_token_covers_its_own_run_only_and_its_controls_still_write() -> None:
    """An anonymous visitor of the watch page gets a token: it reads and writes the run the page
    shows, and is refused (403) on every other stream, reading or deleting."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "devstack.demo", "--auth", "jwt", "--viewers", "2",
         "--tokens", "5000", "--rate", "20"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        found = _line(demo, r"^origin (\S+)  edge (\S+)  metrics")
        origin, edge = found.group(1), found.group(2)
        page_url = _line(demo, r"^watch (\S+)").group(1)
        with urllib.request.urlopen(page_url, timeout=10) as response:
            config = embedded_config(response.read().decode())
        token = config["token"]
        # A stream that is not the run: created at the origin, out of the page's reach.
        other = "/v1/stream/not-the-run-" + secrets.token_hex(4)
        with urllib.request.urlopen(
            urllib.request.Request(origin + other, method="PUT", headers=TEXT), timeout=10
        ) as response:
            assert response.status == 201
        for method in ("GET", "HEAD", "DELETE", "POST"):
            target = other + ("?offset=-1" if method == "GET" else "")
            status, _ = _call(method, edge + target, token, b"x" if method == "POST" else None)
            assert status == 403, method
        assert _call("GET", f"{origin}{other}?offset=-1", token)[0] == 200  # never deleted
        # The watch server hosts the demo's run only: no page (and no token) for another name.
        other_page = page_url.rsplit("/", 1)[0] + "/" + other.rsplit("/", 1)[1]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(other_page, timeout=10)
        with refused.value:
            assert refused.value.code == 404
        # The page still works: it reads its run and appends its controls, as watch.js does.
        run = edge + config["path"]
        assert _call("GET", f"{run}?offset=-1", token)[0] == 200
        me = "page-7e57"  # a page's id: the pages (and the summary) call it Charlie
        stop = json.dumps({"type": "control", "from": me, "seq": 0, "action": "stop"}).encode()
        status, _ = _call(
            "POST", run, token, stop, **{"Content-Type": "application/json",
            "Producer-Id": me, "Producer-Epoch": "0", "Producer-Seq": "0"},
        )  # fmt: skip
        assert status in (200, 204)
        # The agents obey the page's Stop: the run ends and the demo reports it.
        out, _ = demo.communicate(timeout=60)
        assert demo.returncode == 0, out
        assert f"the run stopped by Charlie ({me}:0)" in out
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=20)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
