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
#include "softcap.h" /* cap_scores */

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

#include "attend_tiles.h" /* online_softmax, gather_block, scores_dpbf16 (HAVE_DPBF16) */
#if defined(__AVX512F__)
#include "values_avx512.h" /* weigh_block_512 */
#endif
#if HAVE_DPBF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
#include "prefill_amx.h" /* amx_scores, amx_values: both products on tiles (dp == 2) */
#else
#define HAVE_AMX 0
#endif

/* o[r] += p[r, 0:n] . vs[0:n] for r < rows (P . V of one block of keys; p rows 16 apart, hd a multiple of 16). */
static void weigh_values(int64_t rows, const float *p, const float *vs, int64_t n, float *o, int64_t hd) {
#if defined(__AVX512F__)
    weigh_block_512(rows, p, 16, vs, hd, 0, n, o, hd, NULL);
#else
    for (int64_t c0 = 0; c0 < hd; c0 += 16) product(rows, p, 16, vs + c0, hd, n, o + c0, hd, 1);
#endif
}

/* One task: query tokens t0 .. t1-1 of a chunk, KV head h. Scratch: qs, o (rows x hd), s (rows x 16),
   kt (hd x 16), vs (16 x hd), mx (rows), sums (rows x 16: partial sums lane by lane). `window` > 0: a query at
   position p sees keys p - window + 1 .. p, and keys before the tile's first query's window are never read;
   `softcap` > 0: each block's scores capped (softcap.h) before the mask. */
INLINE void attend_tile(const void *q, int64_t q_stride, const void *kc, const void *vc, void *out,
                        int64_t start, int64_t context_len, const int64_t *table, int64_t t0, int64_t t1,
                        int64_t h, int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, float scale,
                        int64_t window, float softcap,
                        float *qs, float *o, float *s, float *kt, float *vs, float *mx, float *sums, int bf16,
                        int dp, uint16_t *vt, uint16_t *pt) {
    const int64_t n_q = n_kv * grp, rows = (t1 - t0) * grp;
    /* bfloat16 with AVX512-BF16: Q . K^T from the tensors' own bfloat16 pairs (qs and kt then hold
       uint32 pairs, the scale is applied to the sums); softmax and P . V stay in float32 as below. */
    for (int64_t r = 0; r < rows; r++)
        start_row(q, (start + t0 + r / grp) * q_stride + (h * grp + r % grp) * hd, r, hd, scale, qs, o, mx, sums,
                  bf16, dp);
    const int64_t last_key = context_len + t1 - 1; /* the tile's last query sees keys 0 .. last_key */
    const int64_t first_key = window > 0 && context_len + t0 - window + 1 > 0 ? context_len + t0 - window + 1 : 0;
    for (int64_t s0 = first_key; s0 <= last_key; s0 += 16) {
        const int64_t n = last_key + 1 - s0 < 16 ? last_key + 1 - s0 : 16;
        int64_t slots[16];
        key_slots(table, s0, n, bs, n_kv, h, slots);
        gather_block(kc, vc, slots, n, hd, kt, vs, bf16, dp);
#if HAVE_AMX
        if (dp == 2) amx_scores(rows, (const uint16_t *)qs, hd, (const uint32_t *)kt, scale, s);
        else
#endif
#if HAVE_DPBF16
        if (dp) scores_dpbf16(rows, (const uint32_t *)qs, hd / 2, (const uint32_t *)kt, scale, s); /* pairs */
        else
#endif
            product(rows, qs, hd, kt, 16, hd, s, 16, 0);
        if (softcap > 0.f) cap_scores(s, rows * 16, softcap);
        for (int64_t r = 0; r < rows; r++) {
            float *sr = s + r * 16;
            const int64_t pos = context_len + t0 + r / grp; /* this row's query position */
            const int64_t seen = pos - s0 + 1 < n ? pos - s0 + 1 : n; /* keys s0 .. s0+seen-1 visible */
            const int64_t lo = window > 0 && pos - window + 1 > s0 ? pos - window + 1 - s0 : 0; /* from s0 + lo */
            if (seen <= lo) memset(sr, 0, 16 * sizeof(float));
            else online_softmax(sr, lo, seen, mx + r, sums + 16 * r, o + r * hd, hd);
        }
#if HAVE_AMX
        if (dp == 2) {
            amx_gather_values((const uint16_t *)vc, slots, n, hd, vt);
            amx_values(rows, s, vt, o, hd, pt);
            continue;
        }
#endif
        (void)vt, (void)pt;
        weigh_values(rows, s, vs, n, o, hd);
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < grp; g++) {
            const int64_t r = (t - t0) * grp + g;
            const int64_t dst = ((start + t) * n_q + h * grp + g) * hd;
            const float inv = 1.f / lanes_sum(sums + 16 * r);
            for (int64_t d = 0; d < hd; d++) store1(out, dst + d, o[r * hd + d] * inv, bf16);
        }
}

