"""One LoRA adapter read from a PEFT folder and laid onto our fused projections.

    adapter_config.json      r, lora_alpha, target_modules, use_rslora
    adapter_model.safetensors  ...layers.{i}.self_attn.q_proj.lora_A.weight (r, in)
                               ...layers.{i}.self_attn.q_proj.lora_B.weight (out, r)

PEFT computes y = x W^T + scale (x A^T) B^T with scale = alpha / r (alpha / sqrt(r) with rsLoRA).
The scale is folded into B once here. Our q/k/v and gate/up are fused matrices, so a target
becomes a slice of the fused output:

    qkv out columns:   [ q : q_size | k : kv_size | v : kv_size ]      gate_up: [ gate : I | up : I ]
    shrink: s = x A_stack^T          A_stack = [A_q; A_k; A_v]   (r_q + r_k + r_v, H): one product
    expand: out[:, q cols] += s[:, r_q cols] B_q^T, and so on per targeted slice

Two layouts, one per adapter, never both (an adapter's bytes are held once):
  - CPU, where pageserve_kernels/cpu_lora.py's kernel for the dtype loads: only the blocks and panels that
    kernel reads (ProjectionLora.a_packed, LoraSlice.panels), laid out by one single-threaded C call straight
    from the file's bytes (packed_layout.py, pageserve_kernels/lora_pack.py: no GIL held, no torch op per
    tensor), and the entry table (the kernel's per layer and projection record of their addresses and
    ranks): a step only stacks its adapters' tables. A 50 MB float32 adapter, cold from disk, loads in
    about 55 ms of the reader's time (6 of them in C, the buffer's pages faulted in beside the disk read:
    prefaulted_pages.py), a median of 79-83 ms through a busy engine where PyTorch's packing took 178 ms
    (`pageserve bench lora-load`, Zen 4, 2 vCPUs).
  - CUDA, or no CPU kernel, or `packed=False` (tests' reference): the plain A and B (ProjectionLora.a,
    LoraSlice.b), which batch.py's PyTorch products and device_weights.py's slots read.

Every shape is checked against the base model's; anything this engine cannot apply exactly
(DoRA, trained biases, extra saved modules, ranks over --max-lora-rank, MoE experts) is a
LoraError naming it, never a silently different model. Knows nothing about requests.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as safetensors_load

from engine.worker.lora.errors import LoraError
from engine.worker.lora.packed_layout import bound_bytes, pack_projections
from engine.worker.lora.prefaulted_pages import Pages
from engine.worker.lora.safetensors_file import (
    Header,
    StoredTensor,
    as_buffer,
    peek_header,
    read_file,
    read_header,
)
from engine.worker.models.spec import ModelSpec
from pageserve_kernels import cpu_lora, lora_pack

Stored = torch.Tensor | StoredTensor
"""A stored tensor as the checks see it (its shape): parsed by safetensors, or only located in the file."""


@dataclass(frozen=True)
class LoraSlice:
    """One target module inside a fused projection."""

    start: int
    end: int
    """Output columns of the fused projection this target adds to."""
    r0: int
    r1: int
    """Columns of the shrink output (the stacked A's rows) that belong to this target."""
    b: torch.Tensor | None
    """(end - start, r1 - r0): lora_B with the scale folded in; None where the CPU kernel runs (panels only)."""
    panels: torch.Tensor | None = None
    """B in pageserve_kernels/cpu_lora.py's expand panels (None where that kernel does not run)."""


@dataclass(frozen=True)
class ProjectionLora:
    a: torch.Tensor | None
    """(rank, in): every targeted slice's lora_A, stacked; None where the CPU kernel runs (a_packed only)."""
    slices: tuple[LoraSlice, ...]
    a_packed: torch.Tensor | None = None
    """The stacked A in pageserve_kernels/cpu_lora.py's shrink blocks (None where that kernel does not run)."""

    @property
    def rank(self) -> int:
        """Rows of the stacked A: the slices' ranks summed (their columns of s follow one another)."""
        return self.slices[-1].r1


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    load_id: int
    """Unique per load, never reused: a reload under the same name gets a new one (prefix-cache key)."""
    rank: int
    """The largest rank of any target."""
    layers: tuple[dict[str, ProjectionLora], ...]
    """Per decoder layer: fused projection ("qkv", "o", "gate_up", "down") -> its LoRA, if targeted."""
    table: torch.Tensor | None = None
    """(layers, len(cpu_lora.PROJECTIONS), cpu_lora.ENTRY) int64: the kernel's entries, rows left 0 (their
    addresses point into `layers`' tensors, which this record keeps); None where the kernel does not run."""

    @property
    def dtype(self) -> torch.dtype:
        return next(t.dtype for layer in self.layers for p in layer.values() for t in (p.a, p.a_packed)
                    if t is not None)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the adapter holds (plain or packed: one form, never both)."""
        return sum(t.nbytes for layer in self.layers for p in layer.values()
                   for t in (p.a, p.a_packed, *(s.b for s in p.slices), *(s.panels for s in p.slices))
                   if t is not None)


TARGET_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
                "gate_up_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def target_layout(spec: ModelSpec) -> dict[str, tuple[str, int, int, int]]:
    """PEFT target name -> (our fused projection, first output column, end column, input width)."""
    h, q, kv, inter = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    return {
        "q_proj": ("qkv", 0, q, h), "k_proj": ("qkv", q, q + kv, h), "v_proj": ("qkv", q + kv, q + 2 * kv, h),
        "qkv_proj": ("qkv", 0, q + 2 * kv, h), "o_proj": ("o", 0, h, q),
        "gate_proj": ("gate_up", 0, inter, h), "up_proj": ("gate_up", inter, 2 * inter, h),
        "gate_up_proj": ("gate_up", 0, 2 * inter, h), "down_proj": ("down", 0, h, inter),
    }


def read_config(folder: Path) -> dict:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise LoraError(f"{folder}: no adapter_config.json (not a PEFT LoRA folder, or a missing path)")
    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        raise LoraError(f"{path}: not JSON ({e})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{path}: peft_type {config['peft_type']!r} is not LORA")
    for key, ok in (("use_dora", False), ("bias", "none"), ("modules_to_save", None), ("alpha_pattern", {}),
                    ("rank_pattern", {})):
        if config.get(key, ok) not in (ok, None, {}, []):
            raise LoraError(f"{path}: {key}={config[key]!r} is not supported (only plain LoRA on the projections)")
    return config


def load_adapter(folder: str | Path, name: str, spec: ModelSpec, *, max_rank: int, dtype: torch.dtype,
                 device: torch.device | str, load_id: int, packed: bool | None = None) -> LoraAdapter:
    """Read, check and lay out one adapter; raises LoraError naming the problem. `packed`: None lays it out
    for the CPU kernel where that kernel runs (else plain tensors); False always plain (PyTorch's reference)."""
    folder = Path(folder)
    config = read_config(folder)
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise LoraError(f"{folder}: no adapter_model.safetensors")
    kernel = packed is not False and torch.device(device).type == "cpu" and cpu_lora.load(dtype) is not None
    packer = lora_pack.load() if kernel and dtype in lora_pack.SERVING_DTYPES else None
    header = peek_header(path) if packer is not None else None  # sizes the pages; parsed once
    route = _Route(kernel, packer, header, Pages(bound_bytes(header.tensors, dtype)) if header else None)
    try:
        with read_file(path) as data:  # the file's bytes, valid inside this block only
            return _from_bytes(folder, name, config, path, data, spec, max_rank, dtype, device, load_id, route)
    finally:
        if route.pages is not None:
            route.pages.release()  # nothing, if the layout took them


@dataclass(frozen=True)
class _Route:
    """Where one load's tensors go, decided once before the file is read."""

    kernel: bool
    """The CPU kernel runs: only the packed forms are kept."""
    packer: lora_pack.LoraPacker | None
    """The C layout lays them out from the file's bytes (None: PyTorch's packing or plain tensors)."""
    header: Header | None
    """The header as read before the file, reused where the file's bytes still begin with it."""
    pages: Pages | None
    """The packed buffer's pages, mapped beside the file's read (prefaulted_pages.py)."""


def _from_bytes(folder: Path, name: str, config: dict, path: Path, data: torch.Tensor, spec: ModelSpec,
                max_rank: int, dtype: torch.dtype, device: torch.device | str, load_id: int,
                route: _Route) -> LoraAdapter:
    kernel, packer, stored = route.kernel, route.packer, None
    if packer is not None:
        stored = route.header.tensors if route.header and route.header.describes(data) else read_header(path, data)
    tensors: dict[str, torch.Tensor] = {}
    if stored is None or any(t.dtype not in lora_pack.SOURCE_DTYPES for t in stored.values()):
        packer, tensors = None, _parse(path, data)  # PyTorch's layout (float64 or integer tensors: the checks')
    layout = target_layout(spec)
    pairs: dict[tuple[int, str], dict[str, Stored]] = {}
    for key, tensor in (stored if packer is not None else tensors).items():
        m = _KEY.search(key)
        if m is None:
            raise LoraError(f"{folder}: tensor {key!r} is not a LoRA A/B weight of a decoder layer's projection")
        layer, target, which = int(m[1]), m[2], m[3]
        if target not in layout:
            raise LoraError(f"{folder}: target module {target!r} is not one of {TARGET_NAMES}")
        if layer >= spec.num_layers:
            raise LoraError(f"{folder}: layer {layer} does not exist (the base model has {spec.num_layers})")
        if spec.moe and spec.is_sparse(layer) and layout[target][0] in ("gate_up", "down"):
            raise LoraError(f"{folder}: {target} of layer {layer} is a mixture-of-experts layer (not supported)")
        pairs.setdefault((layer, target), {})[which] = tensor
    if not pairs:
        raise LoraError(f"{folder}: adapter_model.safetensors holds no LoRA weights")
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    layers: list[dict[str, list[tuple[str, Stored, Stored, float]]]] = [{} for _ in range(spec.num_layers)]
    rank = 0
    for (layer, target), ab in sorted(pairs.items()):
        a, b = _checked_pair(folder, layer, target, ab, layout[target], max_rank)
        r = a.shape[0]
        rank = max(rank, r)
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        _check_overlap(folder, target, layers[layer].get(layout[target][0], []), layout)
        layers[layer].setdefault(layout[target][0], []).append((target, a, b, scale))
    if packer is not None:
        built = _packed(data, layers, layout, dtype, packer, route.pages)
    else:
        built = tuple({proj: _stack(targets, layout, dtype, device, kernel) for proj, targets in layer.items()}
                      for layer in layers)
    return LoraAdapter(name, str(folder), load_id, rank, built, kernel_table(built) if kernel else None)


def _checked_pair(folder: Path, layer: int, target: str, ab: dict[str, Stored],
                  place: tuple[str, int, int, int], max_rank: int) -> tuple[Stored, Stored]:
    where = f"{folder}: layers.{layer}.{target}"
    if set(ab) != {"A", "B"}:
        raise LoraError(f"{where}: lora_{'A' if 'A' not in ab else 'B'} is missing")
    a, b = ab["A"], ab["B"]
    _, start, end, width = place
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise LoraError(f"{where}: lora_A and lora_B must be matrices")
    r = a.shape[0]
    if r > max_rank:
        raise LoraError(f"{where}: rank {r} is over --max-lora-rank {max_rank}")
    if a.shape[1] != width or tuple(b.shape) != (end - start, r):
        raise LoraError(f"{where}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the base model "
                        f"(expected ({r}, {width}) / ({end - start}, {r}))")
    return a, b


def _check_overlap(folder: Path, target: str, others: list[tuple[str, Stored, Stored, float]],
                   layout: dict[str, tuple[str, int, int, int]]) -> None:
    """q_proj beside qkv_proj: no model has both; the kernel's slices must not overlap."""
    _, start, end, _ = layout[target]
    for other, *_ in others:
        if start < layout[other][2] and layout[other][1] < end:
            raise LoraError(f"{folder}: {target} overlaps another target of the same fused projection")


def _stack(targets: list[tuple[str, Stored, Stored, float]], layout: dict[str, tuple[str, int, int, int]],
           dtype: torch.dtype, device: torch.device | str, kernel: bool) -> ProjectionLora:
    """PyTorch's layout: the plain tensors (the reference; CUDA's input), or where the C kernel runs but the
    C packer does not (a source dtype it does not read), only their packed forms."""
    slices: list[LoraSlice] = []
    r0 = 0
    for target, a, b, scale in targets:
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        _, start, end, _ = layout[target]
        b = (b.float() * scale).to(dtype).to(device).contiguous()  # the scale folded in float32, then rounded
        slices.append(LoraSlice(start, end, r0, r0 + a.shape[0], None if kernel else b,
                                cpu_lora.pack_b(b) if kernel else None))
        r0 += a.shape[0]
    stacked = torch.cat([a for _, a, _, _ in targets]).to(dtype).to(device).contiguous()  # type: ignore[misc]
    return ProjectionLora(None if kernel else stacked, tuple(slices), cpu_lora.pack_a(stacked) if kernel else None)


def _packed(data: torch.Tensor, layers: list[dict[str, list[tuple[str, Stored, Stored, float]]]],
            layout: dict[str, tuple[str, int, int, int]], dtype: torch.dtype,
            packer: lora_pack.LoraPacker, pages: Pages | None) -> tuple[dict[str, ProjectionLora], ...]:
    """The C kernel's layout only, straight from the file's bytes (packed_layout.py: one C call)."""
    plans = [{proj: [(*layout[t][1:3], a, b, scale) for t, a, b, scale in targets]  # type: ignore[misc]
              for proj, targets in layer.items()} for layer in layers]
    views = pack_projections(data, plans, dtype, packer, pages)
    built = []
    for layer, packed in zip(layers, views, strict=True):
        projections = {}
        for proj, targets in layer.items():
            a_packed, panels = packed[proj]
            slices, r0 = [], 0
            for (target, a, _, _), p in zip(targets, panels, strict=True):
                slices.append(LoraSlice(layout[target][1], layout[target][2], r0, r0 + a.shape[0], None, p))
                r0 += a.shape[0]
            projections[proj] = ProjectionLora(None, tuple(slices), a_packed)
        built.append(projections)
    return tuple(built)


def kernel_table(layers: tuple[dict[str, ProjectionLora], ...]) -> torch.Tensor:
    """(layers, projections, ENTRY) int64: pageserve_kernels/cpu_lora.py's entry of each targeted projection."""
    rows = []  # one torch.tensor at the end, not one per entry: a load's Python holds the GIL the least
    for layer in layers:
        for name in cpu_lora.PROJECTIONS:
            lora = layer.get(name)
            if lora is None:
                rows.append([0] * cpu_lora.ENTRY)
                continue
            assert lora.a_packed is not None
            rows.append(cpu_lora.entry(lora.a_packed, lora.rank, [
                (s.start, s.end, s.r0, s.r1, s.panels) for s in lora.slices]))  # type: ignore[misc]
    return torch.tensor(rows, dtype=torch.int64).view(len(layers), len(cpu_lora.PROJECTIONS), cpu_lora.ENTRY)


def _parse(path: Path, data: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors by safetensors, from the bytes already read (not safe_open: its tensors page the file in
    from its mmap while holding the GIL, tensor by tensor: a cold 50 MB adapter stalled the engine's step
    loop for its whole read, p99 inter-token latency of the running streams 44 -> 294 ms on a Zen 4 host)."""
    try:
        return safetensors_load(bytes(as_buffer(data)))
    except Exception as e:  # a truncated or foreign file: the reader's own words
        raise LoraError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
