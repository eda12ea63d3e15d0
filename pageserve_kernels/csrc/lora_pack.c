/* A LoRA adapter's file bytes laid out for the shrink/expand kernels (lora_f32.c, lora_bf16.c) in one call:
   pageserve_kernels/lora_pack.py binds it, engine/worker/lora/adapter.py plans the jobs and checks every shape.

   The source is the adapter_model.safetensors file as read (little-endian float32, bfloat16 or float16
   tensors at any byte offset, so every load is a memcpy); the destination one buffer of the serving dtype
   (float32 or bfloat16) holding every packed A and every B panel at 64-byte aligned offsets. One job per
   tensor, JOB_FIELDS int64s:

     KIND        0: rows of a stacked A, 1: one slice's B
     SRC, SRC_DT byte offset into the file, its dtype (0 float32, 1 bfloat16, 2 float16)
     ROWS, COLS  the tensor's shape: A (r, K) / B (n, r)
     DST         byte offset of the packed A / the panels in the destination
     ROW0, TOTAL A: its first row in the stack and the stack's rows (the last job of a stack zeroes the pad rows)
     SCALE       B: the scale as float32 bits, multiplied in float32 before rounding (PyTorch's b.float() * scale)

   Layouts (pageserve_kernels/cpu_lora.py's pack_a and cpu_gemm.py's pack_panels, which the tests hold these to,
   bit for bit; every pad element written 0, so the destination needs no clearing):
     A  (ceil(TOTAL/4), ceil(K/w), 4, w)        w = 8 (float32), 32 (bfloat16)
     B  float32 (ceil(n/16), r, 16)             bfloat16 (ceil(n/32), ceil(r/2), 32, 2)

   Single-threaded on purpose (built without OpenMP): it runs on the engine's reader thread beside the step
   loop's own compute threads, and must take one core at most. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KIND, SRC, SRC_DT, ROWS, COLS, DST, ROW0, TOTAL, SCALE, JOB_FIELDS };
enum { KIND_A, KIND_B };
enum { DT_F32, DT_BF16, DT_F16 };

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf, NaN (payload kept, as PyTorch's conversion) */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant) { /* subnormal: normalise */
        int e = -1;
        do { mant <<= 1; e++; } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* c10::BFloat16's round to nearest even, NaN to 0x7fc0: PyTorch's to(torch.bfloat16) exactly (bf16_elem.h's
   f32_to_bf16 keeps a NaN's payload instead: the packed A and B must equal pack_a/pack_b of PyTorch's casts). */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7fc0;
    return (uint16_t)((u + ((u >> 16) & 1) + 0x7fff) >> 16);
}

/* n elements of the source (dtype dt) at src, as float32, into out. */
static void widen(const uint8_t *src, int64_t dt, int64_t n, float *out) {
    if (dt == DT_F32) {
        memcpy(out, src, n * 4);
    } else if (dt == DT_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(out + i, &bits, 4);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = f16_to_f32(h);
        }
    }
}

/* n values of v into dst in the serving dtype, then pad - n zeros. */
static void put(const float *v, int64_t n, int64_t pad, uint8_t *dst, int bf16) {
    if (bf16) {
        uint16_t *d = (uint16_t *)dst; /* the destination is 64-byte aligned and so is every offset into it */
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(v[i]);
        for (int64_t i = n; i < pad; i++) d[i] = 0;
    } else {
        float *d = (float *)dst;
        memcpy(d, v, n * 4);
        for (int64_t i = n; i < pad; i++) d[i] = 0.0f;
    }
}

/* Rows ROW0.. of a stack into its blocks; the stack's last job also writes the pad rows' zeros. */
static void pack_a(const int64_t *job, const uint8_t *src, uint8_t *dst, int bf16, float *row) {
    const int64_t w = bf16 ? 32 : 8, out = bf16 ? 2 : 4, k = job[COLS], kb = (k + w - 1) / w;
    const int64_t last = job[ROW0] + job[ROWS] == job[TOTAL], pad_to = (job[TOTAL] + 3) / 4 * 4;
    const int64_t esize = job[SRC_DT] == DT_F32 ? 4 : 2;
    for (int64_t i = 0; i < (last ? pad_to - job[ROW0] : job[ROWS]); i++) {
        const int64_t r = job[ROW0] + i, valid = i < job[ROWS] ? k : 0;
        if (valid) widen(src + job[SRC] + i * k * esize, job[SRC_DT], k, row);
        uint8_t *block = dst + job[DST] + ((r / 4) * kb * 4 * w + (r % 4) * w) * out; /* (r/4, 0, r%4, 0) */
        for (int64_t c = 0; c < kb; c++, block += 4 * w * out) {
            const int64_t n = valid - c * w;
            put(row + c * w, n < 0 ? 0 : n > w ? w : n, w, block, bf16);
        }
    }
}

