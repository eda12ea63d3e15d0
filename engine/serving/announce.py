"""The engine's whole use of Redis: announce this engine to gateways, renew it, withdraw it.

A daemon thread writes the engine's record (shared/engine_registry.py) with a
TTL and renews it every `ttl / 3` seconds, so an engine that dies without a
word vanishes from the registry within `ttl`; `stop()` deletes it at once on a
clean shutdown. A Redis outage only logs: the engine goes on serving the
gateways already connected. The thread cannot tell a stalled busy loop from a
working one; gateways find that out themselves (their stats probe gets no answer).
It knows nothing about the core, requests or ZeroMQ.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator

import redis

from shared.engine_registry import EngineRecord, encode_record, index_key, record_key
from shared.model_info import ModelInfo

log = logging.getLogger("pageserve.engine")


def engine_record(address: str, info: ModelInfo) -> EngineRecord:
    return EngineRecord(address=address, model=info.model_name, num_blocks=info.num_blocks,
                        max_model_len=info.max_model_len, pid=os.getpid(), host=socket.gethostname(),
                        adapters=[{"name": a.name, "parent": a.parent} for a in info.adapters])


class Announcer:
    def __init__(self, redis_url: str, prefix: str, record: EngineRecord, ttl_s: float = 6.0) -> None:
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._prefix, self._record, self._ttl_s = prefix, record, ttl_s
        self._stopped = threading.Event()
        self._kick = threading.Event()
        """Set to renew at once (stop, or new model facts)."""
        self._thread = threading.Thread(target=self._run, name="engine-announce", daemon=True)

    def start(self) -> None:
        self._announce()  # at once: gateways may connect before the first renewal
        self._thread.start()
        log.info("announced %s in Redis (ttl %g s)", self._record.address, self._ttl_s)

    def update(self, info: ModelInfo) -> None:
        """The model facts changed (an adapter loaded or unloaded): re-announced now by the thread, not at
        the next renewal; the caller (the step loop) never waits on Redis."""
        self._record = engine_record(self._record.address, info)
        self._kick.set()

    def _run(self) -> None:
        while True:
            self._kick.wait(self._ttl_s / 3)
            self._kick.clear()
            if self._stopped.is_set():
                return
            self._announce()

    def _announce(self) -> None:
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(record_key(self._prefix, self._record.address), encode_record(self._record),
                         px=int(self._ttl_s * 1000))
                pipe.sadd(index_key(self._prefix), self._record.address)
                pipe.execute()
        except redis.RedisError as e:
            log.warning("could not renew the engine's announcement in Redis: %s", e)

    def stop(self) -> None:
        """Withdraw the announcement (gateways stop routing here at their next look)."""
        self._stopped.set()
        self._kick.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(record_key(self._prefix, self._record.address))
                pipe.srem(index_key(self._prefix), self._record.address)
                pipe.execute()
        except redis.RedisError as e:
            log.warning("could not withdraw the engine's announcement (it expires by itself): %s", e)
        self._redis.close()


def add_announce_args(p: argparse.ArgumentParser) -> None:
    """`pageserve engine`'s flags for announcing itself."""
    p.add_argument("--redis-url", default=os.environ.get("PAGESERVE_ENGINE_REDIS_URL"),
                   help="announce this engine to gateways in this Redis (env PAGESERVE_ENGINE_REDIS_URL)")
    p.add_argument("--redis-prefix", default="ps", help="namespace of the announcement's keys")
    p.add_argument("--advertise", default=None, metavar="ADDRESS",
                   help="address announced to gateways (default: the bound --listen address)")
    p.add_argument("--announce-ttl", type=float, default=6.0,
                   help="seconds an announcement outlives its last renewal (a dead engine leaves within it)")


@contextlib.contextmanager
def announced(args: argparse.Namespace, bound_address: str, info: ModelInfo) -> Iterator[Announcer | None]:
    """Announced while the block runs, when `args.redis_url` is set; withdrawn when it ends."""
    if args.redis_url is None:
        yield None
        return
    announcer = Announcer(args.redis_url, args.redis_prefix, engine_record(args.advertise or bound_address, info),
                          ttl_s=args.announce_ttl)
    announcer.start()
    try:
        yield announcer
    finally:
        announcer.stop()
