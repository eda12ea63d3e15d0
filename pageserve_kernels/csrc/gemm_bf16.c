/* bfloat16 products over prepacked 32-column weight panels, AVX512-BF16 dot products with float32
   accumulation, and (gemm_bf16_amx, where the build has AMX-BF16) the same on AMX tiles
   (bound by pageserve_kernels/cpu_gemm.py, whose docstring explains the layout);
   compiled by pageserve_kernels/native_build.py on hosts whose flags include avx512f and avx512_bf16. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define MR_MAX 12 /* 12 rows x 2 vectors: 24 accumulators of the 32 registers */

static inline __m512 bf16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline void store_bf16(uint16_t *p, __m512 v) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
}

/* The pair (a[2k], a[2k+1]) in every 32-bit lane. */
static inline __m512bh pair(const uint16_t *a, int64_t k) {
    int32_t both;
    memcpy(&both, a + 2 * k, 4);
    return (__m512bh)_mm512_set1_epi32(both);
}

/* The last of an odd K: a[K-1] paired with zero (the panel's pad is zero too; a row's next element
   may not exist, or hold a NaN that zero would not cancel). */
static inline __m512bh last_half(const uint16_t *a, int64_t K) {
    return (__m512bh)_mm512_set1_epi32((int32_t)a[K - 1]);
}

/* c[r, 0:ncols] = a[r, 0:K] . panel (+ bias) for r < MR, rounded to bfloat16 once. Named
   accumulators, not an array: GCC keeps them in registers only then. MR is a constant at every call. */
static inline __attribute__((always_inline)) void tile(
    const int MR, const uint16_t *restrict a, int64_t lda, const uint16_t *restrict b, int64_t K,
    const uint16_t *restrict bias, uint16_t *restrict c, int64_t ldc, int64_t ncols) {
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    ROWS(DECL)
#define DOT(r) if (MR > r) { const __m512bh x = PAIR(a + r * lda); \
            c##r##0 = _mm512_dpbf16_ps(c##r##0, x, b0); c##r##1 = _mm512_dpbf16_ps(c##r##1, x, b1); }
    int64_t k = 0;
    for (; k < K / 2; k++) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b + k * 64), b1 = (__m512bh)_mm512_load_si512(b + k * 64 + 32);
#define PAIR(row) pair(row, k)
        ROWS(DOT)
#undef PAIR
    }
    if (K & 1) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b + k * 64), b1 = (__m512bh)_mm512_load_si512(b + k * 64 + 32);
#define PAIR(row) last_half(row, K)
        ROWS(DOT)
#undef PAIR
    }
    if (bias) {
        const __m512 bias0 = bf16_to_f32(bias), bias1 = bf16_to_f32(bias + 16);
#define BIAS(r) if (MR > r) { c##r##0 = _mm512_add_ps(c##r##0, bias0); c##r##1 = _mm512_add_ps(c##r##1, bias1); }
        ROWS(BIAS)
    }
    if (ncols == 32) {
#define STORE(r) if (MR > r) { store_bf16(c + r * ldc, c##r##0); store_bf16(c + r * ldc + 16, c##r##1); }
        ROWS(STORE)
    } else { /* the last panel of an N that is no multiple of 32 */
        uint16_t tmp[32];
#define STORE_PART(r) if (MR > r) { store_bf16(tmp, c##r##0); store_bf16(tmp + 16, c##r##1); \
            memcpy(c + r * ldc, tmp, ncols * sizeof(uint16_t)); }
        ROWS(STORE_PART)
    }
}

/* Panel p's 32 bias values (NULL without a bias); the last panel of an N that is no multiple of 32 gets
   them copied into `tail`, zero past N: the bias has N entries, no reading past them. */
static inline const uint16_t *panel_bias(const uint16_t *bias, int64_t p, int64_t ncols, uint16_t tail[32]) {
    if (!bias) return NULL;
    if (ncols == 32) return bias + p * 32;
    memset(tail, 0, 32 * sizeof(uint16_t));
    memcpy(tail, bias + p * 32, ncols * sizeof(uint16_t));
    return tail;
}

#define CASE(n) case n: tile(n, a, lda, b, K, bias, c, ldc, ncols); break;
static void tile_rows(int64_t mr, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t K, const uint16_t *bias,
                      uint16_t *c, int64_t ldc, int64_t ncols) {
    switch (mr) {
    CASE(12) CASE(11) CASE(10) CASE(9) CASE(8) CASE(7) CASE(6) CASE(5) CASE(4) CASE(3) CASE(2)
    default: tile(1, a, lda, b, K, bias, c, ldc, ncols); break;
    }
}

/* C (M, N) row-major bfloat16 = A (M, K; row stride lda) @ W^T (+ bias), W given as panels
   (ceil(N/32), ceil(K/2), 32, 2). The same signature as gemm_f32's, by the element's address. */
