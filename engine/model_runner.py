"""Executes one scheduler step on the model: move blocks, build inputs, forward, sample.

    SchedulerOutput ─> KVCache.move_blocks (swap out / swap in / copy, batched)
                    ─> build_step_inputs (flat tensors, attention plan)
                    ─> model.forward over all rows ─> lm_head on sampled rows only
                    ─> Sampler ─> RunnerOutput {request_id: token}

The runner owns the device: the model, the KV cache tensors and the sampler's
generators. It never decides what runs (that is the scheduler's job) and never
sees text.
"""

from __future__ import annotations

import torch

from engine.input_batch import build_step_inputs, order_chunks
from engine.kv_cache import KVCache
from engine.layers.attention import KernelPagedAttention, PagedAttentionOp, TorchPagedAttention
from engine.models.llama import LlamaModel
from engine.outputs import RunnerOutput, SchedulerOutput
from engine.sampler import Sampler
from engine.structured_outputs import StructuredOutputs
from kernels.cpu_attention import native_decode_available


def make_attention(choice: str, device: torch.device) -> tuple[PagedAttentionOp, bool]:
    """(attention op, whether it wants the CPU plan) for a backend choice."""
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return TorchPagedAttention(), True
    from kernels.dispatch import select_backend  # Triton modules load only when chosen

    return KernelPagedAttention(select_backend(choice, device)), False


class ModelRunner:
    def __init__(
        self, model: LlamaModel, kv_cache: KVCache, sampler: Sampler, attention_backend: str = "auto",
        structured: StructuredOutputs | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.sampler = sampler
        self.structured = structured
        """Grammar masks of constrained rows, applied right before sampling (None: no request may be constrained)."""
        self.device = kv_cache.device_pool.device
        self.block_size = kv_cache.layout.block_size
        self.attention, self._plan = make_attention(attention_backend, self.device)
        self._native = self._plan and native_decode_available(kv_cache.layout.dtype, self.device)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.sampler.forget(out.finished_request_ids)
        if self.structured is not None:
            self.structured.forget(out.finished_request_ids)
        self.kv_cache.move_blocks(out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy)
        if not out.chunks:
            return RunnerOutput({})
        with torch.inference_mode():
            inputs = build_step_inputs(
                order_chunks(out.chunks), self.block_size, self.device, self._plan, self._native
            )
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta, self.attention)
            if not inputs.sampled:
                return RunnerOutput({})
            logits = self.model.compute_logits(hidden[inputs.logits_indices])  # (N, V) float32
            if self.structured is not None:  # structured outputs: banned tokens of constrained rows -> -inf
                self.structured.mask(logits, inputs.sampled)
            tokens = self.sampler.sample(logits, inputs.sampled)
            if self.structured is not None:
                self.structured.advance(inputs.sampled, tokens)
        return RunnerOutput({c.request_id: t for c, t in zip(inputs.sampled, tokens, strict=True)})
