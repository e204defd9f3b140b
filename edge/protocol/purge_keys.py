"""The keys a CDN purges a stream's stored answers by (Fastly/Varnish ``Surrogate-Key``,
Cloudflare ``Cache-Tag``).

Rules this module owns:

* Every cacheable answer of a stream carries the stream's key; where the shared tier names the
  stream's instance (its generation), the instance's key too. Forgetting a stream purges by the
  stream key, which reaches every instance's answers; the instance key lets one instance go alone.
* A key names the stream by a digest of its path, never the path itself: a path may hold bytes
  no header value may, and its length is the client's. Every key is ``KEY_LENGTH`` characters or
  fewer of ``[a-z0-9-]``, so two of them stay far inside the CDNs' documented limits (a key of
  up to 1,024 bytes, a header of up to 16 KB, Cloudflare's 30 tags per purge call).
* The same stream gives the same key on every replica and in every process (no salt, no
  process state), so a purge sent by one replica reaches what another one's answers put in a CDN.

Pure: strings in, strings out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

PREFIX = "ds-"
DIGEST_BYTES = 12  # 96 bits: a collision between two streams of one CDN is not a concern
KEY_LENGTH = len(PREFIX) + 2 * DIGEST_BYTES + 1 + 2 * DIGEST_BYTES


def _digest(value: str) -> str:
    return hashlib.blake2b(
        value.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES
    ).hexdigest()


def stream_key(stream: str) -> str:
    """The key of every answer of ``stream`` (its path, as the edge keys it)."""
    return PREFIX + _digest(stream)


def instance_key(stream: str, generation: str) -> str:
    """The key of the answers of one instance of ``stream``: the stream's key, a dash, and a
    digest of the shared tier's generation token."""
    return stream_key(stream) + "-" + _digest(generation)


@dataclass(frozen=True, kw_only=True, slots=True)
class PurgeKeys:
    """The keys one answer carries, the stream's first, and their header values (joined once,
    when the keys are made: every answer of the instance carries the same)."""

    keys: tuple[str, ...]
    surrogate_key: str  # the ``Surrogate-Key`` value: space-separated (Fastly, Varnish xkey)
    cache_tag: str  # the ``Cache-Tag`` value: comma-separated (Cloudflare)

    @staticmethod
    def of(keys: tuple[str, ...]) -> PurgeKeys:
        return PurgeKeys(keys=keys, surrogate_key=" ".join(keys), cache_tag=",".join(keys))


def purge_keys(stream: str, generation: str = "") -> PurgeKeys:
    """The keys of an answer of ``stream``'s instance ``generation`` ("" where the shared tier
    has named none: the stream's key alone)."""
    if generation:
        return PurgeKeys.of((stream_key(stream), instance_key(stream, generation)))
    return PurgeKeys.of((stream_key(stream),))
