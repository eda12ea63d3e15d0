"""The prefix cache's block hash: one definition for the engine's cache and the gateway's router.

A block's hash is sha256 of (parent block's hash, cache salt, the block's token
ids, and the LoRA adapter's name and load for an adapter's request), chained, so it names the whole prefix up to and including that block and
two tenants with different salts never share one. The engine's block manager
(engine/scheduling/block_manager.py) indexes cached KV blocks by it; the
gateway's replica router (gateway/replicas/policy.py) hashes a prompt's first
blocks the same way, so requests that would share cached blocks meet on the
same replica. Pure Python: no torch, no engine, no gateway.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes
"""sha256 of (parent hash, cache salt, token ids): chained, so it names the whole prefix."""


def hash_block(parent: BlockHash | None, salt: str, token_ids: Sequence[int], adapter: str = "") -> BlockHash:
    """`adapter`: the LoRA adapter's name and load ("name#load id", engine/request.py); "" for the base
    model, whose hashes are the same as before adapters existed."""
    h = hashlib.sha256(parent or b"\0" * 32)
    salt_bytes = salt.encode()
    h.update(len(salt_bytes).to_bytes(4, "little") + salt_bytes)
    h.update(array("q", token_ids).tobytes())
    if adapter:  # after the tokens: an adapter block's bytes are longer than any base block's of the same size
        adapter_bytes = adapter.encode()
        h.update(b"lora" + len(adapter_bytes).to_bytes(4, "little") + adapter_bytes)
    return h.digest()


def prefix_hash(token_ids: Sequence[int], salt: str, block_size: int, max_blocks: int) -> BlockHash | None:
    """The chained hash of the first `max_blocks` full blocks; None when not one block is full."""
    num_blocks = min(len(token_ids) // block_size, max_blocks)
    digest: BlockHash | None = None
    for i in range(num_blocks):
        digest = hash_block(digest, salt, token_ids[i * block_size : (i + 1) * block_size])
    return digest
