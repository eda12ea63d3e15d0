/* add + RMSNorm, SiLU-and-mul and rotary for bfloat16 tensors, one pass each (bound by kernels/cpu_fused_bf16.py).

   Plain C loops under `#pragma omp simd`: compiled with -march=native, GCC vectorises them for
   the widest vectors of the host (AVX-512 where there is one, AVX2 elsewhere), so one source is
   tested wherever the suite runs. Arithmetic in float32; every result is rounded to bfloat16
   (nearest even) where the PyTorch reference (kernels/fused_ops.py) rounds it, so results
   match the reference up to float32 summation order in the norm. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_elem.h" /* INLINE, bf16_to_f32, f32_to_bf16 (round to nearest even, NaN kept) */

#define MIN_PARALLEL 16384

/* float -> bfloat16 -> float: the rounding the reference applies between two ops. */
INLINE float round_bf(float f) { return bf16_to_f32(f32_to_bf16(f)); }

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

/* residual += x (rounded); x = round(round(residual * r) * w), r = 1/sqrt(mean(residual^2) + eps). */
void add_rms_norm_bf16(uint16_t* x, uint16_t* residual, const uint16_t* w, int64_t T, int64_t H, float eps,
                       int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        uint16_t* xr = x + t * H;
        uint16_t* rr = residual + t * H;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < H; d++) {
            const float s = round_bf(bf16_to_f32(rr[d]) + bf16_to_f32(xr[d]));
            rr[d] = f32_to_bf16(s);
            ss += s * s;
        }
        const float r = 1.f / sqrtf(ss / (float)H + eps);
#pragma omp simd
        for (int64_t d = 0; d < H; d++) xr[d] = f32_to_bf16(bf16_to_f32(w[d]) * round_bf(bf16_to_f32(rr[d]) * r));
    }
}

void rms_norm_bf16(const uint16_t* x, int64_t x_stride, const uint16_t* w, uint16_t* out, int64_t T, int64_t H,
                   float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (T * H >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t* row = x + t * x_stride;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < H; d++) ss += bf16_to_f32(row[d]) * bf16_to_f32(row[d]);
        const float r = 1.f / sqrtf(ss / (float)H + eps);
#pragma omp simd
        for (int64_t d = 0; d < H; d++) out[t * H + d] = f32_to_bf16(bf16_to_f32(w[d]) * round_bf(bf16_to_f32(row[d]) * r));
    }
}

/* out = round(round(silu(g)) * u), g = gate_up[:, :I], u = gate_up[:, I:]. */
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
            o[d] = f32_to_bf16(round_bf(x / (1.f + exp_approx(-x))) * bf16_to_f32(u[d]));
        }
    }
}

/* Each head [x1 | x2] -> [round(round(x1 c1) + round(x2 s1)) | round(round(x2 c2) + round(x1 s2))]. */
void rotary_bf16(uint16_t* qk, int64_t row_stride, const uint16_t* cos, const uint16_t* sin, int64_t table_stride,
                 int64_t T, int64_t heads, int64_t hd, int nthreads) {
    const int64_t half = hd / 2;
#pragma omp parallel for num_threads(nthreads) if (T * heads * hd >= MIN_PARALLEL) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t* c = cos + t * table_stride;
        const uint16_t* s = sin + t * table_stride;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t* x = qk + t * row_stride + h * hd;
#pragma omp simd
            for (int64_t d = 0; d < half; d++) {
                const float x1 = bf16_to_f32(x[d]), x2 = bf16_to_f32(x[half + d]);
                x[d] = f32_to_bf16(round_bf(x1 * bf16_to_f32(c[d])) + round_bf(x2 * bf16_to_f32(s[d])));
                x[half + d] = f32_to_bf16(round_bf(x2 * bf16_to_f32(c[half + d])) + round_bf(x1 * bf16_to_f32(s[half + d])));
            }
        }
    }
}
