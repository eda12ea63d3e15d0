"""Block tables: which physical KV blocks each request holds, on the device or in the CPU pool.

Owns the mapping request -> blocks (it writes `Request.block_ids`), prefix-cache
lookups and registration, copy-on-write of shared blocks, forks for parallel
sampling, and swapping to and from the CPU pool. It does not decide who runs or
who is preempted (engine/scheduling/scheduler.py does) and never touches a tensor: it
returns (src, dst) block pairs that the model runner copies.

    request tokens   [t0 .. t15][t16 .. t31][t32 t33 t34]      block_size 16
    block table      [    7    ][    2     ][    9     ]       req.block_ids
    slot of p        block_ids[p // 16] * 16 + p % 16          (t33 -> slot 9*16 + 1)

A full block whose tokens are all computed gets a chained hash (engine/scheduling/block_pool.py)
and becomes findable by later requests with the same prefix and cache salt.
Swapped requests hold no device blocks; their CPU table lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Request
from engine.scheduling.block_pool import BlockHash, BlockPool, KVBlock, hash_block

BlockPairs = list[tuple[int, int]]


@dataclass(frozen=True)
class PrefixHit:
    """Cached blocks covering a request's first `num_tokens` tokens (not yet taken)."""

    blocks: list[KVBlock] = field(default_factory=list)
    num_tokens: int = 0


_NO_HIT = PrefixHit()


