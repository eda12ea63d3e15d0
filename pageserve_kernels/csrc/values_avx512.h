/* P . V in AVX-512 tiles, the one loop both attention kernels weigh values with: paged_decode.c (through
   decode_avx512.h) over a block of the paged pool, float32 or bfloat16 widened as it is loaded;
   prefill_attention.c over a block of keys already widened into its scratch. Included where the build has
   AVX-512F. Every sum runs in float32 on the float32 probabilities (not _mm512_dpbf16_ps on pairs of tokens:
   that rounds the probabilities to bfloat16, and the tests hold both kernels to the float32 attention of
   the cached values). */
#ifndef PAGESERVE_VALUES_AVX512_H
#define PAGESERVE_VALUES_AVX512_H

#include <immintrin.h>

#include "bf16_elem.h"
#include "line_run.h" /* the decode kernel's prefetches, asked a few per key */

/* Sixteen values from element i of p: float32, or bfloat16 widened (a shift into the high half). */
INLINE __m512 load16(const void* p, int64_t i, int bf16) {
    if (bf16) {
        const __m256i h = _mm256_loadu_si256((const __m256i*)((const uint16_t*)p + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float*)p + i);
}

/* o[r, d0 : d0 + 16 W] += sum_k p[r, k] V[k, d0 : d0 + 16 W], r < MR, k < n: p rows p_stride apart, V rows
   v_stride elements apart, o rows hd apart. MR x W accumulators (6 x 4 = 24 of the 32 registers): each V
   row loaded once feeds MR rows, and each broadcast probability W vectors. `ahead` (NULL: none): lines to ask
   for, spread over the n keys (line_run.h). On an AMD EPYC Zen 4, whose
   512-bit FMAs issue as two 256-bit halves, this only matches an AVX2 tile of 6 x 2 eight-lane vectors
   (prompt P . V runs at ~200 GFLOP/s on 2 cores either way, the FMA units' peak there); cores with two
   512-bit FMA ports (Intel Xeon) do twice its multiply-adds a cycle. */
INLINE void values_tile(const int MR, const int W, const float* restrict p, int64_t p_stride, const void* restrict v,
                        int64_t v_stride, int bf16, int64_t n, float* restrict o, int64_t hd, int64_t d0,
                        LineRun* ahead) {
    const int64_t per_key = lines_per_step(ahead, n);
    __m512 c[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) c[r][w] = _mm512_loadu_ps(o + r * hd + d0 + 16 * w);
    for (int64_t k = 0; k < n; k++) {
        if (per_key) ask_lines(ahead, per_key);
        __m512 b[4];
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) b[w] = load16(v, k * v_stride + d0 + 16 * w, bf16);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m512 x = _mm512_set1_ps(p[r * p_stride + k]);
#pragma GCC unroll 4
            for (int w = 0; w < W; w++) c[r][w] = _mm512_fmadd_ps(x, b[w], c[r][w]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) _mm512_storeu_ps(o + r * hd + d0 + 16 * w, c[r][w]);
}

/* Columns d0 .. d0 + 16 W of every row, six rows a tile (constant tile shapes keep c in registers). */
INLINE void values_columns(const int W, int64_t rows, const float* p, int64_t p_stride, const void* v,
                           int64_t v_stride, int bf16, int64_t n, float* o, int64_t hd, int64_t d0, LineRun* ahead) {
    for (int64_t r = 0; r < rows; r += 6, p += 6 * p_stride, o += 6 * hd) {
#define VALUES_TILE(MR) values_tile(MR, W, p, p_stride, v, v_stride, bf16, n, o, hd, d0, ahead)
        switch (rows - r < 6 ? rows - r : 6) {
            case 6: VALUES_TILE(6); break;
            case 5: VALUES_TILE(5); break;
            case 4: VALUES_TILE(4); break;
            case 3: VALUES_TILE(3); break;
            case 2: VALUES_TILE(2); break;
            default: VALUES_TILE(1); break;
        }
#undef VALUES_TILE
    }
}

/* o[r] += p[r, 0:n] . V[0:n] for r < rows (one block of keys); hd a multiple of 16. The first tile spends
   `ahead` (NULL: none). */
INLINE void weigh_block_512(int64_t rows, const float* p, int64_t p_stride, const void* v, int64_t v_stride, int bf16,
                            int64_t n, float* o, int64_t hd, LineRun* ahead) {
    int64_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) values_columns(4, rows, p, p_stride, v, v_stride, bf16, n, o, hd, d0, ahead);
    switch ((hd - d0) / 16) {
        case 3: values_columns(3, rows, p, p_stride, v, v_stride, bf16, n, o, hd, d0, ahead); break;
        case 2: values_columns(2, rows, p, p_stride, v, v_stride, bf16, n, o, hd, d0, ahead); break;
        case 1: values_columns(1, rows, p, p_stride, v, v_stride, bf16, n, o, hd, d0, ahead); break;
        default: break;
    }
}

#endif
