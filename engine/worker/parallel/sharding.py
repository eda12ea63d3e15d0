"""Slices a loaded full DecoderModel into one rank's ParallelLlama (before packing and the device move).

    qkv_weight   rows [q | k | v] -> [q of this rank's query heads | k, v of its KV heads]   (column-parallel)
    o_weight     the columns of this rank's query heads                                    (row-parallel)
    gate_up      rows [gate | up] -> [gate, up of this rank's intermediate columns]          (column-parallel)
    down_weight  the same intermediate columns                                              (row-parallel)
    embed        this rank's vocabulary rows; lm_head the same rows (a tied model keeps one matrix)
    norms, rotary: replicated

Copies (`.clone()`), so the full model is freed once the shard is built. Knows the
weight layout of engine/worker/models/decoder.py, nothing about processes or collectives.
"""

from __future__ import annotations

import dataclasses

import torch

from engine.worker.layers.attention import Attention
from engine.worker.layers.mlp import GatedMLP
from engine.worker.layers.moe import SparseMoE
from engine.worker.models.decoder import DecoderModel
from engine.worker.parallel.group import RankGroup
from engine.worker.parallel.layers import ParallelLlama
from engine.worker.parallel.moe_shard import shard_moe
from engine.worker.parallel.partition import ShardPlan


def shard_model(full: DecoderModel, plan: ShardPlan, group: RankGroup) -> ParallelLlama:
    s = full.shape
    local_shape = dataclasses.replace(
        s, num_heads=plan.num_q_heads, num_kv_heads=plan.num_kv_heads,
        intermediate_size=plan.intermediate_size, vocab_size=plan.vocab_size,
    )
    shard = ParallelLlama(local_shape, full.dtype, full.rotary.max_position, plan, group)
    shard.rotary, shard.local_rotary = full.rotary, full.local_rotary
    with torch.no_grad():
        shard.embed.data = full.embed.data[plan.vocab[0]: plan.vocab[1]].clone()
        if full.lm_head is full.embed:
            shard.lm_head = shard.embed  # tied: one matrix, two uses, as in the full model
        else:
            shard.lm_head.data = full.lm_head.data[plan.vocab[0]: plan.vocab[1]].clone()
        shard.norm.weight.data = full.norm.weight.data.clone()
        for mine, theirs in zip(shard.layers, full.layers, strict=True):
            for name, param in theirs.named_parameters():  # every norm (q/k norms too) is replicated
                if name.endswith("norm.weight") or name.endswith("_norm"):
                    _named(mine, name).data = param.data.clone()
            _shard_attention(mine.attn.inner, theirs.attn, plan, group.rank)
            if isinstance(theirs.mlp, SparseMoE):  # each expert's columns split as a dense MLP's are
                mine.mlp.inner = shard_moe(theirs.mlp, plan.world_size, plan.rank)
            else:
                _shard_mlp(mine.mlp.inner, theirs.mlp, plan)
    return shard


def _named(layer: torch.nn.Module, name: str) -> torch.nn.Parameter:
    """The shard's parameter of the full layer's `name` (the shard wraps attn and mlp: `.inner`)."""
    head, _, rest = name.partition(".")
    if head in ("attn", "mlp"):
        name = f"{head}.inner.{rest}"
    return layer.get_parameter(name)


def _shard_attention(mine: Attention, full: Attention, plan: ShardPlan, rank: int) -> None:
    hd = full.head_dim
    q_rows = slice(plan.q_heads[0] * hd, plan.q_heads[1] * hd)
    k_rows = slice(full.q_size + plan.kv_heads[0] * hd, full.q_size + plan.kv_heads[1] * hd)
    v_rows = slice(full.q_size + full.kv_size + plan.kv_heads[0] * hd, full.q_size + full.kv_size + plan.kv_heads[1] * hd)
    mine.qkv_weight.data = torch.cat([full.qkv_weight.data[r] for r in (q_rows, k_rows, v_rows)]).contiguous()
    if full.qkv_bias is not None:
        mine.qkv_bias.data = torch.cat([full.qkv_bias.data[r] for r in (q_rows, k_rows, v_rows)]).contiguous()
    mine.o_weight.data = full.o_weight.data[:, q_rows].contiguous()
    if full.o_bias is not None:  # row-parallel: the partial sums are added up, so one rank adds the bias
        mine.o_bias.data = full.o_bias.data.clone() if rank == 0 else torch.zeros_like(full.o_bias.data)


def _shard_mlp(mine: GatedMLP, full: GatedMLP, plan: ShardPlan) -> None:
    size = full.intermediate_size
    cols = slice(*plan.intermediate)
    up = slice(size + plan.intermediate[0], size + plan.intermediate[1])
    mine.gate_up_weight.data = torch.cat([full.gate_up_weight.data[cols], full.gate_up_weight.data[up]]).contiguous()
    mine.down_weight.data = full.down_weight.data[:, cols].contiguous()
