import pytest

from edge.cli import SERVE_OPTIONS, build_parser, parse_settings
from edge.config import Address, ConfigError


def test_flags_and_defaults() -> None:
    settings = parse_settings(["serve", "--origin", "http://o:4437/"], {})
    assert settings.origin_base == "http://o:4437"
    assert settings.listen == Address(host="127.0.0.1", port=8080)
    assert settings.admin_listen == Address(host="127.0.0.1", port=9090)
    assert settings.upstream_headers_timeout_seconds > 30


def test_every_flag_reads_its_env_and_the_flag_wins() -> None:
    env = {
        "EDGE_ORIGIN": "http://env-origin",
        "EDGE_LISTEN": "[::1]:81",
        "EDGE_ADMIN_LISTEN": ":9999",
        "EDGE_LOG_LEVEL": "debug",
        "EDGE_UPSTREAM_CONNECT_TIMEOUT": "1.5",
        "EDGE_UPSTREAM_HEADERS_TIMEOUT": "40",
        "EDGE_UPSTREAM_READ_TIMEOUT": "7",
        "EDGE_UPSTREAM_MAX_CONNECTIONS": "12",
        "EDGE_DRAIN_SECONDS": "3",
        "EDGE_CACHE_BYTES": "64MiB",
        "EDGE_MAX_RESPONSE_BYTES": "512KiB",
        "EDGE_MAX_SEGMENT_BYTES": "1048576",
        "EDGE_TAIL_FRESHNESS": "0.5",
        "EDGE_LONG_POLL_TIMEOUT": "12",
        "EDGE_SSE_MAX_SECONDS": "0",
        "EDGE_SSE_HEARTBEAT": "3",
        "EDGE_SSE_BUFFER_BYTES": "64KiB",
        "EDGE_MAX_VIEWERS": "7",
        "EDGE_TAIL_MODE": "sse",
        "EDGE_TAIL_LINGER": "2",
        "EDGE_REDIS_URL": "redis://127.0.0.1:6390/2",
        "EDGE_REDIS_TTL": "60",
        "EDGE_REDIS_TIMEOUT": "0.1",
    }
    assert {option.env for option in SERVE_OPTIONS} == set(env)
    settings = parse_settings(["serve", "--listen", "0.0.0.0:82"], env)
    assert settings.origin == "http://env-origin"
    assert settings.listen == Address(host="0.0.0.0", port=82)
    assert settings.admin_listen == Address(host="0.0.0.0", port=9999)
    assert settings.log_level == "DEBUG"
    assert settings.upstream_connect_timeout_seconds == 1.5
    assert settings.upstream_headers_timeout_seconds == 40
    assert settings.upstream_read_timeout_seconds == 7
    assert settings.upstream_max_connections == 12
    assert settings.drain_seconds == 3
    assert settings.cache_bytes == 64 * 1024 * 1024
    assert settings.max_response_bytes == 512 * 1024
    assert settings.max_segment_bytes == 1024 * 1024
    assert settings.tail_freshness_seconds == 0.5
    assert settings.redis_url == "redis://127.0.0.1:6390/2"
    assert settings.redis_ttl_seconds == 60
    assert settings.redis_timeout_seconds == 0.1
    assert settings.long_poll_timeout_seconds == 12
    assert settings.sse_max_seconds == 0
    assert settings.sse_heartbeat_seconds == 3
    assert settings.sse_buffer_bytes == 64 * 1024
    assert settings.max_viewers == 7
    assert settings.tail_mode == "sse"
    assert settings.tail_linger_seconds == 2


def test_redis_is_off_unless_asked_for() -> None:
    assert parse_settings(["serve", "--origin", "http://o"], {}).redis_url is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "--origin"),
        (["serve", "--origin", "ftp://x"], "http(s) URL"),
        (["serve", "--origin", "http://x", "--listen", "nope"], "HOST:PORT"),
        (["serve", "--origin", "http://x", "--listen", "h:99999"], "out of range"),
        (["serve", "--origin", "http://x", "--log-level", "loud"], "--log-level"),
        (["serve", "--origin", "http://x", "--upstream-read-timeout", "0"], "positive"),
        (["serve", "--origin", "http://x", "--upstream-max-connections", "-1"], "--upstream"),
        (["serve", "--origin", "http://x", "--cache-bytes", "lots"], "--cache-bytes"),
        (["serve", "--origin", "http://x", "--redis-url", "http://r"], "redis://"),
        (["serve", "--origin", "http://x", "--sse-max-seconds", "1"], "at least"),
        (["serve", "--origin", "http://x", "--tail-mode", "carrier-pigeon"], "tail_mode"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_settings(argv, {})


def test_help_explains_every_flag() -> None:
    serve_help = build_parser({})._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for option in SERVE_OPTIONS:
        assert option.flag in serve_help
        assert option.env in serve_help
