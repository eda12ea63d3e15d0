/* add + RMSNorm, SiLU-and-mul, rotary, argmax in one pass each, float32, and the KV cache write for
   any dtype (bound by kernels/cpu_fused.py). The module docstring there explains the algorithm;
   compiled by kernels/native_build.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

#define INLINE static inline __attribute__((always_inline))
/* Below this many elements a parallel region costs more than it saves. */
#define MIN_PARALLEL 16384

#if HAVE_AVX2
INLINE __m256 sq8(const float* p) { const __m256 v = _mm256_loadu_ps(p); return _mm256_mul_ps(v, v); }

/* sum(x[i]^2) added in the order ATen's sum uses on AVX2 (SumKernel.cpp, cascade_sum): 8-float
   vectors in 4 interleaved columns, summed in cascade levels of 16, then the columns, the scalar
   tail, the lanes. Same order, same float32 roundings: the same mean as F.rms_norm. */
INLINE float sum_squares(const float* x, int64_t n) {
    const int64_t nvec = n / 8, rows = nvec / 4;
    __m256 acc[4][4];
    for (int l = 0; l < 4; l++)
        for (int k = 0; k < 4; k++) acc[l][k] = _mm256_setzero_ps();
    int64_t i = 0;
    while (i + 16 <= rows) {
        for (int64_t j = 0; j < 16; j++, i++)
            for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], sq8(x + (i * 4 + k) * 8));
        for (int l = 1; l < 4; l++) {
            for (int k = 0; k < 4; k++) {
                acc[l][k] = _mm256_add_ps(acc[l][k], acc[l - 1][k]);
                acc[l - 1][k] = _mm256_setzero_ps();
            }
            if (i & ((int64_t)15 << (4 * l))) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], sq8(x + (i * 4 + k) * 8));
    for (int l = 1; l < 4; l++)
        for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], acc[l][k]);
    for (int64_t v = rows * 4; v < nvec; v++) acc[0][0] = _mm256_add_ps(acc[0][0], sq8(x + v * 8));
    for (int k = 1; k < 4; k++) acc[0][0] = _mm256_add_ps(acc[0][0], acc[0][k]);
    float total = 0.f, lanes[8];
    for (int64_t e = nvec * 8; e < n; e++) total += x[e] * x[e];
    _mm256_storeu_ps(lanes, acc[0][0]);
    for (int k = 0; k < 8; k++) total += lanes[k];
    return total;
}

/* SLEEF's expf_u10 (ATen's Vectorized<float>::exp on AVX2), step for step. */
INLINE __m256 exp8(__m256 d) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(d, _mm256_set1_ps(1.442695040888963407359924681001892137f)));
    const __m256 qf = _mm256_cvtepi32_ps(q);
    __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-0.693145751953125f), d);
    s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-1.428606765330187045e-06f), s);
    __m256 u = _mm256_set1_ps(0.000198527617612853646278381f);
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00139304355252534151077271f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00833336077630519866943359f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.0416664853692054748535156f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.166666671633720397949219f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.5f));
    u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s));
    /* u * 2^q in two halves, so q near the ends of the range neither overflows nor underflows early */
    const __m256i q1 = _mm256_srai_epi32(q, 1), q2 = _mm256_sub_epi32(q, q1), bias = _mm256_set1_epi32(0x7f);
    u = _mm256_mul_ps(u, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q1, bias), 23)));
    u = _mm256_mul_ps(u, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q2, bias), 23)));
    u = _mm256_andnot_ps(_mm256_cmp_ps(d, _mm256_set1_ps(-104.f), _CMP_LT_OQ), u);
    return _mm256_blendv_ps(u, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(_mm256_set1_ps(100.f), d, _CMP_LT_OQ));
}
#else
INLINE float sum_squares(const float* x, int64_t n) {
    float total = 0.f;
    for (int64_t e = 0; e < n; e++) total += x[e] * x[e];
    return total;
}
#endif

INLINE float inv_rms(const float* x, int64_t n, float eps) {
    return 1.f / sqrtf(sum_squares(x, n) / (float)n + eps);
}

/* out[d] = (x[d] * r) * w[d]: PyTorch's order (normalise, then scale). */
INLINE void scale_row(const float* x, const float* w, float r, float* out, int64_t n) {
    int64_t d = 0;
#if HAVE_AVX2
    const __m256 rv = _mm256_set1_ps(r);
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), rv), _mm256_loadu_ps(w + d)));
#endif
    for (; d < n; d++) out[d] = (x[d] * r) * w[d];
}

void rms_norm_f32(const float* x, int64_t x_stride, const float* w, float* out, int64_t T, int64_t H, float eps,
                  int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float* row = x + t * x_stride;
        scale_row(row, w, inv_rms(row, H, eps), out + t * H, H);
    }
}

void add_rms_norm_f32(float* x, float* residual, const float* w, int64_t T, int64_t H, float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float* xr = x + t * H;
        float* rr = residual + t * H;
        for (int64_t d = 0; d < H; d++) rr[d] += xr[d];
        scale_row(rr, w, inv_rms(rr, H, eps), xr, H);
    }
}

/* ATen's vectorized loops work in pairs of vectors and leave the rest of each row to the
   scalar formula (with libm's expf): same split here, same results. */
