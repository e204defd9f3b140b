"""The purge calls of each kind (edge.cdn.api), exactly as their receivers document them, and
what their answers mean: no sockets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.cdn.api import (
    CLOUDFLARE_TAGS_PER_CALL,
    FASTLY_KEYS_PER_CALL,
    MAX_KEY_HEADER_CHARS,
    MAX_RETRY_AFTER_SECONDS,
    VARNISH_KEYS_PER_CALL,
    PurgeCall,
    Purged,
    Target,
    call_for,
    judge,
    retry_after,
    targets,
)
from edge.config import Address, Settings
from edge.protocol.purge_keys import stream_key

VARNISH = Target(kind="varnish", target="http://127.0.0.1:6081")
WEBHOOK = Target(kind="webhook", target="https://hooks.example/cdn?team=a")
FASTLY = Target(
    kind="fastly", target="SU1Z0isxPaozGVKXdv0eY", api_url="https://api.fastly.com",
    token="fastly-secret-token",
)  # fmt: skip
CLOUDFLARE = Target(
    kind="cloudflare", target="023e105f4ecef8ad9ca31a8372d0c353",
    api_url="https://api.cloudflare.com/client/v4/", token="cloudflare-secret-token",
)  # fmt: skip
ALL = (VARNISH, WEBHOOK, FASTLY, CLOUDFLARE)


def _purged(*streams: str) -> list[Purged]:
    return [Purged(stream=s, reason="deleted") for s in streams]


def _header(call: PurgeCall, name: str) -> str | None:
    found = [v for n, v in call.headers if n.lower() == name.lower()]
    assert len(found) <= 1
    return found[0] if found else None


def keys_of(target: Target, call: PurgeCall) -> list[str]:
    """The keys a call purges, read back as its receiver reads them."""
    if target.kind == "varnish":
        return (_header(call, "xkey-purge") or "").split(" ")
    if target.kind == "fastly":
        return (_header(call, "Surrogate-Key") or "").split(" ")
    body = json.loads(call.body)
    return list(body["tags"] if target.kind == "cloudflare" else body["keys"])


def test_varnish_is_a_purge_by_xkey_to_the_urls_path() -> None:
    call = call_for(VARNISH, _purged("/v1/stream/a", "/v1/stream/b"))
    assert (call.method, call.url, call.body) == ("PURGE", "http://127.0.0.1:6081/", b"")
    assert call.headers == (
        ("xkey-purge", f"{stream_key('/v1/stream/a')} {stream_key('/v1/stream/b')}"),
    )
    with_path = Target(kind="varnish", target="http://varnish.internal:80/purge?x=1")
    assert call_for(with_path, _purged("/s")).url == "http://varnish.internal:80/purge"


def test_a_webhook_is_a_json_post_of_one_streams_keys_and_why() -> None:
    call = call_for(WEBHOOK, [Purged(stream="/v1/stream/a", reason="created")])
    assert (call.method, call.url) == ("POST", "https://hooks.example/cdn?team=a")
    assert call.headers == (("Content-Type", "application/json"),)
    assert json.loads(call.body) == {
        "keys": [stream_key("/v1/stream/a")],
        "stream": "/v1/stream/a",
        "reason": "created",
    }
    with pytest.raises(ValueError, match="1 to 1"):
        call_for(WEBHOOK, _purged("/a", "/b"))


def test_fastly_is_its_bulk_purge_by_surrogate_key_and_hard() -> None:
    call = call_for(FASTLY, _purged("/v1/stream/a", "/v1/stream/b"))
    assert call.method == "POST"
    assert call.url == "https://api.fastly.com/service/SU1Z0isxPaozGVKXdv0eY/purge"
    assert dict(call.headers) == {
        "Fastly-Key": "fastly-secret-token",
        "Surrogate-Key": f"{stream_key('/v1/stream/a')} {stream_key('/v1/stream/b')}",
        "Accept": "application/json",
    }
    assert _header(call, "Fastly-Soft-Purge") is None  # a soft purge leaves them servable
    assert call.body == b""


def test_cloudflare_is_its_purge_cache_by_tags() -> None:
    call = call_for(CLOUDFLARE, _purged("/v1/stream/a"))
    assert call.method == "POST"
    assert call.url == (
        "https://api.cloudflare.com/client/v4/zones/023e105f4ecef8ad9ca31a8372d0c353/purge_cache"
    )
    assert dict(call.headers) == {
        "Authorization": "Bearer cloudflare-secret-token",
        "Content-Type": "application/json",
    }
    assert json.loads(call.body) == {"tags": [stream_key("/v1/stream/a")]}


def test_the_limits_per_call_are_the_documented_ones() -> None:
    assert FASTLY.streams_per_call == FASTLY_KEYS_PER_CALL == 256
    assert CLOUDFLARE.streams_per_call == CLOUDFLARE_TAGS_PER_CALL == 30
    assert VARNISH.streams_per_call == VARNISH_KEYS_PER_CALL
    assert WEBHOOK.streams_per_call == 1


@given(
    target=st.sampled_from(ALL),
    streams=st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=300, unique=True),
)
def test_every_call_carries_exactly_its_batchs_keys_within_the_kinds_limits(
    target: Target, streams: list[str]
) -> None:
    batch = _purged(*streams)
    if len(batch) > target.streams_per_call:
        with pytest.raises(ValueError, match="takes 1 to"):
            call_for(target, batch)
        batch = batch[: target.streams_per_call]
    call = call_for(target, batch)
    assert keys_of(target, call) == [stream_key(s) for s in streams[: len(batch)]]
    assert call.streams == tuple(p.stream for p in batch)
    for name, value in call.headers:
        assert len(value) <= MAX_KEY_HEADER_CHARS
        # A key is never the raw path: header-safe whatever the stream is called.
        assert value.isascii(), name
        assert value.isprintable(), name
    # The token only in its header: never in the URL, the body or a repr.
    if target.token:
        carrying = [n for n, v in call.headers if target.token in v]
        assert carrying == (["Fastly-Key"] if target.kind == "fastly" else ["Authorization"])
        assert target.token not in call.url
        assert target.token.encode() not in call.body
        assert target.token not in repr(call) + repr(target)
        assert target.token not in target.label


def test_a_call_never_repeats_a_stream_nor_goes_out_empty() -> None:
    for target in ALL:
        with pytest.raises(ValueError, match="takes 1 to"):
            call_for(target, [])
    with pytest.raises(ValueError, match="takes 1 to"):
        call_for(FASTLY, _purged("/a", "/a"))


def test_targets_follow_the_settings_with_their_tokens_and_api_urls() -> None:
    settings = Settings(
        origin="http://127.0.0.1:1", listen=Address(host="127.0.0.1", port=0),
        admin_listen=Address(host="127.0.0.1", port=0),
        cdn_purge=(("varnish", "http://v:6081/"), ("fastly", "svc"), ("cloudflare", "zone")),
        fastly_token="f", cloudflare_token="c", fastly_api_url="http://127.0.0.1:9/",
    )  # fmt: skip
    assert targets(settings) == (
        Target(kind="varnish", target="http://v:6081/"),
        Target(kind="fastly", target="svc", api_url="http://127.0.0.1:9/", token="f"),
        Target(
            kind="cloudflare", target="zone", api_url="https://api.cloudflare.com/client/v4",
            token="c",
        ),
    )  # fmt: skip
    # The overridden base is joined without a doubled slash.
    assert (
        call_for(targets(settings)[1], _purged("/s")).url == "http://127.0.0.1:9/service/svc/purge"
    )


def test_an_answer_is_done_when_2xx_and_cloudflare_does_not_deny_it() -> None:
    ok = b'{"success": true, "errors": [], "messages": [], "result": {"id": "x"}}'
    for target in ALL:
        assert judge(target, 200, (), ok).done
        assert judge(target, 204, (), b"").done
        assert not judge(target, None, (), b"").done
        for status in (301, 400, 401, 403, 404, 429, 500, 503):
            assert not judge(target, status, (), b"").done
    denied = b'{"success": false, "errors": [{"code": 1134, "message": "no"}]}'
    assert not judge(CLOUDFLARE, 200, (), denied).done
    assert judge(FASTLY, 200, (), denied).done  # Fastly answers a map of purge ids


def test_retry_after_is_honoured_in_seconds_and_capped() -> None:
    limited = judge(CLOUDFLARE, 429, (("Retry-After", "7"),), b"")
    assert (limited.done, limited.retry_after_seconds, limited.detail) == (False, 7.0, "429")
    assert retry_after((("retry-after", "100000"),)) == MAX_RETRY_AFTER_SECONDS
    assert retry_after((("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"),)) is None
    assert retry_after(()) is None
