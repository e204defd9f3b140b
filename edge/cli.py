"""``edge serve``: flags, each also readable from an ``EDGE_<NAME>`` environment variable.

This is the only module that reads ``os.environ``. A flag on the command line wins over its
environment variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge import __version__
from edge.config import REDIS_MODES, Address, ConfigError, ResumeRoute, Settings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    # The Settings field it fills, when that is not ``dest`` (units in names: ``..._seconds``).
    field: str | None = None
    # Other names of the same flag (each with its own EDGE_ variable): older spellings kept.
    aliases: tuple[str, ...] = ()
    # May be given several times; its environment variable holds one value per line.
    repeatable: bool = False

    @property
    def setting(self) -> str:
        return self.field or self.dest

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return "EDGE_" + self.dest.upper()

    @property
    def envs(self) -> tuple[str, ...]:
        """The variables it is read from, in order of precedence."""
        aliases = (alias.removeprefix("--").replace("-", "_").upper() for alias in self.aliases)
        return (self.env, *("EDGE_" + name for name in aliases))


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"one of {', '.join(LOG_LEVELS)}")
    return level


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise ValueError("on or off")
    return value == "on"


def _optional_str(text: str) -> str | None:
    return text or None


BYTE_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def _byte_size(text: str) -> int:
    number = text.strip().upper().rstrip()
    unit = ""
    for suffix in ("KIB", "MIB", "GIB", "B"):
        if number.endswith(suffix):
            number, unit = number[: -len(suffix)].strip(), suffix
            break
    if not number.isdigit():
        raise ValueError("a whole number of bytes, optionally with KiB, MiB or GiB")
    return int(number) * BYTE_UNITS[unit]


DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """Seconds, as a number (``1.5``) or with a unit (``500ms``, ``30s``, ``2m``, ``1h``)."""
    value = text.strip().lower()
    unit = 1.0
    for suffix in ("ms", "s", "m", "h"):  # "ms" before "s" and "m"
        if value.endswith(suffix):
            value, unit = value[: -len(suffix)].strip(), DURATION_UNITS[suffix]
            break
    try:
        seconds = float(value) * unit
    except ValueError:
        raise ValueError("a duration: seconds, or a number with ms, s, m or h") from None
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number")
    return seconds  # its range is the setting's to check (edge.config)


def _whole_duration(text: str) -> int:
    """A duration (``_duration``) of whole seconds, as ``max-age`` says them."""
    seconds = _duration(text)
    if not seconds.is_integer():
        raise ValueError("whole seconds (a max-age)")
    return int(seconds)


def _whole_number(text: str) -> int:
    """A whole number, said as such when it is not one (``int``'s own words name base 10)."""
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("a whole number") from None


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _name_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of header or cookie names."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not all(c.isalnum() or c in "-_.!#$%&'*+^`|~" for c in name):
            raise ValueError(f"{name!r} is not a valid name")
    return names


def _workers(text: str) -> int:
    """``auto``: one per CPU this process may run on (its affinity mask, not the machine's
    count, so ``taskset`` and cpusets are honoured; a container's CPU quota is not visible
    here: set it explicitly there)."""
    if text.strip().lower() == "auto":
        return len(os.sched_getaffinity(0))
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("a whole number of workers, or auto") from None
    if value < 1:
        raise ValueError("must be at least 1, or auto")
    return value


def _header_names(text: str) -> tuple[str, ...]:
    return tuple(name.lower() for name in _name_list(text))


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return text

    parse.choices = choices  # type: ignore[attr-defined]  # shown by --help
    return parse


def _header_lines(text: str) -> tuple[tuple[str, str], ...]:
    """``Name: value`` headers, one per line (each use of a repeatable flag is one line)."""
    headers: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not all(c.isalnum() or c in "-_.!#$%&'*+^`|~" for c in name):
            raise ValueError("expected 'Name: value'")
        if not value.isascii() or not value.isprintable():
            raise ValueError(f"the value of {name} must be printable ASCII")
        headers.append((name, value))
    return tuple(headers)


def _kind_targets(text: str) -> tuple[tuple[str, str], ...]:
    """``KIND=TARGET`` pairs, one per line (each use of a repeatable flag is one line)."""
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, sep, target = line.strip().partition("=")
        if not sep or not kind or not target:
            raise ValueError("expected KIND=TARGET")
        pairs.append((kind.strip().lower(), target.strip()))
    return tuple(pairs)


def _resume_routes(text: str) -> tuple[ResumeRoute, ...]:
    """``PATH=URL`` pairs, one per line (each use of a repeatable flag is one line)."""
    routes: list[ResumeRoute] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        path, sep, url = line.strip().partition("=")
        if not sep or not path.strip() or not url.strip():
            raise ValueError("expected PATH=URL")
        routes.append(ResumeRoute(path=path.strip(), url=url.strip()))
    return tuple(routes)


SERVE_OPTIONS = (
    Option("--origin", str, None, "Base URL of the origin stream server (required)."),
    Option("--listen", Address.parse, "127.0.0.1:8080", "HOST:PORT for stream traffic."),
    Option(
        "--admin-listen",
        Address.parse,
        "127.0.0.1:9090",
        "HOST:PORT for /metrics, /healthz and /readyz; never the stream port.",
    ),
    Option("--log-level", _log_level, "INFO", "Logging threshold: DEBUG also logs each request."),
    Option(
        "--upstream-connect-timeout",
        _duration,
        "5",
        "Seconds to open a connection to the origin before answering 502.",
        field="upstream_connect_timeout_seconds",
    ),
    Option(
        "--upstream-headers-timeout",
        _duration,
        "75",
        "Seconds to wait for the origin's response headers before answering 504; keep it "
        "above the origin's long-poll timeout (30 s for both real origins).",
        field="upstream_headers_timeout_seconds",
    ),
    Option(
        "--upstream-read-timeout",
        _duration,
        "60",
        "Seconds a non-live origin body may stall between chunks before the client's "
        "connection is aborted. Live (SSE) bodies have no idle limit.",
        field="upstream_read_timeout_seconds",
    ),
    Option(
        "--upstream-max-connections",
        _positive_int,
        "0",
        "Cap on concurrent origin connections: relays, cache fills, live tails and long-poll "
        "groups share it. 0 = an eighth of the open-file limit (ulimit -n) after 64 for the "
        "process itself.",
    ),
    Option(
        "--drain-seconds",
        _duration,
        "10",
        "On SIGTERM, how long in-flight requests may finish before connections are closed.",
    ),
    Option(
        "--cache-bytes",
        _byte_size,
        "256MiB",
        "Byte budget of the local cache over all segments (LRU); accepts KiB, MiB, GiB.",
    ),
    Option(
        "--max-response-bytes",
        _byte_size,
        "4MiB",
        "Stitched catch-up answers stop adding segments past this size; such an answer "
        "carries no Stream-Up-To-Date.",
    ),
    Option(
        "--max-segment-bytes",
        _byte_size,
        "32MiB",
        "Origin answers larger than this are relayed without being cached.",
    ),
    Option(
        "--tail-freshness",
        _duration,
        "1",
        "Seconds an at-tail answer of an open stream is reused without asking the origin, "
        "counted from when the edge's request for the tail left; a read in the last tenth "
        "refills it in the background. Writes through this edge invalidate at once; a reader "
        "is at most this far behind writes made elsewhere, and loses nothing (it goes live "
        "from there).",
        field="tail_freshness_seconds",
    ),
    Option(
        "--browser-max-age",
        _whole_duration,
        "60",
        "Seconds a browser (or any cache nobody can purge) may keep an answer that can never "
        "change (a closed or capped range): a deleted stream's bytes stay visible there that "
        "long. A CDN keeps such answers a year when --cdn-purge names where to purge it, else "
        "this long too.",
        field="browser_max_age_seconds",
    ),
    Option(
        "--long-poll-timeout",
        _duration,
        "30",
        "Seconds a long-poll at the tail waits for data before answering 204.",
        field="long_poll_timeout_seconds",
    ),
    Option(
        "--sse-max-seconds",
        _duration,
        "60",
        "Rotate SSE connections after this long, at a batch boundary (clients resume by "
        "offset); 0 = never. At least 5, since short SSE connections make clients fall back.",
    ),
    Option(
        "--sse-heartbeat",
        _duration,
        "15",
        "Seconds of silence after which an SSE viewer gets a comment heartbeat.",
        field="sse_heartbeat_seconds",
    ),
    Option(
        "--sse-buffer-bytes",
        _byte_size,
        "256KiB",
        "Per-viewer socket buffer; a viewer slower than this lags and catches up from the log.",
    ),
    Option(
        "--max-viewers",
        _positive_int,
        "0",
        "Cap on live readers (SSE viewers and long-polls) of the edge; beyond it a new one "
        "gets 503 with Retry-After. 0 = as many as --max-connections leaves after the short "
        "requests' reserve (a sixteenth); a viewer holds one descriptor.",
    ),
    Option(
        "--tail-mode",
        _choice("auto", "sse", "long-poll"),
        "auto",
        "How a stream is followed upstream: sse, long-poll, or auto (SSE for JSON and binary "
        "streams, long-poll for text, whose SSE framing the reference origin makes lossy).",
    ),
    Option(
        "--tail-linger",
        _duration,
        "5",
        "Seconds an upstream tail stays after its last reader leaves.",
        field="tail_linger_seconds",
    ),
    Option(
        "--redis-url",
        _optional_str,
        "",
        "Shared cache tier, e.g. redis://127.0.0.1:6379/0; empty disables it. In cluster mode "
        "one or more seed nodes, in sentinel mode the sentinels (comma-separated).",
    ),
    Option(
        "--redis-mode",
        _choice(*REDIS_MODES),
        "standalone",
        "standalone (one Redis), cluster (a Redis Cluster; --redis-url names seed nodes) or "
        "sentinel (the primary the sentinels in --redis-url name, see "
        "--redis-sentinel-service).",
    ),
    Option(
        "--redis-sentinel-service",
        _optional_str,
        "",
        "In sentinel mode: the name the sentinels monitor the primary by.",
    ),
    Option(
        "--redis-ttl",
        _positive_int,
        "3600",
        "Seconds a segment lives in the shared tier.",
        field="redis_ttl_seconds",
    ),
    Option(
        "--redis-timeout",
        _duration,
        "0.25",
        "Seconds one shared-tier operation may take before it counts as a failure; a few "
        "failures in a row open a circuit breaker for 5 s.",
        field="redis_timeout_seconds",
    ),
    Option(
        "--scope-headers",
        _header_names,
        "Authorization,Cookie",
        "Comma-separated request headers that identify a reader: each distinct set of values "
        "is its own cache scope, and only these travel upstream on cache fills and live tails.",
    ),
    Option(
        "--scope-cookies",
        _name_list,
        "",
        "Comma-separated cookie names: when set, only these cookies split scopes and travel "
        "upstream on cached and live reads (others, e.g. analytics cookies, are stripped "
        "there). Empty: every cookie counts.",
    ),
    Option(
        "--fill-buffer-bytes",
        _byte_size,
        "64MiB",
        "Bytes all cache fills together may buffer; past it a read is relayed uncached.",
    ),
    Option(
        "--fill-deadline",
        _duration,
        "30",
        "Seconds a cache fill (the origin's headers and whole body) may take, plus one more for "
        "every 64 KiB it has received; past it the fill is abandoned, nothing of it is stored, "
        "and its reader is answered 504. Only a total bounds an origin that trickles: it is "
        "never idle for --upstream-read-timeout.",
        field="fill_deadline_seconds",
    ),
    Option(
        "--fill-wait",
        _duration,
        "5",
        "Seconds a reader waits on another reader's cache fill of the same range before the "
        "origin is asked for its own read (relayed to it, stored nowhere).",
        field="fill_wait_seconds",
    ),
    Option(
        "--header-timeout",
        _duration,
        "10",
        "Seconds a client connection may take to send a complete request head, counted from "
        "its connect or from the first byte of its next request; then it is closed.",
        field="header_timeout_seconds",
    ),
    Option(
        "--keepalive-timeout",
        _duration,
        "60",
        "Seconds a client connection may stay idle between requests before it is closed.",
        field="keepalive_timeout_seconds",
    ),
    Option(
        "--body-timeout",
        _duration,
        "20",
        "Seconds a request body may take after its head, plus one more for every KiB it has "
        "delivered; past it the connection is answered 408 and closed, and nothing of the "
        "request reaches the origin as if whole.",
        field="body_timeout_seconds",
    ),
    Option(
        "--max-connections",
        _positive_int,
        "0",
        "Cap on open client connections on the stream listener, every kind (one descriptor "
        "each); live readers may take all but a sixteenth of it, kept for short requests "
        "(writes, catch-up reads, HEAD). Past it, while every connection is busy, a thirty-"
        "second more are admitted to read their heads: idle ones are evicted for a request, "
        "a live reader is never cut, and only past that does a newcomer get a plain 503. 0 = "
        "derived from the open-file limit (ulimit -n): what is left after 64 for the process "
        "and an eighth for origin connections.",
    ),
    Option(
        "--fast-path",
        _on_off,
        "on",
        "on: immutable shared hits (closed or capped ranges) are answered from stored, "
        "pre-serialised responses before the full HTTP stack sees the request; off: every "
        "request takes the full path (same bytes, slower).",
    ),
    Option(
        "--origin-health-path",
        _optional_str,
        "",
        "Path /readyz probes on the origin with GET; empty probes OPTIONS / (a CORS "
        "preflight, which a Durable Streams origin answers). Ready only on 2xx or 3xx.",
    ),
    Option(
        "--workers",
        _workers,
        "auto",
        "Worker processes sharing the stream port (SO_REUSEPORT), supervised: each a complete "
        "edge with its own share of --cache-bytes, --fill-buffer-bytes, --max-viewers, "
        "--max-connections and --upstream-max-connections, and its own origin tails. auto: "
        "the CPUs this process may use. 1: one process, no supervisor.",
    ),
    Option(
        "--admin-token",
        _optional_str,
        "",
        "Bearer token the admin listener requires for POST /purge (and, with --admin-protect "
        "all, for every path). Empty: /purge is open on a loopback admin listener and refused "
        "(403) on any other. (--purge-token, its older name, still works.)",
        field="purge_token",
        aliases=("--purge-token",),
    ),
    Option(
        "--admin-protect",
        _choice("purge", "all"),
        "purge",
        "What --admin-token guards on the admin listener: purge (POST /purge only; /metrics, "
        "/healthz and /readyz stay open, as Prometheus and probes expect) or all.",
    ),
    Option(
        "--auth",
        _choice("none", "jwt", "forward"),
        "none",
        "Reader authorization at the edge: none (credentials split cache scopes), jwt (verify "
        "a bearer token against --jwt-jwks) or forward (ask --auth-url). In jwt and forward "
        "mode authorized reads share one cache scope and the origin sees --origin-header.",
        field="auth_mode",
    ),
    Option(
        "--jwt-jwks",
        _optional_str,
        "",
        "JWKS (a file or an http(s) URL) with the keys tokens are signed with, chosen by kid.",
    ),
    Option("--jwt-audience", _optional_str, "", "When set, tokens must name it in aud."),
    Option("--jwt-issuer", _optional_str, "", "When set, tokens must carry it as iss."),
    Option(
        "--jwt-leeway",
        _duration,
        "30",
        "Seconds of clock skew allowed on exp and nbf.",
        field="jwt_leeway_seconds",
    ),
    Option(
        "--jwt-jwks-min-refresh",
        _duration,
        "10",
        "Least seconds between two JWKS URL fetches caused by unknown kids.",
        field="jwks_min_refresh_seconds",
    ),
    Option("--auth-url", _optional_str, "", "Forward mode: the auth service each verdict asks."),
    Option(
        "--auth-timeout",
        _duration,
        "2",
        "Forward mode: seconds the auth service may take; then 503 (fail closed).",
        field="auth_timeout_seconds",
    ),
    Option(
        "--auth-cache-seconds",
        _duration,
        "10",
        "Forward mode: the longest a verdict is reused: the auth answer's Cache-Control "
        "max-age when shorter (no-store, no-cache or max-age=0: not reused).",
    ),
    Option(
        "--auth-subject-header",
        _optional_str,
        "",
        "Forward mode: the header of the auth service's 2xx answer that names the principal "
        "(X-Auth-Request-User, Remote-User...): resume routes bind their answers to it.",
    ),
    Option(
        "--origin-header",
        _header_lines,
        "",
        "'Name: value' the edge sends to the origin on the authorized reads it makes for its "
        "shared scope (jwt and forward modes), instead of any client's credentials. Repeatable; "
        "the environment variable takes one per line.",
        field="origin_headers",
        repeatable=True,
    ),
    Option(
        "--cdn-purge",
        _kind_targets,
        "",
        "KIND=TARGET: where purges of a forgotten stream's CDN copies are sent: varnish=URL "
        "(PURGE by key, the shipped VCL), webhook=URL (a POST of the keys), fastly=SERVICE_ID, "
        "cloudflare=ZONE_ID (their purge-by-key APIs; tokens from the environment). Repeatable; "
        "the environment variable takes one per line.",
        repeatable=True,
    ),
    Option(
        "--fastly-token",
        _optional_str,
        "",
        "Fastly API token for --cdn-purge fastly= (purge_select scope). Give it in the "
        "environment: a command line is visible to every user of the machine.",
    ),
    Option(
        "--cloudflare-token",
        _optional_str,
        "",
        "Cloudflare API token for --cdn-purge cloudflare= (Cache Purge permission). Give it in "
        "the environment: a command line is visible to every user of the machine.",
    ),
    Option(
        "--fastly-api-url",
        str,
        "https://api.fastly.com",
        "Base URL of Fastly's API (--cdn-purge fastly=): another for a stand-in or a proxy.",
    ),
    Option(
        "--cloudflare-api-url",
        str,
        "https://api.cloudflare.com/client/v4",
        "Base URL of Cloudflare's API (--cdn-purge cloudflare=): another for a stand-in or a "
        "proxy.",
    ),
    Option(
        "--resume-route",
        _resume_routes,
        "",
        "PATH=URL: requests at PATH or under it are relayed to URL (an MCP server, an agent "
        "endpoint); an SSE answer there is kept in a durable stream at the origin, so a client "
        "that drops resumes with Last-Event-ID on any replica (docs/resume.md). Repeatable; the "
        "environment variable takes one per line.",
        field="resume_routes",
        repeatable=True,
    ),
    Option(
        "--resume-retention",
        _duration,
        "600",
        "How long a finished answer on a resume route stays resumable (its stream's TTL).",
        field="resume_retention_seconds",
    ),
    Option(
        "--resume-stream-prefix",
        str,
        "/_edge/resume/",
        "Path at the origin under which the answers of resume routes are kept, one stream each.",
    ),
    Option(
        "--resume-lease",
        _duration,
        "30",
        "A pump appends a lease to its answer's stream while its upstream is quiet; a reader "
        "that sees nothing in an open answer for this long ends it with a JSON-RPC error (its "
        "replica died, or the origin refuses its writes). Longer than an origin's restart.",
        field="resume_lease_seconds",
    ),
    Option(
        "--resume-max-pumps",
        _whole_number,
        "1000",
        "Answers this process keeps at once; past it, a new answer is relayed without ids (it "
        'works, it is not resumable), counted in edge_resume_unkept_total{reason="pumps"}.',
    ),
    Option(
        "--resume-max-bytes",
        _byte_size,
        "16MiB",
        "Bytes of one answer's events kept; past it the rest goes to its own client without ids "
        "and a resume elsewhere ends with the JSON-RPC error.",
    ),
    Option(
        "--resume-max-seconds",
        _duration,
        "3600",
        "How long one answer is kept; past it the rest goes to its own client without ids and a "
        "resume elsewhere ends with the JSON-RPC error.",
    ),
)

FLAG_OF_SETTING = {option.setting: option.flag for option in SERVE_OPTIONS}
SECRET_FLAGS = frozenset(
    {"--admin-token", "--origin-header", "--fastly-token", "--cloudflare-token"}
)

# ``edge serve --help`` in topics, in this order; every flag is in one (a unit test checks).
TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("listeners and workers", ("--listen", "--admin-listen", "--workers", "--drain-seconds")),
    (
        "origin",
        (
            "--origin", "--upstream-connect-timeout", "--upstream-headers-timeout",
            "--upstream-read-timeout", "--upstream-max-connections",
        ),
    ),
    (
        "cache",
        (
            "--cache-bytes", "--max-response-bytes", "--max-segment-bytes",
            "--fill-buffer-bytes", "--fill-deadline", "--fill-wait", "--tail-freshness",
            "--scope-headers", "--scope-cookies", "--fast-path",
        ),
    ),
    (
        "live reads",
        (
            "--long-poll-timeout", "--sse-max-seconds", "--sse-heartbeat", "--sse-buffer-bytes",
            "--tail-mode", "--tail-linger",
        ),
    ),
    (
        "redis (the shared tier)",
        (
            "--redis-url", "--redis-mode", "--redis-sentinel-service", "--redis-ttl",
            "--redis-timeout",
        ),
    ),
    (
        "reader authorization",
        (
            "--auth", "--jwt-jwks", "--jwt-audience", "--jwt-issuer", "--jwt-leeway",
            "--jwt-jwks-min-refresh", "--auth-url", "--auth-timeout", "--auth-cache-seconds",
            "--auth-subject-header", "--origin-header",
        ),
    ),
    (
        "limits",
        ("--max-viewers", "--max-connections", "--header-timeout", "--keepalive-timeout",
         "--body-timeout"),
    ),
    (
        "cdn in front",
        (
            "--cdn-purge", "--fastly-token", "--cloudflare-token", "--fastly-api-url",
            "--cloudflare-api-url", "--browser-max-age",
        ),
    ),
    (
        "resume routes",
        (
            "--resume-route", "--resume-retention", "--resume-stream-prefix", "--resume-lease",
            "--resume-max-pumps", "--resume-max-bytes", "--resume-max-seconds",
        ),
    ),
    ("observability", ("--log-level", "--origin-health-path")),
    ("admin", ("--admin-token", "--admin-protect")),
)  # fmt: skip
OTHER_TOPIC = "other"

