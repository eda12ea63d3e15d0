"""Block manager and block pool alone: allocation on demand, freeing, prefix cache, LRU,
copy-on-write, forks, swapping; plus a property test over random operation sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.scheduling.block_manager import BlockManager
from engine.scheduling.block_pool import BlockPool, hash_block
from tests.engine.scheduling.fakes import make_request


def manager(device: int = 8, cpu: int = 4, bs: int = 4, caching: bool = True) -> BlockManager:
    return BlockManager(device, cpu, bs, caching)


def compute(req, n: int) -> None:  # type: ignore[no-untyped-def]
    """What the scheduler does once a chunk of n tokens is scheduled and run."""
    req.num_computed_tokens += n


def test_allocates_on_demand_and_frees_everything() -> None:
    bm, req = manager(), make_request(6)
    assert bm.allocate(req, 5) == []
    assert len(req.block_ids) == 2 and bm.num_free_device_blocks == 6
    compute(req, 5)
    assert bm.allocate(req, 1) == [] and len(req.block_ids) == 2  # position 5 fits block 1
    compute(req, 1)
    bm.allocate(req, 3)
    assert len(req.block_ids) == 3  # positions 6..8 need a third block
    bm.check([req])
    bm.free(req)
    assert req.block_ids == [] and bm.num_free_device_blocks == 8
    bm.check([])


def test_allocation_that_does_not_fit_changes_nothing() -> None:
    bm, a, b = manager(device=3), make_request(8), make_request(8)
    assert bm.allocate(a, 8) == []
    assert bm.allocate(b, 8) is None
    assert b.block_ids == [] and bm.num_free_device_blocks == 1
    assert bm.allocate(b, 4, reserve=1) is None  # the reserve must stay free
    assert bm.allocate(b, 4) == []
    bm.check([a, b])


def test_double_free_is_caught() -> None:
    pool = BlockPool(2)
    block = pool.allocate()
    pool.release(block)
    with pytest.raises(AssertionError, match="double free"):
        pool.release(block)


def test_prefix_hit_rechecks_tokens_and_never_covers_the_last_token() -> None:
    bm = manager()
    a = make_request(list(range(1, 10)))  # 9 tokens: blocks [1..4][5..8][9]
    bm.allocate(a, 9)
    compute(a, 9)
    bm.cache_full_blocks(a)
    assert bm.device.num_cached == 2
    same = make_request(list(range(1, 10)))
    assert bm.find_prefix(same).num_tokens == 8
    exact = make_request(list(range(1, 9)))  # 8 tokens: the last must be computed
    assert bm.find_prefix(exact).num_tokens == 4
    other = make_request([1, 2, 3, 4, 7, 7, 7, 7, 9])
    assert bm.find_prefix(other).num_tokens == 4
    # A forged hash entry whose tokens differ is not a hit.
    block = bm.device.lookup(bm.block_hashes(a)[0], [1, 2, 3, 4])
    assert block is not None and bm.device.lookup(bm.block_hashes(a)[0], [1, 2, 3, 5]) is None


def test_salts_separate_tenants() -> None:
    bm = manager()
    a = make_request(list(range(1, 10)), cache_salt="tenant-a")
    bm.allocate(a, 9)
    compute(a, 9)
    bm.cache_full_blocks(a)
    assert bm.find_prefix(make_request(list(range(1, 10)), cache_salt="tenant-b")).num_tokens == 0
    assert bm.find_prefix(make_request(list(range(1, 10)), cache_salt="tenant-a")).num_tokens == 8
    assert hash_block(None, "x", [1]) != hash_block(None, "", [1])


def test_prefix_hit_takes_blocks_and_reference_counts_them() -> None:
    bm = manager()
    a = make_request(list(range(1, 10)))
    bm.allocate(a, 9)
    compute(a, 9)
    bm.cache_full_blocks(a)
    b = make_request(list(range(1, 10)) + [20])
    hit = bm.find_prefix(b)
    assert bm.allocate(b, b.num_tokens - hit.num_tokens, hit) == []
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert [bm.device.blocks[i].ref_cnt for i in b.block_ids[:2]] == [2, 2]
    bm.check([a, b])
    bm.free(a)
    bm.free(b)
    assert bm.num_free_device_blocks == 8 and bm.device.num_cached == 2
    bm.check([])


def test_lru_evicts_least_recently_freed_and_tail_blocks_first() -> None:
    bm = manager(device=6)
    a, b = make_request(list(range(1, 10))), make_request(list(range(21, 30)))
    for r in (a, b):
        bm.allocate(r, 9)
        compute(r, 9)
        bm.cache_full_blocks(r)
    a_blocks, b_blocks = list(a.block_ids), list(b.block_ids)
    bm.free(a)
    bm.free(b)
    # Evictable order: a's tail block before a's head, then b's.
    assert bm.device.evictable_ids() == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    # A hit on a's prefix takes its head block out of the list; freeing puts it at the tail.
    again = make_request(list(range(1, 6)))
    hit = bm.find_prefix(again)
    assert [blk.block_id for blk in hit.blocks] == [a_blocks[0]]
    bm.allocate(again, 1, hit)
    bm.free(again)
    assert bm.device.evictable_ids() == [a_blocks[1], b_blocks[1], b_blocks[0], a_blocks[0]]
    # Two fresh blocks remain free; the third allocation evicts the least recent cached block.
    c = make_request(12)
    bm.allocate(c, 12)
    assert a_blocks[1] in c.block_ids and bm.device.num_cached == 3
    assert bm.find_prefix(make_request(list(range(1, 10)))).num_tokens == 4
    bm.check([c])


def test_fork_shares_blocks_and_copies_the_partial_block_on_first_write() -> None:
    bm = manager()
    parent = make_request(list(range(1, 8)))  # 7 tokens: [1..4][5 6 7]
    bm.allocate(parent, 7)
    compute(parent, 7)
    child = make_request(list(range(1, 8)))
    bm.fork(parent, child, 6)  # shares blocks covering 6 tokens: both blocks
    child.num_computed_tokens = 6
    assert child.block_ids == parent.block_ids
    assert [bm.device.blocks[i].ref_cnt for i in parent.block_ids] == [2, 2]
    copies = bm.allocate(child, 1)  # position 6 lies in the shared block 1
    assert copies == [(parent.block_ids[1], child.block_ids[1])]
    assert child.block_ids[0] == parent.block_ids[0] and child.block_ids[1] != parent.block_ids[1]
    bm.check([parent, child])
    bm.free(parent)
    bm.free(child)
    bm.check([])
    # The copy's source stays held until the step's moves are applied.
    assert bm.num_free_device_blocks == 7
    bm.end_step()
    bm.check([])
    assert bm.num_free_device_blocks == 8


def test_swap_out_and_in_round_trip() -> None:
    bm = manager(device=4, cpu=2)
    req = make_request(7)
    bm.allocate(req, 7)
    compute(req, 7)
    dev = list(req.block_ids)
    pairs = bm.swap_out(req)
    assert pairs is not None and [d for d, _ in pairs] == dev
    assert req.block_ids == [] and bm.num_free_device_blocks == 4 and bm.num_free_cpu_blocks == 0
    bm.check([req])
    big = make_request(12)
    bm.allocate(big, 12)
    assert bm.swap_in(req) is None  # one device block left for two
    bm.free(big)
    back = bm.swap_in(req, reserve=1)
    assert back is not None and [c for c, _ in back] == [c for _, c in pairs]
    assert req.block_ids == [d for _, d in back] and bm.num_free_cpu_blocks == 2
    bm.check([req])


def test_swap_out_needs_room_in_the_cpu_pool() -> None:
    bm = manager(device=4, cpu=1)
    req = make_request(7)
    bm.allocate(req, 7)
    assert bm.swap_out(req) is None and len(req.block_ids) == 2
    bm.check([req])


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "grow", "free", "swap_out", "swap_in", "fork", "end_step"]),
            st.integers(0, 5),
        ),
        max_size=40,
    )
)
def test_random_operations_keep_the_books(ops: list[tuple[str, int]]) -> None:
    bm = manager(device=10, cpu=5, bs=2)
    common = list(range(1, 9))
    # Pairs (0, 1), (2, 3), (4, 5) share a prompt, so forks happen; all share a prefix.
    reqs = [make_request(common[: 3 + i // 2] + [30 + i // 2], request_id=f"b{i}") for i in range(6)]
    state = {r.request_id: "new" for r in reqs}
    for op, i in ops:
        req = reqs[i]
        st_ = state[req.request_id]
        if op == "alloc" and st_ == "new":
            hit = bm.find_prefix(req)
            if bm.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None:
                req.num_computed_tokens = req.num_tokens
                bm.cache_full_blocks(req)
                state[req.request_id] = "dev"
        elif op == "grow" and st_ == "dev":
            req.output_token_ids.append(40 + i)
            if bm.allocate(req, 1) is not None:
                compute(req, 1)
                bm.cache_full_blocks(req)
            else:
                req.output_token_ids.pop()
        elif op == "free" and st_ in ("dev", "cpu"):
            bm.free(req)
            req.num_computed_tokens = 0
            del req.output_token_ids[:]
            state[req.request_id] = "new"
        elif op == "swap_out" and st_ == "dev" and bm.swap_out(req) is not None:
            state[req.request_id] = "cpu"
        elif op == "swap_in" and st_ == "cpu" and bm.swap_in(req) is not None:
            state[req.request_id] = "dev"
        elif op == "end_step":
            bm.end_step()
        elif op == "fork" and st_ == "dev":
            child = next((r for r in reqs if state[r.request_id] == "new" and r is not req), None)
            if child is not None and child.prompt_token_ids == req.prompt_token_ids:
                shared = min(req.num_computed_tokens, child.num_tokens - 1)
                bm.fork(req, child, shared)
                child.num_computed_tokens = shared
                state[child.request_id] = "dev"
        bm.check([r for r in reqs if state[r.request_id] != "new"])
        for r in reqs:
            if state[r.request_id] == "dev":
                assert len(r.block_ids) == bm.blocks_for(r.num_computed_tokens)
    for r in reqs:
        bm.free(r)
    bm.end_step()
    bm.check([])
    assert bm.num_free_device_blocks == 10 and bm.num_free_cpu_blocks == 5


def test_a_copy_source_is_not_reused_by_a_swap_in_of_the_same_step() -> None:
    bm = manager(device=4, cpu=4)
    parked = make_request(3)
    bm.allocate(parked, 3)
    parked.num_computed_tokens = 3
    assert bm.swap_out(parked) is not None  # resumes later in the step below
    parent = make_request(list(range(1, 4)))
    bm.allocate(parent, 3)
    compute(parent, 3)
    child = make_request(list(range(1, 4)))
    bm.fork(parent, child, 2)
    child.num_computed_tokens = 2
    ((src, dst),) = bm.allocate(child, 1)  # copy-on-write of the shared block
    assert bm.swap_out(parent) is not None  # its last holder lets go in the same step
    back = bm.swap_in(parked)
    assert back is not None and src not in [d for _, d in back], "the copy would read a swapped-in block"
    bm.check([parked, parent, child])
    bm.end_step()
    assert bm.device.blocks[src].ref_cnt == 0
    bm.check([parked, parent, child])
