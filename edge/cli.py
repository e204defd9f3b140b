"""``edge serve``: flags, each also readable from an ``EDGE_<NAME>`` environment variable.

This is the only module that reads ``os.environ``. A flag on the command line wins over its
environment variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge import __version__
from edge.config import Address, ConfigError, Settings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    # The Settings field it fills, when that is not ``dest`` (units in names: ``..._seconds``).
    field: str | None = None

    @property
    def setting(self) -> str:
        return self.field or self.dest

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return "EDGE_" + self.dest.upper()


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"one of {', '.join(LOG_LEVELS)}")
    return level


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


def _positive_int(text: str) -> int:
    value = int(text)
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
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1, or auto")
    return value


def _header_names(text: str) -> tuple[str, ...]:
    return tuple(name.lower() for name in _name_list(text))


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
        float,
        "5",
        "Seconds to open a connection to the origin before answering 502.",
        field="upstream_connect_timeout_seconds",
    ),
    Option(
        "--upstream-headers-timeout",
        float,
        "75",
        "Seconds to wait for the origin's response headers before answering 504; keep it "
        "above the origin's long-poll timeout (30 s for both real origins).",
        field="upstream_headers_timeout_seconds",
    ),
    Option(
        "--upstream-read-timeout",
        float,
        "60",
        "Seconds a non-live origin body may stall between chunks before the client's "
        "connection is aborted. Live (SSE) bodies have no idle limit.",
        field="upstream_read_timeout_seconds",
    ),
    Option(
        "--upstream-max-connections",
        _positive_int,
        "0",
        "Cap on concurrent origin connections (0 = unlimited).",
    ),
    Option(
        "--drain-seconds",
        float,
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
        float,
        "1",
        "Seconds an at-tail answer of an open stream is reused without asking the origin. "
        "Writes through this edge invalidate at once; a reader is at most this far behind "
        "writes made elsewhere, and loses nothing (it goes live from there).",
        field="tail_freshness_seconds",
    ),
    Option(
        "--long-poll-timeout",
        float,
        "30",
        "Seconds a long-poll at the tail waits for data before answering 204.",
        field="long_poll_timeout_seconds",
    ),
    Option(
        "--sse-max-seconds",
        float,
        "60",
        "Rotate SSE connections after this long, at a batch boundary (clients resume by "
        "offset); 0 = never. At least 5, since short SSE connections make clients fall back.",
    ),
    Option(
        "--sse-heartbeat",
        float,
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
    Option("--max-viewers", _positive_int, "20000", "SSE viewers per edge; beyond it, 503."),
    Option(
        "--tail-mode",
        str,
        "auto",
        "How a stream is followed upstream: sse, long-poll, or auto (SSE for JSON and binary "
        "streams, long-poll for text, whose SSE framing the reference origin makes lossy).",
    ),
    Option(
        "--tail-linger",
        float,
        "5",
        "Seconds an upstream tail stays after its last reader leaves.",
        field="tail_linger_seconds",
    ),
    Option(
        "--redis-url",
        _optional_str,
        "",
        "Shared cache tier, e.g. redis://127.0.0.1:6379/0; empty disables it.",
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
        float,
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
        "--header-timeout",
        float,
        "10",
        "Seconds a client connection may take to send a complete request head, counted from "
        "its connect or from the first byte of its next request; then it is closed.",
        field="header_timeout_seconds",
    ),
    Option(
        "--keepalive-timeout",
        float,
        "60",
        "Seconds a client connection may stay idle between requests before it is closed.",
        field="keepalive_timeout_seconds",
    ),
    Option(
        "--max-connections",
        _positive_int,
        "0",
        "Cap on open client connections on the stream listener; at the cap a newcomer evicts "
        "the longest-idle connection, or gets 503 when all are busy. 0 = half the open-file "
        "limit (ulimit -n), leaving the rest for one origin connection each, Redis and the "
        "admin listener.",
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
        "--purge-token",
        _optional_str,
        "",
        "Bearer token POST /purge on the admin listener requires. Empty: /purge is open on a "
        "loopback admin listener and refused (403) on any other.",
    ),
)

FLAG_OF_SETTING = {option.setting: option.flag for option in SERVE_OPTIONS}


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge", description="A caching edge proxy for the Durable Streams protocol."
    )
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the edge in front of an origin",
        description="Run the edge. Every flag can also be set as EDGE_<FLAG> in the environment "
        "(e.g. EDGE_ORIGIN, EDGE_LISTEN); a flag on the command line wins.",
    )
    for option in SERVE_OPTIONS:
        default = env.get(option.env, option.default)
        serve.add_argument(
            option.flag,
            dest=option.dest,
            default=default,
            metavar=option.dest.upper(),
            help=f"{option.help} [env {option.env}; default {option.default or 'none'}]",
        )
    return parser


def parse_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Settings from the command line and environment; raises ConfigError with a clear reason."""
    parser = build_parser(env)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for option in SERVE_OPTIONS:
        raw = getattr(args, option.dest)
        if raw is None:
            raise ConfigError(f"{option.flag} (or {option.env}) is required")
        try:
            values[option.setting] = option.parse(raw)
        except ValueError as error:
            # Never echo a secret back, not even into a terminal.
            shown = "..." if option.flag == "--purge-token" else repr(raw)
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
    from edge.server import StartupError, run

    try:
        return run(settings)
    except StartupError as error:
        print(f"edge: error: {error}", file=sys.stderr)
        return 2
