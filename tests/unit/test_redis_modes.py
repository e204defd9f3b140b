"""The rules of ``--redis-mode`` that need no Redis: every key of a stream is in one cluster slot,
and when a purge's generation counts as durable (``edge.store.redis_modes``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from edge.config import RedisTarget
from edge.log.stream_log import LogKey
from edge.store.redis_modes import (
    ClusterLink,
    Durability,
    RedisLink,
    SentinelLink,
    StandaloneLink,
    connect,
    promotable_replicas,
)
from edge.store.shared_codec import closed_key, generation_key, index_key, segment_key


@given(stream=st.text(min_size=1), scope=st.text(), starts=st.lists(st.text(), max_size=5))
def test_every_key_of_a_stream_is_in_one_slot(stream: str, scope: str, starts: list[str]) -> None:
    """What the shared tier names in one command (MGET of generation and value, EXISTS, DEL of
    the index and every value, the write pipeline) is one slot, whatever the path, scope or
    offsets hold (braces included): one node of a cluster, one round trip."""
    key = LogKey(stream=stream, scope=scope)
    names = [generation_key(stream), index_key(stream), closed_key(key)]
    names += [segment_key(key, start) for start in starts]
    assert len({key_slot(name.encode()) for name in names}) == 1


def test_streams_spread_over_slots() -> None:
    slots = {key_slot(generation_key(f"/v1/stream/run-{i}").encode()) for i in range(200)}
    assert len(slots) > 150  # the tag is a digest of the path, not a constant


# CLUSTER NODES as Redis writes it (ids shortened): id addr flags master-id ping pong epoch link
NODES = "\n".join(
    [
        "r4 127.0.0.1:30004@31004 slave p1 0 1426238317239 4 connected",
        "p2 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922",
        "p3 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383",
        "r5 127.0.0.1:30005@31005 slave,fail p2 0 1426238316232 5 connected",
        "r6 127.0.0.1:30006@31006 slave,fail? p2 0 1426238317741 6 connected",
        "p1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460",
    ]
)


def test_promotable_replicas_are_the_answering_primarys_not_confirmed_failed() -> None:
    assert promotable_replicas(NODES) == 1
    assert promotable_replicas(NODES.encode()) == 1
    second = NODES.replace("myself,master", "master").replace(
        "127.0.0.1:30002@31002 master", "127.0.0.1:30002@31002 myself,master"
    )
    assert promotable_replicas(second) == 1  # its fail? replica may still be promoted
    alone = NODES.replace("myself,master", "master").replace(
        "127.0.0.1:30003@31003 master", "127.0.0.1:30003@31003 myself,master"
    )
    assert promotable_replicas(alone) == 0
    assert promotable_replicas(None) is None
    assert promotable_replicas("ERR not a cluster") is None


class _Judge(RedisLink):
    def __init__(self) -> None:
        super().__init__(commands=None, timeout_seconds=0.25)  # type: ignore[arg-type]


CONNECTED = [b"master", 10, [[b"127.0.0.1", b"7001", b"10"]]]
NONE_CONNECTED = [b"master", 10, []]


@pytest.mark.parametrize(
    ("acks", "role", "standby", "verdict"),
    [
        (1, CONNECTED, 1, Durability.ON_A_REPLICA),
        (2, CONNECTED, None, Durability.ON_A_REPLICA),
        (0, CONNECTED, 1, Durability.NOT_YET),  # connected but slow: wait for it
        (0, NONE_CONNECTED, 1, Durability.NOT_YET),  # disconnected, could be promoted
        (0, NONE_CONNECTED, None, Durability.NOT_YET),  # the topology could not say
        (0, CONNECTED, 0, Durability.NOT_YET),  # connected though the topology says failed
        (0, NONE_CONNECTED, 0, Durability.ONLY_COPY),  # nobody to copy it to
        (0, "ERR", 0, Durability.NOT_YET),
    ],
)
def test_a_generation_is_durable_on_a_replica_or_when_none_could_take_over(
    acks: object, role: object, standby: int | None, verdict: Durability
) -> None:
    assert _Judge()._judge(acks, role, standby) is verdict


async def test_the_mode_decides_the_client() -> None:
    links = [
        connect(RedisTarget(mode="standalone", urls=("redis://127.0.0.1:1/0",)), timeout_seconds=1),
        connect(
            RedisTarget(mode="cluster", urls=("redis://127.0.0.1:1", "redis://127.0.0.1:2")),
            timeout_seconds=1,
        ),
        connect(
            RedisTarget(mode="sentinel", urls=("redis://127.0.0.1:1",), sentinel_service="p"),
            timeout_seconds=1,
        ),
    ]
    assert [type(link) for link in links] == [StandaloneLink, ClusterLink, SentinelLink]
    for link in links:
        await link.aclose()