void gemm_bf16(const void *A_, int64_t lda, const void *panels_, const void *bias_, void *C_,
               int64_t M, int64_t N, int64_t K, int nthreads) {
    const uint16_t *A = A_, *panels = panels_, *bias = bias_;
    uint16_t *C = C_;
    const int64_t n_panels = (N + 31) / 32, pairs = (K + 1) / 2, max_rows = 96;
    const int64_t n_chunks = (M + max_rows - 1) / max_rows;
    const int64_t mc = ((M + n_chunks - 1) / n_chunks + MR_MAX - 1) / MR_MAX * MR_MAX; /* equal chunks, whole tiles */
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
    for (int64_t ch = 0; ch < n_chunks; ch++)
        for (int64_t p = 0; p < n_panels; p++) {
            const int64_t m0 = ch * mc, m1 = m0 + mc < M ? m0 + mc : M;
            const int64_t ncols = N - p * 32 < 32 ? N - p * 32 : 32;
            uint16_t bias_tail[32];
            const uint16_t *b = panels + p * pairs * 64, *bias_p = panel_bias(bias, p, ncols, bias_tail);
            for (int64_t m = m0; m < m1; m += MR_MAX)
                tile_rows(m1 - m < MR_MAX ? m1 - m : MR_MAX, A + m * lda, lda, b, K, bias_p, C + m * N + p * 32, N,
                          ncols);
        }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* The same product on AMX tiles, over the same panels: a panel's pairs are rows of 32 columns x 2
   (128 bytes), so 16 consecutive pairs of its first or last 16 columns are a right-hand tile as they lie
   (stride 128 bytes), and 16 rows x 32 k of A a left-hand tile as x lies. Each block of 32 rows x one
   panel keeps four 16 x 16 float32 sums in tiles 0-3 over the whole k; tiles 4-5 hold A, 6-7 the panel.
   Every output element is still one float32 chain over k in order (32 at a time), whatever the row
   count: batch-invariant as the AVX512-BF16 kernel. K must be a multiple of 32. Threads split the
   panels, so the weights stream from memory once per call (per 256 rows for prompt steps: x's chunk
   stays in L2). Linux grants a process the tile state only when asked (gemm_bf16_amx_permitted). */
#include "amx_tiles.h" /* amx_permitted, amx_configure */

#define AMX_CHUNK 256

int gemm_bf16_amx_permitted(void) { return amx_permitted(); }

static void amx_configure_gemm(void) { /* tiles 0-3 sums, 4-5 A, 6-7 panel: all 16 rows of 64 bytes */
    const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_configure(8, rows, colsb);
}

/* C[0:rows, 0:ncols] = A[0:rows] . panel (+ bias) for rows <= 32 (A padded to whole 16-row tiles). */
static void amx_block(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t K, const uint16_t *bias,
                      uint16_t *c, int64_t ldc, int64_t rows, int64_t ncols) {
    float sums[32 * 32] __attribute__((aligned(64)));
    _tile_zero(0); _tile_zero(1);
    if (rows > 16) {
        _tile_zero(2); _tile_zero(3);
        for (int64_t k = 0; k < K; k += 32) {
            _tile_loadd(4, a + k, lda * 2); _tile_loadd(5, a + 16 * lda + k, lda * 2);
            _tile_loadd(6, b + k * 32, 128); _tile_loadd(7, b + k * 32 + 32, 128);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(2, sums + 16 * 32, 128); _tile_stored(3, sums + 16 * 32 + 16, 128);
    } else {
        for (int64_t k = 0; k < K; k += 32) {
            _tile_loadd(4, a + k, lda * 2); _tile_loadd(6, b + k * 32, 128); _tile_loadd(7, b + k * 32 + 32, 128);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, sums, 128); _tile_stored(1, sums + 16, 128);
    const __m512 bias0 = bias ? bf16_to_f32(bias) : _mm512_setzero_ps(), bias1 = bias ? bf16_to_f32(bias + 16) : bias0;
    for (int64_t r = 0; r < rows; r++) {
        uint16_t out[32];
        store_bf16(out, _mm512_add_ps(_mm512_load_ps(sums + 32 * r), bias0));
        store_bf16(out + 16, _mm512_add_ps(_mm512_load_ps(sums + 32 * r + 16), bias1));
        memcpy(c + r * ldc, out, ncols * sizeof(uint16_t));
    }
}

void gemm_bf16_amx(const void *A_, int64_t lda, const void *panels_, const void *bias_, void *C_, int64_t M,
                   int64_t N, int64_t K, int nthreads) {
    if (K % 32 || !gemm_bf16_amx_permitted()) { gemm_bf16(A_, lda, panels_, bias_, C_, M, N, K, nthreads); return; }
    const uint16_t *A = A_, *panels = panels_, *bias = bias_;
    uint16_t *C = C_, *padded = NULL;
    if (M % 16) { /* the last tile's rows past M read zeros, not memory past x */
        const int64_t rows = (M + 15) / 16 * 16;
        padded = (uint16_t *)calloc(rows * K, sizeof(uint16_t));
        for (int64_t r = 0; r < M; r++) memcpy(padded + r * K, A + r * lda, K * sizeof(uint16_t));
        A = padded, lda = K;
    }
    const int64_t n_panels = (N + 31) / 32;
#pragma omp parallel num_threads(nthreads)
    {
        amx_configure_gemm();
        for (int64_t m0 = 0; m0 < M; m0 += AMX_CHUNK) {
            const int64_t m1 = m0 + AMX_CHUNK < M ? m0 + AMX_CHUNK : M;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < n_panels; p++) {
                const int64_t ncols = N - p * 32 < 32 ? N - p * 32 : 32;
                uint16_t bias_tail[32];
                const uint16_t *bias_p = panel_bias(bias, p, ncols, bias_tail);
                for (int64_t m = m0; m < m1; m += 32)
                    amx_block(A + m * lda, lda, panels + p * (K / 2) * 64, K, bias_p, C + m * N + p * 32, N,
                              m1 - m < 32 ? m1 - m : 32, ncols);
            }
        }
        _tile_release();
    }
    free(padded);
}
#else
int gemm_bf16_amx_permitted(void) { return 0; }
#endif
