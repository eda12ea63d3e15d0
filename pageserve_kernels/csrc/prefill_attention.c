/* Causal attention of prompt chunks over the paged KV cache, AVX2 + FMA (bound by kernels/cpu_prefill.py).
   float32 or bfloat16 queries, K/V and output; the softmax and every sum run in float32. bfloat16 rows are
   widened as they are copied into the tiles' scratch (which happens for float32 too), except that with
   AVX512-BF16 the keys and queries stay bfloat16 pairs for Q . K^T (scores_dpbf16: exact products, float32 sums).
   The module docstring there explains the algorithm; compiled by kernels/native_build.py. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_elem.h"

#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TILE_TOKENS 32

/* c[r, 0:16] (+)= a[r, 0:K] . b[0:K, 0:16] for r < MR; b rows ldb apart. */
static inline __attribute__((always_inline)) void tile(
    const int MR, const float *restrict a, int64_t lda, const float *restrict b, int64_t ldb, int64_t K,
    float *restrict c, int64_t ldc, int accumulate) {
#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
    ROWS(DECL)
#define LOADC(r) if (MR > r) { c##r##0 = _mm256_loadu_ps(c + r * ldc); c##r##1 = _mm256_loadu_ps(c + r * ldc + 8); }
    if (accumulate) { ROWS(LOADC) }
    for (int64_t k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
#define FMA(r) if (MR > r) { const __m256 x = _mm256_broadcast_ss(a + r * lda + k); \
            c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0); c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1); }
        ROWS(FMA)
    }
#define STORE(r) if (MR > r) { _mm256_storeu_ps(c + r * ldc, c##r##0); _mm256_storeu_ps(c + r * ldc + 8, c##r##1); }
    ROWS(STORE)
}

/* All rows of a (rows x 16) product, six at a time. */
static void product(int64_t rows, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t K,
                    float *c, int64_t ldc, int accumulate) {
    for (int64_t r = 0; r < rows; r += 6, a += 6 * lda, c += 6 * ldc) {
        switch (rows - r < 6 ? rows - r : 6) {
        case 6: tile(6, a, lda, b, ldb, K, c, ldc, accumulate); break;
        case 5: tile(5, a, lda, b, ldb, K, c, ldc, accumulate); break;
        case 4: tile(4, a, lda, b, ldb, K, c, ldc, accumulate); break;
        case 3: tile(3, a, lda, b, ldb, K, c, ldc, accumulate); break;
        case 2: tile(2, a, lda, b, ldb, K, c, ldc, accumulate); break;
        default: tile(1, a, lda, b, ldb, K, c, ldc, accumulate); break;
        }
    }
}

#include "exp8_avx2.h"
#if defined(__AVX512F__)
#include "exp16_avx512.h"
#include "values_avx512.h" /* weigh_block_512 */

/* The first n of sixteen lanes (all of them from 16 on). */
INLINE __mmask16 first_lanes(int64_t n) { return (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u); }

#endif

/* o[r] += p[r, 0:n] . vs[0:n] for r < rows (P . V of one block of keys; p rows 16 apart, hd a multiple of 16). */
static void weigh_values(int64_t rows, const float *p, const float *vs, int64_t n, float *o, int64_t hd) {
#if defined(__AVX512F__)
    weigh_block_512(rows, p, 16, vs, hd, 0, n, o, hd);
#else
    for (int64_t c0 = 0; c0 < hd; c0 += 16) product(rows, p, 16, vs + c0, hd, n, o + c0, hd, 1);
#endif
}

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

/* One row's block of 16 scores sr (keys past `seen` masked) into the online softmax: sr becomes
   exp(score - max), zero where masked, and is added lane by lane to the row's 16 partial sums. */
INLINE void online_softmax(float *restrict sr, int64_t seen, float *restrict mx, float *restrict sums,
                           float *restrict o, int64_t hd) {
#if defined(__AVX512F__)
    const __mmask16 valid = first_lanes(seen);
    const __m512 v = _mm512_loadu_ps(sr);
    if (_mm512_mask_cmp_ps_mask(valid, v, _mm512_set1_ps(*mx + RESCALE_ABOVE), _CMP_GT_OQ))
        move_maximum(_mm512_mask_reduce_max_ps(valid, v), mx, sums, o, hd);
    const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(v, _mm512_set1_ps(*mx))));
    _mm512_storeu_ps(sr, e);
    _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_loadu_ps(sums), e));
