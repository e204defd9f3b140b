"""What ``edge serve`` says when it starts: a few lines a person reads, the same in every process
shape (one process, or a supervisor of workers, whose workers say nothing at INFO).

Rules this module owns:

* The lines state what decides how the edge behaves, each on one topic: where it listens, the
  origin, the workers (and what they mean for caching), the cache, the shared tier, reader
  authorization, resume routes and the connection limits (how many viewers and short requests
  the stream listener holds and what limits it: ``edge.web.descriptors.holds_line``). Secrets
  (the admin token, ``--origin-header`` values, a Redis password, one in a URL) are never shown.
* The machine-readable ``{"event": "listening"}`` line on stdout is the launchers' and is not
  made here.

Pure: settings and bound addresses in, lines out.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from edge.config import Settings, per_worker

MiB = 1024 * 1024


def _size(count: int) -> str:
    if count % MiB == 0:
        return f"{count // MiB} MiB"
    if count % 1024 == 0:
        return f"{count // 1024} KiB"
    return f"{count} B"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def redacted_url(url: str) -> str:
    """``url`` without its password (a Redis URL may carry one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, ""))


def _redis_line(settings: Settings) -> str:
    target = settings.redis_target
    if target is None:
        return "  redis    off (each replica caches alone; --redis-url shares a tier)"
    where = ",".join(redacted_url(url) for url in target.urls)
    if target.mode == "cluster":
        where = f"a cluster, seeds {where}"
    elif target.mode == "sentinel":
        where = f"the primary {target.sentinel_service!r} of the sentinels {where}"
    return f"  redis    {where} (the shared tier)"


def limits_summary(holds: str, settings: Settings) -> str:
    """The limits line: what the stream listener holds and what limits it
    (``edge.web.descriptors.holds_line``), and its timeouts."""
    return (
        f"{holds}; header timeout {_seconds(settings.header_timeout_seconds)}, keep-alive "
        f"timeout {_seconds(settings.keepalive_timeout_seconds)}, body timeout "
        f"{_seconds(settings.body_timeout_seconds)}"
    )


def startup_lines(
    settings: Settings, *, listen: str, admin: str, version: str, limits: str | None = None
) -> list[str]:
    """The start-up summary; ``limits``: the connection limits line, where it is known."""
    workers = settings.workers
    share = per_worker(settings)
    lines = [f"edge {version} listening on {listen} (admin, metrics and probes on {admin})"]
    lines.append(f"  origin   {settings.origin}")
    if workers == 1:
        lines.append("  workers  1 process")
    else:
        lines.append(
            f"  workers  {workers} processes sharing the port; each caches what it serves, so "
            "a stream's first read on each worker is a miss"
        )
    cache = f"  cache    {_size(settings.cache_bytes)}"
    if workers > 1:
        cache += f" ({_size(share.cache_bytes)} a worker)"
    cache += (
        f"; at-tail answers reused for {_seconds(settings.tail_freshness_seconds)} "
        f"(--tail-freshness); hit path {'on' if settings.fast_path else 'off'}"
    )
    lines.append(cache)
    lines.append(_redis_line(settings))
    if settings.auth_mode == "jwt":
        auth = f"jwt: bearer tokens checked against {settings.jwt_jwks}"
    elif settings.auth_mode == "forward":
        auth = f"forward: each verdict asked of {settings.auth_url}"
    else:
        auth = "none: the origin decides; credentials split cache scopes"
    lines.append(f"  auth     {auth}")
    if settings.cdn_purge:
        kinds = ", ".join(kind for kind, _ in settings.cdn_purge)
        lines.append(
            f"  cdn      purges sent to: {kinds}; closed ranges kept a year there, "
            f"{_seconds(settings.browser_max_age_seconds)} by browsers (--browser-max-age)"
        )
    if settings.resume_routes:
        routes = ", ".join(
            f"{route.path} to {redacted_url(route.url)}" for route in settings.resume_routes
        )
        lines.append(
            f"  resume   {routes}; SSE answers kept resumable at the origin under "
            f"{settings.resume_stream_prefix} for {_seconds(settings.resume_retention_seconds)}; "
            f"lease {_seconds(settings.resume_lease_seconds)}, at most "
            f"{settings.resume_max_pumps} at once, each up to "
            f"{settings.resume_max_bytes // 1024} KiB and "
            f"{_seconds(settings.resume_max_seconds)}"
        )
    if limits is not None:
        lines.append(f"  limits   {limits}")
    return lines
