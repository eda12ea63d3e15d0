/* LoRA's two products for every adapter group of a step, one projection per call, bfloat16: AVX512-BF16
   dot products, float32 sums (bound by pageserve_kernels/cpu_lora.py, whose docstring explains the entry
   table and the layouts); compiled on hosts whose flags include avx512f, avx512bw and avx512_bf16.

     shrink  s[i, 0:R] = x[rows[i]] . A^T           A in blocks of 4 rows: each s element one dot over k
     expand  out[rows[i], slice] += s[i, r0:r1] . B^T   B of each slice in 32-column panels of pairs

   s is rounded to bfloat16 once (the expand multiplies bfloat16 pairs); each out element gets its product
   sum in float32 plus its old value, rounded once. Every element's sums run in an order fixed by K, r and
   the layouts alone: a row's result does not depend on the other rows of the step. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lora_entry.h" /* ENTRY fields, work items */

static inline __m512 bf16_to_f32(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

static inline uint16_t round_bf16(float f) {
    __m512 v = _mm512_set1_ps(f);
    return (uint16_t)_mm_extract_epi16(_mm256_castsi256_si128((__m256i)_mm512_cvtneps_pbh(v)), 0);
}

/* s[i, j0 + j] for 4 rows x one block of 4 rows of A, packed (ceil(K/32), 4, 32): the block is read as one
   stream. Rows past the group's end repeat its last row (their sums are not stored); x's last k are masked
   (the packed A is zero past K and past R). */
static void shrink_tile(const uint16_t *x[4], const uint16_t *a, int64_t K, uint16_t *s, int64_t lds,
                        int64_t rows, int64_t cols) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, a += 128) {
        const __mmask32 m = K - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
        __m512bh xv[4], av[4];
        for (int i = 0; i < 4; i++) xv[i] = (__m512bh)_mm512_maskz_loadu_epi16(m, x[i] + k);
        for (int j = 0; j < 4; j++) av[j] = (__m512bh)_mm512_loadu_si512(a + j * 32);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], av[j]);
    }
    float sums[4][4]; /* every accumulator read at a constant index: GCC keeps them in registers only then */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) s[i * lds + j] = round_bf16(sums[i][j]);
}

/* One group's shrink columns j0..j0+3 (A's block j0 / 4), every row of the group. */
static void shrink(const uint16_t *x, int64_t ldx, int64_t K, const int64_t *rows, int64_t n, const uint16_t *A,
                   int64_t R, int64_t j0, uint16_t *s, int64_t lds) {
    const int64_t cols = R - j0 < 4 ? R - j0 : 4;
    const uint16_t *a = A + (j0 / 4) * ((K + 31) / 32) * 128;
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t m = n - i0 < 4 ? n - i0 : 4;
        const uint16_t *xr[4];
        for (int i = 0; i < 4; i++) xr[i] = x + rows[i0 + (i < m ? i : m - 1)] * ldx;
        shrink_tile(xr, a, K, s + i0 * lds + j0, lds, m, cols);
    }
}

/* The pair (v[2k], v[2k+1]) in every 32-bit lane; the last of an odd r paired with zero. */
static inline __m512bh pair(const uint16_t *v, int64_t k, int64_t r) {
    int32_t both = 0;
    if (2 * k + 1 < r) memcpy(&both, v + 2 * k, 4);
    else both = v[2 * k];
    return (__m512bh)_mm512_set1_epi32(both);
}

/* out[rows[i], c0 : c0 + ncols] += s[i, r0 : r0 + r] . panel, for every row of the group: 4 rows at a time,
   eight independent sums (one chain of r/2 dot products each would wait on its own latency). */
static void expand(uint16_t *out, int64_t ldo, const int64_t *rows, int64_t n, const uint16_t *s, int64_t lds,
                   int64_t r0, int64_t r, const uint16_t *panel, int64_t c0, int64_t ncols) {
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
    const __mmask16 m1 = ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1);
    const int64_t pairs = (r + 1) / 2;
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t m = n - i0 < 4 ? n - i0 : 4;
        const uint16_t *si[4];
        for (int i = 0; i < 4; i++) si[i] = s + (i0 + (i < m ? i : m - 1)) * lds + r0;
        __m512 acc[4][2];
        for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t k = 0; k < pairs; k++) {
            const __m512bh b0 = (__m512bh)_mm512_load_si512(panel + k * 64);
            const __m512bh b1 = (__m512bh)_mm512_load_si512(panel + k * 64 + 32);
            for (int i = 0; i < 4; i++) {
                const __m512bh v = pair(si[i], k, r);
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], v, b0);
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], v, b1);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) { /* constant indices: the sums stay in registers */
            if (i >= m) break;
            uint16_t *o = out + rows[i0 + i] * ldo + c0;
            const __m512 lo = _mm512_add_ps(acc[i][0], bf16_to_f32(_mm256_maskz_loadu_epi16(m0, o)));
            const __m512 hi = _mm512_add_ps(acc[i][1], bf16_to_f32(_mm256_maskz_loadu_epi16(m1, o + 16)));
            _mm256_mask_storeu_epi16(o, m0, (__m256i)_mm512_cvtneps_pbh(lo));
            _mm256_mask_storeu_epi16(o + 16, m1, (__m256i)_mm512_cvtneps_pbh(hi));
        }
    }
}

/* out (T, N; row stride ldo) += each group's LoRA term of x (T, K; row stride ldx): n_groups entries
   (cpu_lora.py's ENTRY int64 each, entry_stride apart), their rows in `rows`. */
void lora_bf16(const void *x_, int64_t ldx, void *out_, int64_t ldo, int64_t K, const int64_t *rows,
               const int64_t *entries, int64_t n_groups, int64_t entry_stride, int nthreads) {
    const uint16_t *x = x_;
    uint16_t *out = out_;
    struct lora_work w;
    if (!lora_work_plan(&w, entries, n_groups, entry_stride, 4, 32)) return;
    uint16_t *s = malloc(w.n_rows * w.lds * sizeof(uint16_t) + 64);
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < w.n_shrink; t++) {
            const struct lora_item *it = &w.shrink[t];
            const int64_t *e = it->entry;
            shrink(x, ldx, K, rows + e[ROW_BEGIN], e[ROW_END] - e[ROW_BEGIN], (const uint16_t *)(intptr_t)e[A_ADDR],
                   e[RANK], it->at, s + e[ROW_BEGIN] * w.lds, w.lds);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < w.n_expand; t++) {
            const struct lora_item *it = &w.expand[t];
            const int64_t *e = it->entry, *sl = e + SLICES + it->slice * SLICE_FIELDS;
            const int64_t r = sl[R1] - sl[R0], pairs = (r + 1) / 2, c = it->at * 32;
            const uint16_t *panels = (const uint16_t *)(intptr_t)sl[B_ADDR];
            expand(out, ldo, rows + e[ROW_BEGIN], e[ROW_END] - e[ROW_BEGIN], s + e[ROW_BEGIN] * w.lds, w.lds,
                   sl[R0], r, panels + it->at * pairs * 64, sl[START] + c,
                   sl[END] - sl[START] - c < 32 ? sl[END] - sl[START] - c : 32);
        }
    }
    free(s);
    lora_work_free(&w);
}
