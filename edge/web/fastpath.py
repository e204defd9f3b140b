"""The pre-serialised hit path: immutable shared answers written as stored bytes, in one write.

Rules this module owns:

* Only answers that cannot change are stored (``register``): a plain shared-scope catch-up
  ``GET`` whose full-path answer was a local ``edge; hit``, 200, ``immutable`` (capped, or ending
  a closed stream with no known lifetime), for a target that is the stream's normalised path.
  Each representation (gzip accepted or not) is stored once, with its 304 beside it.
* The stored bytes are the full path's answer: built from the same ``Answer`` by the same header
  code (``edge.web.app.answer_headers_for``), serialised as aiohttp would
  (``edge.protocol.http1``). ``Date`` is the only header made per request.
* A stored answer is used only while everything the full path would consult still says the
  same: the stream instance is current (entries are forgotten with it, in the local tier), its
  generation was confirmed by the shared tier within ``GENERATION_CHECK_SECONDS`` (with Redis),
  it still has no known end of life, the origin has not since forbidden storing it
  (``no-store``), and the origin's CORS headers are the ones it was built
  with. Otherwise the request takes the full path, which re-checks and stores it again.
* With ``--auth jwt|forward`` it is off: a read must be authorized before it is answered, and
  that decision is the full path's (``edge.web.gatekeeper``).
* Counting is plain integers here; ``fold_into`` adds them to the Prometheus counters when
  ``/metrics`` is scraped, so a hit costs no ``labels()`` call.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from multidict import CIMultiDict

from edge.catchup import Answer
from edge.config import Settings
from edge.log.policy import IMMUTABLE_MAX_AGE_SECONDS, accepts_gzip, if_none_match_hits
from edge.metrics import Metrics
from edge.protocol.http1 import (
    CLOSE_TRAILER,
    KEEP_ALIVE_TRAILER,
    HeadParser,
    RequestHead,
    date_line,
    serialise,
)
from edge.protocol.paths import Target
from edge.protocol.reads import PUBLIC_SCOPE, Read, RequestKind
from edge.store.local import LocalTier, StoredHit
from edge.streams import GENERATION_CHECK_SECONDS

HIT = "edge; hit"
IMMUTABLE = f"public, max-age={IMMUTABLE_MAX_AGE_SECONDS}, immutable"

# Small bodies are joined to their head (one buffer, one send); larger ones are not copied.
JOIN_BELOW_BYTES = 16 * 1024

_accepts_gzip = functools.lru_cache(maxsize=1024)(accepts_gzip)


class FastPath:
    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        cors: Callable[[], tuple[tuple[str, str], ...]],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # With --auth jwt|forward every read is authorized first, by the full path.
        self.enabled = settings.fast_path and settings.auth_mode == "none"
        self._scope_headers = settings.scope_headers
        self._local = local
        self._cors = cors
        self._clock = clock
        self._verify = settings.redis_url is not None
        self._date_second = -1
        self._date = b""
        # Plain counters, folded into the Prometheus ones at scrape time.
        self.ok = 0
        self.not_modified = 0
        self.served_bytes = 0
        self._folded = (0, 0, 0)

    def parser(self) -> HeadParser:
        return HeadParser(self._scope_headers)

    def answer(self, head: RequestHead) -> list[bytes] | None:
        """The bytes to write for ``head``, or None: the full path answers it."""
        entry = self._local.response(head.path, head.query, _accepts_gzip(head.accept_encoding))
        if entry is None:
            return None
        instance = entry.instance
        now = self._clock()
        if (
            (self._verify and now - instance.verified_at >= GENERATION_CHECK_SECONDS)
            or instance.expires_at is not None
            or instance.ttl_seconds is not None
            or instance.bypass_until > now
            or entry.cors is not self._cors()
        ):
            return None
        second = int(now)
        if second != self._date_second:
            self._date_second, self._date = second, date_line(second)
        trailer = KEEP_ALIVE_TRAILER if head.keep_alive else CLOSE_TRAILER
        if if_none_match_hits(head.if_none_match, entry.etag):
            self.not_modified += 1
            return [entry.not_modified + self._date + trailer]
        self.ok += 1
        body = entry.body
        self.served_bytes += len(body)
        if len(body) <= JOIN_BELOW_BYTES:
            return [b"".join((entry.ok, self._date, trailer, body))]  # one send()
        return [entry.ok + self._date + trailer, body]

    def register(
        self,
        target: Target,
        read: Read,
        answer: Answer,
        response_headers: CIMultiDict[str],
        *,
        version: tuple[int, int],
        accept_encoding: str | None,
    ) -> None:
        """Store the full path's ``answer`` (its final headers) to a request of ``version``
        that sent ``accept_encoding``, if it can never change."""
        if not (
            self.enabled
            and answer.status == 200
            and answer.cache_status == HIT
            and answer.hold is None
            and read.scope == PUBLIC_SCOPE
            and read.plain
            and version == (1, 1)
            and target.upstream == target.stream + (f"?{target.query}" if target.query else "")
            and target.stream.isascii()
            and target.query.isascii()
            and response_headers.get("Cache-Control") == IMMUTABLE
        ):
            return
        instance = self._local.instance(read.stream)
        tag = response_headers.get("ETag")
        headers = list(response_headers.items())
        if instance is None or tag is None:
            return
        unencoded = [(n, v) for n, v in headers if n.lower() != "content-encoding"]
        try:
            ok, not_modified = (
                serialise(200, headers, len(answer.body)),
                serialise(304, unencoded, 0),
            )
        except ValueError:
            return  # a header aiohttp refuses too: the full path answers this one as it can
        stored = StoredHit(
            instance=instance,
            etag=tag,
            ok=ok,
            not_modified=not_modified,
            body=answer.body,
            cors=self._cors(),
        )
        gzip = _accepts_gzip(accept_encoding)
        self._local.put_response(target.stream, target.query, gzip, stored)

    def fold_into(self, metrics: Metrics) -> None:
        """Add what was counted since the last scrape to the Prometheus counters."""
        ok, not_modified, served = self.ok, self.not_modified, self.served_bytes
        last_ok, last_nm, last_served = self._folded
        self._folded = (ok, not_modified, served)
        kind = RequestKind.CATCHUP.value
        if ok > last_ok:
            metrics.requests.labels(kind=kind, code="200").inc(ok - last_ok)
        if not_modified > last_nm:
            metrics.requests.labels(kind=kind, code="304").inc(not_modified - last_nm)
        if ok + not_modified > last_ok + last_nm:
            hits = ok + not_modified - last_ok - last_nm
            metrics.cache_requests.labels(result="hit").inc(hits)
            metrics.fast_path_answers.inc(hits)
        if served > last_served:
            metrics.served_bytes.inc(served - last_served)
