/* The AVX-512 loops of the decode attention kernel (paged_decode.c includes this file; only there).

   Compiled where the host has AVX-512F+BW (the kernels are built with -march=native on the host that
   runs them): 16 float32 lanes, 32 registers. Scores take 16 tokens at a time, one vector of partial
   products per token, then one reduction tree turns the 16 vectors into the 16 scores. The
   bfloat16 products come in two kinds:
     split   a 32-value K vector is widened into its even and odd halves (a shift, an and) and
             multiplied in float32 by the query split the same way (the query stays float32)
     dp      AVX512-BF16's _mm512_dpbf16_ps takes the bfloat16 query and K directly: one
             instruction for 32 products, float32 accumulation; the scale is applied to the sums
   The weighted sum over V is values_avx512.h's, shared with the prompt kernel: each bfloat16 row
   widened once feeds the group's query heads, 64 columns (four registers) at a time. */
#ifndef PAGESERVE_DECODE_AVX512_H
#define PAGESERVE_DECODE_AVX512_H

#include <immintrin.h>

#include "values_avx512.h" /* weigh_block_512: the weighted sum over V */
#include "exp16_avx512.h"

/* Sixteen vectors -> one vector whose lane j is the sum of v[j]'s lanes. */
INLINE __m512 hsum16(const __m512* v) {
    __m512 a[8], b[4], c[2];
    for (int j = 0; j < 8; j++)  /* halves of 256 bits: lanes 0-7 from v[2j], 8-15 from v[2j+1] */
        a[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; j++)  /* quarter k: four partial sums of v[4j + k] */
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int j = 0; j < 2; j++)  /* quarter k: two partial sums of v[8j + k], then two of v[8j + 4 + k] */
        c[j] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * j], b[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * j], b[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4k + m holds the sum of v[k + 4m]: put it back in lane k + 4m */
    const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, d);
}

/* acc + one step of a query head . token product at column d: 16 values (DOT_F32) or 32 (bfloat16).
   q: DOT_F32 float32 (scaled); DOT_BF16_SPLIT float32 (scaled), each 32 values stored as 16 even
   then 16 odd; DOT_BF16_DP the query's own bfloat16 values (unscaled). */
INLINE __m512 dot_step(__m512 acc, const void* q, const void* k, int64_t d, int mode) {
    if (mode == DOT_F32)
        return _mm512_fmadd_ps(_mm512_loadu_ps((const float*)q + d), _mm512_loadu_ps((const float*)k + d), acc);
    const __m512i kv = _mm512_loadu_si512((const uint16_t*)k + d);
#ifdef __AVX512BF16__
    if (mode == DOT_BF16_DP)
        return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512((const uint16_t*)q + d), (__m512bh)kv);
#endif
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(kv, 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(kv, _mm512_set1_epi32((int)0xFFFF0000u)));
    acc = _mm512_fmadd_ps(_mm512_loadu_ps((const float*)q + d), even, acc);
    return _mm512_fmadd_ps(_mm512_loadu_ps((const float*)q + d + 16), odd, acc);
}

#define DOT_COLUMNS(mode) ((mode) == DOT_F32 ? 16 : 32) /* columns of hd one dot_step takes */

/* Partial products of one query head with one token's K (hd values), summed across steps only. */
INLINE __m512 token_dot(const void* q, const void* k, int64_t hd, int mode) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += DOT_COLUMNS(mode)) acc = dot_step(acc, q, k, d, mode);
    return acc;
}

/* scores[g, s0 + i] = q_g . K[token i of the block] (times `post`), i < n; `k` points at token 0, head h.
   `q` holds grp heads of hd values in dot_step's layout (q_elem bytes each). Sixteen tokens at a
   time, columns in the outer loop: sixteen independent accumulator chains (token_dot's one chain
   of dependent FMAs per token, sixteen times over, left the FMA units waiting on their latency:
   with the K/V in cache, ~10% slower on an AMD EPYC Zen 4). `ahead`: lines to ask for, a few at each step
   over the columns (line_run.h); what a partial block leaves, at its end. */
INLINE void block_scores_512(const void* q, int64_t q_elem, const void* k, int64_t tok_stride, int64_t n,
                             int64_t grp, int64_t hd, float* scores, int64_t S, int64_t s0, float post, int mode,
                             LineRun* ahead) {
    const int64_t k_elem = mode == DOT_F32 ? 4 : 2;
    const int64_t per_step = lines_per_step(ahead, grp * (hd / DOT_COLUMNS(mode)));
    const char* kb = (const char*)k;
    for (int64_t g = 0; g < grp; g++) {
        const char* qg = (const char*)q + g * hd * q_elem;
        float* out = scores + g * S + s0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m512 v[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) v[t] = _mm512_setzero_ps();
            for (int64_t d = 0; d < hd; d += DOT_COLUMNS(mode)) {
                ask_lines(ahead, per_step);
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) v[t] = dot_step(v[t], qg, kb + (i + t) * tok_stride * k_elem, d, mode);
            }
            _mm512_storeu_ps(out + i, _mm512_mul_ps(hsum16(v), _mm512_set1_ps(post)));
        }
        for (; i < n; i++) out[i] = _mm512_reduce_add_ps(token_dot(qg, kb + i * tok_stride * k_elem, hd, mode)) * post;
    }
    if (ahead) ask_lines(ahead, ahead->left);
}

/* sc[0:S] = exp(sc - m), m the largest of sc and `floor` (a maximum already seen: -INFINITY for none), put in
   *m_out; returns the sum. paged_decode.c's softmax_row sixteen lanes wide (exp16 takes the same steps as its
   exp8, lane for lane). */
INLINE float softmax_row_512(float* sc, int64_t S, float floor, float* m_out) {
    const int64_t full = S / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (S - full)) - 1u);
    __m512 mv = _mm512_set1_ps(floor);
    for (int64_t s = 0; s < full; s += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + s));
    mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, sc + full));
    *m_out = _mm512_reduce_max_ps(mv);
    const __m512 m = _mm512_set1_ps(*m_out);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t s = 0; s < full; s += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + s), m));
        _mm512_storeu_ps(sc + s, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sc + full), m)));
    _mm512_mask_storeu_ps(sc + full, tail, e);
    return _mm512_reduce_add_ps(_mm512_add_ps(sum, e));
}

#endif
