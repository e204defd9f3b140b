"""Keys, JWKS documents and tokens for the authorization tests, made with joserfc (and by hand
for the tokens no library would sign: ``alg: none``, key confusion)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import warnings
from typing import Any

from joserfc import jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, Key, OctKey, OKPKey, RSAKey


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs_key(kid: str) -> OctKey:
    return OctKey.generate_key(256, parameters={"kid": kid})


def rsa_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid})


def ec_key(kid: str) -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid})


def ed_key(kid: str) -> OKPKey:
    return OKPKey.generate_key("Ed25519", parameters={"kid": kid})


def jwks(*keys: Key, private: bool = False) -> bytes:
    """A JWKS document; HMAC keys are secrets, so they are in it whatever ``private`` says."""
    entries = [key.as_dict(private=private or key.key_type == "oct") for key in keys]
    return json.dumps({"keys": entries}).encode()


ALG_OF = {"oct": "HS256", "RSA": "RS256", "EC": "ES256", "OKP": "EdDSA"}


def claims_for(
    stream: str,
    *,
    sub: str = "viewer",
    scope: str = "read",
    lifetime: float = 300.0,
    now: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {"sub": sub, "scope": scope, "streams": [stream], "exp": int(now + lifetime), **extra}


def sign(key: Key, claims: dict[str, Any], *, alg: str | None = None, kid: Any = ...) -> str:
    alg = alg or ALG_OF[key.key_type]
    header: dict[str, Any] = {"alg": alg}
    kid = key.kid if kid is ... else kid
    if kid is not None:
        header["kid"] = kid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecurityWarning)  # EdDSA: superseded, still accepted
        return jwt.encode(header, claims, key, algorithms=[alg])


def token(key: Key, stream: str, **claim_args: Any) -> str:
    return sign(key, claims_for(stream, **claim_args))


def unsigned(claims: dict[str, Any], kid: str | None = None) -> str:
    header: dict[str, Any] = {"alg": "none", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}."


def key_confusion(rsa: RSAKey, claims: dict[str, Any]) -> str:
    """HS256 "signed" with the RSA key's public PEM as the HMAC secret, under the RSA kid: what
    a verifier that trusts the token's alg would accept."""
    header = b64(json.dumps({"alg": "HS256", "kid": rsa.kid, "typ": "JWT"}).encode())
    payload = b64(json.dumps(claims).encode())
    secret = rsa.as_pem(private=False)
    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


def with_header(token: str, **changes: Any) -> str:
    """``token`` with its protected header changed (the signature then no longer matches)."""
    header, payload, signature = token.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    return f"{b64(json.dumps(decoded | changes).encode())}.{payload}.{signature}"
