"""One frozen ``Settings`` for the whole process, with units in its names.

Only ``edge.cli`` builds it (from flags and ``EDGE_*`` environment variables); everything else
receives it as an argument.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

SECONDS = 1.0
# The longest lifetime any cache is told (RFC 9111 §5.2.2.1: no more than a year).
IMMUTABLE_MAX_AGE_SECONDS = 31_536_000
MIN_SSE_SECONDS = 5 * SECONDS
KiB = 1024
MiB = 1024 * KiB


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which and why.

    ``Settings`` names its fields as ``{field_name}`` in ``template``; ``render`` replaces them
    with what the user typed (``edge.cli`` passes the flag of each field), ``str()`` with the bare
    field names. ``detail`` (which may quote user input) is appended as is.
    """

    def __init__(self, template: str, detail: str = "") -> None:
        super().__init__(template + detail)
        self.template = template
        self.detail = detail

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(_FIELD_REF.findall(self.template))

    def render(self, names: Mapping[str, str]) -> str:
        text = self.template
        for name in self.fields:
            text = text.replace("{" + name + "}", names.get(name, name))
        return text + self.detail

    def __str__(self) -> str:
        return self.render({})


_FIELD_REF = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (all interfaces)."""
        host, sep, port_text = text.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError("expected HOST:PORT", f", got {text!r}")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ConfigError("port out of range", f" in {text!r}")
        host = host.strip("[]") or "0.0.0.0"
        return cls(host=host, port=port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


# ``--redis-mode``: one server, a Redis Cluster (``--redis-url`` lists seed nodes), or the primary
# a set of Sentinels names (``--redis-url`` lists the sentinels, ``--redis-sentinel-service``
# names the primary).
REDIS_MODES = ("standalone", "cluster", "sentinel")


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisTarget:
    """Where the shared tier is: the mode and its URLs (one for standalone; seed nodes for a
    cluster; sentinels for sentinel mode, with the service they name)."""

    mode: str
    urls: tuple[str, ...]
    sentinel_service: str | None = None

    @property
    def first(self) -> str:
        return self.urls[0]


def redis_urls(text: str) -> tuple[str, ...]:
    """A comma-separated list of Redis URLs, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeRoute:
    """``--resume-route PATH=URL``: requests at ``path`` or under it are relayed to ``url`` (the
    rest of the path appended), and their SSE answers kept resumable (``edge.resume``)."""

    path: str
    url: str

    def holds(self, request_path: str) -> bool:
        base = self.path.rstrip("/")
        return request_path == self.path or request_path.startswith(base + "/")

    def upstream(self, request_path: str, query: str) -> str:
        rest = request_path[len(self.path.rstrip("/")) :]
        base = self.url.rstrip("/") + rest if rest not in ("", "/") else self.url
        return base + ("?" + query if query else "")


