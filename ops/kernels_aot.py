"""Compile every kernel for a GPU target without a GPU: a build check for CUDA code paths.

    python -m ops.kernels_aot            # all variants for sm_90 (H100/H200), one line each
    python -m ops.kernels_aot --quick    # a representative few (tests/ops/test_kernels_aot.py)

The interpreter proves the kernels compute the right thing; it never runs
Triton's GPU compiler, so a kernel can pass every CPU test and still fail to
compile, or compile into slow code. This lowers each variant through
ttir -> ttgir -> ptx -> cubin (ptxas ships with triton) with the integer
specialisation a real launch gets (pointers 16-byte aligned, strides multiples
of 16), and reports shared memory and whether the paged-attention K/V loads
became pipelined 16-byte asynchronous copies, which decode bandwidth needs.
Must run with TRITON_INTERPRET unset or 0 (main() refuses otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variant:
    name: str
    kernel: str  # module:function
    ptr_types: dict[str, str]  # pointer args -> "*fp16" etc.
    constexprs: dict[str, Any]
    float_args: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    wants_async_kv: bool = False
    aligned_ints: tuple[str, ...] = ()
    """Integer args a real launch sees as multiples of 16 (Triton specialises them): a model's widths."""


DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def attention_variant(dtype: str, hd: int, group: int, one_q: bool, splits: int, bs: int = 16) -> Variant:
    import torch

    from pageserve_kernels.attention_launch import attention_constexprs, plan_launch

    t = DTYPE[dtype]
    max_q = 1 if one_q else 200
    plan = plan_launch(max_q, 1, group, 1, hd, max_q, 4096, torch.device("cpu"), num_splits=splits)
    return Variant(
        name=f"paged_attention {dtype} hd={hd} group={group} {'decode' if one_q else 'varlen'} splits={splits}",
        kernel="pageserve_kernels.paged_attention:_paged_attention_kernel",
        ptr_types={
            **{n: f"*{t}" for n in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")},
            "part_out_ptr": "*fp32",
            "part_lse_ptr": "*fp32",
            **{n: "*i32" for n in ("block_tables_ptr", "query_start_loc_ptr", "seq_lens_ptr")},
        },
        float_args=("qk_scale", "softcap"),
        constexprs=attention_constexprs(plan, group, 1, hd, bs, upcast=False),
        num_warps=plan.num_warps,
        wants_async_kv=dtype != "float32" and hd % 16 == 0,
    )


def other_variants(dtype: str) -> list[Variant]:
    from pageserve_kernels.merge_splits import merge_constexprs

    t = DTYPE[dtype]
    return [
        Variant(
            f"merge_splits {dtype}",
            "pageserve_kernels.merge_splits:_merge_splits_kernel",
            {"out_ptr": f"*{t}", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"},
            merge_constexprs(128, exact=False),
        ),
        Variant(
            f"write_kv {dtype}",
            "pageserve_kernels.write_kv:_write_kv_kernel",
            {
                "key_ptr": "*fp32",
                "value_ptr": "*fp32",
                "key_cache_ptr": f"*{t}",
                "value_cache_ptr": f"*{t}",
                "slot_mapping_ptr": "*i64",
            },  # fmt: skip
            {"BLOCK_SIZE": 16, "N_KV": 8, "HEAD_DIM": 128, "TILE": 1024, "EXACT_BF16": False},
        ),
        Variant(
            f"copy_blocks {dtype}",
            "pageserve_kernels.copy_blocks:_copy_blocks_kernel",
            {"first_cache_ptr": f"*{t}", "cache_addresses_ptr": "*i64", "src_dst_ptr": "*i64"},
            {"TILE": 1024},
        ),
    ]


def lora_variants(dtype: str, prompt: bool) -> list[Variant]:
    """The LoRA shrink/expand of a decode step (16-row tiles, split-K) or of prompt chunks (64 rows)."""
    t, rows = DTYPE[dtype], 64 if prompt else 16
    index_ptrs = {n: "*i32" for n in ("row_indices_ptr", "group_start_ptr", "group_slot_ptr")}
    kind = "prompt" if prompt else "decode"
    return [
        Variant(
            f"lora_shrink {dtype} {kind}",
            "pageserve_kernels.lora_shrink:_lora_shrink_kernel",
            {"x_ptr": f"*{t}", "a_ptr": f"*{t}", "s_ptr": "*fp32", "slot_rank_ptr": "*i32", **index_ptrs},
            {"BLOCK_M": rows, "BLOCK_R": 64, "BLOCK_K": 64, "SPLIT_K": 1 if prompt else 8, "UPCAST": False},
            aligned_ints=("K",),
        ),
        Variant(
            f"lora_expand {dtype} {kind}",
            "pageserve_kernels.lora_expand:_lora_expand_kernel",
            {"s_ptr": "*fp32", "b_ptr": f"*{t}", "out_ptr": f"*{t}", "slices_ptr": "*i32", **index_ptrs},
            {"NUM_SLICES": 3, "BLOCK_M": rows, "BLOCK_N": 64, "BLOCK_R": 16, "B_PADDED": True, "UPCAST": False,
             "EXACT_BF16": False},
            aligned_ints=("N", "RB"),
        ),
    ]


def variants(quick: bool) -> list[Variant]:
    if quick:
        return [
            attention_variant("float16", 128, 4, True, 8),
            attention_variant("bfloat16", 64, 3, False, 1),
            *other_variants("bfloat16"),
            *lora_variants("bfloat16", prompt=False),
        ]
    out = []
    for dtype in DTYPE:
        for hd in (64, 128, 80, 256):
            for group in (1, 4, 7):
                out.append(attention_variant(dtype, hd, group, True, 1))
                out.append(attention_variant(dtype, hd, group, True, 8))
                out.append(attention_variant(dtype, hd, group, False, 1))
        out.append(attention_variant(dtype, 128, 4, True, 8, bs=32))
        out.append(attention_variant(dtype, 64, 3, False, 1, bs=32))
        out.extend(other_variants(dtype))
        out.extend(lora_variants(dtype, prompt=False) + lora_variants(dtype, prompt=True))
    return out


@dataclass(frozen=True)
class Compiled:
    shared_bytes: int
    async_16b_copies: int


def compile_variant(v: Variant, arch: int) -> Compiled:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = v.kernel.split(":")
    fn = getattr(importlib.import_module(module), name)
    signature = {}
    for arg in fn.arg_names:
        if arg in v.constexprs:
            signature[arg] = "constexpr"
        elif arg in v.ptr_types:
            signature[arg] = v.ptr_types[arg]
        else:
            signature[arg] = "fp32" if arg in v.float_args else "i32"
    # A real launch proves 16-byte alignment of pointers and fixed strides; the runtime values the
    # kernel marks do_not_specialize (batch size, split count, table width) get no such hint.
    loose = set(getattr(fn, "do_not_specialize", ()))
    loose |= {fn.arg_names[i] for i in loose if isinstance(i, int)}
    aligned = [a for a in fn.arg_names
               if (a in v.ptr_types or a.startswith("stride_") or a in v.aligned_ints) and a not in loose]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn, signature, v.constexprs, attrs)
    options = {"num_warps": v.num_warps, "num_stages": v.num_stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    ptx = kernel.asm["ptx"]
    return Compiled(kernel.metadata.shared, ptx.count("cp.async.cg.shared.global"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.kernels_aot", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90: H100/H200)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter never compiles", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    failures = 0
    for v in variants(args.quick):
        try:
            c = compile_variant(v, args.arch)
        except Exception as exc:  # report every broken variant, not just the first
            failures += 1
            print(f"FAIL {v.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        slow = v.wants_async_kv and c.async_16b_copies == 0
        failures += slow
        note = "  NOT PIPELINED: K/V loads are not 16-byte async copies" if slow else ""
        print(f"ok   {v.name}: {c.shared_bytes} B shared, {c.async_16b_copies} 16B async copies{note}")
    print(f"{failures} failure(s) for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