/* Chunk c: query rows starts[c] .. starts[c]+lens[c]-1, context_lens[c] tokens before it,
   block table tables[c * max_blocks ..]. out (T, n_q, hd) contiguous; q rows q_stride apart. */
INLINE void prefill_attention(const void *q, int64_t q_stride, const void *kc, const void *vc, void *out,
                              const int64_t *starts, const int64_t *lens, const int64_t *context_lens,
                              const int64_t *tables, int64_t max_blocks, int64_t n_chunks, int64_t n_q,
                              int64_t n_kv, int64_t hd, int64_t bs, float scale, int nthreads, int64_t window,
                              float softcap, int bf16, int dp) {
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
        uint16_t *vt = NULL, *pt = NULL;
#if HAVE_AMX
        if (dp == 2) {
            amx_tiles();
            vt = (uint16_t *)aligned_alloc(64, sizeof(uint16_t) * hd * 16);
            pt = (uint16_t *)aligned_alloc(64, sizeof(uint16_t) * 512);
        }
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < n_tasks; k++) {
            const int64_t j = n_tasks - 1 - k; /* later tiles see more keys: start with them */
            const int64_t c = task[3 * j], t0 = task[3 * j + 1], h = task[3 * j + 2];
            const int64_t t1 = t0 + TILE_TOKENS < lens[c] ? t0 + TILE_TOKENS : lens[c];
#define ATTEND_TILE(WINDOW, SOFTCAP)                                                                              \
    attend_tile(q, q_stride, kc, vc, out, starts[c], context_lens[c], tables + c * max_blocks, t0, t1, h, grp, n_kv, \
                hd, bs, scale, WINDOW, SOFTCAP, qs, o, s, kt, vs, mx, sums, bf16, dp, vt, pt)
            /* A plain layer's tiles inline with the constants 0: no window or soft-cap test left in their loops. */
            if (window == 0 && softcap == 0.f) ATTEND_TILE(0, 0.f);
            else ATTEND_TILE(window, softcap);
#undef ATTEND_TILE
        }
        free(qs); free(o); free(s); free(kt); free(vs); free(mx); free(sums); free(vt); free(pt);
#if HAVE_AMX
        if (dp == 2) _tile_release();
#endif
    }
    free(task);
}

#define PREFILL_ARGS const int64_t *starts, const int64_t *lens, const int64_t *context_lens, const int64_t *tables, \
    int64_t max_blocks, int64_t n_chunks, int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int nthreads, \
    int64_t window, float softcap
#define PREFILL_PASS starts, lens, context_lens, tables, max_blocks, n_chunks, n_q, n_kv, hd, bs, scale, nthreads, \
    window, softcap

void prefill_attention_f32(const float *q, int64_t q_stride, const float *kc, const float *vc, float *out, PREFILL_ARGS) {
    prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 0, 0);
}

/* The same on bfloat16 tensors (uint16_t bit patterns); results rounded to bfloat16 once, at the end.
   dot_products: 2, both products on AMX tiles (prefill_amx.h) where this build has them, Linux grants their
   state and hd is a multiple of 32; else 1 (or 2), Q . K^T with AVX512-BF16 where this build has it
   (prefill_attention_has_dpbf16); else (or 0) from the keys widened to float32. */
void prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *kc, const uint16_t *vc, uint16_t *out,
                            PREFILL_ARGS, int dot_products) {
#if HAVE_AMX
    if (dot_products == 2 && hd % 32 == 0 && amx_permitted()) {
        prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 1, 2);
        return;
    }
#endif
#if HAVE_DPBF16
    if (dot_products) { prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 1, 1); return; }
#endif
    (void)dot_products;
    prefill_attention(q, q_stride, kc, vc, out, PREFILL_PASS, 1, 0);
}

int prefill_attention_has_dpbf16(void) { return HAVE_DPBF16; }

int prefill_attention_has_amx(void) {
#if HAVE_AMX
    return amx_permitted();
#else
    return 0;
#endif
}
