"""The purge call each kind of CDN takes, and what its answer means (``--cdn-purge KIND=TARGET``).

Rules this module owns:

* A call purges a batch of forgotten streams by their **stream keys**
  (``edge.protocol.purge_keys``): every answer of a stream, of any instance, carries its
  stream's key, so the stream key alone reaches all of them.
* Each kind's call, exactly as its receiver documents it:

  - ``varnish=URL``: ``PURGE <URL's path, "/" if none>`` to URL's host and port, with
    ``xkey-purge: <space-separated keys>`` and no body (the shipped VCL purges them with vmod
    xkey); at most ``VARNISH_KEYS_PER_CALL`` keys, so the header stays far below Varnish's
    ``http_req_hdr_len`` (8 KiB).
  - ``webhook=URL``: ``POST URL``, ``Content-Type: application/json``, body
    ``{"keys": [...], "stream": "<path>", "reason": "<why>"}``: one stream per call.
  - ``fastly=SERVICE_ID``: ``POST <api>/service/<id>/purge`` with ``Fastly-Key: <token>`` and
    ``Surrogate-Key: <space-separated keys>`` (Fastly's bulk purge by surrogate key); at most
    ``FASTLY_KEYS_PER_CALL`` keys (Fastly's documented batch limit). A hard purge: no
    ``Fastly-Soft-Purge``, since a soft purge only marks the answers stale and Fastly may still
    serve them under ``stale-while-revalidate``/``stale-if-error``, and a forgotten stream's
    bytes must not be served again.
  - ``cloudflare=ZONE_ID``: ``POST <api>/zones/<id>/purge_cache`` with
    ``Authorization: Bearer <token>`` and ``{"tags": [...]}``; at most
    ``CLOUDFLARE_TAGS_PER_CALL`` tags (the per-call limit Cloudflare documents for tag purges
    on every plan; newer plans take more).

* An answer is **done** when it is 2xx (for Cloudflare, also not ``"success": false``);
  anything else, or no answer, is retried, after its ``Retry-After`` when it gives one (up to
  ``MAX_RETRY_AFTER_SECONDS``).
* A token travels only in its own header: never in a URL, a ``repr``, or a log line (``label``).

Pure: values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

from edge.config import Settings
from edge.protocol.purge_keys import KEY_LENGTH, stream_key

VARNISH_KEYS_PER_CALL = 100  # 100 keys of at most KEY_LENGTH characters: under 5.3 KB
FASTLY_KEYS_PER_CALL = 256
CLOUDFLARE_TAGS_PER_CALL = 30
WEBHOOK_STREAMS_PER_CALL = 1
STREAMS_PER_CALL = {
    "varnish": VARNISH_KEYS_PER_CALL,
    "webhook": WEBHOOK_STREAMS_PER_CALL,
    "fastly": FASTLY_KEYS_PER_CALL,
    "cloudflare": CLOUDFLARE_TAGS_PER_CALL,
}
# The longest header value a call carries: Varnish's and Fastly's keys, space-separated.
MAX_KEY_HEADER_CHARS = FASTLY_KEYS_PER_CALL * (KEY_LENGTH + 1)
# A Retry-After longer than this is not believed: the purge is retried sooner.
MAX_RETRY_AFTER_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """One ``--cdn-purge KIND=TARGET``, with what its kind needs to be called."""

    kind: str
    target: str  # the URL (varnish, webhook) or the service or zone id (fastly, cloudflare)
    api_url: str = ""  # fastly, cloudflare: the API's base URL
    token: str = field(default="", repr=False)

    @property
    def streams_per_call(self) -> int:
        return STREAMS_PER_CALL[self.kind]

    @property
    def label(self) -> str:
        """How logs name it: never with its token."""
        if self.kind == "fastly":
            return f"fastly service {self.target}"
        if self.kind == "cloudflare":
            return f"cloudflare zone {self.target}"
        return f"{self.kind} {self.target}"


def targets(settings: Settings) -> tuple[Target, ...]:
    """The targets ``settings`` names, in order (``Settings`` checked each, and that the
    tokens their kinds need are there)."""
    # The kinds that call an API: its base URL and token.
    apis = {
        "fastly": (settings.fastly_api_url, settings.fastly_token or ""),
        "cloudflare": (settings.cloudflare_api_url, settings.cloudflare_token or ""),
    }
    found: list[Target] = []
    for kind, target in settings.cdn_purge:
        if kind in apis:
            api_url, token = apis[kind]
            found.append(Target(kind=kind, target=target, api_url=api_url, token=token))
        else:
            found.append(Target(kind=kind, target=target))
    return tuple(found)


@dataclass(frozen=True, kw_only=True, slots=True)
class Purged:
    """One forgotten stream a call purges, and why it was forgotten."""

    stream: str
    reason: str

    @property
    def key(self) -> str:
        return stream_key(self.stream)


@dataclass(frozen=True, kw_only=True, slots=True)
class PurgeCall:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)  # a token may be among them
    body: bytes = b""
    streams: tuple[str, ...] = ()


def _base(url: str) -> str:
    return url.rstrip("/")


def _varnish_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))


def call_for(target: Target, batch: Sequence[Purged]) -> PurgeCall:
    """The one call that purges ``batch`` (1 to ``target.streams_per_call`` distinct streams)
    at ``target``; ValueError for a batch the kind cannot take in one call."""
    streams = tuple(p.stream for p in batch)
    if not batch or len(batch) > target.streams_per_call or len(set(streams)) != len(streams):
        raise ValueError(f"a {target.kind} call takes 1 to {target.streams_per_call} streams")
    keys = [p.key for p in batch]
    if target.kind == "varnish":
        return PurgeCall(
            method="PURGE",
            url=_varnish_url(target.target),
            headers=(("xkey-purge", " ".join(keys)),),
            streams=streams,
        )
    if target.kind == "webhook":
        (only,) = batch
        body = {"keys": keys, "stream": only.stream, "reason": only.reason}
        return PurgeCall(
            method="POST",
            url=target.target,
            headers=(("Content-Type", "application/json"),),
            body=json.dumps(body).encode(),
            streams=streams,
        )
    if target.kind == "fastly":
        return PurgeCall(
            method="POST",
            url=f"{_base(target.api_url)}/service/{quote(target.target, safe='')}/purge",
            headers=(
                ("Fastly-Key", target.token),
                ("Surrogate-Key", " ".join(keys)),
                ("Accept", "application/json"),
            ),
            streams=streams,
        )
    if target.kind == "cloudflare":
        return PurgeCall(
            method="POST",
            url=f"{_base(target.api_url)}/zones/{quote(target.target, safe='')}/purge_cache",
            headers=(
                ("Authorization", f"Bearer {target.token}"),
                ("Content-Type", "application/json"),
            ),
            body=json.dumps({"tags": keys}).encode(),
            streams=streams,
        )
    raise ValueError(f"no purge call for kind {target.kind!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    done: bool
    # Seconds the receiver asked to wait before the next try (its Retry-After), if any.
    retry_after_seconds: float | None = None
    # What to log and count when not done (a status, "no answer: ..."): no body, no token.
    detail: str = ""


def retry_after(headers: Sequence[tuple[str, str]]) -> float | None:
    """``Retry-After`` in delta-seconds (RFC 9110 §10.2.3), capped; None if absent or a date
    (a date needs a clock: the backoff's own wait stands instead)."""
    for name, value in headers:
        if name.lower() == "retry-after":
            text = value.strip()
            if text.isdigit():
                return min(float(int(text)), MAX_RETRY_AFTER_SECONDS)
            return None
    return None


def judge(
    target: Target, status: int | None, headers: Sequence[tuple[str, str]], body: bytes
) -> Verdict:
    """What the answer to a purge call means (``status`` None: there was none)."""
    if status is None:
        return Verdict(done=False, detail="no answer")
    if not 200 <= status < 300:
        return Verdict(done=False, retry_after_seconds=retry_after(headers), detail=str(status))
    if target.kind == "cloudflare":
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("success") is False:
            return Verdict(done=False, detail=f"{status} success=false")
    return Verdict(done=True)
