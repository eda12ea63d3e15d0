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

INLINE float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t H) {
    float s = 0.f; /* each product is exact in float32 (8 x 8 significand bits); only the sum rounds */
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < H; d++) s += bf16_to_f32(a[d]) * bf16_to_f32(b[d]);
    return s;
}

/* The row's values that could be its largest before the rounding: those at or above `threshold`, rewritten
   as the float32 product of hidden and their weight rows, unless there are more than K (a flat row).
   Blocks of 64 are tested with a vectorised OR first: a hit is rare, the row long. */
static void refine_row(float* o, int64_t V, float threshold, const uint16_t* hidden, const uint16_t* weight,
                       int64_t w_stride, int64_t H, int64_t K) {
    int64_t count = 0;
#pragma omp simd reduction(+ : count)
    for (int64_t v = 0; v < V; v++) count += o[v] >= threshold;
    if (count > K) return;
    for (int64_t b = 0; b < V; b += 64) {
        const int64_t end = b + 64 < V ? b + 64 : V;
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int64_t v = b; v < end; v++) any |= o[v] >= threshold;
        if (!any) continue;
        for (int64_t v = b; v < end; v++)
            if (o[v] >= threshold) o[v] = dot_bf16(hidden, weight + v * w_stride, H);
    }
}

/* out (N, V) float32 = logits (N, V), the bfloat16-rounded vocab product of hidden (N, H) and weight (V, H),
   except each row's values within one unit in the last place (at `bits` significand bits) of the row's
   maximum, which are the exact float32 products: engine/worker/layers/exact_logits.py says why. A row with
   a NaN or no finite maximum, or more than K such values, keeps its rounded values. One pass converts and
   finds the maximum; the row then sits in L2 for the rare refinement. */
void exact_logits_bf16(const uint16_t* logits, int64_t stride, const uint16_t* hidden, int64_t h_stride,
                       const uint16_t* weight, int64_t w_stride, float* out, int64_t N, int64_t V, int64_t H, int bits,
                       int64_t K, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (N * V >= MIN_PARALLEL) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint16_t* row = logits + n * stride;
        float* o = out + n * V;
        float m = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
        for (int64_t v = 0; v < V; v++) {
            const float x = bf16_to_f32(row[v]);
            o[v] = x;
            m = x > m ? x : m;
            nan |= x != x;
        }
        if (nan || !isfinite(m)) continue;
        int e;
        frexpf(m, &e); /* |m| = f * 2^e, f in [0.5, 1): a step of 2^(e - bits) at `bits` bits */
        refine_row(o, V, m - ldexpf(1.0f, e - bits), hidden + n * h_stride, weight, w_stride, H, K);
    }
}
