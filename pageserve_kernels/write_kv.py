"""Write this step's new keys and values into their cache slots.

Same contract as `pageserve_kernels.reference.write_kv_ref`: token t goes to slot
slot_mapping[t] = block * block_size + offset; a slot of -1 marks a padded
token that is not written. One program per token copies its (n_kv, hd) rows of
K and V, converting to the cache dtype. The inputs may be strided views (the K
and V parts of a fused QKV projection); only the last dimension must be dense.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.bf16 import store_cast
from pageserve_kernels.checks import (
    FLOAT_DTYPES,
    KernelArgError,
    check_device,
    check_dim,
    check_dtype,
    check_int_index,
    check_last_contiguous,
    exact_bf16,
    next_pow2,
)

# The engine passes K and V as views of its fused QKV rows, the warm-up dense tensors: token
# strides differ between them but are read once per program, so they get no specialisation.
WRITE_KV_DO_NOT_SPECIALIZE = ("stride_kt", "stride_vt")


@triton.jit(do_not_specialize=WRITE_KV_DO_NOT_SPECIALIZE)
def _write_kv_kernel(
    key_ptr,  # (T, n_kv, hd)
    value_ptr,
    key_cache_ptr,  # (num_blocks, block_size, n_kv, hd)
    value_cache_ptr,
    slot_mapping_ptr,  # (T,)
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    BLOCK_SIZE: tl.constexpr,
    N_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    i = tl.arange(0, TILE)  # flat (head, dim) index
    head = i // HEAD_DIM
    d = i % HEAD_DIM
    ok = i < N_KV * HEAD_DIM
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + d, mask=ok)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + d, mask=ok)
    k_dst = key_cache_ptr + block * stride_kcb + offset * stride_kcs + head * stride_kch + d
    v_dst = value_cache_ptr + block * stride_vcb + offset * stride_vcs + head * stride_vch + d
    cache_dtype = key_cache_ptr.dtype.element_ty
    tl.store(k_dst, store_cast(k, cache_dtype, EXACT_BF16), mask=ok)
    tl.store(v_dst, store_cast(v, cache_dtype, EXACT_BF16), mask=ok)


def write_kv(
    key: torch.Tensor,  # (T, n_kv, hd)
    value: torch.Tensor,  # (T, n_kv, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int32/int64; -1 = do not write
) -> None:
    check_dim("key", key, 3)
    check_dim("key_cache", key_cache, 4)
    check_int_index("slot_mapping", slot_mapping, 1)
    if value.shape != key.shape:
        raise KernelArgError("value", f"shape {tuple(value.shape)} != key {tuple(key.shape)}")
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        raise KernelArgError("value_cache", "shape/dtype differ from key_cache")
    if key.shape[1:] != key_cache.shape[2:]:
        raise KernelArgError(
            "key", f"(n_kv, hd) {tuple(key.shape[1:])} != cache {tuple(key_cache.shape[2:])}"
        )
    if slot_mapping.shape[0] != key.shape[0] or not slot_mapping.is_contiguous():
        raise KernelArgError("slot_mapping", f"need {key.shape[0]} contiguous entries")
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_contiguous(name, t)
        check_device(name, t)
        if t.device != key_cache.device:
            raise KernelArgError(name, f"on {t.device}, key_cache on {key_cache.device}")
    if slot_mapping.device != key_cache.device:
        raise KernelArgError("slot_mapping", f"on {slot_mapping.device}, key_cache on {key_cache.device}")
    num_tokens, n_kv, head_dim = key.shape
    if num_tokens == 0:
        return
    tile = next_pow2(n_kv * head_dim)
    _write_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        BLOCK_SIZE=key_cache.shape[1], N_KV=n_kv, HEAD_DIM=head_dim, TILE=tile,
        EXACT_BF16=exact_bf16(key_cache.dtype) and key.dtype != key_cache.dtype,
        num_warps=4 if tile <= 1024 else 8,
    )  # fmt: skip
