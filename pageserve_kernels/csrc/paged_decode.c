/* Decode attention over the paged KV cache, float32 and bfloat16 (bound by kernels/cpu_decode.py).
   The module docstring there explains the algorithm; compiled by kernels/native_build.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

#define INLINE static inline __attribute__((always_inline))

INLINE float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* `bf16` is a compile-time constant at every call site: the branches fold away. */
INLINE float load1(const void* p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

INLINE void store1(void* p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t*)p)[i] = f32_to_bf16(v);
    else ((float*)p)[i] = v;
}

#if HAVE_AVX2
INLINE __m256 load8(const void* p, int64_t i, int bf16) {
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float*)p + i);
}

/* Eight vectors -> one vector holding their eight horizontal sums, in order. */
INLINE __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

#include "exp8_avx2.h"
#endif

/* scores[g, s0 + i] = qf[g] . K[token i of the block], i < n; `k` points at token 0, head h. */
INLINE void block_scores(const float* qf, const void* k, int64_t tok_stride, int64_t n, int64_t grp,
                         int64_t hd, float* scores, int64_t S, int64_t s0, int bf16) {
    int64_t i = 0;
#if HAVE_AVX2
    if (hd % 8 == 0) {
        /* Eight tokens at a time: eight independent FMA chains hide the FMA latency. */
        for (; i + 8 <= n; i += 8) {
            for (int64_t g = 0; g < grp; g++) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
                for (int64_t d = 0; d < hd; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qf + g * hd + d);
                    const int64_t o = i * tok_stride + d;
                    a0 = _mm256_fmadd_ps(qv, load8(k, o, bf16), a0);
                    a1 = _mm256_fmadd_ps(qv, load8(k, o + tok_stride, bf16), a1);
                    a2 = _mm256_fmadd_ps(qv, load8(k, o + 2 * tok_stride, bf16), a2);
                    a3 = _mm256_fmadd_ps(qv, load8(k, o + 3 * tok_stride, bf16), a3);
                    a4 = _mm256_fmadd_ps(qv, load8(k, o + 4 * tok_stride, bf16), a4);
                    a5 = _mm256_fmadd_ps(qv, load8(k, o + 5 * tok_stride, bf16), a5);
                    a6 = _mm256_fmadd_ps(qv, load8(k, o + 6 * tok_stride, bf16), a6);
                    a7 = _mm256_fmadd_ps(qv, load8(k, o + 7 * tok_stride, bf16), a7);
                }
                _mm256_storeu_ps(scores + g * S + s0 + i, hsum8(a0, a1, a2, a3, a4, a5, a6, a7));
            }
        }
    }
#endif
    for (; i < n; i++) {
        for (int64_t g = 0; g < grp; g++) {
            float dot = 0.f;
            for (int64_t d = 0; d < hd; d++) dot += qf[g * hd + d] * load1(k, i * tok_stride + d, bf16);
            scores[g * S + s0 + i] = dot;
        }
    }
}

/* sc[0:S] = exp(sc - max); returns 1 / sum. */
INLINE float softmax_row(float* sc, int64_t S) {
    float m = sc[0];
    for (int64_t s = 1; s < S; s++) m = sc[s] > m ? sc[s] : m;
    float sum = 0.f;
    int64_t s = 0;
#if HAVE_AVX2
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    for (; s + 8 <= S; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + s), mv));
        _mm256_storeu_ps(sc + s, e);
        sv = _mm256_add_ps(sv, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sv);
    for (int j = 0; j < 8; j++) sum += lanes[j];
#endif
    for (; s < S; s++) { sc[s] = expf(sc[s] - m); sum += sc[s]; }
    return 1.f / sum;
}

/* acc[g] += sum_i p[g, s0 + i] * V[token i of the block], i < n; `v` points at token 0, head h. */
INLINE void block_values(float* acc, const void* v, int64_t tok_stride, int64_t n, int64_t grp,
                         int64_t hd, const float* scores, int64_t S, int64_t s0, int bf16) {
    int64_t d0 = 0;
#if HAVE_AVX2
    /* 64 columns at a time stay in eight registers across the block's tokens. */
    for (; d0 + 64 <= hd; d0 += 64) {
        for (int64_t g = 0; g < grp; g++) {
            float* a = acc + g * hd + d0;
            __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + 8), r2 = _mm256_loadu_ps(a + 16),
                   r3 = _mm256_loadu_ps(a + 24), r4 = _mm256_loadu_ps(a + 32), r5 = _mm256_loadu_ps(a + 40),
                   r6 = _mm256_loadu_ps(a + 48), r7 = _mm256_loadu_ps(a + 56);
            const float* p = scores + g * S + s0;
            for (int64_t i = 0; i < n; i++) {
                const __m256 pv = _mm256_set1_ps(p[i]);
                const int64_t o = i * tok_stride + d0;
                r0 = _mm256_fmadd_ps(pv, load8(v, o, bf16), r0);
                r1 = _mm256_fmadd_ps(pv, load8(v, o + 8, bf16), r1);
                r2 = _mm256_fmadd_ps(pv, load8(v, o + 16, bf16), r2);
                r3 = _mm256_fmadd_ps(pv, load8(v, o + 24, bf16), r3);
                r4 = _mm256_fmadd_ps(pv, load8(v, o + 32, bf16), r4);
                r5 = _mm256_fmadd_ps(pv, load8(v, o + 40, bf16), r5);
                r6 = _mm256_fmadd_ps(pv, load8(v, o + 48, bf16), r6);
                r7 = _mm256_fmadd_ps(pv, load8(v, o + 56, bf16), r7);
            }
            _mm256_storeu_ps(a, r0); _mm256_storeu_ps(a + 8, r1); _mm256_storeu_ps(a + 16, r2);
            _mm256_storeu_ps(a + 24, r3); _mm256_storeu_ps(a + 32, r4); _mm256_storeu_ps(a + 40, r5);
            _mm256_storeu_ps(a + 48, r6); _mm256_storeu_ps(a + 56, r7);
        }
    }
