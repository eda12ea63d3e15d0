"""The routing policy on its own: affinity, stability under membership change, overflow, salts."""

from __future__ import annotations

import random

import pytest

from gateway.replicas.policy import (
    Decision,
    ReplicaLoad,
    RoutingConfig,
    affinity_key,
    choose,
    overloaded,
    rendezvous_order,
)
from shared.block_hash import hash_block

BS = 16
CONFIG = RoutingConfig(affinity_blocks=4, max_waiting=4, max_kv_usage=0.95)


def idle(*ids: str) -> list[ReplicaLoad]:
    return [ReplicaLoad(i) for i in ids]


def keys(n: int, salt: str = "") -> list[bytes]:
    rng = random.Random(7)
    out = []
    for _ in range(n):
        key = affinity_key([rng.randrange(49152) for _ in range(80)], salt, BS, CONFIG)
        assert key is not None
        out.append(key)
    return out


def test_the_key_is_the_engines_own_chained_block_hash() -> None:
    tokens = list(range(100))
    expected = None
    for i in range(4):
        expected = hash_block(expected, "salt", tokens[i * BS : (i + 1) * BS])
    assert affinity_key(tokens, "salt", BS, CONFIG) == expected


def test_only_the_first_blocks_count_and_a_partial_block_has_no_key() -> None:
    head = list(range(64))
    assert affinity_key(head + [1, 2, 3], "", BS, CONFIG) == affinity_key(head + [9] * 40, "", BS, CONFIG)
    assert affinity_key(list(range(15)), "", BS, CONFIG) is None


def test_same_prefix_same_tenant_same_replica() -> None:
    loads = idle("a", "b", "c", "d")
    prompt = list(range(70))
    first = choose(affinity_key(prompt, "t1", BS, CONFIG), loads, CONFIG)
    again = choose(affinity_key(prompt + [5, 6, 7], "t1", BS, CONFIG), list(reversed(loads)), CONFIG)
    assert first == again and first.reason == "affinity"


def test_tenant_salt_changes_the_key_and_spreads_tenants() -> None:
    prompt = list(range(64))
    assert affinity_key(prompt, "t1", BS, CONFIG) != affinity_key(prompt, "t2", BS, CONFIG)
    loads = idle("a", "b", "c", "d")
    replicas = {choose(affinity_key(prompt, f"tenant-{i}", BS, CONFIG), loads, CONFIG).replica_id for i in range(40)}
    assert len(replicas) > 1  # the same prompt of different tenants may land on different replicas


def test_a_joining_replica_takes_keys_only_for_itself() -> None:
    before = {k: rendezvous_order(k, ["a", "b", "c"])[0] for k in keys(2000)}
    after = {k: rendezvous_order(k, ["a", "b", "c", "d"])[0] for k in before}
    moved = [k for k in before if before[k] != after[k]]
    assert all(after[k] == "d" for k in moved)
    assert 0.15 < len(moved) / len(before) < 0.35  # about a quarter, not a reshuffle


def test_a_leaving_replica_moves_only_its_own_keys() -> None:
    before = {k: rendezvous_order(k, ["a", "b", "c", "d"])[0] for k in keys(2000)}
    after = {k: rendezvous_order(k, ["a", "b", "d"])[0] for k in before}
    assert all(before[k] == after[k] for k in before if before[k] != "c")
    assert all(after[k] != "c" for k in before)


def test_keys_spread_over_replicas() -> None:
    counts: dict[str, int] = {}
    for k in keys(2000):
        r = choose(k, idle("a", "b", "c", "d"), CONFIG).replica_id
        counts[r] = counts.get(r, 0) + 1
    assert min(counts.values()) > 350


def test_an_overloaded_affine_replica_overflows_to_the_least_loaded() -> None:
    key = keys(1)[0]
    affine = rendezvous_order(key, ["a", "b", "c"])[0]
    others = sorted({"a", "b", "c"} - {affine})
    loads = [ReplicaLoad(affine, num_waiting=5), ReplicaLoad(others[0], num_waiting=2),
             ReplicaLoad(others[1], num_waiting=1)]
    assert choose(key, loads, CONFIG) == Decision(others[1], "overflow", affine)


def test_a_busy_but_not_overloaded_affine_replica_keeps_its_prefix() -> None:
    key = keys(1)[0]
    affine = rendezvous_order(key, ["a", "b"])[0]
    loads = [ReplicaLoad(r, num_waiting=4 if r == affine else 0, num_running=30 if r == affine else 0)
             for r in ("a", "b")]
    assert choose(key, loads, CONFIG) == Decision(affine, "affinity", affine)


def test_a_full_kv_pool_is_overload_too() -> None:
    assert overloaded(ReplicaLoad("a", kv_usage=0.99), CONFIG)
    assert not overloaded(ReplicaLoad("a", kv_usage=0.5, num_waiting=4), CONFIG)


def test_when_every_replica_is_overloaded_the_least_loaded_wins_and_ties_stay_affine() -> None:
    key = keys(1)[0]
    affine = rendezvous_order(key, ["a", "b"])[0]
    tied = [ReplicaLoad("a", num_waiting=9), ReplicaLoad("b", num_waiting=9)]
    assert choose(key, tied, CONFIG) == Decision(affine, "affinity", affine)


def test_overflow_of_one_prefix_meets_on_one_second_replica() -> None:
    key = keys(1)[0]
    order = rendezvous_order(key, ["a", "b", "c", "d"])
    loads = [ReplicaLoad(order[0], num_waiting=9), *idle(*order[1:])]
    assert choose(key, loads, CONFIG).replica_id == order[1]


def test_a_short_prompt_goes_to_the_least_loaded() -> None:
    loads = [ReplicaLoad("a", num_waiting=3), ReplicaLoad("b", num_running=2), ReplicaLoad("c", num_waiting=1)]
    assert choose(None, loads, CONFIG) == Decision("b", "load", None)


def test_no_replica_is_an_error() -> None:
    with pytest.raises(ValueError, match="no live replica"):
        choose(None, [], CONFIG)
