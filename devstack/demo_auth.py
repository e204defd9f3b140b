"""``make demo ARGS='--auth jwt'``: the demo's edge verifies tokens, as a signed-in site's would.

A fresh HS256 key is written as a JWKS file next to the demo's logs; the agent writes with a
``write`` token, every viewer reads with a token of its own (a distinct ``sub``), and the
printed viewer URL carries one more (``&token=``, as a browser ``EventSource`` would send it).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

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

    def edge_args(self) -> list[str]:
        jwks = self.logs / "demo-jwks.json"
        jwks.write_text(json.dumps({"keys": [self.key.as_dict(private=True)]}))
        return ["--auth", "jwt", "--jwt-jwks", str(jwks), "--origin-header", ORIGIN_CREDENTIAL]

    def token(self, sub: str, scope: str = "read") -> str:
        claims = {
            "sub": sub,
            "scope": scope,
            "streams": ["/v1/stream/"],
            "exp": int(time.time()) + TOKEN_SECONDS,
        }
        return jwt.encode({"alg": "HS256", "kid": "demo-1"}, claims, self.key, algorithms=["HS256"])

    def headers(self, sub: str, scope: str = "read") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(sub, scope)}"}

    def viewer_url(self, stream_url: str) -> str:
        return f"{stream_url}?offset=-1&live=sse&token={self.token(f'you-{secrets.token_hex(4)}')}"