#else
    const __m256 n = _mm256_set1_ps((float)seen), lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 valid[2] = {_mm256_cmp_ps(lanes, n, _CMP_LT_OQ),
                             _mm256_cmp_ps(_mm256_add_ps(lanes, _mm256_set1_ps(8.f)), n, _CMP_LT_OQ)};
    const __m256 v[2] = {_mm256_loadu_ps(sr), _mm256_loadu_ps(sr + 8)}, above = _mm256_set1_ps(*mx + RESCALE_ABOVE);
    if (_mm256_movemask_ps(_mm256_and_ps(valid[0], _mm256_cmp_ps(v[0], above, _CMP_GT_OQ))) |
        _mm256_movemask_ps(_mm256_and_ps(valid[1], _mm256_cmp_ps(v[1], above, _CMP_GT_OQ)))) {
        float bm = sr[0];
        for (int64_t j = 1; j < seen; j++) bm = sr[j] > bm ? sr[j] : bm;
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

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define HAVE_DPBF16 1
/* s[r][0:16] = scale * sum_p qb[r][p] . kt2[p], r < rows: pairs of bfloat16 (p < pairs) multiplied
   and summed in float32 by AVX512-BF16's dot product, sixteen keys per instruction; eight rows at a
   time keep eight independent accumulation chains in flight. */
#define DP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
static void scores_dpbf16(int64_t rows, const uint32_t *restrict qb, int64_t pairs, const uint32_t *restrict kt2,
                          float scale, float *restrict s) {
    const __m512 sc = _mm512_set1_ps(scale);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
#define DP_DECL(i) __m512 a##i = _mm512_setzero_ps();
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
    for (int64_t j = 0; j < n; j++) /* hd is a multiple of 16 (cpu_prefill.supports) */
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

/* One task: query tokens t0 .. t1-1 of a chunk, KV head h. Scratch: qs, o (rows x hd), s (rows x 16),
   kt (hd x 16), vs (16 x hd), mx (rows), sums (rows x 16: partial sums lane by lane). */
INLINE void attend_tile(const void *q, int64_t q_stride, const void *kc, const void *vc, void *out,
                        int64_t start, int64_t context_len, const int64_t *table, int64_t t0, int64_t t1,
                        int64_t h, int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, float scale,
                        float *qs, float *o, float *s, float *kt, float *vs, float *mx, float *sums, int bf16,
                        int dp) {
    const int64_t n_q = n_kv * grp, rows = (t1 - t0) * grp, pairs = hd / 2;
    /* bfloat16 with AVX512-BF16: Q . K^T from the tensors' own bfloat16 pairs (qs and kt then hold
       uint32 pairs, the scale is applied to the sums); softmax and P . V stay in float32 as below. */
    uint32_t *qb = (uint32_t *)qs;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < grp; g++) {
            const int64_t r = (t - t0) * grp + g;
            const int64_t src = (start + t) * q_stride + (h * grp + g) * hd;
            if (dp) memcpy(qb + r * pairs, (const uint16_t *)q + src, hd * sizeof(uint16_t));
            else for (int64_t d = 0; d < hd; d++) qs[r * hd + d] = load1(q, src + d, bf16) * scale;
            memset(o + r * hd, 0, hd * sizeof(float));
            mx[r] = -INFINITY;
            memset(sums + 16 * r, 0, 16 * sizeof(float));
        }
    const int64_t last_key = context_len + t1 - 1; /* the tile's last query sees keys 0 .. last_key */
    for (int64_t s0 = 0; s0 <= last_key; s0 += 16) {
        const int64_t n = last_key + 1 - s0 < 16 ? last_key + 1 - s0 : 16;
        /* keys s0 .. s0+n-1 (any block size: each key's row found through the table; one division a
           block of keys, not two a key) */
        int64_t slots[16], block = s0 / bs, offset = s0 % bs;
        for (int64_t j = 0; j < n; j++) {
            slots[j] = (table[block] * bs + offset) * n_kv + h;
            if (++offset == bs) offset = 0, block++;
        }
        gather_block(kc, vc, slots, n, hd, kt, vs, bf16, dp);
#if HAVE_DPBF16
        if (dp) scores_dpbf16(rows, qb, pairs, (const uint32_t *)kt, scale, s); /* kt holds the pairs */
        else
#endif
            product(rows, qs, hd, kt, 16, hd, s, 16, 0);
        for (int64_t r = 0; r < rows; r++) {
            float *sr = s + r * 16;
            const int64_t pos = context_len + t0 + r / grp; /* this row's query position */
            const int64_t seen = pos - s0 + 1 < n ? pos - s0 + 1 : n; /* keys s0 .. s0+seen-1 visible */
            if (seen <= 0) memset(sr, 0, 16 * sizeof(float));
            else online_softmax(sr, seen, mx + r, sums + 16 * r, o + r * hd, hd);
        }
        weigh_values(rows, s, vs, n, o, hd);
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < grp; g++) {
            const int64_t r = (t - t0) * grp + g;
            const int64_t dst = ((start + t) * n_q + h * grp + g) * hd;
            float sum = 0.f;
            for (int j = 0; j < 16; j++) sum += sums[16 * r + j];
            const float inv = 1.f / sum;
            for (int64_t d = 0; d < hd; d++) store1(out, dst + d, o[r * hd + d] * inv, bf16);
        }
}

/* Chunk c: query rows starts[c] .. starts[c]+lens[c]-1, context_lens[c] tokens before it,
   block table tables[c * max_blocks ..]. out (T, n_q, hd) contiguous; q rows q_stride apart. */
INLINE void prefill_attention(const void *q, int64_t q_stride, const void *kc, const void *vc, void *out,
                              const int64_t *starts, const int64_t *lens, const int64_t *context_lens,
                              const int64_t *tables, int64_t max_blocks, int64_t n_chunks, int64_t n_q,
                              int64_t n_kv, int64_t hd, int64_t bs, float scale, int nthreads, int bf16, int dp) {
    const int64_t grp = n_q / n_kv, rows_max = TILE_TOKENS * grp;
    int64_t n_tasks = 0;
    for (int64_t c = 0; c < n_chunks; c++) n_tasks += n_kv * ((lens[c] + TILE_TOKENS - 1) / TILE_TOKENS);
    /* (chunk, tile, head) per task, the costliest (latest tiles of long contexts) first */
    int64_t *task = (int64_t *)malloc(sizeof(int64_t) * 3 * (n_tasks > 0 ? n_tasks : 1));
    int64_t i = 0;
    for (int64_t c = 0; c < n_chunks; c++)
        for (int64_t t0 = 0; t0 < lens[c]; t0 += TILE_TOKENS)
            for (int64_t h = 0; h < n_kv; h++, i++) { task[3 * i] = c; task[3 * i + 1] = t0; task[3 * i + 2] = h; }
#pragma omp parallel num_threads(nthreads)
    {
        float *qs = (float *)aligned_alloc(64, sizeof(float) * rows_max * hd);
        float *o = (float *)aligned_alloc(64, sizeof(float) * rows_max * hd);
        float *s = (float *)aligned_alloc(64, sizeof(float) * rows_max * 16);
        float *kt = (float *)aligned_alloc(64, sizeof(float) * hd * 16);
        float *vs = (float *)aligned_alloc(64, sizeof(float) * hd * 16);
        float *mx = (float *)malloc(sizeof(float) * rows_max), *sums = (float *)malloc(sizeof(float) * 16 * rows_max);
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < n_tasks; k++) {
            const int64_t j = n_tasks - 1 - k; /* later tiles see more keys: start with them */
            const int64_t c = task[3 * j], t0 = task[3 * j + 1], h = task[3 * j + 2];
            const int64_t t1 = t0 + TILE_TOKENS < lens[c] ? t0 + TILE_TOKENS : lens[c];
            attend_tile(q, q_stride, kc, vc, out, starts[c], context_lens[c], tables + c * max_blocks, t0, t1, h,
                        grp, n_kv, hd, bs, scale, qs, o, s, kt, vs, mx, sums, bf16, dp);
        }
        free(qs); free(o); free(s); free(kt); free(vs); free(mx); free(sums);
    }
    free(task);
}

#define PREFILL_ARGS const int64_t *starts, const int64_t *lens, const int64_t *context_lens, const int64_t *tables, \
    int64_t max_blocks, int64_t n_chunks, int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int nthreads
#define PREFILL_PASS starts, lens, context_lens, tables, max_blocks, n_chunks, n_q, n_kv, hd, bs, scale, nthreads

void prefill_attention_f32(const float *q, int64_t q_stride, const float *kc, const float *vc, float *out, PREFILL_ARGS) {
    prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 0, 0);
}

/* The same on bfloat16 tensors (uint16_t bit patterns); results rounded to bfloat16 once, at the end.
   dot_products: Q . K^T with AVX512-BF16 where this build has it (prefill_attention_has_dpbf16), else
   (or 0) from the keys widened to float32. Both are exact products summed in float32. */
void prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *kc, const uint16_t *vc, uint16_t *out,
                            PREFILL_ARGS, int dot_products) {
#if HAVE_DPBF16
    if (dot_products) { prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 1, 1); return; }
#endif
    (void)dot_products;
    prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 1, 0);
}

int prefill_attention_has_dpbf16(void) { return HAVE_DPBF16; }
