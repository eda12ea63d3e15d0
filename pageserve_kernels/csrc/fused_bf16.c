/* add + RMSNorm, RMSNorm, SiLU-and-mul and rotary for bfloat16 models, one pass each (bound by
   pageserve_kernels/cpu_fused_bf16.py).

   Plain C loops under `#pragma omp simd`: compiled with -march=native, GCC vectorises them for
   the widest vectors of the host (AVX-512 where there is one, AVX2 elsewhere), so one source is
   tested wherever the suite runs. The mixed-precision rule of pageserve_kernels/fused_reference.py:
   the residual stream and the rotary tables are float32, arithmetic is float32, and each op rounds
   its bfloat16 output once (PyTorch's bfloat16 ops round after every op; each rounding moves
   greedy tokens away from a float32 model's). Results match the reference up to the float32
   summation order of the norm and the SiLU's exp. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_elem.h" /* INLINE, bf16_to_f32, f32_to_bf16 (round to nearest even, NaN kept) */

#define MIN_PARALLEL 16384

/* exp(x) for the SiLU: Cephes' polynomial on x clamped to [-87, 88] (infinity above), relative error ~1e-7
   (far below bfloat16's 4e-3), written so the loop around it vectorises. */
INLINE float exp_approx(float x) {
    const int overflow = x > 88.f; /* exp overflows float32: infinity, so silu(very negative) is -0 as torch's */
    x = x < -87.f ? -87.f : (overflow ? 88.f : x);
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return overflow ? INFINITY : y * scale;
}

/* The residual stream stays float32 (one rounding per op, not one per op and per layer):
   residual += x;  x = round(residual * r * w),  r = 1/sqrt(mean(residual^2) + eps). */
void add_rms_norm_bf16(uint16_t* x, float* residual, const uint16_t* w, int64_t T, int64_t H, float eps,
                       int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        uint16_t* xr = x + t * H;
        float* rr = residual + t * H;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < H; d++) {
            const float s = rr[d] + bf16_to_f32(xr[d]);
            rr[d] = s;
            ss += s * s;
        }
        const float r = 1.f / sqrtf(ss / (float)H + eps);
#pragma omp simd
        for (int64_t d = 0; d < H; d++) xr[d] = f32_to_bf16(rr[d] * r * bf16_to_f32(w[d]));
    }
}

/* out = round(x * r * w): x is a row of the float32 residual stream (the first layer's input, the final norm). */
void rms_norm_bf16(const float* x, int64_t x_stride, const uint16_t* w, uint16_t* out, int64_t T, int64_t H,
                   float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float* row = x + t * x_stride;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < H; d++) ss += row[d] * row[d];
        const float r = 1.f / sqrtf(ss / (float)H + eps);
#pragma omp simd
        for (int64_t d = 0; d < H; d++) out[t * H + d] = f32_to_bf16(row[d] * r * bf16_to_f32(w[d]));
    }
}

/* out = round(silu(g) * u), g = gate_up[:, :I], u = gate_up[:, I:]. */
void silu_and_mul_bf16(const uint16_t* gate_up, int64_t gu_stride, uint16_t* out, int64_t T, int64_t I,
                       int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * I >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t* g = gate_up + t * gu_stride;
        const uint16_t* u = g + I;
        uint16_t* o = out + t * I;
#pragma omp simd
        for (int64_t d = 0; d < I; d++) {
            const float x = bf16_to_f32(g[d]);
            o[d] = f32_to_bf16(x / (1.f + exp_approx(-x)) * bf16_to_f32(u[d]));
        }
    }
}

/* Each head [x1 | x2] -> [round(x1 c1 + x2 s1) | round(x2 c2 + x1 s2)], with float32 cos and signed sin tables. */
void rotary_bf16(uint16_t* qk, int64_t row_stride, const float* cos, const float* sin, int64_t table_stride,
                 int64_t T, int64_t heads, int64_t hd, int nthreads) {
    const int64_t half = hd / 2;
#pragma omp parallel for num_threads(nthreads) if (T * heads * hd >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float* c = cos + t * table_stride;
        const float* s = sin + t * table_stride;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t* x = qk + t * row_stride + h * hd;
#pragma omp simd
            for (int64_t d = 0; d < half; d++) {
                const float x1 = bf16_to_f32(x[d]), x2 = bf16_to_f32(x[half + d]);
                x[d] = f32_to_bf16(x1 * c[d] + x2 * s[d]);
                x[half + d] = f32_to_bf16(x2 * c[half + d] + x1 * s[half + d]);
            }
        }
    }
}
