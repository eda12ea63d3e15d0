"""The elementwise ops of a Llama layer in C, one pass each: add + RMSNorm, SiLU-and-mul, rotary.

Part of the CPU forward pass (pageserve_kernels/fused_ops.py picks these or the PyTorch
references). In PyTorch each of these ops is several kernels, each reading and
writing a (T, H)-sized temporary; here each is one loop over the rows, which
OpenMP spreads over the threads torch uses. float32 only.

    add_rms_norm   residual += x;  x = residual * rsqrt(mean(residual^2) + eps) * w     (in place)
    rms_norm       out = x * rsqrt(mean(x^2) + eps) * w
    silu_and_mul   out = silu(gate_up[:, :I]) * gate_up[:, I:]
    rotary         qk = qk * [cos|cos] + [x2|x1] * [-sin|sin]                          (in place)
    argmax         out[n] = first index of max(x[n]), as torch.argmax (greedy sampling: a
                   vectorised max, where ATen's argmax compares one element at a time)
    exact_logits   bfloat16 logits -> float32, each row's values within one ulp of its max recomputed
                   as float32 products (engine/worker/layers/exact_logits.py; bfloat16 library only)
    store_kv       key_cache[slots[t]] = key[t], value_cache[slots[t]] = value[t]: a byte copy
                   (any dtype), for pageserve_kernels/cpu_attention.py's store_kv

Results are meant to equal PyTorch's bit for bit on an AVX2 CPU, so that the
fused path changes no greedy token: the sum of squares follows the order of
ATen's vectorized sum (8-wide, see `sum_squares`), SiLU uses the same exp as
ATen (SLEEF's expf_u10), and nothing is contracted into an FMA that PyTorch
computes as a separate multiply and add (hence our own FLAGS).

The source (pageserve_kernels/csrc/fused_ops.c) is compiled on first use (pageserve_kernels/native_build.py); without a
compiler, or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from pageserve_kernels import native_build

FLAGS = native_build.EXACT_FLAGS  # no FMA contraction or reassociation: results as PyTorch's



class NativeFused:
    """ctypes bindings of one compiled library of these ops (float32 here, bfloat16 in
    pageserve_kernels/cpu_fused_bf16.py: the same C signatures, named `<op>_<suffix>`);
    each call checks shapes, strides and dtypes first. `dtype` is the model's (weights and
    activations); the residual stream and the rotary tables are float32 for every model
    (pageserve_kernels/fused_reference.py says why)."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype = torch.float32, suffix: str = "f32") -> None:
        p, i, f, n = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        signatures = {
            "rms_norm": [p, i, p, p, i, i, f, n],
            "add_rms_norm": [p, p, p, i, i, f, n],
            "silu_and_mul": [p, i, p, i, i, n],
            "rotary": [p, i, p, p, i, i, i, i, n],
            "argmax_rows": [p, i, i, i, p, n],  # float32 only
            "exact_logits": [p, i, p, i, p, i, p, i, i, i, n, i, n],  # bfloat16 only
        }
        self.dtype = dtype
        self._fn: dict[str, Callable[..., None]] = {}
        for name, argtypes in signatures.items():
            fn = getattr(lib, f"{name}_{suffix}", None)
            if fn is not None:
                fn.restype, fn.argtypes = None, argtypes
                self._fn[name] = fn
        store = getattr(lib, "store_kv_rows", None)  # a byte copy: in the float32 library only, for every dtype
        if store is not None:
            store.restype, store.argtypes = i, [p, i, p, i, p, p, p, i, i, i]
            self._fn["store_kv"] = store

    def address(self, op: str) -> int:
        """The C function of `op` (0 where this build lacks it), for pageserve_kernels/csrc/llama_layers.cpp."""
        fn = self._fn.get(op)
        return 0 if fn is None else native_build.address(fn)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # (T, H) -> (T, H)
        """x: the float32 residual stream; the output is in the model dtype."""
        t, h = x.shape
        self._check_rows(x, weight, torch.float32)
        out = torch.empty((t, h), dtype=self.dtype)
        self._fn["rms_norm"](x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), t, h, eps, _threads())
        return out

    def add_rms_norm_(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        """residual += x; x = rms_norm(residual) * weight; both (T, H) contiguous, overwritten;
        x in the model dtype, residual float32."""
        self._check_rows(x, weight, self.dtype)
        assert x.is_contiguous() and residual.is_contiguous() and residual.shape == x.shape
        assert residual.dtype == torch.float32
        t, h = x.shape
        self._fn["add_rms_norm"](x.data_ptr(), residual.data_ptr(), weight.data_ptr(), t, h, eps, _threads())

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # (T, 2 I) -> (T, I)
        t, two_i = gate_up.shape
        assert gate_up.dtype == self.dtype and gate_up.stride(1) == 1 and two_i % 2 == 0
        out = torch.empty((t, two_i // 2), dtype=gate_up.dtype)
        self._fn["silu_and_mul"](gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), t, two_i // 2, _threads())
        return out

    def rotary_(self, qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> None:
        """qk (T, heads, hd), heads contiguous, rotated in place; cos, sin_signed (T, 1, hd) or (T, hd), float32."""
        t, heads, hd = qk.shape
        assert qk.dtype == self.dtype and cos.dtype == sin_signed.dtype == torch.float32 and hd % 2 == 0
        assert qk.stride(2) == 1 and qk.stride(1) == hd
        # Read in place (no reshape: two views a layer): a row of hd values, rows stride(0) apart.
        assert cos.shape[0] == sin_signed.shape[0] == t and cos.shape[-1] == sin_signed.shape[-1] == hd
        assert cos.stride(-1) == sin_signed.stride(-1) == 1 and cos.stride(0) == sin_signed.stride(0)
        assert cos.numel() == sin_signed.numel() == t * hd
        self._fn["rotary"](qk.data_ptr(), qk.stride(0), cos.data_ptr(), sin_signed.data_ptr(), cos.stride(0), t,
                           heads, hd, _threads())

    @property
    def has_argmax(self) -> bool:
        return "argmax_rows" in self._fn

    def argmax(self, x: torch.Tensor) -> torch.Tensor:  # (N, V) -> (N,) int64
        n, v = x.shape
        assert self.has_argmax and x.dtype == torch.float32 and x.stride(1) == 1 and v > 0
        out = torch.empty(n, dtype=torch.int64)
        self._fn["argmax_rows"](x.data_ptr(), x.stride(0), n, v, out.data_ptr(), _threads())
        return out

    @property
    def has_exact_logits(self) -> bool:
        return "exact_logits" in self._fn

    def exact_logits(self, logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bits: int,
                     k: int) -> torch.Tensor:
        """fused_reference.exact_logits_reference in one pass: (N, V) in this dtype -> (N, V) float32."""
        n, v = logits.shape
        h = hidden.shape[1]
        assert self.has_exact_logits and logits.dtype == hidden.dtype == weight.dtype == self.dtype
        assert logits.stride(1) == hidden.stride(1) == weight.stride(1) == 1 and k > 0
        assert hidden.shape[0] == n and weight.shape == (v, h)
        out = torch.empty((n, v), dtype=torch.float32)
        self._fn["exact_logits"](logits.data_ptr(), logits.stride(0), hidden.data_ptr(), hidden.stride(0),
                                 weight.data_ptr(), weight.stride(0), out.data_ptr(), n, v, h, bits, k, _threads())
        return out

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slots: torch.Tensor) -> bool:
        """key, value (T, n_kv, hd) -> rows `slots` (T,) int64 of the caches (num_blocks, block_size, n_kv, hd).
        False, having written nothing, where the layouts do not fit this copy (the caller uses torch's);
        IndexError for a slot outside the cache, as index_copy_."""
        fn = self._fn.get("store_kv")
        row = key_cache.shape[2:]
        if (fn is None or key.dim() != 3 or key.shape[1:] != row or value.shape != key.shape
                or not (key.dtype == value.dtype == key_cache.dtype == value_cache.dtype)
                or key.stride(2) != 1 or key.stride(1) != row[1] or value.stride(2) != 1 or value.stride(1) != row[1]
                or not (key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.shape == value_cache.shape)
                or slots.dtype != torch.int64 or slots.dim() != 1 or slots.stride(0) != 1 or slots.shape[0] != key.shape[0]
                or not (key.is_cpu and value.is_cpu and key_cache.is_cpu and slots.is_cpu)):
            return False
        size = key.element_size()
        num_slots = key_cache.shape[0] * key_cache.shape[1]
        bad = fn(key.data_ptr(), key.stride(0) * size, value.data_ptr(), value.stride(0) * size, key_cache.data_ptr(),
                 value_cache.data_ptr(), slots.data_ptr(), key.shape[0], row.numel() * size, num_slots)
        if bad:
            raise IndexError(f"{bad} KV cache slots outside [0, {num_slots})")
        return True

    def _check_rows(self, x: torch.Tensor, weight: torch.Tensor, x_dtype: torch.dtype) -> None:
        assert x.dtype == x_dtype and weight.dtype == self.dtype and x.dim() == 2 and x.stride(1) == 1
        assert weight.is_contiguous() and weight.shape == (x.shape[1],)


def _threads() -> int:
    return torch.get_num_threads()


@functools.cache
def load() -> NativeFused | None:
    """The compiled kernels, or None when disabled or no C compiler works here."""
    lib = native_build.try_load_kernel("fused_ops", FLAGS)
    return None if lib is None else NativeFused(lib)
