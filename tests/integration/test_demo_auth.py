"""``make demo ARGS='--auth jwt'`` runs end to end and prints a viewer URL whose token the
demo's edge accepts."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from edge.auth.keys import KeyRing
from edge.auth.policy import Access, ClaimRules, Grant, check_claims

REPO = Path(__file__).resolve().parents[2]


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
