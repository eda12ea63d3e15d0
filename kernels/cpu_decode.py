"""Decode attention over the paged KV cache in C: one pass over the K/V bytes, no gather.

Part of the CPU attention path (kernels/cpu_attention.py uses it for decode rows).
A decode query attends to every token of its request, and at serving batch
sizes that read is the step's memory traffic: PyTorch alone must gather the
blocks into a padded copy first (read, write, read again). This kernel walks
each request's block table and reads K and V in place; OpenMP spreads the
(request, KV head) pairs over the threads torch uses; float32 and bfloat16.

    for each (request b, kv head h):            q heads h*grp .. h*grp+grp-1 share K/V head h
        scores[g, s] = q[g] . K[table[s // bs], s % bs, h] * scale
        p = softmax(scores[g, :seq_len])        (max-subtracted, in float32)
        out[g] = sum_s p[g, s] * V[table[s // bs], s % bs, h]

The source is compiled on first use (kernels/native_build.py); without a
compiler, or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and callers
keep the pure-PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess

import torch

from kernels import native_build

log = logging.getLogger("pageserve.kernels")

MAX_GROUP, MAX_HEAD_DIM = 16, 256
SUPPORTED = (torch.float32, torch.bfloat16)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#define MAX_GROUP 16
#define MAX_HD 256

/* One (request, kv head): the group of query heads sharing it attends to seq_len tokens. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE)                                                          \
void NAME(const T* q, const T* kc, const T* vc, T* out, const int64_t* rows,                          \
          const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,          \
          int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int64_t max_seq,            \
          int nthreads, int64_t q_stride) {                                                           \
    const int64_t grp = n_q / n_kv;                                                                   \
    _Pragma("omp parallel num_threads(nthreads)")                                                     \
    {                                                                                                 \
        float* scores = (float*)malloc(sizeof(float) * grp * (max_seq > 0 ? max_seq : 1));            \
        float qf[MAX_GROUP][MAX_HD];                                                                  \
        float acc[MAX_GROUP][MAX_HD];                                                                 \
        _Pragma("omp for collapse(2) schedule(dynamic, 1)")                                           \
        for (int64_t b = 0; b < n_req; b++) {                                                         \
            for (int64_t h = 0; h < n_kv; h++) {                                                      \
                const int64_t S = seq_lens[b];                                                        \
                const int64_t* table = tables + b * max_blocks;                                       \
                const int64_t row = rows[b];                                                          \
                for (int64_t g = 0; g < grp; g++)                                                     \
                    for (int64_t d = 0; d < hd; d++)                                                  \
                        qf[g][d] = LOAD(q[row * q_stride + (h * grp + g) * hd + d]) * scale;       \
                for (int64_t s0 = 0; s0 < S; s0 += bs) {                                              \
                    const T* kb = kc + (table[s0 / bs] * bs * n_kv + h) * hd;                         \
                    const int64_t n = S - s0 < bs ? S - s0 : bs;                                      \
                    for (int64_t i = 0; i < n; i++) {                                                 \
                        const T* k = kb + i * n_kv * hd;                                              \
                        for (int64_t g = 0; g < grp; g++) {                                           \
                            float dot = 0.f;                                                          \
                            _Pragma("omp simd reduction(+:dot)")                                      \
                            for (int64_t d = 0; d < hd; d++) dot += qf[g][d] * LOAD(k[d]);            \
                            scores[g * S + s0 + i] = dot;                                             \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
                float inv_sum[MAX_GROUP];                                                             \
                for (int64_t g = 0; g < grp; g++) {                                                   \
                    float* sc = scores + g * S;                                                       \
                    float m = sc[0];                                                                  \
                    for (int64_t s = 1; s < S; s++) m = sc[s] > m ? sc[s] : m;                        \
                    float sum = 0.f;                                                                  \
                    _Pragma("omp simd reduction(+:sum)")                                              \
                    for (int64_t s = 0; s < S; s++) { sc[s] = expf(sc[s] - m); sum += sc[s]; }        \
                    inv_sum[g] = 1.f / sum;                                                           \
                    for (int64_t d = 0; d < hd; d++) acc[g][d] = 0.f;                                 \
                }                                                                                     \
                for (int64_t s0 = 0; s0 < S; s0 += bs) {                                              \
                    const T* vb = vc + (table[s0 / bs] * bs * n_kv + h) * hd;                         \
                    const int64_t n = S - s0 < bs ? S - s0 : bs;                                      \
                    for (int64_t i = 0; i < n; i++) {                                                 \
                        const T* v = vb + i * n_kv * hd;                                              \
                        for (int64_t g = 0; g < grp; g++) {                                           \
                            const float p = scores[g * S + s0 + i];                                   \
                            _Pragma("omp simd")                                                       \
                            for (int64_t d = 0; d < hd; d++) acc[g][d] += p * LOAD(v[d]);             \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
                for (int64_t g = 0; g < grp; g++)                                                     \
                    for (int64_t d = 0; d < hd; d++)                                                  \
                        out[(row * n_q + h * grp + g) * hd + d] = STORE(acc[g][d] * inv_sum[g]);      \
            }                                                                                         \
        }                                                                                             \
        free(scores);                                                                                 \
    }                                                                                                 \
}

#define ID(x) (x)
DEFINE_DECODE(paged_decode_f32, float, ID, ID)
DEFINE_DECODE(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)

int paged_decode_limits(int64_t* max_group, int64_t* max_hd) {
    *max_group = MAX_GROUP;
    *max_hd = MAX_HD;
    return 0;
}
"""


class NativeDecode:
    """ctypes bindings of the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        argtypes = [p, p, p, p, p, p, i, p, i, i, i, i, i, ctypes.c_float, i, ctypes.c_int, i]
        self._fns = {}
        for dtype, name in ((torch.float32, "paged_decode_f32"), (torch.bfloat16, "paged_decode_bf16")):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, argtypes
            self._fns[dtype] = fn

    def __call__(
        self,
        out: torch.Tensor,  # (T, n_q, hd) contiguous; rows `rows` are written
        query: torch.Tensor,  # (T, n_q, hd), heads contiguous (rows may be strided: a slice of q|k)
        key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd) contiguous
        value_cache: torch.Tensor,
        rows: torch.Tensor,  # (D,) int64: the decode rows
        block_tables: torch.Tensor,  # (D, max_blocks) int64 contiguous
        seq_lens: torch.Tensor,  # (D,) int64
        max_seq_len: int,
        scale: float,
    ) -> None:
        n_q, hd = query.shape[1], query.shape[2]
        bs, n_kv = key_cache.shape[1], key_cache.shape[2]
        assert query.dtype == key_cache.dtype == value_cache.dtype == out.dtype and query.dtype in SUPPORTED
        assert query.stride(2) == 1 and query.stride(1) == hd
        assert out.is_contiguous() and key_cache.is_contiguous()
        assert value_cache.is_contiguous() and block_tables.is_contiguous()
        assert n_q % n_kv == 0 and n_q // n_kv <= MAX_GROUP and hd <= MAX_HEAD_DIM
        self._fns[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), out.data_ptr(), rows.data_ptr(),
            block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(), rows.shape[0], n_q, n_kv, hd, bs,
            scale, max_seq_len, torch.get_num_threads(), query.stride(0),
        )


@functools.cache
def load() -> NativeDecode | None:
    """The compiled kernel, or None when disabled or no C compiler works here."""
    if not native_build.enabled():
        return None
    try:
        return NativeDecode(native_build.load_library("paged_decode", SOURCE))
    except (OSError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        log.warning("native decode attention unavailable (%s); using the PyTorch path", exc)
        return None