/* b (n, r) floats into panels of `panel` columns, `step` k per group (1 float32, 2 bfloat16): constants at
   each call, so a full group (the common case: every row and k inside b) is a branch-free copy. */
static inline __attribute__((always_inline)) void panels(const float *b, int64_t n, int64_t r, uint8_t *out,
                                                         const int64_t panel, const int64_t step, const int bf16) {
    const int64_t np = (n + panel - 1) / panel, depth = (r + step - 1) / step * step;
    float t[32 * 2];
    for (int64_t p = 0; p < np; p++) {
        const float *rows = b + p * panel * r;
        for (int64_t k = 0; k < depth; k += step) {
            if ((p + 1) * panel <= n && k + step <= r) {
                for (int64_t j = 0; j < panel; j++)
                    for (int64_t s = 0; s < step; s++) t[j * step + s] = rows[j * r + k + s];
            } else {
                for (int64_t j = 0; j < panel; j++)
                    for (int64_t s = 0; s < step; s++)
                        t[j * step + s] = (p * panel + j < n && k + s < r) ? rows[j * r + k + s] : 0.0f;
            }
            put(t, panel * step, panel * step, out, bf16);
            out += panel * step * (bf16 ? 2 : 4);
        }
    }
}

/* One slice's B (n, r), times the scale in float32, into its panels, written in their own order (b: scratch
   of n * r floats). */
static void pack_b(const int64_t *job, const uint8_t *src, uint8_t *dst, int bf16, float *b) {
    const int64_t n = job[ROWS], r = job[COLS];
    float scale;
    uint32_t bits = (uint32_t)job[SCALE];
    memcpy(&scale, &bits, 4);
    widen(src + job[SRC], job[SRC_DT], n * r, b);
    for (int64_t i = 0; i < n * r; i++) b[i] = b[i] * scale;
    if (bf16) panels(b, n, r, dst + job[DST], 32, 2, 1);
    else panels(b, n, r, dst + job[DST], 16, 1, 0);
}

/* Every job, in order. 0, or 1 + the index of a job whose bytes fall outside src or dst (nothing after it
   is written: the caller's plan is wrong), or -1 when out of memory. */
int64_t lora_pack(const uint8_t *src, int64_t src_len, uint8_t *dst, int64_t dst_len, int dst_bf16,
                  const int64_t *jobs, int64_t n_jobs) {
    int64_t most = 1;
    for (int64_t j = 0; j < n_jobs; j++) {
        const int64_t *job = jobs + j * JOB_FIELDS, n = job[ROWS] * job[COLS];
        const int64_t esize = job[SRC_DT] == DT_F32 ? 4 : 2, out = dst_bf16 ? 2 : 4;
        const int64_t w = dst_bf16 ? 32 : 8, panel = dst_bf16 ? 32 : 16;
        const int64_t packed = job[KIND] == KIND_A
            ? (job[TOTAL] + 3) / 4 * 4 * ((job[COLS] + w - 1) / w * w)
            : (job[ROWS] + panel - 1) / panel * panel * (dst_bf16 ? (job[COLS] + 1) / 2 * 2 : job[COLS]);
        if (job[SRC] < 0 || job[SRC] + n * esize > src_len || job[DST] < 0 || job[DST] + packed * out > dst_len
            || (job[KIND] == KIND_A && job[ROW0] + job[ROWS] > job[TOTAL]))
            return j + 1;
        if (job[KIND] == KIND_A ? job[COLS] + w > most : n > most) most = job[KIND] == KIND_A ? job[COLS] + w : n;
    }
    float *scratch = malloc(most * sizeof(float));
    if (!scratch) return -1;
    for (int64_t j = 0; j < n_jobs; j++) {
        const int64_t *job = jobs + j * JOB_FIELDS;
        if (job[KIND] == KIND_A) pack_a(job, src, dst, dst_bf16, scratch);
        else pack_b(job, src, dst, dst_bf16, scratch);
    }
    free(scratch);
    return 0;
}
