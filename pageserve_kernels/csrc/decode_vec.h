/* The decode kernel's loops for the scalar and AVX2 variants (paged_decode.c includes this file; only
   there): each a plain C loop, the specification the vector variants are tested against, and where the
   build has AVX2 + FMA (HAVE_AVX2) an eight-lane version of it in front. The AVX-512 loops: decode_avx512.h. */
#ifndef PAGESERVE_DECODE_VEC_H
#define PAGESERVE_DECODE_VEC_H

#include <math.h>
#include <stdint.h>

#include "bf16_elem.h"
#include "line_run.h"

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

/* scores[g, s0 + i] = qf[g] . K[token i of the block], i < n; `k` points at token 0, head h. `ahead`: lines
   to ask for, a few at each eight tokens of each head in the AVX2 loop (line_run.h); the rest at the end. */
INLINE void block_scores(const float* qf, const void* k, int64_t tok_stride, int64_t n, int64_t grp,
                         int64_t hd, float* scores, int64_t S, int64_t s0, int bf16, int vec, LineRun* ahead) {
    int64_t i = 0;
#if HAVE_AVX2
    if (vec && hd % 8 == 0) {
        /* Eight tokens at a time: eight independent FMA chains hide the FMA latency. */
        const int64_t per_step = lines_per_step(ahead, n / 8 * grp);
        for (; i + 8 <= n; i += 8) {
            for (int64_t g = 0; g < grp; g++) {
                ask_lines(ahead, per_step);
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
    ask_lines(ahead, ahead->left);
}

/* sc[0:S] = exp(sc - max); returns 1 / sum. */
INLINE float softmax_row(float* sc, int64_t S, int vec) {
    float m = sc[0];
    int64_t s = 1;
#if HAVE_AVX2
    if (vec && S >= 8) { /* eight running maxima: the scalar loop is one 4-cycle dependency chain */
        __m256 mv = _mm256_loadu_ps(sc);
        for (s = 8; s + 8 <= S; s += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + s));
        float lanes[8];
        _mm256_storeu_ps(lanes, mv);
        for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
    }
#endif
    for (; s < S; s++) m = sc[s] > m ? sc[s] : m;
    float sum = 0.f;
    s = 0;
#if HAVE_AVX2
    if (vec) {
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
    }
#endif
    for (; s < S; s++) { sc[s] = expf(sc[s] - m); sum += sc[s]; }
    return 1.f / sum;
}

/* acc[g] += sum_i p[g, s0 + i] * V[token i of the block], i < n; `v` points at token 0, head h. `ahead`: as
   for block_scores, a few lines at each token of the AVX2 loop's first head. */
INLINE void block_values(float* acc, const void* v, int64_t tok_stride, int64_t n, int64_t grp,
                         int64_t hd, const float* scores, int64_t S, int64_t s0, int bf16, int vec, LineRun* ahead) {
    int64_t d0 = 0;
#if HAVE_AVX2
    const int64_t per_token = lines_per_step(ahead, n);
    /* 64 columns at a time stay in eight registers across the block's tokens. */
    for (; vec && d0 + 64 <= hd; d0 += 64) {
        for (int64_t g = 0; g < grp; g++) {
            float* a = acc + g * hd + d0;
            __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + 8), r2 = _mm256_loadu_ps(a + 16),
                   r3 = _mm256_loadu_ps(a + 24), r4 = _mm256_loadu_ps(a + 32), r5 = _mm256_loadu_ps(a + 40),
                   r6 = _mm256_loadu_ps(a + 48), r7 = _mm256_loadu_ps(a + 56);
            const float* p = scores + g * S + s0;
            for (int64_t i = 0; i < n; i++) {
                ask_lines(ahead, per_token);
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
    ask_lines(ahead, ahead->left);
}

#endif
