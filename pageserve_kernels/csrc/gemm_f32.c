/* float32 products over prepacked 16-column weight panels, AVX2 + FMA (bound by kernels/cpu_gemm.py).
   The module docstring there explains the algorithm; compiled by kernels/native_build.py. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* c[r, 0:ncols] = a[r, 0:K] . panel (+ bias) for r < MR. Named accumulators, not an
   array: GCC keeps them in registers only then. MR is a constant at every call site. */
static inline __attribute__((always_inline)) void tile(
    const int MR, const float *restrict a, int64_t lda, const float *restrict b, int64_t K,
    const float *restrict bias, float *restrict c, int64_t ldc, int64_t ncols) {
#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
    ROWS(DECL)
    for (int64_t k = 0; k < K; k++) {
        const __m256 b0 = _mm256_load_ps(b + k * 16), b1 = _mm256_load_ps(b + k * 16 + 8);
#define FMA(r) if (MR > r) { const __m256 x = _mm256_broadcast_ss(a + r * lda + k); \
            c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0); c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1); }
        ROWS(FMA)
    }
    if (bias) {
        const __m256 bias0 = _mm256_loadu_ps(bias), bias1 = _mm256_loadu_ps(bias + 8);
#define BIAS(r) if (MR > r) { c##r##0 = _mm256_add_ps(c##r##0, bias0); c##r##1 = _mm256_add_ps(c##r##1, bias1); }
        ROWS(BIAS)
    }
    if (ncols == 16) {
#define STORE(r) if (MR > r) { _mm256_storeu_ps(c + r * ldc, c##r##0); _mm256_storeu_ps(c + r * ldc + 8, c##r##1); }
        ROWS(STORE)
    } else { /* the last panel of an N that is no multiple of 16 */
        float tmp[16];
#define STORE_PART(r) if (MR > r) { _mm256_storeu_ps(tmp, c##r##0); _mm256_storeu_ps(tmp + 8, c##r##1); \
            memcpy(c + r * ldc, tmp, ncols * sizeof(float)); }
        ROWS(STORE_PART)
    }
}

static void tile_rows(int64_t mr, const float *a, int64_t lda, const float *b, int64_t K, const float *bias,
                      float *c, int64_t ldc, int64_t ncols) {
    switch (mr) {
    case 6: tile(6, a, lda, b, K, bias, c, ldc, ncols); break;
    case 5: tile(5, a, lda, b, K, bias, c, ldc, ncols); break;
    case 4: tile(4, a, lda, b, K, bias, c, ldc, ncols); break;
    case 3: tile(3, a, lda, b, K, bias, c, ldc, ncols); break;
    case 2: tile(2, a, lda, b, K, bias, c, ldc, ncols); break;
    default: tile(1, a, lda, b, K, bias, c, ldc, ncols); break;
    }
}

/* C (M, N) row-major = A (M, K; row stride lda) @ W^T (+ bias), W given as panels (ceil(N/16), K, 16). */
void gemm_f32(const float *A, int64_t lda, const float *panels, const float *bias, float *C,
              int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t n_panels = (N + 15) / 16, max_rows = 96;
    const int64_t n_chunks = (M + max_rows - 1) / max_rows;
    const int64_t mc = ((M + n_chunks - 1) / n_chunks + 5) / 6 * 6; /* equal chunks, whole tiles */
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
    for (int64_t ch = 0; ch < n_chunks; ch++)
        for (int64_t p = 0; p < n_panels; p++) {
            const int64_t m0 = ch * mc, m1 = m0 + mc < M ? m0 + mc : M;
            const int64_t ncols = N - p * 16 < 16 ? N - p * 16 : 16;
            const float *b = panels + p * K * 16, *bias_p = bias ? bias + p * 16 : 0;
            float bias_tail[16] = {0};
            if (bias && ncols < 16) { /* the bias has N entries: no reading past them */
                memcpy(bias_tail, bias_p, ncols * sizeof(float));
                bias_p = bias_tail;
            }
            for (int64_t m = m0; m < m1; m += 6)
                tile_rows(m1 - m < 6 ? m1 - m : 6, A + m * lda, lda, b, K, bias_p, C + m * N + p * 16, N, ncols);
        }
}