# What a value looks like, by its parser (--help's metavar).
_METAVARS: dict[Callable[[str], Any], str] = {
    _duration: "DURATION",
    _whole_duration: "DURATION",
    _byte_size: "SIZE",
    _positive_int: "N",
    Address.parse: "HOST:PORT",
    _workers: "N|auto",
    _on_off: "{on,off}",
    _log_level: "{" + ",".join(LOG_LEVELS) + "}",
    _header_names: "NAME,...",
    _name_list: "NAME,...",
    _header_lines: "'NAME: VALUE'",
    _kind_targets: "KIND=TARGET",
    _resume_routes: "PATH=URL",
}


def metavar(option: Option) -> str:
    choices = getattr(option.parse, "choices", None)
    if choices is not None:
        return "{" + ",".join(choices) + "}"
    known = _METAVARS.get(option.parse)
    if known is not None:
        return known
    if option.flag.endswith("-path"):
        return "PATH"
    return "URL" if option.flag.endswith(("-url", "origin", "-jwks")) else "TEXT"


def _shown_default(option: Option) -> str:
    if option.default is None:
        return "required"
    if option.default == "":
        return "none"
    if option.parse is _duration:
        return option.default + "s"
    return option.default


def topic_of(flag: str) -> str:
    return next((topic for topic, flags in TOPICS if flag in flags), OTHER_TOPIC)


