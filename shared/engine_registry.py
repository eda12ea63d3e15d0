"""Where engines announce themselves in Redis: the key names and the record, for both sides.

    {prefix}:engines              set     the announced addresses (an index; may hold stale ones)
    {prefix}:engine:{address}     string  JSON EngineRecord, with a TTL the engine renews

An engine (engine/serving/announce.py) renews its key every `ttl / 3` seconds
and deletes it when it stops; a gateway (gateway/replicas/discovery.py) reads
the index, then the records: a member without a record has expired and is
dropped from the index. Only the format lives here; no Redis client, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class EngineRecord:
    address: str
    """ZeroMQ address gateways connect to (tcp://HOST:PORT)."""
    model: str
    num_blocks: int
    """Capacity: KV blocks in the device pool."""
    max_model_len: int
    pid: int
    host: str
    adapters: list[dict[str, str]] = field(default_factory=list)
    """LoRA adapters served on `model`: [{"name", "parent"}] (vLLM's /v1/models shape); absent: none."""


def index_key(prefix: str) -> str:
    return f"{prefix}:engines"


def record_key(prefix: str, address: str) -> str:
    return f"{prefix}:engine:{address}"


def encode_record(record: EngineRecord) -> str:
    return json.dumps(asdict(record), sort_keys=True)


def decode_record(raw: str | bytes) -> EngineRecord | None:
    """None for anything that is not a record (a foreign or older writer): it is ignored."""
    try:
        data = json.loads(raw)
        required = [k for k in EngineRecord.__dataclass_fields__ if k != "adapters"]
        adapters = data.get("adapters", [])
        if not isinstance(adapters, list):
            return None
        return EngineRecord(**{k: data[k] for k in required}, adapters=adapters)
    except (ValueError, TypeError, KeyError):
        return None
