"""One frozen ``Settings`` for the whole process, with units in its names.

Only ``edge.cli`` builds it (from flags and ``EDGE_*`` environment variables); everything else
receives it as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SECONDS = 1.0
MIN_SSE_SECONDS = 5 * SECONDS
KiB = 1024
MiB = 1024 * KiB


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which and why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (all interfaces)."""
        host, sep, port_text = text.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError(f"expected HOST:PORT, got {text!r}")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ConfigError(f"port out of range in {text!r}")
        host = host.strip("[]") or "0.0.0.0"
        return cls(host=host, port=port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


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
    max_viewers: int = 20_000
    tail_mode: str = "auto"  # auto | sse | long-poll
    tail_linger_seconds: float = 5 * SECONDS
    redis_url: str | None = None
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

    def __post_init__(self) -> None:
        parts = urlsplit(self.origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--origin must be an http(s) URL, got {self.origin!r}")
        if parts.query or parts.fragment:
            raise ConfigError("--origin must not carry a query or fragment")
        for name in (
            "upstream_connect_timeout_seconds",
            "upstream_headers_timeout_seconds",
            "upstream_read_timeout_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in (
            "cache_bytes",
            "max_response_bytes",
            "max_segment_bytes",
            "redis_ttl_seconds",
            "fill_buffer_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_segment_bytes > self.cache_bytes:
            # A segment the cache cannot hold would be fetched, dropped and fetched again.
            raise ConfigError("max_segment_bytes must not exceed cache_bytes")
        if self.tail_freshness_seconds < 0:
            raise ConfigError("tail_freshness_seconds must be >= 0")
        if self.redis_timeout_seconds <= 0:
            raise ConfigError("redis_timeout_seconds must be positive")
        if self.redis_url is not None and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ConfigError(
                f"--redis-url must be redis://, rediss:// or unix://, got {self.redis_url!r}"
            )
        if self.sse_max_seconds != 0 and self.sse_max_seconds < MIN_SSE_SECONDS:
            # The official client falls back to long-poll when SSE connections are short.
            raise ConfigError(f"sse_max_seconds must be 0 (never) or at least {MIN_SSE_SECONDS}")
        for name in ("long_poll_timeout_seconds", "sse_heartbeat_seconds", "sse_buffer_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_viewers < 1:
            raise ConfigError("max_viewers must be at least 1")
        if self.tail_mode not in ("auto", "sse", "long-poll"):
            raise ConfigError("tail_mode must be auto, sse or long-poll")
        if self.tail_linger_seconds < 0:
            raise ConfigError("tail_linger_seconds must be >= 0")
        if self.drain_seconds < 0:
            raise ConfigError("drain_seconds must be >= 0")
        if self.upstream_max_connections < 0:
            raise ConfigError("upstream_max_connections must be >= 0 (0 = unlimited)")

    @property
    def origin_base(self) -> str:
        """The origin URL without a trailing slash; request paths are appended to it."""
        return self.origin.rstrip("/")