void silu_and_mul_f32(const float* gate_up, int64_t gu_stride, float* out, int64_t T, int64_t I, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * I >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float* g = gate_up + t * gu_stride;
        const float* u = g + I;
        float* o = out + t * I;
        int64_t d = 0;
#if HAVE_AVX2
        const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
        for (; d < I / 16 * 16; d += 16) {  /* two independent vectors: the exp chains overlap */
            const __m256 x0 = _mm256_loadu_ps(g + d), x1 = _mm256_loadu_ps(g + d + 8);
            const __m256 e0 = exp8(_mm256_xor_ps(x0, sign)), e1 = exp8(_mm256_xor_ps(x1, sign));
            const __m256 s0 = _mm256_div_ps(x0, _mm256_add_ps(one, e0)), s1 = _mm256_div_ps(x1, _mm256_add_ps(one, e1));
            _mm256_storeu_ps(o + d, _mm256_mul_ps(s0, _mm256_loadu_ps(u + d)));
            _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(s1, _mm256_loadu_ps(u + d + 8)));
        }
#endif
        for (; d < I; d++) o[d] = (g[d] / (1.f + expf(-g[d]))) * u[d];
    }
}

/* Each head [x1 | x2] of each row -> [x1 c1 + x2 s1 | x2 c2 + x1 s2], c = cos row, s = signed sin row. */
void rotary_f32(float* qk, int64_t row_stride, const float* cos, const float* sin, int64_t table_stride, int64_t T,
                int64_t heads, int64_t hd, int nthreads) {
    const int64_t half = hd / 2;
#pragma omp parallel for num_threads(nthreads) if (T * heads * hd >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float* c = cos + t * table_stride;
        const float* s = sin + t * table_stride;
        for (int64_t h = 0; h < heads; h++) {
            float* x = qk + t * row_stride + h * hd;
            int64_t d = 0;
#if HAVE_AVX2
            for (; d + 8 <= half; d += 8) {
                const __m256 x1 = _mm256_loadu_ps(x + d), x2 = _mm256_loadu_ps(x + half + d);
                const __m256 lo = _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(c + d)),
                                                _mm256_mul_ps(x2, _mm256_loadu_ps(s + d)));
                const __m256 hi = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(c + half + d)),
                                                _mm256_mul_ps(x1, _mm256_loadu_ps(s + half + d)));
                _mm256_storeu_ps(x + d, lo);
                _mm256_storeu_ps(x + half + d, hi);
            }
#endif
            for (; d < half; d++) {
                const float x1 = x[d], x2 = x[half + d];
                x[d] = x1 * c[d] + x2 * s[d];
                x[half + d] = x2 * c[half + d] + x1 * s[half + d];
            }
        }
    }
}

/* A row's maximum (NaNs skipped) and whether it holds a NaN: one vectorised pass. */
INLINE float row_max(const float* row, int64_t V, int* has_nan) {
    float m = -INFINITY;
    int nan = 0;
    int64_t d = 0;
#if HAVE_AVX2
    __m256 mv = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
    for (; d + 8 <= V; d += 8) {
        const __m256 v = _mm256_loadu_ps(row + d);
        mv = _mm256_max_ps(mv, v);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int k = 0; k < 8; k++) m = lanes[k] > m ? lanes[k] : m;
    nan = _mm256_movemask_ps(unordered) != 0;
#endif
    for (; d < V; d++) {
        nan |= isnan(row[d]);
        m = row[d] > m ? row[d] : m;
    }
    *has_nan = nan;
    return m;
}

/* Each row's first index of its maximum, a NaN counting as the maximum: torch.argmax's rules.
   One vectorised pass finds the maximum (and whether the row has a NaN), a second the index. */
void argmax_rows_f32(const float* x, int64_t stride, int64_t N, int64_t V, int64_t* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (N * V >= MIN_PARALLEL) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float* row = x + n * stride;
        int nan;
        const float m = row_max(row, V, &nan);
        int64_t at = 0;
        if (nan) {
            while (!isnan(row[at])) at++;
        } else {
            while (row[at] != m) at++;
        }
        out[n] = at;
    }
}

/* This step's K and V rows into their cache slots: row t of key (value) -> row slots[t] of key_cache
   (value_cache). A byte copy, so any dtype: `width` bytes a row, source rows `key_stride` and
   `value_stride` bytes apart (slices of the QKV product), cache rows contiguous. A slot outside
   [0, num_slots) is skipped and counted: the caller raises, as index_copy_ would. torch's index_copy_
   took 66 us a layer for 64 decode rows in a step (two calls and their views), this a few. */
int64_t store_kv_rows(const char* key, int64_t key_stride, const char* value, int64_t value_stride,
                      char* key_cache, char* value_cache, const int64_t* slots, int64_t T, int64_t width,
                      int64_t num_slots) {
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        const int64_t s = slots[t];
        if (s < 0 || s >= num_slots) {
            bad++;
            continue;
        }
        memcpy(key_cache + s * width, key + t * key_stride, (size_t)width);
        memcpy(value_cache + s * width, value + t * value_stride, (size_t)width);
    }
    return bad;
}