# ``--cdn-purge`` kinds: an HTTP PURGE by key to the shipped VCL, a POST of the keys to any URL,
# and the purge-by-key APIs of Fastly (a service id) and Cloudflare (a zone id).
CDN_PURGE_KINDS = ("varnish", "webhook", "fastly", "cloudflare")


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    origin: str
    listen: Address
    admin_listen: Address
    log_level: str = "INFO"
    upstream_connect_timeout_seconds: float = 5 * SECONDS
    # Longer than any origin's long-poll timeout (30 s in both real origins) plus slack, so a
    # long-poll that ends normally never turns into a 504.
    upstream_headers_timeout_seconds: float = 75 * SECONDS
    # Idle time allowed between two body chunks of a non-live answer. Live answers (SSE) have
    # none: the production origin sends nothing while idle.
    upstream_read_timeout_seconds: float = 60 * SECONDS
    # Origin connections at most (the pool's cap); 0 = an eighth of the descriptors left after
    # the process's own (edge.web.descriptors).
    upstream_max_connections: int = 0
    # On SIGTERM: stop accepting, give in-flight requests this long, then close what is left.
    drain_seconds: float = 10 * SECONDS
    # The local tier's one byte budget over all segments of all streams.
    cache_bytes: int = 256 * MiB
    # Stitched catch-up answers stop adding segments here (one segment is always whole).
    max_response_bytes: int = 4 * MiB
    # An origin answer larger than this is relayed without being cached.
    max_segment_bytes: int = 32 * MiB
    # How long an at-tail answer of an open stream may be reused without asking the origin.
    # One second bounds a herd of catch-up readers to one origin request per stream per second,
    # while a reader is at most a second behind (it then goes live from there and loses nothing;
    # writes through this edge invalidate at once).
    tail_freshness_seconds: float = 1 * SECONDS
    # Live reads.
    long_poll_timeout_seconds: float = 30 * SECONDS
    sse_max_seconds: float = 60 * SECONDS  # rotate SSE connections (§10.2); 0 = never
    sse_heartbeat_seconds: float = 15 * SECONDS
    sse_buffer_bytes: int = 256 * KiB  # per-viewer socket buffer before writes wait
    # Live readers (SSE viewers and long-polls) at most; 0 = as many as the client connections
    # leave after the short requests' reserve (edge.web.descriptors).
    max_viewers: int = 0
    tail_mode: str = "auto"  # auto | sse | long-poll
    tail_linger_seconds: float = 5 * SECONDS
    redis_url: str | None = None
    redis_mode: str = "standalone"
    redis_sentinel_service: str | None = None
    redis_ttl_seconds: int = 3600
    redis_timeout_seconds: float = 0.25 * SECONDS
    # Request headers that identify a reader: each distinct set of values is its own cache scope,
    # and only these travel upstream on cache fills and live tails. Lower-case names.
    scope_headers: tuple[str, ...] = ("authorization", "cookie")
    # When non-empty, only these cookie names split scopes and travel upstream on cached and live
    # reads; other cookies (analytics, ...) are stripped there. Empty: every cookie counts.
    scope_cookies: tuple[str, ...] = ()
    # Bytes all cache fills together may buffer while reading origin answers; past it, a read is
    # relayed uncached instead of buffered.
    fill_buffer_bytes: int = 64 * MiB
    # Every wait has an end. A cache fill (headers and whole body) that has not ended by
    # ``fill_deadline_seconds`` is abandoned: its upstream closed, its buffer given back, its
    # reader answered 504. An origin that trickles is never idle for --upstream-read-timeout, so
    # only a total bounds it; a fill that keeps moving earns more (edge.fill_budget's
    # ``fill_deadline_seconds``: a second per 64 KiB received), so a large body on a busy edge
    # is not cut.
    fill_deadline_seconds: float = 30 * SECONDS
    # A reader that finds another reader's fill of the same range in flight waits for it at most
    # this long, then asks the origin itself (a relay, stored nowhere): a healthy fill ends in
    # milliseconds, so only a stuck one makes its waiters pay this.
    fill_wait_seconds: float = 5 * SECONDS
    # Client connections on the stream listener (edge.web.connection_table): a connection must
    # deliver a complete request head this soon after connecting (or after the first byte of its
    # next request), may sit idle this long between requests, and at most this many are open
    # (0 = derived from the open-file limit at start-up: edge.web.descriptors).
    header_timeout_seconds: float = 10 * SECONDS
    keepalive_timeout_seconds: float = 60 * SECONDS
    # A request body must be whole this soon after its head, plus a second for every KiB it has
    # delivered (edge.web.connection_table's ``body_deadline``); past it the connection is
    # answered 408 and closed, so bodies that trickle cannot hold the connection slots.
    body_timeout_seconds: float = 20 * SECONDS
    max_connections: int = 0
    # Immutable shared hits answered from stored, pre-serialised responses (edge.web.fastpath).
    fast_path: bool = True
    # Readiness: None probes ``OPTIONS /`` (a Durable Streams origin answers CORS preflights on
    # any path), a path is probed with GET instead. Ready only on 2xx/3xx.
    origin_health_path: str | None = None
    # When set, POST /purge on the admin listener needs ``Authorization: Bearer <token>``
    # (``--admin-token``, older name ``--purge-token``); with ``admin_protect="all"`` every admin
    # path does.
    purge_token: str | None = field(default=None, repr=False)
    admin_protect: str = "purge"  # purge | all
    # Reader authorization at the edge (edge.auth): none (credentials split scopes), jwt or
    # forward. In jwt/forward mode an authorized read is served from the stream's one shared
    # scope, and the origin is reached with ``origin_headers`` instead of the client's.
    auth_mode: str = "none"
    jwt_jwks: str | None = None  # a JWKS file path or an http(s) URL
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_leeway_seconds: float = 30 * SECONDS
    # An unknown ``kid`` refreshes a JWKS URL at most this often.
    jwks_min_refresh_seconds: float = 10 * SECONDS
    auth_url: str | None = None
    auth_timeout_seconds: float = 2 * SECONDS
    # How long a forward-auth verdict is reused when its answer gives no Cache-Control max-age.
    auth_cache_seconds: float = 10 * SECONDS
    # Forward mode: the header of the auth service's 2xx answer that names the principal (what
    # a resume route binds its answers to); None: verdicts name no one.
    auth_subject_header: str | None = None
    origin_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Worker processes sharing the stream port (edge.workers); 1 is a single process, no
    # supervisor. The bounds above are the edge's totals: ``per_worker`` divides them.
    workers: int = 1
    # Where purges of a stream's CDN copies are sent when the edge forgets it
    # (``--cdn-purge KIND=TARGET``, repeatable): (kind, target) pairs, kinds ``CDN_PURGE_KINDS``.
    # With none, nobody downstream can be told, so CDN lifetimes stay as short as the browser's.
    cdn_purge: tuple[tuple[str, str], ...] = ()
    # The purge-by-key APIs (edge.cdn.api): tokens (from the environment; needed by their kind)
    # and base URLs (overridable for stand-ins and private endpoints).
    fastly_token: str | None = field(default=None, repr=False)
    cloudflare_token: str | None = field(default=None, repr=False)
    fastly_api_url: str = "https://api.fastly.com"
    cloudflare_api_url: str = "https://api.cloudflare.com/client/v4"
    # How long a browser (any cache nobody can purge) may keep an answer that can never change:
    # a deleted stream's bytes stay visible there that long (edge.log.freshness).
    browser_max_age_seconds: int = 60
    # Resume routes (``--resume-route PATH=URL``, repeatable) and how long a finished answer
    # stays resumable (the TTL of the stream it is kept in at the origin).
    resume_routes: tuple[ResumeRoute, ...] = ()
    resume_retention_seconds: float = 600 * SECONDS
    # Where those streams live at the origin: one path segment per answer is added.
    resume_stream_prefix: str = "/_edge/resume/"
    # A pump appends a lease while its upstream is quiet (every third of this); a reader that
    # sees nothing in an open answer's stream for this long takes the pump for dead and ends the
    # answer. Longer than a pump's write retries (~16 s), so an origin's restart is not a death.
    resume_lease_seconds: float = 30 * SECONDS
    # Caps on what this process keeps: past them an answer goes on to its own client without
    # ids (it works, it is not resumable): a pump per answer at once, the bytes of one answer's
    # events, and how long one answer is kept.
    resume_max_pumps: int = 1000
    resume_max_bytes: int = 16 * 1024 * 1024
    resume_max_seconds: float = 3600 * SECONDS

    def __post_init__(self) -> None:
        parts = urlsplit(self.origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("{origin} must be an http(s) URL", f", got {self.origin!r}")
        if parts.query or parts.fragment:
            raise ConfigError("{origin} must not carry a query or fragment")
        if parts.path not in ("", "/"):
            # Clients' paths are forwarded verbatim, so a prefix here would be silently ignored.
            raise ConfigError(
                "{origin} must not carry a path: the edge forwards each client's path verbatim, "
                "so give scheme://host:port only",
                f" (got path {parts.path!r})",
            )
        for name in (
            "upstream_connect_timeout_seconds",
            "upstream_headers_timeout_seconds",
            "upstream_read_timeout_seconds",
            "cache_bytes",
            "max_response_bytes",
            "max_segment_bytes",
            "redis_ttl_seconds",
            "fill_buffer_bytes",
            "fill_deadline_seconds",
            "fill_wait_seconds",
            "redis_timeout_seconds",
            "long_poll_timeout_seconds",
            "sse_heartbeat_seconds",
            "sse_buffer_bytes",
            "header_timeout_seconds",
            "keepalive_timeout_seconds",
            "body_timeout_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError("{" + name + "} must be positive")
        for name in (
            "tail_freshness_seconds",
            "tail_linger_seconds",
            "drain_seconds",
            "max_connections",
        ):
            if getattr(self, name) < 0:
                raise ConfigError("{" + name + "} must be >= 0")
        if self.max_segment_bytes > self.cache_bytes:
            # A segment the cache cannot hold would be fetched, dropped and fetched again.
            raise ConfigError("{max_segment_bytes} must not exceed {cache_bytes}")
        self._check_redis()
        if self.sse_max_seconds != 0 and self.sse_max_seconds < MIN_SSE_SECONDS:
            # The official client falls back to long-poll when SSE connections are short.
            raise ConfigError(
                "{sse_max_seconds} must be 0 (never) or at least " + f"{MIN_SSE_SECONDS:g}"
            )
        if self.workers < 1:
            raise ConfigError("{workers} must be at least 1")
        if self.max_viewers < 0:
            raise ConfigError("{max_viewers} must be >= 0 (0 = what the open-file limit allows)")
        if self.tail_mode not in ("auto", "sse", "long-poll"):
            raise ConfigError("{tail_mode} must be auto, sse or long-poll")
        if self.upstream_max_connections < 0:
            raise ConfigError(
                "{upstream_max_connections} must be >= 0 (0 = derived from the open-file limit)"
            )
        if self.origin_health_path is not None and not self.origin_health_path.startswith("/"):
            raise ConfigError("{origin_health_path} must start with /")
        if self.purge_token is not None and (
            not self.purge_token.isascii() or not self.purge_token.isprintable()
        ):
            raise ConfigError("{purge_token} must be printable ASCII")
        if self.admin_protect not in ("purge", "all"):
            raise ConfigError("{admin_protect} must be purge or all")
        if self.admin_protect == "all" and self.purge_token is None:
            raise ConfigError("{admin_protect}=all needs {purge_token}")
        if not 0 <= self.browser_max_age_seconds <= IMMUTABLE_MAX_AGE_SECONDS:
            raise ConfigError(
                "{browser_max_age_seconds} must be 0 to " + f"{IMMUTABLE_MAX_AGE_SECONDS} (a year)"
            )
        self._check_auth()
        self._check_cdn_purge()
        self._check_resume()

    def _check_resume(self) -> None:
        if self.resume_retention_seconds < 1:
            raise ConfigError("{resume_retention_seconds} must be at least a second")
        if self.resume_max_pumps < 0 or self.resume_max_bytes < 0 or self.resume_max_seconds < 0:
            raise ConfigError("the resume caps must not be negative")
        if self.resume_lease_seconds < 1:
            raise ConfigError("{resume_lease_seconds} must be at least a second")
        prefix = self.resume_stream_prefix
        if not prefix.startswith("/") or not prefix.endswith("/") or "?" in prefix:
            raise ConfigError("{resume_stream_prefix} must be a path that starts and ends with /")
        for route in self.resume_routes:
            parts = urlsplit(route.url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
                raise ConfigError("{resume_routes} URL must be http(s)", f", got {route.url!r}")
            if not route.path.startswith("/") or "?" in route.path:
                raise ConfigError("{resume_routes} PATH must start with /", f": {route.path!r}")
            if route.holds(prefix) or prefix.startswith(route.path.rstrip("/") + "/"):
                # The answers' own streams are read through the edge: never a resume route.
                raise ConfigError(
                    "{resume_routes} PATH must not hold {resume_stream_prefix}",
                    f": {route.path!r}",
                )

    def _check_redis(self) -> None:
        if self.redis_mode not in REDIS_MODES:
            raise ConfigError("{redis_mode} must be " + ", ".join(REDIS_MODES))
        if self.redis_sentinel_service is not None and self.redis_mode != "sentinel":
            raise ConfigError("{redis_sentinel_service} is for {redis_mode}=sentinel")
        if self.redis_url is None:
            if self.redis_mode != "standalone":
                raise ConfigError("{redis_mode}=" + self.redis_mode + " needs {redis_url}")
            return
        urls = redis_urls(self.redis_url)
        if not urls:
            raise ConfigError("{redis_url} names no Redis")
        if self.redis_mode == "standalone" and len(urls) > 1:
            raise ConfigError(
                "{redis_url} lists several URLs: that is for {redis_mode} cluster or sentinel"
            )
        schemes: tuple[str, ...] = ("redis://", "rediss://", "unix://")
        if self.redis_mode != "standalone":
            schemes = ("redis://", "rediss://")  # a cluster or sentinels are reached over TCP
        for url in urls:
            if not url.startswith(schemes):
                raise ConfigError("{redis_url} must be " + " or ".join(schemes), f", got {url!r}")
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 - parsing is the check
            except ValueError:
                raise ConfigError("{redis_url} has an invalid port") from None
            if self.redis_mode == "cluster" and parts.path not in ("", "/", "/0"):
                raise ConfigError("{redis_url}: a cluster has database 0 only", f", got {url!r}")
        if self.redis_mode == "sentinel" and not self.redis_sentinel_service:
            raise ConfigError("{redis_mode}=sentinel needs {redis_sentinel_service}")

    @property
    def redis_target(self) -> RedisTarget | None:
        """The shared tier's Redis, or None without one."""
        if self.redis_url is None:
            return None
        return RedisTarget(
            mode=self.redis_mode,
            urls=redis_urls(self.redis_url),
            sentinel_service=self.redis_sentinel_service,
        )

    def _check_cdn_purge(self) -> None:
        for name in ("fastly_api_url", "cloudflare_api_url"):
            parts = urlsplit(getattr(self, name))
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
                raise ConfigError("{" + name + "} must be an http(s) URL without a query")
        for name in ("fastly_token", "cloudflare_token"):
            token = getattr(self, name)
            if token is not None and not (token.isascii() and token.isprintable() and token):
                raise ConfigError("{" + name + "} must be printable ASCII")
        kinds = {kind for kind, _ in self.cdn_purge}
        if "fastly" in kinds and not self.fastly_token:
            raise ConfigError(
                "{cdn_purge} fastly= needs a Fastly API token (with purge_select scope): set "
                "EDGE_FASTLY_TOKEN ({fastly_token})"
            )
        if "cloudflare" in kinds and not self.cloudflare_token:
            raise ConfigError(
                "{cdn_purge} cloudflare= needs a Cloudflare API token (Cache Purge permission): "
                "set EDGE_CLOUDFLARE_TOKEN ({cloudflare_token})"
            )
        if len(set(self.cdn_purge)) != len(self.cdn_purge):
            raise ConfigError("{cdn_purge} names the same target twice")
        for kind, target in self.cdn_purge:
            if kind not in CDN_PURGE_KINDS:
                raise ConfigError(
                    "{cdn_purge} kinds are " + ", ".join(CDN_PURGE_KINDS), f", got {kind!r}"
                )
            if kind in ("varnish", "webhook"):
                parts = urlsplit(target)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ConfigError(
                        "{cdn_purge} " + kind + "= needs an http(s) URL", f", got {target!r}"
                    )
            elif not target or not all(c.isalnum() or c in "-_" for c in target):
                raise ConfigError(
                    "{cdn_purge} " + kind + "= needs an id of letters, digits, - and _",
                    f", got {target!r}",
                )

    def _check_auth(self) -> None:
        if self.auth_mode not in ("none", "jwt", "forward"):
            raise ConfigError("{auth_mode} must be none, jwt or forward")
        if self.auth_mode == "jwt" and not self.jwt_jwks:
            raise ConfigError("{auth_mode}=jwt needs {jwt_jwks} (a JWKS file or URL)")
        if self.auth_mode == "forward":
            parts = urlsplit(self.auth_url or "")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError("{auth_mode}=forward needs {auth_url}, an http(s) URL")
        if self.auth_mode == "none" and self.origin_headers:
            raise ConfigError("{origin_headers} is for {auth_mode} jwt or forward")
        if self.auth_mode != "forward" and self.auth_subject_header:
            raise ConfigError("{auth_subject_header} is for {auth_mode} forward")
        for name in ("jwt_leeway_seconds", "jwks_min_refresh_seconds", "auth_cache_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError("{" + name + "} must be >= 0")
        if self.auth_timeout_seconds <= 0:
            raise ConfigError("{auth_timeout_seconds} must be positive")

    @property
    def admin_on_loopback(self) -> bool:
        """Whether only this machine can reach the admin listener."""
        host = self.admin_listen.host
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to any interface

    @property
    def origin_base(self) -> str:
        """The origin URL without a trailing slash; request paths are appended to it."""
        return self.origin.rstrip("/")


def per_worker(settings: Settings) -> Settings:
    """One worker's share of the edge's bounds, so that N workers together keep the memory,
    viewers, client and origin connections the operator configured (each rounded down, at
    least 1). A bound of 0 (derived from the open-file limit) stays per process: descriptors
    are per process. A segment no worker's cache can hold is not fetched to be
    dropped: ``--max-segment-bytes`` is capped at one worker's cache."""
    n = settings.workers
    if n == 1:
        return settings
    cache_bytes = max(1, settings.cache_bytes // n)

    def share(total: int) -> int:
        return max(1, total // n) if total else 0

    return replace(
        settings,
        cache_bytes=cache_bytes,
        max_segment_bytes=min(settings.max_segment_bytes, cache_bytes),
        fill_buffer_bytes=max(1, settings.fill_buffer_bytes // n),
        max_viewers=share(settings.max_viewers),
        max_connections=share(settings.max_connections),
        upstream_max_connections=share(settings.upstream_max_connections),
    )
