/* The pieces of a tile of query rows attending to 16 keys at a time, shared by both attention kernels:
   prefill_attention.c's tiles of prompt tokens, and paged_decode.c's tiles of decode rows over the blocks
   every request of a batch shares (a common system prompt). Keys gathered from the paged cache by slot into
   a transposed scratch, Q . K^T on it, and the online softmax with conditional rescaling. Requires AVX2 and
   FMA; the AVX-512 and AVX512-BF16 paths where the build has them. */
#ifndef PAGESERVE_ATTEND_TILES_H
#define PAGESERVE_ATTEND_TILES_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_elem.h"
#include "exp8_avx2.h"
#if defined(__AVX512F__)
#include "exp16_avx512.h"

/* The first n of sixteen lanes (all of them from 16 on). */
INLINE __mmask16 first_lanes(int64_t n) { return (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u); }
#endif

/* How far a block's scores may rise above the row's running maximum before it is moved: exp(score -
   maximum) then stays below e^8 (~3,000), harmless in float32, and a block that does not exceed it
   (after the first, nearly all of them) costs one vector compare instead of a horizontal maximum and
   a rescale of the row's output (FlashAttention-4's conditional rescaling). The result is the same
   softmax: every exp and the sum share the one maximum they were taken against. */
#define RESCALE_ABOVE 8.0f

/* A new running maximum bm for one row: its output o and partial sums rescaled to it. */
INLINE void move_maximum(float bm, float *restrict mx, float *restrict sums, float *restrict o, int64_t hd) {
    const float alpha = expf(*mx - bm); /* 0 on the first block */
    for (int64_t d = 0; d < hd; d++) o[d] *= alpha;
    for (int j = 0; j < 16; j++) sums[j] *= alpha;
    *mx = bm;
}

/* One row's block of 16 scores sr (keys before `lo` and from `seen` on masked: lo > 0 only for a sliding
   window's first block) into the online softmax: sr becomes exp(score - max), zero where masked, and is
   added lane by lane to the row's 16 partial sums. Needs lo < seen. */
INLINE void online_softmax(float *restrict sr, int64_t lo, int64_t seen, float *restrict mx, float *restrict sums,
                           float *restrict o, int64_t hd) {
#if defined(__AVX512F__)
    const __mmask16 valid = first_lanes(seen) & (__mmask16)~first_lanes(lo);
    const __m512 v = _mm512_loadu_ps(sr);
    if (_mm512_mask_cmp_ps_mask(valid, v, _mm512_set1_ps(*mx + RESCALE_ABOVE), _CMP_GT_OQ))
        move_maximum(_mm512_mask_reduce_max_ps(valid, v), mx, sums, o, hd);
    const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(v, _mm512_set1_ps(*mx))));
    _mm512_storeu_ps(sr, e);
    _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_loadu_ps(sums), e));
#else
    const __m256 n = _mm256_set1_ps((float)seen), lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 first = _mm256_set1_ps((float)lo), lanes8 = _mm256_add_ps(lanes, _mm256_set1_ps(8.f));
    const __m256 valid[2] = {_mm256_and_ps(_mm256_cmp_ps(lanes, n, _CMP_LT_OQ), _mm256_cmp_ps(lanes, first, _CMP_GE_OQ)),
                             _mm256_and_ps(_mm256_cmp_ps(lanes8, n, _CMP_LT_OQ), _mm256_cmp_ps(lanes8, first, _CMP_GE_OQ))};
    const __m256 v[2] = {_mm256_loadu_ps(sr), _mm256_loadu_ps(sr + 8)}, above = _mm256_set1_ps(*mx + RESCALE_ABOVE);
    if (_mm256_movemask_ps(_mm256_and_ps(valid[0], _mm256_cmp_ps(v[0], above, _CMP_GT_OQ))) |
        _mm256_movemask_ps(_mm256_and_ps(valid[1], _mm256_cmp_ps(v[1], above, _CMP_GT_OQ)))) {
        float bm = sr[lo];
        for (int64_t j = lo + 1; j < seen; j++) bm = sr[j] > bm ? sr[j] : bm;
        move_maximum(bm, mx, sums, o, hd);
    }
    const __m256 m = _mm256_set1_ps(*mx);
    for (int h = 0; h < 2; h++) { /* masked and missing keys become 0 */
        const __m256 e = _mm256_and_ps(valid[h], exp8(_mm256_sub_ps(v[h], m)));
        _mm256_storeu_ps(sr + 8 * h, e);
        _mm256_storeu_ps(sums + 8 * h, _mm256_add_ps(_mm256_loadu_ps(sums + 8 * h), e));
    }