class BlockManager:
    def __init__(
        self, num_device_blocks: int, num_cpu_blocks: int, block_size: int, enable_prefix_caching: bool
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        if num_cpu_blocks < 0:
            raise ValueError("num_cpu_blocks must be non-negative")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.device = BlockPool(num_device_blocks)
        self.num_cpu_blocks = num_cpu_blocks
        self._cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self._tables: dict[str, list[KVBlock]] = {}
        self._cpu_tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}
        self._num_registered: dict[str, int] = {}
        self._copy_sources: set[int] = set()
        self._deferred: list[KVBlock] = []

    # -- sizes ---------------------------------------------------------------------------

    @property
    def num_free_device_blocks(self) -> int:
        return self.device.num_free

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_held(self, req: Request) -> int:
        return len(self._tables.get(req.request_id, ()))

    def num_reclaimable(self, req: Request) -> int:
        """Device blocks that would become free if the request let go (held by it alone)."""
        return sum(b.ref_cnt == 1 for b in self._tables.get(req.request_id, ()))

    def num_swapped_blocks(self, req: Request) -> int:
        return len(self._cpu_tables.get(req.request_id, ()))

    def num_new_blocks(self, req: Request, num_new_tokens: int, hit: PrefixHit | None = None) -> int:
        """Free blocks an `allocate(req, num_new_tokens, hit)` would consume (copies included)."""
        table = self._tables.get(req.request_id, ())
        start = req.num_computed_tokens + (hit.num_tokens if hit else 0)
        end = -(-(start + num_new_tokens) // self.block_size)
        needed = max(end - len(table) - (len(hit.blocks) if hit else 0), 0)
        for i in range(start // self.block_size, min(len(table), end)):  # at most the last block
            needed += self._must_copy(table[i])
        if hit:
            needed += sum(b.ref_cnt == 0 for b in hit.blocks)
        return needed

    # -- prefix cache --------------------------------------------------------------------

    def block_hashes(self, req: Request) -> list[BlockHash]:
        """Chained hashes of every full block of the request's known tokens (memoized)."""
        hashes = self._hashes.setdefault(req.request_id, [])
        bs, tokens = self.block_size, req.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[i - 1] if i else None
            hashes.append(hash_block(parent, req.cache_salt, tokens[i * bs : (i + 1) * bs], req.adapter_key))
        return hashes

    def find_prefix(self, req: Request) -> PrefixHit:
        """Longest cached prefix of a request that holds no blocks; never its last token,
        which must be computed to sample the next one."""
        if not self.enable_prefix_caching or req.sampling.prompt_logprobs is not None:
            # A cached prefix has no hidden states to take prompt logprobs from: such a request computes
            # its whole prompt (vLLM's rule); its blocks are still cached for the requests after it.
            return PrefixHit()
        assert not self._tables.get(req.request_id), "prefix lookup is for requests without blocks"
        bs, tokens, hashes = self.block_size, req.all_token_ids, self.block_hashes(req)
        hits: list[KVBlock] = []
        for i in range((req.num_tokens - 1) // bs):
            block = self.device.lookup(hashes[i], tokens[i * bs : (i + 1) * bs])
            if block is None:
                break
            hits.append(block)
        return PrefixHit(hits, len(hits) * bs)

    def cache_full_blocks(self, req: Request) -> None:
        """Register the blocks that the request's computed tokens fill (at schedule time: their
        KV is written by this step's forward, before any attention of the step reads it)."""
        if not self.enable_prefix_caching:
            return
        table, bs = self._tables.get(req.request_id, []), self.block_size
        num_full = min(req.num_computed_tokens // bs, len(table))
        start = self._num_registered.get(req.request_id, 0)
        if num_full <= start:
            return
        hashes, tokens = self.block_hashes(req), req.all_token_ids
        for i in range(start, num_full):
            block = table[i]
            if block.block_hash is None:
                self.device.register(block, hashes[i], tokens[i * bs : (i + 1) * bs])
            else:
                assert block.block_hash == hashes[i], f"block {block.block_id} holds another prefix"
        self._num_registered[req.request_id] = num_full

    # -- allocation ----------------------------------------------------------------------

    def allocate(
        self, req: Request, num_new_tokens: int, hit: PrefixHit | None = None, reserve: int = 0
    ) -> BlockPairs | None:
        """Grow the table so it covers num_computed + hit + num_new_tokens tokens.

        Takes the hit's blocks, appends fresh blocks, and copies any shared (or cached)
        block that the new tokens would write into. Returns the (src, dst) copies, or None
        (changing nothing) if fewer than the needed blocks plus `reserve` are free.
        """
        hit = hit or _NO_HIT
        if self.num_new_blocks(req, num_new_tokens, hit) + reserve > self.device.num_free:
            return None
        table = self._tables.setdefault(req.request_id, [])
        size_before = len(table)
        assert not (hit.blocks and table), "prefix hits only for a request without blocks"
        for block in hit.blocks:
            self.device.take(block)
            table.append(block)
        start = req.num_computed_tokens + hit.num_tokens
        end = self.blocks_for(start + num_new_tokens)
        copies: BlockPairs = []
        for i in range(start // self.block_size, min(len(table), end)):
            if self._must_copy(table[i]):
                new = self.device.allocate()
                copies.append((table[i].block_id, new.block_id))
                self._copy_sources.add(table[i].block_id)
                self._release(table[i])
                table[i] = new
        while len(table) < end:
            table.append(self.device.allocate())
        if copies or len(table) != size_before:  # most decodes change nothing
            req.block_ids = [b.block_id for b in table]
        return copies

    def _release(self, block: KVBlock) -> None:
        # A copy source whose last holder lets go stays held until end_step(), so no swap-in
        # of the same step lands on a block a copy still has to read, whatever the order
        # in which the runner applies the moves.
        if block.ref_cnt == 1 and block.block_id in self._copy_sources:
            self._deferred.append(block)
        else:
            self.device.release(block)

    def end_step(self) -> None:
        """The runner has applied this step's moves: release what they still needed."""
        for block in self._deferred:
            self.device.release(block)
        self._deferred = []
        self._copy_sources.clear()

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """Share the parent's blocks covering its first `num_tokens` tokens with the child."""
        assert not self._tables.get(child.request_id)
        shared = self._tables[parent.request_id][: self.blocks_for(num_tokens)]
        for block in shared:
            self.device.take(block)
        self._tables[child.request_id] = list(shared)
        child.block_ids = [b.block_id for b in shared]
        if child.cache_salt == parent.cache_salt and child.adapter_key == parent.adapter_key:
            n_prompt_blocks = child.num_prompt_tokens // self.block_size
            self._hashes[child.request_id] = list(self.block_hashes(parent)[:n_prompt_blocks])

    def free(self, req: Request, forget: bool = True) -> None:
        """Release every block of the request, device and CPU. Tail blocks are released first
        so that, among equally old cached blocks, a prefix's tail is evicted before its head.
        `forget=False` keeps the memoized hashes (a recompute will look them up again)."""
        for block in reversed(self._tables.pop(req.request_id, [])):
            self._release(block)
        self._cpu_free.extend(reversed(self._cpu_tables.pop(req.request_id, [])))
        self._num_registered.pop(req.request_id, None)
        if forget:
            self._hashes.pop(req.request_id, None)
        req.block_ids = []

    def _must_copy(self, block: KVBlock) -> bool:
        # A shared block, or a cached one that others may look up, is never written in place.
        return block.ref_cnt > 1 or block.block_hash is not None

    # -- swapping ------------------------------------------------------------------------

    def swap_out(self, req: Request) -> BlockPairs | None:
        """Move the request's device blocks to the CPU pool; None if the pool lacks room."""
        table = self._tables.get(req.request_id, [])
        if len(table) > len(self._cpu_free):
            return None
        cpu = [self._cpu_free.pop() for _ in table]
        pairs = [(b.block_id, c) for b, c in zip(table, cpu, strict=True)]
        for block in reversed(table):
            self._release(block)
        del self._tables[req.request_id]
        self._cpu_tables[req.request_id] = cpu
        self._num_registered.pop(req.request_id, None)
        req.block_ids = []
        return pairs

    def swap_in(self, req: Request, reserve: int = 0) -> BlockPairs | None:
        """Bring a swapped request's blocks back; None if fewer than its blocks + reserve are free."""
        cpu = self._cpu_tables.get(req.request_id)
        assert cpu is not None, f"{req.request_id} is not swapped out"
        if len(cpu) + reserve > self.device.num_free:
            return None
        table = [self.device.allocate() for _ in cpu]
        pairs = [(c, b.block_id) for c, b in zip(cpu, table, strict=True)]
        del self._cpu_tables[req.request_id]
        self._cpu_free.extend(reversed(cpu))
        self._tables[req.request_id] = table
        req.block_ids = [b.block_id for b in table]
        return pairs

    # -- invariants ----------------------------------------------------------------------

    def check(self, live: list[Request]) -> None:
        """Assert tables, reference counts and both pools agree (tests call it every step)."""
        live_ids = {r.request_id for r in live}
        assert set(self._tables) <= live_ids, f"tables of dead requests: {set(self._tables) - live_ids}"
        assert set(self._cpu_tables) <= live_ids
        refs: dict[int, int] = {}
        for req in live:
            table = self._tables.get(req.request_id, [])
            assert req.block_ids == [b.block_id for b in table], f"{req.request_id}: stale block_ids"
            for block in table:
                refs[block.block_id] = refs.get(block.block_id, 0) + 1
        for block in self._deferred:
            refs[block.block_id] = refs.get(block.block_id, 0) + 1
        self.device.check(refs)
        cpu_held = [c for t in self._cpu_tables.values() for c in t]
        assert len(set(cpu_held) | set(self._cpu_free)) == len(cpu_held) + len(self._cpu_free), (
            "a CPU block is held twice or both held and free"
        )
        assert len(cpu_held) + len(self._cpu_free) == self.num_cpu_blocks, "CPU free + used != total"
