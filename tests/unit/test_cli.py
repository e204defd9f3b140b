import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from edge.cli import FLAG_OF_SETTING, SERVE_OPTIONS, TOPICS, build_parser, parse_settings
from edge.config import Address, ConfigError, RedisTarget, ResumeRoute, Settings
from edge.web.admin import purge_refusal

REPO = Path(__file__).resolve().parents[2]


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
        "EDGE_BROWSER_MAX_AGE": "5m",
        "EDGE_LONG_POLL_TIMEOUT": "12",
        "EDGE_SSE_MAX_SECONDS": "0",
        "EDGE_SSE_HEARTBEAT": "3",
        "EDGE_SSE_BUFFER_BYTES": "64KiB",
        "EDGE_MAX_VIEWERS": "7",
        "EDGE_TAIL_MODE": "sse",
        "EDGE_TAIL_LINGER": "2",
        "EDGE_REDIS_URL": "redis://127.0.0.1:6390/2, redis://127.0.0.1:6391/2",
        "EDGE_REDIS_MODE": "sentinel",
        "EDGE_REDIS_SENTINEL_SERVICE": "edge-primary",
        "EDGE_REDIS_TTL": "60",
        "EDGE_REDIS_TIMEOUT": "0.1",
        "EDGE_SCOPE_HEADERS": "Authorization,X-Tenant",
        "EDGE_SCOPE_COOKIES": "session",
        "EDGE_FILL_BUFFER_BYTES": "8MiB",
        "EDGE_FILL_DEADLINE": "12s",
        "EDGE_FILL_WAIT": "500ms",
        "EDGE_HEADER_TIMEOUT": "4",
        "EDGE_KEEPALIVE_TIMEOUT": "20",
        "EDGE_BODY_TIMEOUT": "15",
        "EDGE_MAX_CONNECTIONS": "500",
        "EDGE_FAST_PATH": "off",
        "EDGE_ORIGIN_HEALTH_PATH": "/healthz",
        "EDGE_ADMIN_TOKEN": "s3cret",
        "EDGE_ADMIN_PROTECT": "all",
        "EDGE_AUTH": "forward",
        "EDGE_JWT_JWKS": "/etc/edge/jwks.json",
        "EDGE_JWT_AUDIENCE": "viewers",
        "EDGE_JWT_ISSUER": "https://issuer",
        "EDGE_JWT_LEEWAY": "5",
        "EDGE_JWT_JWKS_MIN_REFRESH": "3",
        "EDGE_AUTH_URL": "http://auth:9000/check",
        "EDGE_AUTH_TIMEOUT": "0.5",
        "EDGE_AUTH_CACHE_SECONDS": "20",
        "EDGE_AUTH_SUBJECT_HEADER": "X-Auth-Request-User",
        "EDGE_ORIGIN_HEADER": "Authorization: Bearer edge-secret\nX-Edge: one",
        "EDGE_WORKERS": "3",
        "EDGE_CDN_PURGE": "varnish=http://varnish:6081/\nfastly=svc-1",
        "EDGE_FASTLY_TOKEN": "fastly-secret",
        "EDGE_CLOUDFLARE_TOKEN": "cloudflare-secret",
        "EDGE_FASTLY_API_URL": "http://fastly-stand-in:1/",
        "EDGE_CLOUDFLARE_API_URL": "http://cloudflare-stand-in:2/client/v4",
        "EDGE_RESUME_ROUTE": "/mcp=http://agent:8000/mcp\n/chat/=http://chat:7000/v1/",
        "EDGE_RESUME_RETENTION": "2m",
        "EDGE_RESUME_STREAM_PREFIX": "/v1/stream/resume/",
        "EDGE_RESUME_LEASE": "45s",
        "EDGE_RESUME_MAX_PUMPS": "12",
        "EDGE_RESUME_MAX_BYTES": "2MiB",
        "EDGE_RESUME_MAX_SECONDS": "5m",
    }
    assert {option.env for option in SERVE_OPTIONS} == set(env)
    settings = parse_settings(["serve", "--listen", "0.0.0.0:82"], env)
    assert settings.origin == "http://env-origin"
    assert settings.listen == Address(host="0.0.0.0", port=82)
    assert settings.admin_listen == Address(host="0.0.0.0", port=9999)
    assert settings.log_level == "DEBUG"
    assert settings.cdn_purge == (("varnish", "http://varnish:6081/"), ("fastly", "svc-1"))
    assert settings.resume_routes == (
        ResumeRoute(path="/mcp", url="http://agent:8000/mcp"),
        ResumeRoute(path="/chat/", url="http://chat:7000/v1/"),
    )
    assert settings.resume_retention_seconds == 120
    assert settings.resume_stream_prefix == "/v1/stream/resume/"
    assert settings.resume_lease_seconds == 45
    assert settings.resume_max_pumps == 12
    assert settings.resume_max_bytes == 2 * 1024 * 1024
    assert settings.resume_max_seconds == 300
    assert settings.fastly_token == "fastly-secret"
    assert settings.cloudflare_token == "cloudflare-secret"
    assert settings.fastly_api_url == "http://fastly-stand-in:1/"
    assert settings.cloudflare_api_url == "http://cloudflare-stand-in:2/client/v4"
    assert settings.upstream_connect_timeout_seconds == 1.5
    assert settings.upstream_headers_timeout_seconds == 40
    assert settings.upstream_read_timeout_seconds == 7
    assert settings.upstream_max_connections == 12
    assert settings.drain_seconds == 3
    assert settings.cache_bytes == 64 * 1024 * 1024
    assert settings.max_response_bytes == 512 * 1024
    assert settings.max_segment_bytes == 1024 * 1024
    assert (settings.fill_deadline_seconds, settings.fill_wait_seconds) == (12, 0.5)
    assert settings.tail_freshness_seconds == 0.5
    assert settings.browser_max_age_seconds == 300  # 5m
    assert settings.redis_url == "redis://127.0.0.1:6390/2, redis://127.0.0.1:6391/2"
    assert settings.redis_target == RedisTarget(
        mode="sentinel",
        urls=("redis://127.0.0.1:6390/2", "redis://127.0.0.1:6391/2"),
        sentinel_service="edge-primary",
    )
    assert settings.fast_path is False
    assert settings.redis_ttl_seconds == 60
    assert settings.redis_timeout_seconds == 0.1
    assert settings.long_poll_timeout_seconds == 12
    assert settings.sse_max_seconds == 0
    assert settings.sse_heartbeat_seconds == 3
    assert settings.sse_buffer_bytes == 64 * 1024
    assert settings.max_viewers == 7
    assert settings.tail_mode == "sse"
    assert settings.tail_linger_seconds == 2
    assert settings.scope_headers == ("authorization", "x-tenant")
    assert settings.scope_cookies == ("session",)
    assert settings.fill_buffer_bytes == 8 * 1024 * 1024
    assert settings.header_timeout_seconds == 4
    assert settings.keepalive_timeout_seconds == 20
    assert settings.body_timeout_seconds == 15
    assert settings.max_connections == 500
    assert settings.origin_health_path == "/healthz"
    assert settings.purge_token == "s3cret"
    assert settings.admin_protect == "all"
    assert settings.auth_mode == "forward"
    assert settings.jwt_jwks == "/etc/edge/jwks.json"
    assert settings.jwt_audience == "viewers"
    assert settings.jwt_issuer == "https://issuer"
    assert settings.jwt_leeway_seconds == 5
    assert settings.jwks_min_refresh_seconds == 3
    assert settings.auth_url == "http://auth:9000/check"
    assert settings.auth_timeout_seconds == 0.5
    assert settings.auth_cache_seconds == 20
    assert settings.auth_subject_header == "X-Auth-Request-User"
    assert settings.origin_headers == (("Authorization", "Bearer edge-secret"), ("X-Edge", "one"))
    assert settings.workers == 3
    flagged = parse_settings(
        ["serve", "--origin-header", "X-A: 1", "--origin-header", "X-B: 2"], env
    )
    assert flagged.origin_headers == (("X-A", "1"), ("X-B", "2"))


