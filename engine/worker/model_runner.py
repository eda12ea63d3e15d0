"""Executes one scheduler step on the model: move blocks, build inputs, forward, sample.

    SchedulerOutput ─> KVCache.move_blocks (swap out / swap in / copy, batched)
                    ─> build_step_inputs (flat tensors, attention plan)
                    ─> model.forward over all rows ─> lm_head on sampled rows only
                       (and the prompt rows of requests asking for prompt logprobs: prompt_logprobs.py)
                    ─> Sampler ─> RunnerOutput {request_id: token}

The runner owns the device: the model, the KV cache tensors and the sampler's
generators. It never decides what runs (that is the scheduler's job) and never
sees text.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput
from engine.step_failures import EngineStateLost
from engine.worker import host_allocator
from engine.worker.decode_graphs import DecodeGraphs
from engine.worker.input_batch import StepInputs, build_step_inputs, order_chunks
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.layers.attention import KernelPagedAttention, PagedAttentionOp, TorchPagedAttention
from engine.worker.logprobs import beam_candidates
from engine.worker.lora.batch import LoraBatch, build_lora_batch
from engine.worker.lora.device_weights import LoraSlots
from engine.worker.lora.registry import LoraRegistry
from engine.worker.models.decoder import DecoderModel
from engine.worker.native_layers import NativeLayers
from engine.worker.prompt_logprobs import PromptLogprobs
from engine.worker.sampler import Sampler
from engine.worker.structured_outputs import StructuredOutputs
from pageserve_kernels import prefill_choice
from pageserve_kernels.cpu_attention import native_decode_available
from pageserve_kernels.dispatch import AttentionBackend


def make_attention(choice: str | AttentionBackend, device: torch.device, layout: CacheLayout,
                   num_heads: int) -> PagedAttentionOp:
    """The attention op of a backend choice or an already selected backend; it plans its own step metadata."""
    if isinstance(choice, AttentionBackend):
        return _cpu_attention(device, layout, num_heads) if choice.name == "torch" else KernelPagedAttention(choice)
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return _cpu_attention(device, layout, num_heads)
    from pageserve_kernels.dispatch import select_backend  # Triton modules load only when chosen

    return KernelPagedAttention(select_backend(choice, device))


def _cpu_attention(device: torch.device, layout: CacheLayout, num_heads: int) -> TorchPagedAttention:
    """The C kernels where they load; prompt chunks in C only where it beat PyTorch's attention here."""
    native = native_decode_available(layout.dtype, device)
    prompts = native and prefill_choice.native_prompts_win(layout.dtype, num_heads, layout.num_kv_heads,
                                                           layout.head_dim, layout.block_size)
    return TorchPagedAttention(native, prompts)


class ModelRunner:
    def __init__(
        self, model: DecoderModel, kv_cache: KVCache, sampler: Sampler,
        attention_backend: str | AttentionBackend = "auto", structured: StructuredOutputs | None = None,
    ) -> None:
        host_allocator.keep_freed_buffers()  # once per process: a step's temporaries stay mapped
        self.model = model
        self.kv_cache = kv_cache
        self.sampler = sampler
        self.structured = structured
        """Grammar masks of constrained rows, applied right before sampling (None: no request may be constrained)."""
        self.device = kv_cache.device_pool.device
        self.block_size = kv_cache.layout.block_size
        self.attention = make_attention(attention_backend, self.device, kv_cache.layout, model.shape.num_heads)
        self.fast_forward: DecodeGraphs | NativeLayers | None = None
        """Decode-only steps without the Python forward: recorded CUDA graphs, or the CPU's C++ layer loop
        (EngineCore sets it up at start-up; its forward returns None for steps it does not cover)."""
        self.prompt_logprobs = PromptLogprobs()
        """Prompt logprobs of requests whose prompt spans several chunks, until its end is computed."""
        self.loras: LoraRegistry | None = None
        """--enable-lora: the adapters chunks' lora_id name (EngineCore sets it); None: no adapter rows ever."""
        self.lora_slots = LoraSlots()
        """On CUDA: the active adapters stacked for the Triton LoRA kernels, kept while the set is unchanged."""
        self.before_step: Callable[[SchedulerOutput], None] | None = None
        """Tensor parallelism: sends the step to the other ranks first (engine/worker/parallel/leader.py)."""

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        if self.before_step is not None:
            self.before_step(out)
        self.sampler.forget(out.finished_request_ids)
        self.prompt_logprobs.forget(out.finished_request_ids)
        if self.structured is not None:
            self.structured.forget(out.finished_request_ids)
        try:
            self.kv_cache.move_blocks(out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy)
        except Exception as e:  # a half-done move may have corrupted requests outside this step
            raise EngineStateLost(f"KV block moves failed: {type(e).__name__}: {e}") from e
        if not out.chunks:
            return RunnerOutput({})
        with torch.inference_mode():
            chunks = order_chunks(out.chunks)
            inputs = build_step_inputs(chunks, self.block_size, self.device, self.attention)
            lora = self._lora_batch(chunks)
            hidden = self._fast_forward(inputs, lora)
            if hidden is None:
                hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta,
                                    self.attention, lora)
            if not inputs.has_logits:
                return RunnerOutput({})
            all_logits = self.model.compute_logits(hidden[inputs.logits_indices])  # (N + P, V) float32
            n = len(inputs.sampled)
            prompt = self.prompt_logprobs.collect(all_logits[n:], inputs.prompt_rows) if inputs.prompt_rows else {}
            if not n:
                return RunnerOutput({})
            logits = all_logits[:n] if inputs.prompt_rows else all_logits  # (N, V)
            if self.structured is not None:  # structured outputs: banned tokens of constrained rows -> -inf
                self.structured.mask(logits, inputs.sampled)
            beams = beam_candidates(logits, inputs.sampled)  # before the sampler changes logits in place
            sampled = self.sampler.sample_with_logprobs(logits, inputs.sampled)
            if self.structured is not None:
                self.structured.advance(inputs.sampled, sampled.token_ids)
        ids = [c.request_id for c in inputs.sampled]
        return RunnerOutput(dict(zip(ids, sampled.token_ids, strict=True)),
                            {ids[row]: lp for row, lp in sampled.logprobs.items()}, prompt,
                            {ids[row]: cands for row, cands in beams.items()})

    def _fast_forward(self, inputs: StepInputs, lora: LoraBatch | None) -> torch.Tensor | None:
        """The step's hidden states without the Python forward, or None. Adapter rows: only the C++ loop
        (it applies the LoRA kernel after each product); the CUDA graphs know no LoRA."""
        if self.fast_forward is None:
            return None
        if lora is None:
            return self.fast_forward.forward(inputs)
        return self.fast_forward.forward(inputs, lora) if isinstance(self.fast_forward, NativeLayers) else None

    def _lora_batch(self, chunks: list[ScheduledChunk]) -> LoraBatch | None:
        """The step's adapter rows by adapter; None (nothing to pay) when no chunk has an adapter."""
        if self.loras is None or not any(c.lora_id for c in chunks):
            return None
        adapters = {c.lora_id: self.loras.adapter(c.lora_id) for c in chunks if c.lora_id}
        return build_lora_batch([len(c.token_ids) for c in chunks], [c.lora_id for c in chunks], adapters,
                                self.device, self.lora_slots)