class _ServeParser(argparse.ArgumentParser):
    """``edge serve``'s parser: its own usage for flags it does not know (argparse would
    otherwise answer them with the top-level usage)."""


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    # No abbreviations: a mistyped flag (--tail-freshnes) is an error, never another flag.
    parser = argparse.ArgumentParser(
        prog="edge",
        description="A caching edge proxy for the Durable Streams protocol.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_ServeParser)
    serve = commands.add_parser(
        "serve",
        allow_abbrev=False,
        help="run the edge in front of an origin",
        usage="edge serve --origin URL [options]  (edge serve --help: every option, by topic)",
        description="Run the edge. Every flag can also be set as EDGE_<FLAG> in the environment "
        "(e.g. EDGE_ORIGIN, EDGE_LISTEN); a flag on the command line wins. DURATION is seconds "
        "or a number with ms, s, m or h (30s, 500ms); SIZE is bytes or a number with KiB, MiB "
        "or GiB.",
    )
    groups = {topic: serve.add_argument_group(topic) for topic, _ in TOPICS}
    for option in SERVE_OPTIONS:
        default = next((env[name] for name in option.envs if name in env), option.default)
        topic = topic_of(option.flag)
        group = groups.get(topic) or groups.setdefault(topic, serve.add_argument_group(topic))
        group.add_argument(
            option.flag,
            *option.aliases,
            dest=option.dest,
            default=None if option.repeatable else default,
            action="append" if option.repeatable else "store",
            metavar=metavar(option),
            help=f"{option.help} (default: {_shown_default(option)}; env {option.env})",
        )
        if option.repeatable:
            serve.set_defaults(**{option.dest + "_env": default})
    parser.set_defaults(serve_parser=serve)
    return parser


def parse_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Settings from the command line and environment; raises ConfigError with a clear reason."""
    parser = build_parser(env)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        serve: argparse.ArgumentParser = args.serve_parser
        serve.error(f"unrecognized arguments: {' '.join(unknown)}")
    values: dict[str, Any] = {}
    for option in SERVE_OPTIONS:
        raw = getattr(args, option.dest)
        if option.repeatable:
            raw = "\n".join(raw) if raw is not None else getattr(args, option.dest + "_env")
        if raw is None:
            raise ConfigError(f"{option.flag} (or {option.env}) is required")
        try:
            values[option.setting] = option.parse(raw)
        except ValueError as error:
            # Never echo a secret back, not even into a terminal.
            shown = "..." if option.flag in SECRET_FLAGS else repr(raw)
            raise ConfigError(option.flag, f"={shown}: {error}") from None
    try:
        return Settings(**values)
    except ConfigError as error:
        # Settings names its fields; the user typed flags.
        raise ConfigError("", error.render(FLAG_OF_SETTING)) from None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as error:
        print(f"edge: error: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from edge.startup import StartupError

    try:
        return run(settings)
    except StartupError as error:
        print(f"edge: error: {error}", file=sys.stderr)
        return 2


def run(settings: Settings) -> int:
    """Serve until stopped; the exit code. ``--workers`` above 1 runs the supervisor, which
    starts each worker as ``edge.workers.child`` (``run_worker``)."""
    from edge.startup import run_loop

    if settings.workers > 1:
        from edge.workers.supervisor import supervise

        return run_loop(supervise(settings))
    from edge.server import serve

    run_loop(serve(settings))
    return 0