def test_admin_token_is_the_purge_token() -> None:
    """``--admin-token`` and ``--purge-token`` are one flag (and one setting)."""
    base = ["serve", "--origin", "http://o"]
    assert parse_settings([*base, "--admin-token", "t1"], {}).purge_token == "t1"
    assert parse_settings(base, {"EDGE_ADMIN_TOKEN": "t2"}).purge_token == "t2"
    assert parse_settings(base, {"EDGE_PURGE_TOKEN": "t3"}).purge_token == "t3"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auth", "magic"], "--auth"),
        (["--auth", "jwt"], "--auth=jwt needs --jwt-jwks"),
        (["--auth", "forward"], "--auth=forward needs --auth-url"),
        (["--auth", "forward", "--auth-url", "ftp://a"], "--auth-url, an http(s) URL"),
        (["--origin-header", "X-A: 1"], "--origin-header is for --auth jwt or forward"),
        (
            ["--auth", "jwt", "--jwt-jwks", "k", "--auth-subject-header", "X-User"],
            "--auth-subject-header is for --auth forward",
        ),
        (["--auth", "jwt", "--jwt-jwks", "k", "--origin-header", "nocolon"], "Name: value"),
        (["--admin-protect", "all"], "--admin-protect=all needs --admin-token"),
        (["--auth", "jwt", "--jwt-jwks", "k", "--auth-timeout", "0"], "--auth-timeout must be"),
    ],
)
def test_auth_settings_are_checked(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(["serve", "--origin", "http://o", *args], {})


def test_redis_is_off_unless_asked_for() -> None:
    settings = parse_settings(["serve", "--origin", "http://o"], {})
    assert settings.redis_url is None
    assert settings.redis_target is None
    assert settings.redis_mode == "standalone"


def test_cluster_mode_takes_seed_nodes() -> None:
    settings = parse_settings(
        [
            "serve",
            "--origin",
            "http://o",
            "--redis-mode",
            "cluster",
            "--redis-url",
            "redis://10.0.0.1:7000,redis://10.0.0.2:7000,",
        ],
        {},
    )
    assert settings.redis_target == RedisTarget(
        mode="cluster", urls=("redis://10.0.0.1:7000", "redis://10.0.0.2:7000")
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-mode", "ring"], "--redis-mode='ring': one of standalone, cluster, sentinel"),
        (["--redis-mode", "cluster"], "--redis-mode=cluster needs --redis-url"),
        (
            ["--redis-url", "redis://a:1,redis://b:1"],
            "--redis-url lists several URLs: that is for --redis-mode cluster or sentinel",
        ),
        (
            ["--redis-mode", "sentinel", "--redis-url", "redis://s:26379"],
            "--redis-mode=sentinel needs --redis-sentinel-service",
        ),
        (
            ["--redis-sentinel-service", "p", "--redis-url", "redis://r:1"],
            "--redis-sentinel-service is for --redis-mode=sentinel",
        ),
        (
            ["--redis-mode", "cluster", "--redis-url", "redis://a:1/3"],
            "--redis-url: a cluster has database 0 only",
        ),
        (
            ["--redis-mode", "cluster", "--redis-url", "unix:///run/redis.sock"],
            "--redis-url must be redis:// or rediss://",
        ),
        (["--redis-mode", "cluster", "--redis-url", " , "], "--redis-url names no Redis"),
    ],
)
def test_redis_modes_are_checked(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings(["serve", "--origin", "http://o", *args], {})
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "--origin"),
        (["serve", "--origin", "ftp://x"], "http(s) URL"),
        (["serve", "--origin", "http://x", "--listen", "nope"], "HOST:PORT"),
        (["serve", "--origin", "http://x", "--listen", "h:99999"], "out of range"),
        (["serve", "--origin", "http://x", "--log-level", "loud"], "--log-level"),
        (["serve", "--origin", "http://x", "--upstream-read-timeout", "0"], "positive"),
        (["serve", "--origin", "http://x", "--fill-deadline", "0"], "--fill-deadline"),
        (["serve", "--origin", "http://x", "--fill-wait", "0"], "--fill-wait"),
        (["serve", "--origin", "http://x", "--upstream-max-connections", "-1"], "--upstream"),
        (["serve", "--origin", "http://x", "--cache-bytes", "lots"], "--cache-bytes"),
        (["serve", "--origin", "http://x", "--redis-url", "http://r"], "redis://"),
        (["serve", "--origin", "http://x", "--sse-max-seconds", "1"], "at least"),
        (["serve", "--origin", "http://x", "--tail-mode", "carrier-pigeon"], "--tail-mode"),
        (["serve", "--origin", "http://x", "--workers", "0"], "--workers"),
        (["serve", "--origin", "http://x", "--browser-max-age", "31536001"], "a year"),
        (["serve", "--origin", "http://x", "--browser-max-age", "-1"], "--browser-max-age"),
        (["serve", "--origin", "http://x", "--browser-max-age", "1.5"], "whole seconds"),
        (["serve", "--origin", "http://x", "--workers", "many"], "--workers"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_settings(argv, {})


def serve_help() -> str:
    return build_parser({})._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr,no-any-return]


