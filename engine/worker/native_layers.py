"""CPU steps through the Llama layers in one C++ call (pageserve_kernels/csrc/llama_layers.cpp).

A step calls about a dozen kernels a layer; from Python, each call's wrappers, checks, views and
ctypes conversions cost tens of microseconds, and between kernels that have just streamed a
layer's weights through the caches they run 2-3x slower than alone (5.4-6.6 ms of a 64-row
bfloat16 decode step, 30 layers, on a Zen 4 host: `pageserve bench step-overhead`). The C++
loop calls the very kernels the Python layers would (the C kernels by address, the products by
the implementation linear.py picked for the step's row count), so its hidden states equal the
Python forward's bit for bit; what it drops is the glue.

It runs every step whose decode rows the C kernel takes (pageserve_kernels/cpu_decode.py) when every
op of the layer has a C kernel this host picked (pageserve_kernels/fused_choice.py); prompt chunks
go to the C prefill kernel (pageserve_kernels/cpu_prefill.py) or, where PyTorch's attention won on
this host (pageserve_kernels/prefill_choice.py) or the kernel is not built, to the same SDPA calls
from C++. Steps with LoRA adapter rows run here too where the step's batch carries the LoRA kernel's
entry table (engine/worker/lora/batch.py): after each product the loop adds every group's terms by the
call the Python layers make. Other steps run the Python forward. It is the CPU's counterpart of engine/worker/decode_graphs.py (CUDA graphs),
behind the same `forward(inputs) -> hidden | None`. Off with `enforce_eager`, or with
PAGESERVE_KERNEL_CHOICE=llama_layers=python (=cpp, the default, where it applies); without a C++
compiler it never loads.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.worker.input_batch import StepInputs
from engine.worker.layers.attention import PagedAttentionOp, TorchPagedAttention
from engine.worker.layers.linear import LinearPlan, layout_of
from engine.worker.lora.batch import LoraBatch
from engine.worker.models.decoder import DecoderModel
from pageserve_kernels import (
    choice,
    cpu_decode,
    cpu_fused,
    cpu_fused_bf16,
    cpu_gemm,
    cpu_lora,
    cpu_prefill,
    fused_choice,
    torch_ops,
)
from pageserve_kernels.cpu_decode import VARIANTS

log = logging.getLogger("pageserve.engine")

IMPLS = {"torch": 0, "onednn": 1, "panel": 2, "amx": 3}  # llama_layers.cpp's `Dims::impl` codes
TIMED_KINDS = ("C norms", "C rotary", "KV cache write", "C decode attention", "C silu_and_mul",
               "linear", "prompt attention")  # llama_layers.cpp's `Kind` order, as bench step-overhead names them
_NONE = torch.empty(0, dtype=torch.int64)
_NO_TABLE = torch.empty(0, 0, dtype=torch.int64)
_NO_LORA = torch.empty(0, 0, 0, 0, dtype=torch.int64)
_NO_TIMINGS = torch.empty(0, dtype=torch.float64)


class NativeLayers:
    def __init__(self, model: DecoderModel, kv_layers: list[tuple[torch.Tensor, torch.Tensor]], kernels: list[int],
                 isa: int, dot_products: int) -> None:
        self.model, self.kv_layers, self.kernels = model, kv_layers, kernels
        self.isa, self.dot_products = isa, dot_products
        s = model.shape
        self.eps, self.scale = s.rms_norm_eps, s.head_dim**-0.5
        self.prompts_in_c = kernels[8] != 0  # the prefill kernel (llama_layers.cpp's Kernels)
        """Prompt chunks run the C prefill kernel (else PyTorch's attention, called from C++)."""
        self._layers: dict[tuple[str, ...], Any] = {}
        """llama_layers.cpp's `LlamaLayers` for each choice of products (row buckets sharing it share it)."""
        self._timings: torch.Tensor | None = None
        """Kernel seconds, then calls, by kind (float64 (2, len(TIMED_KINDS))) while `time_kernels` is on;
        None (the engine's case) times nothing."""

    @classmethod
    def build(cls, model: DecoderModel, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
              attention: PagedAttentionOp) -> NativeLayers | None:
        """The C++ layers for this model on this host, or None where its Python forward must run every step."""
        forced = choice.forced("llama_layers")
        if forced not in (None, "cpp", "python"):
            raise ValueError(f"PAGESERVE_KERNEL_CHOICE=llama_layers={forced}: the choices are cpp and python")
        if forced == "python" or not _plain_cpu_llama(model, attention):
            return None
        assert isinstance(attention, TorchPagedAttention)  # _plain_cpu_llama checked
        kernels = _kernel_addresses(model, attention.native_prompts)
        if kernels is None or not torch_ops.load("llama_layers"):
            return None
        s, block_size = model.shape, kv_layers[0][0].shape[1]
        decode, prefill = cpu_decode.load(), cpu_prefill.load()
        assert decode is not None  # the attention op planned for it
        isa = VARIANTS.index(decode.pick(model.dtype, s.num_heads, s.num_kv_heads, s.head_dim, block_size))
        dot_products = -1 if model.dtype == torch.float32 or prefill is None else int(prefill.dot_products)
        log.info("CPU steps run the layers in C++ (pageserve_kernels/csrc/llama_layers.cpp), prompt attention by %s",
                 "the C kernel" if kernels[8] else "PyTorch's SDPA")
        return cls(model, kv_layers, kernels, isa, dot_products)

    def forward(self, inputs: StepInputs, lora: LoraBatch | None = None) -> torch.Tensor | None:
        """The body's hidden states (T, H) float32, or None when this step's decodes were planned for PyTorch
        or its adapter rows have no LoRA kernel (`lora`: the step's adapter groups, None without)."""
        plan, rows = inputs.meta.plan, inputs.input_ids.shape[0]
        if plan is None or rows == 0 or plan.decode_groups:
            return None
        if lora is not None and (lora.table is None or not self.kernels[9]):
            return None
        adapters = (_NONE, _NO_LORA) if lora is None else (lora.rows, lora.table)
        nd, npf = plan.native_decode, plan.native_prefill
        h = self.model.embed_tokens(inputs.input_ids)  # (T, H)
        cos, sin_signed = self.model.rotary.lookup(inputs.positions)  # (T, 1, hd) each
        decode = (nd.rows, nd.block_tables, nd.seq_lens, nd.max_seq_len) if nd else (_NONE, _NO_TABLE, _NONE, 0)
        prompts = (npf.starts, npf.lens, npf.context_lens, npf.block_tables) if npf else (_NONE,) * 3 + (_NO_TABLE,)
        timings = _NO_TIMINGS if self._timings is None else self._timings
        return self._layers_for(rows).run(h, cos, sin_signed, inputs.meta.slot_mapping, *decode, *prompts,  # type: ignore[no-any-return]
                                          *adapters, timings)

    def time_kernels(self) -> None:
        """From now on, add up each kernel kind's seconds and calls inside the C++ loop (the benchmarks)."""
        self._timings = torch.zeros(2, len(TIMED_KINDS), dtype=torch.float64)

    def kernel_times(self) -> dict[str, tuple[float, int]]:
        """Seconds and calls of each kind in TIMED_KINDS since `time_kernels`, which this turns off."""
        assert self._timings is not None, "time_kernels() first"
        seconds, calls = self._timings.tolist()
        self._timings = None
        return {kind: (s, int(c)) for kind, s, c in zip(TIMED_KINDS, seconds, calls, strict=True)}

    def _layers_for(self, rows: int) -> Any:
        first = self.model.layers[0]
        plans = [first.attn.qkv_packed, first.attn.o_packed, first.mlp.gate_up_packed, first.mlp.down_packed]
        impls = tuple(p.impl_for(rows) for p in plans if isinstance(p, LinearPlan))
        layers = self._layers.get(impls)
        if layers is None:
            layers = self._layers[impls] = self._make_layers(impls)
        return layers

    def _make_layers(self, impls: tuple[str, ...]) -> Any:
        tensors: list[torch.Tensor] = []
        for layer, (key_cache, value_cache) in zip(self.model.layers, self.kv_layers, strict=True):
            a, m = layer.attn, layer.mlp
            weights = [(a.qkv_weight, a.qkv_packed), (a.o_weight, a.o_packed), (m.gate_up_weight, m.gate_up_packed),
                       (m.down_weight, m.down_packed)]
            products = [_product_weight(w, p, impl) for (w, p), impl in zip(weights, impls, strict=True)]
            tensors += [layer.input_norm.weight, *products[:2], layer.pre_mlp_norm.weight, *products[2:],
                        key_cache, value_cache, _or_empty(a.qkv_bias), _or_empty(a.q_norm), _or_empty(a.k_norm)]
        s = self.model.shape
        outs = [s.num_heads * s.head_dim + 2 * s.num_kv_heads * s.head_dim, s.hidden_size, 2 * s.intermediate_size,
                s.hidden_size]
        dims = [s.num_heads, s.num_kv_heads, s.head_dim, self.isa, self.dot_products, *(IMPLS[i] for i in impls),
                *outs]
        return torch.classes.pageserve.LlamaLayers(tensors, self.kernels, dims, self.eps, self.scale)


def _or_empty(weight: torch.Tensor | None) -> torch.Tensor:
    """An optional weight as llama_layers.cpp takes it: empty where the model has none."""
    return _NONE if weight is None else weight


def _product_weight(weight: torch.Tensor, plan: object, impl: str) -> torch.Tensor:
    assert isinstance(plan, LinearPlan)
    if impl == "onednn":
        return plan.packed["onednn"]  # type: ignore[return-value]
    if layout_of(impl) == "panel":  # the panel GEMM and its AMX twin read the same panels
        return plan.packed["panel"].panels  # type: ignore[attr-defined,no-any-return]
    return weight


def _plain_cpu_llama(model: DecoderModel, attention: PagedAttentionOp) -> bool:
    """The model the C++ loop mirrors: the plain Llama layers (not tensor-parallel), packed, on the CPU.
    Other architectures' options (engine/worker/models/spec.py) run the Python forward."""
    if type(model) is not DecoderModel or model.dtype not in (torch.float32, torch.bfloat16):
        return False
    if not model.shape.runs_in_cpp_layers:
        return False
    if not (isinstance(attention, TorchPagedAttention) and attention.native_decode) or not model.embed.is_cpu:
        return False
    for layer in model.layers:
        a, m = layer.attn, layer.mlp
        plans = (a.qkv_packed, a.o_packed, m.gate_up_packed, m.down_packed)
        if not all(isinstance(p, LinearPlan) for p in plans):
            return False
        if any(impl not in IMPLS for p in plans for impl in p.impls):  # type: ignore[union-attr]
            return False
    return True


def _kernel_addresses(model: DecoderModel, prompts_in_c: bool) -> list[int] | None:
    """llama_layers.cpp's `Kernels`, or None where some op of the layer would not run its C kernel here; no
    prefill kernel where PyTorch's attention won (pageserve_kernels/prefill_choice.py): the loop calls it."""
    s, dtype = model.shape, model.dtype
    fused = cpu_fused.load() if dtype == torch.float32 else cpu_fused_bf16.load()
    store, decode, gemm, prefill = cpu_fused.load(), cpu_decode.load(), cpu_gemm.load(dtype), cpu_prefill.load()
    if fused is None or store is None or decode is None:
        return None
    widths = {"rms_norm": (s.hidden_size,), "add_rms_norm": (s.hidden_size,),
              "rotary": (s.num_heads + s.num_kv_heads, s.head_dim), "silu_and_mul": (2 * s.intermediate_size,)}
    if not all(fused_choice.native_wins(op, fused, dtype, tail) for op, tail in widths.items()):
        return None
    if s.qk_norm and dtype == torch.float32 and not fused_choice.native_wins("rms_norm", fused, dtype, (s.head_dim,)):
        return None  # the Python layer norms float32 heads by the C kernel only where it won: so must C++
    addresses = [fused.address(op) for op in ("rms_norm", "add_rms_norm", "rotary", "silu_and_mul")]
    amx = cpu_gemm.load_amx() if dtype == torch.bfloat16 else None
    addresses += [store.address("store_kv"), decode.address(dtype), 0 if gemm is None else gemm.address(),
                  0 if amx is None else amx.address()]
    prompts = prompts_in_c and prefill is not None and cpu_prefill.supports(dtype, s.head_dim)
    addresses.append(prefill.address(dtype) if prompts else 0)  # type: ignore[union-attr]
    lora = cpu_lora.load(dtype)
    addresses.append(0 if lora is None else lora.address())  # none: steps with adapter rows run in Python
    return None if 0 in addresses[:6] else addresses