#endif
}

#define DP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#if defined(__AVX512F__)
#define DP_DECL(i) __m512 a##i = _mm512_setzero_ps();
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define HAVE_DPBF16 1
/* s[r][0:16] = scale * sum_p qb[r][p] . kt2[p], r < rows: pairs of bfloat16 (p < pairs) multiplied
   and summed in float32 by AVX512-BF16's dot product, sixteen keys per instruction; eight rows at a
   time keep eight independent accumulation chains in flight. */
static void scores_dpbf16(int64_t rows, const uint32_t *restrict qb, int64_t pairs, const uint32_t *restrict kt2,
                          float scale, float *restrict s) {
    const __m512 sc = _mm512_set1_ps(scale);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        DP_ROWS(DP_DECL)
        for (int64_t p = 0; p < pairs; p++) {
            const __m512bh k = (__m512bh)_mm512_loadu_si512(kt2 + p * 16);
#define DP_FMA(i) a##i = _mm512_dpbf16_ps(a##i, (__m512bh)_mm512_set1_epi32((int)qb[(r + i) * pairs + p]), k);
            DP_ROWS(DP_FMA)
        }
#define DP_STORE(i) _mm512_storeu_ps(s + (r + i) * 16, _mm512_mul_ps(a##i, sc));
        DP_ROWS(DP_STORE)
    }
    for (; r < rows; r++) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t p = 0; p < pairs; p++)
            a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int)qb[r * pairs + p]),
                                 (__m512bh)_mm512_loadu_si512(kt2 + p * 16));
        _mm512_storeu_ps(s + r * 16, _mm512_mul_ps(a, sc));
    }
}
#else
#define HAVE_DPBF16 0
#endif

#if defined(__AVX512F__)
/* s[r][0:16] = sum_d qs[r][d] kt[d][0:16], r < rows: float32 queries (scaled) against keys transposed
   (kt, hd x 16), one FMA of sixteen keys a value; eight rows at a time, eight accumulation chains. */
INLINE void scores_f32_512(int64_t rows, const float *restrict qs, int64_t hd, const float *restrict kt,
                           float *restrict s) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        DP_ROWS(DP_DECL)
        for (int64_t d = 0; d < hd; d++) {
            const __m512 k = _mm512_loadu_ps(kt + d * 16);
#define F32_FMA(i) a##i = _mm512_fmadd_ps(_mm512_set1_ps(qs[(r + i) * hd + d]), k, a##i);
            DP_ROWS(F32_FMA)
        }
#define F32_STORE(i) _mm512_storeu_ps(s + (r + i) * 16, a##i);
        DP_ROWS(F32_STORE)
    }
    for (; r < rows; r++) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; d++) a = _mm512_fmadd_ps(_mm512_set1_ps(qs[r * hd + d]), _mm512_loadu_ps(kt + d * 16), a);
        _mm512_storeu_ps(s + r * 16, a);
    }
}

/* r[i] becomes column i of the 16 x 16 matrix of 32-bit values whose rows r held. */
INLINE void transpose16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Sixteen 32-bit values of slot j's row of a cache (K or V) from `col` on (float32: hd values; bfloat16
   widened; dp: bfloat16 pairs, `valid` of them), zero past n. */
INLINE __m512i row_chunk(const void *cache, const int64_t *slots, int64_t j, int64_t n, int64_t hd, int64_t col,
                         __mmask16 valid, int bf16, int dp) {
    if (j >= n) return _mm512_setzero_si512();
    if (dp) return _mm512_maskz_loadu_epi32(valid, (const uint32_t *)((const uint16_t *)cache + slots[j] * hd) + col);
    if (bf16)
        return _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + slots[j] * hd + col))),
            16);
    return _mm512_loadu_si512((const float *)cache + slots[j] * hd + col);
}
#endif