def test_help_explains_every_flag() -> None:
    text = serve_help()
    for option in SERVE_OPTIONS:
        assert option.flag in text
        assert option.env in text
        assert "(default: " in text


def test_help_is_grouped_by_topic_and_every_flag_has_one() -> None:
    text = serve_help()
    flags = [flag for _, topic_flags in TOPICS for flag in topic_flags]
    assert sorted(flags) == sorted(option.flag for option in SERVE_OPTIONS)  # once each
    positions = [text.index(f"\n{topic}:\n") for topic, _ in TOPICS]
    assert positions == sorted(positions)
    assert "\nother:\n" not in text
    # Choices and units are shown, not a bare metavar.
    assert "--tail-mode {auto,sse,long-poll}" in text
    assert "--tail-freshness DURATION" in text
    assert "--cache-bytes SIZE" in text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1.0), ("0.25", 0.25), ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0),
     (" 1.5 S ", 1.5), ("0", 0.0)],
)  # fmt: skip
def test_durations_take_units(text: str, seconds: float) -> None:
    settings = parse_settings(["serve", "--origin", "http://o", "--tail-freshness", text], {})
    assert settings.tail_freshness_seconds == seconds


@pytest.mark.parametrize("text", ["", "s", "-1", "1d", "nan", "inf", "1 2"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--long-poll-timeout"):
        parse_settings(["serve", "--origin", "http://o", "--long-poll-timeout", text], {})


def test_an_unknown_flag_gets_serves_usage() -> None:
    result = run_edge("--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: edge serve ")
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_an_abbreviated_flag_is_refused_never_taken_for_another() -> None:
    result = run_edge("--tail-freshnes", "2s")
    assert result.returncode == 2
    assert "unrecognized arguments: --tail-freshnes 2s" in result.stderr


def test_new_defaults() -> None:
    settings = parse_settings(["serve", "--origin", "http://o"], {})
    assert settings.header_timeout_seconds == 10
    assert settings.keepalive_timeout_seconds == 60
    assert settings.body_timeout_seconds == 20
    assert settings.max_connections == 0  # derived from the open-file limit at start-up
    assert settings.max_viewers == 0  # what the connections leave after the short reserve
    assert settings.upstream_max_connections == 0  # an eighth of the open-file limit
    assert settings.origin_health_path is None
    assert settings.purge_token is None
    assert settings.workers == len(os.sched_getaffinity(0))  # auto: the CPUs we may use
    assert parse_settings(["serve", "--origin", "http://o", "--workers", "1"], {}).workers == 1


def test_every_setting_has_exactly_one_flag() -> None:
    assert set(FLAG_OF_SETTING) == {field.name for field in fields(Settings)}
    assert len(set(FLAG_OF_SETTING.values())) == len(SERVE_OPTIONS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sse-max-seconds", "1"], "--sse-max-seconds must be 0 (never) or at least 5"),
        (["--header-timeout", "0"], "--header-timeout must be positive"),
        (["--body-timeout", "0"], "--body-timeout must be positive"),
        (["--keepalive-timeout", "-1"], "--keepalive-timeout must be positive"),
        (["--max-connections", "-1"], "--max-connections='-1': must be >= 0"),
        (["--origin-health-path", "healthz"], "--origin-health-path must start with /"),
        (["--max-segment-bytes", "1GiB"], "--max-segment-bytes must not exceed --cache-bytes"),
        (["--redis-ttl", "0"], "--redis-ttl must be positive"),
        (["--tail-freshness", "-1"], "--tail-freshness must be >= 0"),
        (["--tail-linger", "-1"], "--tail-linger must be >= 0"),
        (["--upstream-connect-timeout", "0"], "--upstream-connect-timeout must be positive"),
        (["--long-poll-timeout", "0"], "--long-poll-timeout must be positive"),
        (["--max-viewers", "-1"], "--max-viewers='-1': must be >= 0"),
        (["--max-viewers", "many"], "--max-viewers='many': a whole number"),
        (["--workers", "two"], "--workers='two': a whole number of workers, or auto"),
        (["--workers", "0"], "--workers='0': must be at least 1, or auto"),
        (["--redis-url", "redis://r:port"], "--redis-url has an invalid port"),
        (["--purge-token", "caf\u00e9"], "--admin-token must be printable ASCII"),
    ],
)
def test_validation_messages_name_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings(["serve", "--origin", "http://x", *args], {})
    assert str(raised.value) == message or str(raised.value).startswith(message)
    assert "_seconds" not in str(raised.value)


@pytest.mark.parametrize("origin", ["http://host:4437/v1", "http://host/v1/stream/"])
def test_an_origin_with_a_path_is_refused(origin: str) -> None:
    with pytest.raises(ConfigError, match=r"^--origin must not carry a path.*verbatim"):
        parse_settings(["serve", "--origin", origin], {})
    assert parse_settings(["serve", "--origin", "http://host:4437/"], {}).origin_base == (
        "http://host:4437"
    )


def test_the_admin_token_is_never_shown() -> None:
    settings = parse_settings(["serve", "--origin", "http://x", "--admin-token", "s3cret"], {})
    assert "s3cret" not in repr(settings)
    with pytest.raises(ConfigError) as raised:
        parse_settings(["serve", "--origin", "http://x", "--admin-token", "s3cr\u00e9t"], {})
    assert "s3cr" not in str(raised.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("edge.internal", False),
    ],
)
def test_admin_on_loopback(host: str, loopback: bool) -> None:
    settings = Settings(
        origin="http://o",
        listen=Address(host="127.0.0.1", port=1),
        admin_listen=Address(host=host, port=2),
    )
    assert settings.admin_on_loopback is loopback


