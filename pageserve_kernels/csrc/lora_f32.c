/* LoRA's two products for every adapter group of a step, one projection per call, float32: AVX2 + FMA
   (bound by pageserve_kernels/cpu_lora.py, whose docstring explains the entry table and the layouts).

     shrink  s[i, 0:R] = x[rows[i]] . A^T           A in blocks of 4 rows: each s element one dot over k
     expand  out[rows[i], slice] += s[i, r0:r1] . B^T   B of each slice in gemm_f32's 16-column panels

   Each out element gets its product sum (one FMA chain over r) plus its old value. Every element's sums
   run in an order fixed by K, r and the layouts alone: a row's result does not depend on the other rows. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lora_entry.h" /* ENTRY fields, work items */

static inline float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}

/* s[i, j0 + j] for 4 rows x one block of 4 rows of A, packed (ceil(K/8), 4, 8): the block is read as one
   stream. Rows past the group's end repeat its last row (their sums are not stored); x's last k are masked
   (the packed A is zero past K and past R). */
static void shrink_tile(const float *x[4], const float *a, int64_t K, float *s, int64_t lds, int64_t rows,
                        int64_t cols) {
    __m256 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t k = 0; k < K; k += 8, a += 32) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(K - k < 8 ? K - k : 8)), lane);
        __m256 xv[4];
        for (int i = 0; i < 4; i++) xv[i] = _mm256_maskload_ps(x[i] + k, m);
        for (int j = 0; j < 4; j++) {
            const __m256 av = _mm256_loadu_ps(a + j * 8);
            for (int i = 0; i < 4; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], av, acc[i][j]);
        }
    }
    float sums[4][4]; /* every accumulator read at a constant index: GCC keeps them in registers only then */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) sums[i][j] = sum8(acc[i][j]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) s[i * lds + j] = sums[i][j];
}

/* One group's shrink columns j0..j0+3 (A's block j0 / 4), every row of the group. */
static void shrink(const float *x, int64_t ldx, int64_t K, const int64_t *rows, int64_t n, const float *A, int64_t R,
                   int64_t j0, float *s, int64_t lds) {
    const int64_t cols = R - j0 < 4 ? R - j0 : 4;
    const float *a = A + (j0 / 4) * ((K + 7) / 8) * 32;
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t m = n - i0 < 4 ? n - i0 : 4;
        const float *xr[4];
        for (int i = 0; i < 4; i++) xr[i] = x + rows[i0 + (i < m ? i : m - 1)] * ldx;
        shrink_tile(xr, a, K, s + i0 * lds + j0, lds, m, cols);
    }
}

/* out[rows[i], c0 : c0 + ncols] += s[i, r0 : r0 + r] . panel (r rows of 16), for every row of the group:
   4 rows at a time, eight independent FMA chains (one chain of r would wait on its own latency). */
static void expand(float *out, int64_t ldo, const int64_t *rows, int64_t n, const float *s, int64_t lds, int64_t r0,
                   int64_t r, const float *panel, int64_t c0, int64_t ncols) {
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t m = n - i0 < 4 ? n - i0 : 4;
        const float *si[4];
        for (int i = 0; i < 4; i++) si[i] = s + (i0 + (i < m ? i : m - 1)) * lds + r0;
        __m256 acc[4][2];
        for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int64_t k = 0; k < r; k++) {
            const __m256 b0 = _mm256_load_ps(panel + k * 16), b1 = _mm256_load_ps(panel + k * 16 + 8);
            for (int i = 0; i < 4; i++) {
                const __m256 v = _mm256_broadcast_ss(si[i] + k);
                acc[i][0] = _mm256_fmadd_ps(v, b0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(v, b1, acc[i][1]);
            }
        }
        float sums[4][16]; /* every accumulator read at a constant index: GCC keeps them in registers only then */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            _mm256_storeu_ps(sums[i], acc[i][0]);
            _mm256_storeu_ps(sums[i] + 8, acc[i][1]);
        }
        for (int64_t i = 0; i < m; i++) {
            float *o = out + rows[i0 + i] * ldo + c0;
            for (int64_t c = 0; c < ncols; c++) o[c] += sums[i][c];
        }
    }
}

/* out (T, N; row stride ldo) += each group's LoRA term of x (T, K; row stride ldx): n_groups entries
   (cpu_lora.py's ENTRY int64 each, entry_stride apart), their rows in `rows`. */
void lora_f32(const void *x_, int64_t ldx, void *out_, int64_t ldo, int64_t K, const int64_t *rows,
              const int64_t *entries, int64_t n_groups, int64_t entry_stride, int nthreads) {
    const float *x = x_;
    float *out = out_;
    struct lora_work w;
    if (!lora_work_plan(&w, entries, n_groups, entry_stride, 4, 16)) return;
    float *s = malloc(w.n_rows * w.lds * sizeof(float) + 64);
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < w.n_shrink; t++) {
            const struct lora_item *it = &w.shrink[t];
            const int64_t *e = it->entry;
            shrink(x, ldx, K, rows + e[ROW_BEGIN], e[ROW_END] - e[ROW_BEGIN], (const float *)(intptr_t)e[A_ADDR],
                   e[RANK], it->at, s + e[ROW_BEGIN] * w.lds, w.lds);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < w.n_expand; t++) {
            const struct lora_item *it = &w.expand[t];
            const int64_t *e = it->entry, *sl = e + SLICES + it->slice * SLICE_FIELDS;
            const int64_t r = sl[R1] - sl[R0], c = it->at * 16;
            const float *panels = (const float *)(intptr_t)sl[B_ADDR];
            expand(out, ldo, rows + e[ROW_BEGIN], e[ROW_END] - e[ROW_BEGIN], s + e[ROW_BEGIN] * w.lds, w.lds,
                   sl[R0], r, panels + it->at * r * 16, sl[START] + c,
                   sl[END] - sl[START] - c < 16 ? sl[END] - sl[START] - c : 16);
        }
    }
    free(s);
    lora_work_free(&w);
}