#endif
    for (int64_t g = 0; g < grp; g++) {
        const float* p = scores + g * S + s0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = d0; d < hd; d++) acc[g * hd + d] += p[i] * load1(v, i * tok_stride + d, bf16);
    }
}

INLINE const void* at(const void* base, int64_t i, int bf16) {
    return bf16 ? (const void*)((const uint16_t*)base + i) : (const void*)((const float*)base + i);
}

/* One request, KV heads h0 .. h1-1 (all of them unless the batch is too small to keep every
   thread busy): block by block, so each block's heads are read as one contiguous run.
   qf, acc: (grp * (h1 - h0), hd) scratch; scores: (grp * (h1 - h0), S) scratch. */
INLINE void decode_request(const void* q, const void* kc, const void* vc, void* out, int64_t row,
                           const int64_t* table, int64_t S, int64_t h0, int64_t h1, int64_t grp, int64_t n_kv,
                           int64_t hd, int64_t bs, float scale, int64_t q_stride, float* qf, float* acc,
                           float* scores, int bf16) {
    const int64_t tok_stride = n_kv * hd, n_q = n_kv * grp, nh = h1 - h0;
    const int64_t rows = grp * nh;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < hd; d++) {
            qf[r * hd + d] = load1(q, row * q_stride + (h0 * grp + r) * hd + d, bf16) * scale;
            acc[r * hd + d] = 0.f;
        }
    for (int64_t s0 = 0; s0 < S; s0 += bs) {
        const int64_t n = S - s0 < bs ? S - s0 : bs;
        const int64_t base = (table[s0 / bs] * bs * n_kv + h0) * hd;
        for (int64_t h = 0; h < nh; h++)
            block_scores(qf + h * grp * hd, at(kc, base + h * hd, bf16), tok_stride, n, grp, hd,
                         scores + h * grp * S, S, s0, bf16);
    }
    float inv_sum[rows];
    for (int64_t r = 0; r < rows; r++) inv_sum[r] = softmax_row(scores + r * S, S);
    for (int64_t s0 = 0; s0 < S; s0 += bs) {
        const int64_t n = S - s0 < bs ? S - s0 : bs;
        const int64_t base = (table[s0 / bs] * bs * n_kv + h0) * hd;
        for (int64_t h = 0; h < nh; h++)
            block_values(acc + h * grp * hd, at(vc, base + h * hd, bf16), tok_stride, n, grp, hd,
                         scores + h * grp * S, S, s0, bf16);
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < hd; d++)
            store1(out, (row * n_q + h0 * grp + r) * hd + d, acc[r * hd + d] * inv_sum[r], bf16);
}

INLINE void decode_all(const void* q, const void* kc, const void* vc, void* out, const int64_t* rows,
                       const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                       int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int64_t max_seq,
                       int nthreads, int64_t q_stride, int bf16) {
    const int64_t grp = n_q / n_kv;
    /* Whole requests stream best; split by KV head only when requests alone leave threads idle. */
    const int64_t per_task = n_req >= 4 * nthreads ? n_kv : 1, n_split = n_kv / per_task;
    const int64_t rows_per_task = grp * per_task;
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = (float*)malloc(sizeof(float) * rows_per_task * (max_seq > 0 ? max_seq : 1));
        float* qf = (float*)malloc(sizeof(float) * rows_per_task * hd);
        float* acc = (float*)malloc(sizeof(float) * rows_per_task * hd);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_req * n_split; t++) {
            const int64_t b = t / n_split, h0 = (t % n_split) * per_task;
            decode_request(q, kc, vc, out, rows[b], tables + b * max_blocks, seq_lens[b], h0, h0 + per_task, grp,
                           n_kv, hd, bs, scale, q_stride, qf, acc, scores, bf16);
        }
        free(scores);
        free(qf);
        free(acc);
    }
}

#define DECODE_ARGS const void* q, const void* kc, const void* vc, void* out, const int64_t* rows,               \
    const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req, int64_t n_q, int64_t n_kv, \
    int64_t hd, int64_t bs, float scale, int64_t max_seq, int nthreads, int64_t q_stride
#define DECODE_CALL q, kc, vc, out, rows, tables, max_blocks, seq_lens, n_req, n_q, n_kv, hd, bs, scale, max_seq, \
    nthreads, q_stride

void paged_decode_f32(DECODE_ARGS) { decode_all(DECODE_CALL, 0); }
void paged_decode_bf16(DECODE_ARGS) { decode_all(DECODE_CALL, 1); }