def test_purge_access() -> None:
    assert purge_refusal(token=None, admin_on_loopback=True, authorization=None) is None
    refused = purge_refusal(token=None, admin_on_loopback=False, authorization="Bearer x")
    assert refused is not None
    assert refused.status == 403
    assert "--admin-token" in refused.reason
    for authorization in (None, "Bearer wrong", "Basic s3cret", "s3cret", "Bearer "):
        refused = purge_refusal(token="s3cret", admin_on_loopback=True, authorization=authorization)
        assert refused is not None
        assert refused.status == 401
    for authorization in ("Bearer s3cret", "bearer s3cret"):
        assert (
            purge_refusal(token="s3cret", admin_on_loopback=False, authorization=authorization)
            is None
        )


def run_edge(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "edge", "serve", "--origin", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("flag", "other"),
    [("--listen", "--admin-listen"), ("--admin-listen", "--listen")],
)
def test_a_port_in_use_is_one_line_and_exit_2(held_port: int, flag: str, other: str) -> None:
    result = run_edge(flag, f"127.0.0.1:{held_port}", other, "127.0.0.1:0")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"edge: error: {flag} 127.0.0.1:{held_port}: address already in use\n"


def test_an_unresolvable_listen_host_is_one_line_and_exit_2() -> None:
    result = run_edge("--listen", "no-such-host.invalid:0", "--admin-listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert result.stderr == (
        "edge: error: --listen no-such-host.invalid:0: cannot resolve host 'no-such-host.invalid'\n"
    )


