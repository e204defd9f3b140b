"""The start-up summary: a few lines, one per topic, never a secret."""

from __future__ import annotations

from dataclasses import replace

from edge.config import Address, ResumeRoute, Settings
from edge.summary import redacted_url, startup_lines

BASE = Settings(
    origin="http://127.0.0.1:4437",
    listen=Address.parse("127.0.0.1:8080"),
    admin_listen=Address.parse("127.0.0.1:9090"),
)


def lines(settings: Settings, limits: str | None = None) -> list[str]:
    return startup_lines(
        settings, listen="http://127.0.0.1:8080", admin="http://127.0.0.1:9090", version="9.9",
        limits=limits,
    )  # fmt: skip


def test_one_line_per_topic_in_order() -> None:
    text = lines(BASE, limits="at most 10 client connections")
    assert text[0] == (
        "edge 9.9 listening on http://127.0.0.1:8080 (admin, metrics and probes on "
        "http://127.0.0.1:9090)"
    )
    topics = [line.split()[0] for line in text[1:]]
    assert topics == ["origin", "workers", "cache", "redis", "auth", "limits"]
    assert "redis    off" in "\n".join(text)
    assert len(lines(BASE)) == len(text) - 1  # no limits line when it is not known


def test_workers_say_what_they_mean_for_caching() -> None:
    text = "\n".join(lines(replace(BASE, workers=4)))
    assert "4 processes" in text
    assert "first read on each worker is a miss" in text
    assert "(64 MiB a worker)" in text


def test_no_secret_is_shown() -> None:
    settings = replace(
        BASE,
        redis_url="redis://user:hunter2@redis:6379/0",
        purge_token="t0ken-secret",
        auth_mode="forward",
        auth_url="http://auth:9000/check",
        origin_headers=(("Authorization", "Bearer origin-secret"),),
        cdn_purge=(("fastly", "svc"),),
        fastly_token="fastly-secret",
    )
    text = "\n".join(lines(settings))
    for secret in ("hunter2", "t0ken-secret", "origin-secret", "fastly-secret"):
        assert secret not in text
    assert "redis://user:***@redis:6379/0" in text
    assert "forward: each verdict asked of http://auth:9000/check" in text
    assert "cdn      purges sent to: fastly; closed ranges kept a year there, 60 s by" in text


def test_the_redis_line_names_the_mode_and_shows_no_password() -> None:
    cluster = replace(
        BASE,
        redis_url="redis://:pw1@a:7000,redis://:pw2@b:7000",
        redis_mode="cluster",
    )
    text = "\n".join(lines(cluster))
    assert "redis    a cluster, seeds redis://:***@a:7000,redis://:***@b:7000" in text
    assert "pw1" not in text
    assert "pw2" not in text
    sentinel = replace(
        BASE,
        redis_url="redis://s1:26379,redis://s2:26379",
        redis_mode="sentinel",
        redis_sentinel_service="edge-primary",
    )
    text = "\n".join(lines(sentinel))
    assert "the primary 'edge-primary' of the sentinels redis://s1:26379,redis://s2:26379" in text


def test_urls_without_a_password_are_unchanged() -> None:
    assert redacted_url("redis://redis:6379/0") == "redis://redis:6379/0"
    assert redacted_url("rediss://:pw@h/1") == "rediss://:***@h/1"


def test_resume_routes_are_named_without_their_passwords() -> None:
    settings = replace(
        BASE,
        resume_routes=(ResumeRoute(path="/mcp", url="http://agent:s3cret@agent:8000/mcp"),),
        resume_retention_seconds=120,
    )
    text = lines(settings, limits="at most 10 client connections")
    topics = [line.split()[0] for line in text[1:]]
    assert topics == ["origin", "workers", "cache", "redis", "auth", "resume", "limits"]
    joined = "\n".join(text)
    assert "s3cret" not in joined
    assert "resume   /mcp to http://agent:***@agent:8000/mcp; SSE answers kept" in joined
    assert "under /_edge/resume/ for 120 s" in joined
    assert "lease 30 s, at most 1000 at once, each up to 16384 KiB and 3600 s" in joined
