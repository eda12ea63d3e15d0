"""Engines announced in Redis (the engine's real Announcer) are followed by the gateway without a
restart: a new one joins, a withdrawn one leaves, an expired one is dropped from the index."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from engine.serving.announce import Announcer, engine_record
from gateway.replicas.discovery import Discovery
from gateway.replicas.replica_set import ReplicaSet
from shared.engine_registry import EngineRecord, encode_record, index_key, record_key
from tests.engine.serving.fake_core import INFO
from tests.gateway.replicas.test_replica_set import Engine, config, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def prefix() -> str:
    return f"disc{os.urandom(4).hex()}"


async def test_announced_engines_join_and_withdrawn_ones_leave(redis_url: str, redis: aioredis.Redis) -> None:
    p = prefix()
    a, b = Engine(), Engine()
    announce_a = Announcer(redis_url, p, engine_record(a.address, INFO), ttl_s=3)
    announce_a.start()
    replicas = ReplicaSet(config(), Discovery(redis, p))
    await replicas.start(timeout_s=5)
    assert [r.address for r in replicas.live()] == [a.address]
    announce_b = Announcer(redis_url, p, engine_record(b.address, INFO), ttl_s=3)
    announce_b.start()
    await until(lambda: len(replicas.live()) == 2, 5)
    await asyncio.to_thread(announce_a.stop)
    await until(lambda: [r.address for r in replicas.live()] == [b.address], 5)
    assert replicas.counters.evictions["withdrawn"] == 1
    assert await redis.smembers(index_key(p)) == {b.address.encode()}
    await asyncio.to_thread(announce_b.stop)
    await replicas.close()
    await a.stop()
    await b.stop()


async def test_an_expired_announcement_is_dropped(redis: aioredis.Redis) -> None:
    p = prefix()
    record = EngineRecord("tcp://127.0.0.1:9", "fake", 64, 64, 1, "h")
    await redis.set(record_key(p, record.address), encode_record(record), px=200)
    await redis.sadd(index_key(p), record.address, "tcp://gone:1")
    await redis.sadd(index_key(p), "not-a-record")
    await redis.set(record_key(p, "not-a-record"), "{garbage")
    discovery = Discovery(redis, p)
    assert await discovery.live() == {record.address: record}
    await asyncio.sleep(0.3)
    assert await discovery.live() == {}
    assert await redis.smembers(index_key(p)) == {b"not-a-record"}  # unreadable but unexpired: kept, ignored


async def test_a_redis_outage_keeps_the_last_view() -> None:
    a = Engine()
    broken = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    replicas = ReplicaSet(config(a.address), Discovery(broken, prefix()))
    await replicas.start(timeout_s=5)
    await replicas.refresh()
    assert [r.address for r in replicas.live()] == [a.address]
    await replicas.close()
    await broken.aclose()
    await a.stop()


def test_records_carry_adapters_and_older_records_still_decode() -> None:
    from shared.engine_registry import decode_record

    with_adapters = EngineRecord("tcp://h:1", "smollm2", 64, 512, 1, "h", [{"name": "sql", "parent": "smollm2"}])
    assert decode_record(encode_record(with_adapters)) == with_adapters
    older = '{"address": "tcp://h:1", "host": "h", "max_model_len": 512, "model": "smollm2", "num_blocks": 64, "pid": 1}'
    assert decode_record(older) == EngineRecord("tcp://h:1", "smollm2", 64, 512, 1, "h")
