"""The purge keys: stable, header-safe, bounded, and distinct per stream and instance."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from edge.protocol.purge_keys import KEY_LENGTH, instance_key, purge_keys, stream_key

TOKEN = re.compile(r"^[a-z0-9-]+$")


@given(stream=st.text(max_size=4096), generation=st.text(max_size=64))
def test_keys_are_header_tokens_of_bounded_length(stream: str, generation: str) -> None:
    keys = purge_keys(stream, generation).keys
    assert keys[0] == stream_key(stream)
    for key in keys:
        assert TOKEN.match(key)
        assert len(key) <= KEY_LENGTH
    assert len(keys) == (2 if generation else 1)


@given(a=st.text(), b=st.text())
def test_distinct_streams_get_distinct_keys(a: str, b: str) -> None:
    assert (stream_key(a) == stream_key(b)) == (a == b)


def test_instance_keys_differ_by_generation_and_extend_the_stream_key() -> None:
    first, second = instance_key("/v1/stream/run", "g1"), instance_key("/v1/stream/run", "g2")
    assert first != second
    assert first.startswith(stream_key("/v1/stream/run") + "-")
    both = purge_keys("/v1/stream/run", "g1")
    assert both.surrogate_key == f"{stream_key('/v1/stream/run')} {first}"
    assert both.cache_tag == f"{stream_key('/v1/stream/run')},{first}"


def test_keys_are_the_same_in_every_process() -> None:
    # A fixed value: the digest must not depend on a per-process salt (hash()).
    assert (
        stream_key("/v1/stream/a")
        == "ds-" + __import__("hashlib").blake2b(b"/v1/stream/a", digest_size=12).hexdigest()
    )
