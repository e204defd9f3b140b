"""``make demo ARGS='--auth jwt'``: the demo's edge verifies tokens, as a signed-in site's would.

A fresh HS256 key is written as a JWKS file next to the demo's logs; the agent writes with a
``write`` token, every viewer reads with a token of its own (a distinct ``sub``), and the
printed viewer URL carries one more (``&token=``, as a browser ``EventSource`` would send it).

Rules this module owns:

* Every token names exactly one stream, the run's session stream, never a prefix: a token
  handed to anyone (a viewer URL, a watch page) reaches nothing else on the edge.
* A watch page's token is minted only for a run this demo hosts (``runs``): ``read`` for its
  EventSource and ``write`` for the controls it appends, on that stream alone.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from joserfc import jwt
from joserfc.jwk import OctKey

ORIGIN_CREDENTIAL = "Authorization: Bearer demo-edge-credential"
TOKEN_SECONDS = 3600


@dataclass
class DemoAuth:
    logs: Path
    key: OctKey = field(
        default_factory=lambda: OctKey.generate_key(256, parameters={"kid": "demo-1"})
    )
    # Stream paths of the runs this demo hosts: the only ones a watch page gets a token for.
    runs: set[str] = field(default_factory=set)

    def edge_args(self) -> list[str]:
        jwks = self.logs / "demo-jwks.json"
        jwks.write_text(json.dumps({"keys": [self.key.as_dict(private=True)]}))
        return ["--auth", "jwt", "--jwt-jwks", str(jwks), "--origin-header", ORIGIN_CREDENTIAL]

    def token(self, sub: str, stream: str, scope: str = "read") -> str:
        """A token for ``stream`` (a path, ``/v1/stream/<name>``) alone."""
        claims = {
            "sub": sub,
            "scope": scope,
            "streams": [stream],
            "exp": int(time.time()) + TOKEN_SECONDS,
        }
        return jwt.encode({"alg": "HS256", "kid": "demo-1"}, claims, self.key, algorithms=["HS256"])

    def headers(self, sub: str, stream: str, scope: str = "read") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(sub, stream, scope)}"}

    def page_token(self, sub: str, stream: str) -> str | None:
        """The watch page's token for its run's stream; None for a stream this demo does not
        host (the page server then has no page for it)."""
        if stream not in self.runs:
            return None
        return self.token(sub, stream, "read write")

    def viewer_url(self, stream_url: str) -> str:
        token = self.token(f"you-{secrets.token_hex(4)}", urlsplit(stream_url).path)
        return f"{stream_url}?offset=-1&live=sse&token={token}"