/* Row r of a tile: its query from element `src` of q into the scratch qs (dp: the query's own bfloat16 pairs,
   the scale applied to the sums later; else float32, scaled), and its output, maximum and partial sums reset. */
INLINE void start_row(const void *q, int64_t src, int64_t r, int64_t hd, float scale, float *qs, float *o, float *mx,
                      float *sums, int bf16, int dp) {
    if (dp) memcpy((uint16_t *)qs + r * hd, (const uint16_t *)q + src, hd * sizeof(uint16_t));
    else for (int64_t d = 0; d < hd; d++) qs[r * hd + d] = load1(q, src + d, bf16) * scale;
    memset(o + r * hd, 0, hd * sizeof(float));
    mx[r] = -INFINITY;
    memset(sums + 16 * r, 0, 16 * sizeof(float));
}

/* The cache rows (in units of hd) of keys s0 .. s0+n-1 of KV head h, found through the block table (any
   block size; one division a block of keys, not two a key). */
INLINE void key_slots(const int64_t *table, int64_t s0, int64_t n, int64_t bs, int64_t n_kv, int64_t h,
                      int64_t *slots) {
    int64_t block = s0 / bs, offset = s0 % bs;
    for (int64_t j = 0; j < n; j++) {
        slots[j] = (table[block] * bs + offset) * n_kv + h;
        if (++offset == bs) offset = 0, block++;
    }
}

/* A row's softmax denominator: its sixteen partial sums added. */
INLINE float lanes_sum(const float *sums) {
    float sum = 0.f;
    for (int j = 0; j < 16; j++) sum += sums[j];
    return sum;
}

/* A block's keys (slots[j], j < n) into the tiles' scratch: K transposed, kt[d][j] (dp: bfloat16 pairs,
   kt2[p][j]), zero past n; V as float32 rows vs[j][d]. Sixteen keys at a time by 16 x 16 transposes
   where the build has AVX-512 (the scalar copy took a sixth of the kernel's time). */
INLINE void gather_block(const void *kc, const void *vc, const int64_t *slots, int64_t n, int64_t hd, float *kt,
                         float *vs, int bf16, int dp) {
    const int64_t width = dp ? hd / 2 : hd; /* 32-bit values per key: pairs or floats */
    uint32_t *kt32 = (uint32_t *)kt;
#if defined(__AVX512F__)
    for (int64_t col = 0; col < width; col += 16) {
        const int64_t left = width - col < 16 ? width - col : 16;
        const __mmask16 valid = first_lanes(left);
        __m512i r[16];
        for (int64_t j = 0; j < 16; j++) r[j] = row_chunk(kc, slots, j, n, hd, col, valid, bf16, dp);
        transpose16x16(r);
        for (int64_t i = 0; i < left; i++) _mm512_storeu_si512(kt32 + (col + i) * 16, r[i]);
    }
    for (int64_t j = 0; j < n && dp < 2; j++) /* hd a multiple of 16 (cpu_prefill.supports); AMX (2): prefill_amx.h */
        for (int64_t d = 0; d < hd; d += 16)
            _mm512_storeu_si512(vs + j * hd + d, row_chunk(vc, slots, j, n, hd, d, 0xFFFF, bf16, 0));
#else
    for (int64_t j = 0; j < 16; j++)
        for (int64_t c = 0; c < width; c++) {
            uint32_t x = 0;
            if (j < n && dp) memcpy(&x, (const uint16_t *)kc + slots[j] * hd + 2 * c, 4);
            else if (j < n) { const float f = load1(kc, slots[j] * hd + c, bf16); memcpy(&x, &f, 4); }
            kt32[c * 16 + j] = x;
        }
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < hd; d++) vs[j * hd + d] = load1(vc, slots[j] * hd + d, bf16);
#endif
}

#endif
