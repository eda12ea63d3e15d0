"""The named workloads are exact: token counts at seed 0, the shapes each one promises, and seeding."""

from __future__ import annotations

import pytest

from ops.bench.offline import make_workload
from ops.bench.workloads import (
    FIRST_ORDINARY_ID,
    HEAVY,
    LIGHT,
    LONG_PROMPT,
    WORKLOADS,
    get_workload,
)


def test_throughput_is_the_standard_offline_workload() -> None:
    w = get_workload("throughput")
    assert (len(w.requests), w.prompt_tokens, w.output_tokens) == (64, 17_709, 8_885)
    old = make_workload(64, (32, 512), (16, 256), 49_152, 0)
    assert w.prompts == old.prompts and w.output_lens == old.output_lens


def test_chat_shares_a_384_token_system_prompt() -> None:
    w = get_workload("chat")
    assert (len(w.requests), w.prompt_tokens, w.output_tokens) == (64, 29_762, 4_096)
    system = w.requests[0].prompt[:384]
    assert all(r.prompt[:384] == system and 32 <= len(r.prompt) - 384 <= 128 for r in w.requests)
    assert len({r.prompt[384] for r in w.requests}) > 1  # the own parts differ
    assert set(w.output_lens) == {64}


def test_long_puts_a_few_long_prompts_among_short_ones() -> None:
    w = get_workload("long")
    assert (len(w.requests), w.prompt_tokens, w.output_tokens) == (32, 8_294, 1_920)
    longs = [i for i, r in enumerate(w.requests) if len(r.prompt) == LONG_PROMPT]
    assert longs == [4, 12, 20, 28]
    assert all(32 <= len(r.prompt) <= 128 for i, r in enumerate(w.requests) if i not in longs)


def test_multitenant_floods_with_four_times_the_light_tenants_requests() -> None:
    w = get_workload("multitenant")
    assert (len(w.requests), w.prompt_tokens, w.output_tokens) == (60, 9_873, 3_840)
    assert w.tenants == [HEAVY, LIGHT]
    assert len(w.only(HEAVY).requests) == 4 * len(w.only(LIGHT).requests) == 48
    light = [i for i, r in enumerate(w.requests) if r.tenant == LIGHT]
    assert light[0] < 12 and light[-1] > 48  # interleaved through the run, not grouped


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_seeded_and_free_of_special_tokens(name: str) -> None:
    a, b, c = get_workload(name, seed=0), get_workload(name, seed=0), get_workload(name, seed=1)
    assert a == b and a != c
    assert min(t for r in a.requests for t in r.prompt) >= FIRST_ORDINARY_ID


def test_unknown_workload_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        get_workload("nope")