def test_a_bad_flag_is_one_line_and_exit_2() -> None:
    result = run_edge("--origin", "http://127.0.0.1:9/v1")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("edge: error: --origin must not carry a path")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--cdn-purge", "fastly=svc"], {}, "fastly= needs a Fastly API token"),
        (["--cdn-purge", "fastly=svc"], {}, "set EDGE_FASTLY_TOKEN (--fastly-token)"),
        (["--cdn-purge", "cloudflare=zone"], {}, "set EDGE_CLOUDFLARE_TOKEN"),
        # A token for another kind is not this kind's.
        (["--cdn-purge", "cloudflare=z"], {"EDGE_FASTLY_TOKEN": "t"}, "EDGE_CLOUDFLARE_TOKEN"),
        (["--cdn-purge", "varnish=ftp://v"], {}, "varnish= needs an http(s) URL"),
        (["--cdn-purge", "akamai=x"], {}, "--cdn-purge kinds are varnish, webhook"),
        (["--cdn-purge", "fastly=a/b"], {"EDGE_FASTLY_TOKEN": "t"}, "an id of letters"),
        (["--cdn-purge", "webhook=http://h/", "--cdn-purge", "webhook=http://h/"], {}, "twice"),
        (["--fastly-api-url", "api.fastly.com"], {}, "--fastly-api-url must be an http(s) URL"),
    ],
)
def test_a_cdn_target_without_what_it_needs_is_refused_at_start_up(
    args: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(["serve", "--origin", "http://x", *args], env)


def test_the_cdn_tokens_come_from_the_environment_and_are_never_shown() -> None:
    env = {"EDGE_FASTLY_TOKEN": "fastly-s3cret", "EDGE_CLOUDFLARE_TOKEN": "cf-s3cret"}
    argv = ["serve", "--origin", "http://x", "--cdn-purge", "fastly=svc", "--cdn-purge",
            "cloudflare=zone"]  # fmt: skip
    settings = parse_settings(argv, env)
    assert (settings.fastly_token, settings.cloudflare_token) == ("fastly-s3cret", "cf-s3cret")
    assert "s3cret" not in repr(settings)
    with pytest.raises(ConfigError) as raised:
        parse_settings([*argv, "--fastly-token", "s3cr\u00e9t"], env)
    assert "s3cr" not in str(raised.value)
    assert str(raised.value) == "--fastly-token must be printable ASCII"


def test_the_configuration_reference_names_every_flag_and_variable() -> None:
    reference = (REPO / "docs" / "configuration.md").read_text()
    for option in SERVE_OPTIONS:
        assert f"`{option.flag}`" in reference, option.flag
        assert f"`{option.env}`" in reference, option.env


def test_resume_routes_hold_their_paths_and_never_the_answers_streams() -> None:
    route = ResumeRoute(path="/mcp", url="http://agent:8000/mcp")
    assert route.holds("/mcp")
    assert route.holds("/mcp/tools")
    assert not route.holds("/mcpx")
    assert route.upstream("/mcp", "") == "http://agent:8000/mcp"
    assert route.upstream("/mcp/sub", "a=1") == "http://agent:8000/mcp/sub?a=1"
    argv = ["serve", "--origin", "http://o", "--resume-route", "/=http://agent/"]
    with pytest.raises(ConfigError, match="must not hold"):
        parse_settings(argv, {})
    with pytest.raises(ConfigError, match="PATH=URL"):
        parse_settings(["serve", "--origin", "http://o", "--resume-route", "/mcp"], {})
    with pytest.raises(ConfigError, match="http"):
        parse_settings(["serve", "--origin", "http://o", "--resume-route", "/mcp=ftp://x"], {})
