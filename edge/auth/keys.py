"""Token signatures against a JWKS, with joserfc (no I/O: bytes and strings in, values out).

Rules this module owns:

* A key ring is one JWKS document: keys by ``kid``, each an ``oct`` (HS256/384/512), ``RSA``
  (RS*/PS*), ``EC`` (ES256 P-256, ES384 P-384, ES512 P-521) or ``OKP`` Ed25519 (EdDSA) key.
  Encryption keys (``use: enc``) are left out; a document with no usable key is an error.
* A token's ``alg`` must be one of those and must match its key's type (and curve) before any
  cryptography runs: HS256 under an RSA key's ``kid`` (the key-confusion attack) and ``none``
  are refused here, and joserfc checks the pairing again. ``crit`` headers are refused (no
  extension is understood).
* A token without ``kid`` is checked only against a ring of exactly one key.
* A verified signature is remembered per ring (bounded), so a token presented again costs a
  dictionary look-up; claims are still checked on every request (``edge.auth.policy``).
"""

from __future__ import annotations

import base64
import binascii
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache
from joserfc import jwt
from joserfc.errors import JoseError, SecurityWarning
from joserfc.jwk import ECKey, Key, OctKey, OKPKey, RSAKey

from edge.auth.credentials import MAX_TOKEN_CHARS
from edge.auth.policy import MALFORMED, Refusal, unauthorized

# alg -> (kty, crv)
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "HS256": ("oct", None),
    "HS384": ("oct", None),
    "HS512": ("oct", None),
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "PS256": ("RSA", None),
    "PS384": ("RSA", None),
    "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", "Ed25519"),
    "Ed25519": ("OKP", "Ed25519"),
}
KEY_CLASSES: dict[str, type[Key]] = {"oct": OctKey, "RSA": RSAKey, "EC": ECKey, "OKP": OKPKey}
VERIFIED_TOKENS = 16_384

BAD_SIGNATURE = unauthorized("bad token signature", "invalid")
UNSUPPORTED = unauthorized("unsupported token algorithm", "invalid")
MISMATCH = unauthorized("token algorithm does not match its key", "invalid")
UNKNOWN_KEY = unauthorized("token signed with an unknown key", "invalid")


class JwksError(ValueError):
    """A JWKS document that cannot be used; the message names no key material."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownKid:
    """The token names a key this ring does not have (a rotation the edge has not seen yet?)."""

    kid: str | None


def _b64json(part: str) -> Any:
    padded = part + "=" * (-len(part) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))


def token_header(token: str) -> dict[str, Any] | None:
    """The protected header of a compact JWS, or None when it is not one."""
    parts = token.split(".")
    if len(token) > MAX_TOKEN_CHARS or len(parts) != 3 or not all(parts[:2]):
        return None
    try:
        header = _b64json(parts[0])
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        # RecursionError: JSON nested past the parser's recursion (read before any signature).
        return None
    return header if isinstance(header, dict) else None


class KeyRing:
    def __init__(self, keys: Mapping[str | None, Key]) -> None:
        self._keys = dict(keys)
        self._verified: LRUCache[str, Mapping[str, object]] = LRUCache(maxsize=VERIFIED_TOKENS)

    @classmethod
    def from_jwks(cls, document: bytes) -> KeyRing:
        try:
            data = json.loads(document)
        except (ValueError, UnicodeError):
            raise JwksError("not JSON") from None
        entries = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise JwksError('not a JWKS: no "keys" list')
        keys: dict[str | None, Key] = {}
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or entry.get("use") == "enc":
                continue
            key_class = KEY_CLASSES.get(entry.get("kty", ""))
            if key_class is None:
                raise JwksError(f"key {index}: unsupported kty")
            try:
                key = key_class.import_key(entry)
            except (JoseError, ValueError, TypeError) as error:
                raise JwksError(f"key {index}: {type(error).__name__}") from None
            kid = entry.get("kid")
            keys[kid if isinstance(kid, str) else None] = key
        if not keys:
            raise JwksError("no signing keys")
        return cls(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def has(self, kid: str | None) -> bool:
        return kid in self._keys or (kid is None and len(self._keys) == 1)

    def verify(self, token: str) -> Mapping[str, object] | Refusal | UnknownKid:
        """The token's claims once its signature is good; why not, otherwise."""
        known = self._verified.get(token)
        if known is not None:
            return known
        header = token_header(token)
        if header is None:
            return MALFORMED
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALGORITHMS:
            return UNSUPPORTED
        if "crit" in header:
            return UNSUPPORTED
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            return MALFORMED
        key = self._keys.get(kid)
        if key is None and kid is None and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        if key is None:
            return UnknownKid(kid=kid)
        kty, crv = ALGORITHMS[alg]
        if key.key_type != kty or (crv is not None and key.get("crv") != crv):
            return MISMATCH
        try:
            with warnings.catch_warnings():
                # joserfc flags EdDSA as superseded by Ed25519 (RFC 9864); both are accepted.
                warnings.simplefilter("ignore", SecurityWarning)
                claims = jwt.decode(token, key, algorithms=[alg]).claims
        except JoseError as error:
            return BAD_SIGNATURE if error.error == "bad_signature" else MALFORMED
        except (ValueError, TypeError, UnicodeError, binascii.Error):
            return MALFORMED
        self._verified[token] = claims
        return claims
