"""The device block pool: reference counts, free blocks, and the prefix cache's index.

Owns the physical blocks' bookkeeping only; it knows nothing of requests
(engine/scheduling/block_manager.py maps requests to blocks) and nothing of tensors.

A block is in exactly one of three places:

    held         ref_cnt > 0, by one or more block tables (shared by prefix hits and forks)
    free         ref_cnt == 0, no hash: handed out first, in any order
    evictable    ref_cnt == 0, hashed: still findable in the prefix cache, kept in a
                 doubly linked LRU list; allocation evicts from its head when `free` is empty

    evictable:  HEAD <-> b7 <-> b2 <-> b9 <-> TAIL      (b7 least recently freed)

Every move between the three is O(1): the list links live on the blocks themselves
(vLLM V1's FreeKVCacheBlockQueue), so a prefix hit unlinks a block from the middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The hash is defined in shared/: the gateway's replica router hashes prompts exactly the same way.
from shared.block_hash import BlockHash, hash_block

__all__ = ["BlockHash", "BlockPool", "EvictableQueue", "KVBlock", "hash_block"]


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] | None = None
    """The tokens the hash names: a hit re-checks them, so a hash collision cannot leak KV."""
    prev: KVBlock | None = None
    next: KVBlock | None = None


class EvictableQueue:
    """Doubly linked LRU list of evictable blocks, O(1) append, popleft and remove."""

    def __init__(self) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None and block.prev is None and block.next is None
        last.next, block.prev, block.next, self._tail.prev = block, last, self._tail, block
        self._len += 1

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None, f"block {block.block_id} is not queued"
        prev.next, nxt.prev = nxt, prev
        block.prev = block.next = None
        self._len -= 1

    def popleft(self) -> KVBlock:
        first = self._head.next
        assert first is not None and first is not self._tail, "evictable queue is empty"
        self.remove(first)
        return first

    def block_ids(self) -> list[int]:
        """Head (next to evict) to tail; for tests and invariant checks."""
        out, node = [], self._head.next
        while node is not None and node is not self._tail:
            out.append(node.block_id)
            node = node.next
        return out


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the device pool needs at least one block")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Reversed so that pop() hands out block 0 first: easier to read in tests.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable = EvictableQueue()
        self._cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def allocate(self) -> KVBlock:
        """A block with ref_cnt 1; evicts the least recently freed cached block if needed."""
        if self._free:
            block = self.blocks[self._free.pop()]
        else:
            block = self._evictable.popleft()
            self._uncache(block)
        assert block.ref_cnt == 0
        block.ref_cnt = 1
        return block

    def take(self, block: KVBlock) -> None:
        """One more holder of `block` (a prefix hit or a fork)."""
        if block.ref_cnt == 0:
            assert block.block_hash is not None, "only cached blocks are taken while free"
            self._evictable.remove(block)
        block.ref_cnt += 1

    def release(self, block: KVBlock) -> None:
        assert block.ref_cnt > 0, f"double free of block {block.block_id}"
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            if block.block_hash is not None:
                self._evictable.append(block)
            else:
                self._free.append(block.block_id)

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int]) -> KVBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def register(self, block: KVBlock, block_hash: BlockHash, token_ids: Sequence[int]) -> bool:
        """Make a held, fully computed block findable; False if that prefix is cached already."""
        assert block.ref_cnt > 0 and block.block_hash is None
        if block_hash in self._cached:
            return False
        block.block_hash, block.token_ids = block_hash, tuple(token_ids)
        self._cached[block_hash] = block
        return True

    def _uncache(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        del self._cached[block.block_hash]
        block.block_hash = block.token_ids = None

    def forget_free_cached(self) -> None:
        """Drop every cached block nobody holds from the prefix cache (their KV is untrusted)."""
        while len(self._evictable):
            block = self._evictable.popleft()
            self._uncache(block)
            self._free.append(block.block_id)

    def evictable_ids(self) -> list[int]:
        return self._evictable.block_ids()

    def check(self, expected_refs: dict[int, int]) -> None:
        """Assert the pool agrees with the block tables' reference counts."""
        free, evictable = set(self._free), self._evictable.block_ids()
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert len(evictable) == len(set(evictable)) == len(self._evictable)
        assert not free & set(evictable), "a block is both free and evictable"
        held = [b.block_id for b in self.blocks if b.ref_cnt > 0]
        assert len(free) + len(evictable) + len(held) == self.num_blocks, "free + used != total"
        for block in self.blocks:
            assert block.ref_cnt == expected_refs.get(block.block_id, 0), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} != "
                f"{expected_refs.get(block.block_id, 0)} table entries"
            )
            if block.ref_cnt == 0:
                in_evictable = block.block_hash is not None
                assert (block.block_id in evictable) == in_evictable
                assert (block.block_id in free) != in_evictable
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash
        assert sum(b.block_hash is not None for b in self.blocks) == len(self._cached)
