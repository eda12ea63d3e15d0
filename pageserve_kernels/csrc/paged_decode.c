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
#include "bf16_elem.h" /* INLINE, bfloat16 conversions, load1/store1 */

/* The loop variants, chosen per call (cpu_decode.py picks one by timing those this build has).
   The kernel is compiled with -march=native on the host that runs it, so what the compiler may
   use here is what the CPU has; ISA_SCALAR is the specification every other variant is tested against. */
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_BF16 = 3 };
/* How the AVX-512 loops multiply a query by K (decode_avx512.h). */
enum { DOT_F32 = 0, DOT_BF16_SPLIT = 1, DOT_BF16_DP = 2 };
#if HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define HAVE_AVX512 1
#include "decode_avx512.h"
#else
#define HAVE_AVX512 0
#endif
#if HAVE_AVX512 && defined(__AVX512BF16__)
#define HAVE_AVX512_BF16 1
#else
#define HAVE_AVX512_BF16 0
#endif

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
                         int64_t hd, float* scores, int64_t S, int64_t s0, int bf16, int vec) {
    int64_t i = 0;
#if HAVE_AVX2
    if (vec && hd % 8 == 0) {
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

/* acc[g] += sum_i p[g, s0 + i] * V[token i of the block], i < n; `v` points at token 0, head h. */
INLINE void block_values(float* acc, const void* v, int64_t tok_stride, int64_t n, int64_t grp,
                         int64_t hd, const float* scores, int64_t S, int64_t s0, int bf16, int vec) {
    int64_t d0 = 0;
#if HAVE_AVX2
    /* 64 columns at a time stay in eight registers across the block's tokens. */
    for (; vec && d0 + 64 <= hd; d0 += 64) {
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

/* The scaled query rows of one task in the layout the variant's dot products read (decode_avx512.h):
   float32, split into even and odd halves per 32 values, or (dp) the query's own bfloat16 values. */
INLINE void prepare_query(const void* q, int64_t off, int64_t rows, int64_t hd, float scale, float* qf, int bf16,
                          int wide, int mode) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < hd; d++) {
            const int64_t i = off + r * hd + d;
            if (wide && mode == DOT_BF16_DP) {
                ((uint16_t*)qf)[r * hd + d] = ((const uint16_t*)q)[i];
            } else if (wide && mode == DOT_BF16_SPLIT) {
                const int64_t e = d % 32;
                qf[r * hd + d - e + (e % 2 ? 16 : 0) + e / 2] = load1(q, i, bf16) * scale;
            } else {
                qf[r * hd + d] = load1(q, i, bf16) * scale;
            }
        }
}

/* Where one task's K/V lives: what both passes over its blocks share. */
typedef struct {
    const int64_t* table;        /* the request's block table */
    int64_t S, h0, nh;           /* its length; the KV heads h0 .. h0 + nh - 1 of this task */
    int64_t grp, n_kv, hd, bs;   /* query heads per KV head, KV heads, head size, block size */
    int bf16;
    int64_t blocks;              /* blocks holding its S tokens */
    int64_t slice;               /* cache lines of a full block's prefetch asked for before each head */
} Task;

/* The element offset of head h0 of the task's block b, in either pool. */
INLINE int64_t block_base(const Task* t, int64_t b) {
    return (t->table[b] * t->bs * t->n_kv + t->h0) * t->hd;
}

/* The cache lines from head h0 of a block to the end of head h0 + nh - 1 of its n-th token. */
INLINE int64_t block_lines(const Task* t, int64_t n) {
    return (((n - 1) * t->n_kv + t->nh) * t->hd * (t->bf16 ? 2 : 4) + 63) / 64;
}

/* Blocks sit anywhere in the pool, so the hardware prefetcher cannot see the next one coming:
   ask for the block after next while this one is computed, into L2 (prefetcht1), in `nh`
   slices, one before each of this block's heads (`part`). Into L2 because of Little's law: a core
   tracks only ~16-24 outstanding L1 misses but ~48-64 at L2, and a whole block's lines (96 in
   bfloat16, 192 in float32) asked into L1 at once queue behind those few slots: on an AMD EPYC
   with AVX512-BF16 (2 vCPUs, `python -m ops.bench.kernels.cpu_decode`, 577 MB of K/V a step) the
   next block into L1 streamed 8.5-10 GB/s in bfloat16 (~66 ms a step) and 11 GB/s in float32
   (~102 ms); the block after next into L2, 15-17 GB/s in both (33-39 and 68 ms). Sliced, so the
   requests never pile up at once (worth ~8% with L1 prefetches there). Past the pass's last block
   the prefetches run on into the first blocks of what comes next, `then` in `then_cache`: the
   same task's V pool during the K pass, the next task's K pool during the V pass, so that no pass
   starts on two cold blocks. No division here (a 64-bit one takes ~15 cycles, and this runs before
   every head of every block): block indices, and slices of a length fixed per task. */
INLINE void prefetch_next(const Task* t, const void* cache, const Task* then, const void* then_cache, int64_t b,
                          int64_t part) {
    int64_t ahead = b + 2; /* the block after next */
    if (ahead >= t->blocks) {
        if (!then) return;
        ahead -= t->blocks;
        t = then, cache = then_cache;
    }
    if (ahead >= t->blocks) return;
    const char* p = (const char*)at(cache, block_base(t, ahead), t->bf16);
    const int64_t n = t->S - ahead * t->bs < t->bs ? t->S - ahead * t->bs : t->bs;
    const int64_t lines = block_lines(t, n), from = t->slice * part;
    const int64_t to = from + t->slice < lines ? from + t->slice : lines;
    for (int64_t l = from; l < to; l++) __builtin_prefetch(p + 64 * l, 0, 2);
}

/* Pass 1, over K: scores[r, 0:S] for each of the task's grp * nh query rows r (qf in
   prepare_query's layout; with DOT_BF16_DP unscaled, so the scale comes after the sums). */
INLINE void score_blocks(const Task* t, const float* qf, const void* kc, const void* vc, float* scores, float scale,
                         int isa, int mode) {
    const int64_t tok_stride = t->n_kv * t->hd, grp = t->grp, hd = t->hd, S = t->S;
    const int vec = isa >= ISA_AVX2, wide = isa >= ISA_AVX512;
    const int64_t q_elem = wide && mode == DOT_BF16_DP ? 2 : 4;
    const float post = wide && mode == DOT_BF16_DP ? scale : 1.f;
    (void)q_elem, (void)post; /* read by the AVX-512 loops only */
    for (int64_t b = 0, s0 = 0; s0 < S; b++, s0 += t->bs) {
        const int64_t n = S - s0 < t->bs ? S - s0 : t->bs, base = block_base(t, b);
        for (int64_t h = 0; h < t->nh; h++) {
            prefetch_next(t, kc, t, vc, b, h);
#if HAVE_AVX512
            if (wide) {
                block_scores_512((const char*)qf + h * grp * hd * q_elem, q_elem, at(kc, base + h * hd, t->bf16),
                                 tok_stride, n, grp, hd, scores + h * grp * S, S, s0, post, mode);
                continue;
            }
#endif
            block_scores(qf + h * grp * hd, at(kc, base + h * hd, t->bf16), tok_stride, n, grp, hd,
                         scores + h * grp * S, S, s0, t->bf16, vec);
        }
    }
}

/* Pass 2, over V: acc[r] += sum_s p[r, s] V[s]. */
INLINE void weigh_values(const Task* t, const void* vc, const float* scores, float* acc, int isa, const Task* next,
                         const void* kc) {
    const int64_t tok_stride = t->n_kv * t->hd, grp = t->grp, hd = t->hd, S = t->S;
    const int vec = isa >= ISA_AVX2, wide = isa >= ISA_AVX512;
    (void)wide; /* read by the AVX-512 loops only */
    for (int64_t b = 0, s0 = 0; s0 < S; b++, s0 += t->bs) {
        const int64_t n = S - s0 < t->bs ? S - s0 : t->bs, base = block_base(t, b);
        for (int64_t h = 0; h < t->nh; h++) {
            const void* v = at(vc, base + h * hd, t->bf16);
            prefetch_next(t, vc, next, kc, b, h);
#if HAVE_AVX512
            if (wide) {
                weigh_block_512(grp, scores + h * grp * S + s0, S, v, tok_stride, t->bf16, n, acc + h * grp * hd, hd);
                continue;
            }
#endif
            block_values(acc + h * grp * hd, v, tok_stride, n, grp, hd, scores + h * grp * S, S, s0, t->bf16, vec);
        }
    }
}

/* One task t (a request's KV heads t->h0 ..: all of them unless the batch is too small to keep every
   thread busy), block by block, so each block's heads are read as one contiguous run; `next` is the
   task this thread takes after it (NULL: none), whose first K blocks the V pass's prefetches reach.
   qf, acc: (grp * nh, hd) scratch; scores: (grp * nh, S) scratch. */
INLINE void decode_task(const Task* t, const Task* next, const void* q, const void* kc, const void* vc, void* out,
                        int64_t row, float scale, int64_t q_stride, float* qf, float* acc, float* scores, int isa) {
    const int64_t grp = t->grp, hd = t->hd, S = t->S, rows = grp * t->nh;
    const int bf16 = t->bf16, mode = !bf16 ? DOT_F32 : isa == ISA_AVX512_BF16 ? DOT_BF16_DP : DOT_BF16_SPLIT;
    prepare_query(q, row * q_stride + t->h0 * grp * hd, rows, hd, scale, qf, bf16, isa >= ISA_AVX512, mode);
    for (int64_t r = 0; r < rows * hd; r++) acc[r] = 0.f;
    score_blocks(t, qf, kc, vc, scores, scale, isa, mode);
    float inv_sum[rows];
    for (int64_t r = 0; r < rows; r++) {
#if HAVE_AVX512
        if (isa >= ISA_AVX512) {
            inv_sum[r] = softmax_row_512(scores + r * S, S);
            continue;
        }
#endif
        inv_sum[r] = softmax_row(scores + r * S, S, isa >= ISA_AVX2);
    }
    weigh_values(t, vc, scores, acc, isa, next, kc);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < hd; d++)
            store1(out, (row * t->n_kv * grp + t->h0 * grp + r) * hd + d, acc[r * hd + d] * inv_sum[r], bf16);
}

/* Task i: request i / n_split, per_task KV heads from (i % n_split) * per_task. */
INLINE Task task_at(int64_t i, const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_split,
                    int64_t per_task, int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, int bf16) {
    const int64_t b = i / n_split;
    Task t = {tables + b * max_blocks, seq_lens[b], (i % n_split) * per_task, per_task, grp, n_kv, hd, bs, bf16, 0, 0};
    t.blocks = (t.S + bs - 1) / bs;
    t.slice = (block_lines(&t, bs) + per_task - 1) / per_task;
    return t;
}

INLINE void decode_all(const void* q, const void* kc, const void* vc, void* out, const int64_t* rows,
                       const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                       int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int64_t max_seq,
                       int nthreads, int64_t q_stride, int bf16, int isa) {
    const int64_t grp = n_q / n_kv;
    /* Whole requests stream best; split by KV head only when requests alone leave threads idle. */
    const int64_t per_task = n_req >= 4 * nthreads ? n_kv : 1, n_split = n_kv / per_task;
    const int64_t rows_per_task = grp * per_task, n_tasks = n_req * n_split;
    /* Tasks are handed out in order, one at a time as by schedule(dynamic, 1), but each thread claims
       its next task when it starts one, so that it knows where to prefetch past this one's end. */
    int64_t claimed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = (float*)malloc(sizeof(float) * rows_per_task * (max_seq > 0 ? max_seq : 1));
        float* qf = (float*)malloc(sizeof(float) * rows_per_task * hd);
        float* acc = (float*)malloc(sizeof(float) * rows_per_task * hd);
#define TASK_AT(i) task_at(i, tables, max_blocks, seq_lens, n_split, per_task, grp, n_kv, hd, bs, bf16)
        int64_t i = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
        Task t = i < n_tasks ? TASK_AT(i) : (Task){0};
        while (i < n_tasks) {
            const int64_t j = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
            const Task after = j < n_tasks ? TASK_AT(j) : t;
            decode_task(&t, j < n_tasks ? &after : NULL, q, kc, vc, out, rows[i / n_split], scale, q_stride, qf, acc,
                        scores, isa);
            i = j, t = after;
        }
#undef TASK_AT
        free(scores);
        free(qf);
        free(acc);
    }
}

/* Bit i set: variant i is compiled in (and so runs on this host). */
int paged_decode_isas(void) {
    return 1 << ISA_SCALAR | HAVE_AVX2 << ISA_AVX2 | HAVE_AVX512 << ISA_AVX512 | HAVE_AVX512_BF16 << ISA_AVX512_BF16;
}

/* The variant asked for where it applies to this call, else the best one below it that does. */
static int usable_isa(int isa, int64_t hd, int bf16) {
    if (isa >= ISA_AVX512_BF16 && !(bf16 && HAVE_AVX512_BF16)) isa = ISA_AVX512;
    if (isa >= ISA_AVX512 && !(HAVE_AVX512 && hd % 32 == 0)) isa = ISA_AVX2;
    if (isa >= ISA_AVX2 && !HAVE_AVX2) isa = ISA_SCALAR;
    return isa < ISA_SCALAR ? ISA_SCALAR : isa;
}

#define DECODE_ARGS const void* q, const void* kc, const void* vc, void* out, const int64_t* rows,               \
    const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req, int64_t n_q, int64_t n_kv, \
    int64_t hd, int64_t bs, float scale, int64_t max_seq, int nthreads, int64_t q_stride, int isa
#define DECODE_CALL q, kc, vc, out, rows, tables, max_blocks, seq_lens, n_req, n_q, n_kv, hd, bs, scale, max_seq, \
    nthreads, q_stride

void paged_decode_f32(DECODE_ARGS) {
    switch (usable_isa(isa, hd, 0)) {
#if HAVE_AVX512
        case ISA_AVX512: decode_all(DECODE_CALL, 0, ISA_AVX512); break;
#endif
        case ISA_AVX2: decode_all(DECODE_CALL, 0, ISA_AVX2); break;
        default: decode_all(DECODE_CALL, 0, ISA_SCALAR); break;
    }
}

void paged_decode_bf16(DECODE_ARGS) {
    switch (usable_isa(isa, hd, 1)) {
#if HAVE_AVX512_BF16
        case ISA_AVX512_BF16: decode_all(DECODE_CALL, 1, ISA_AVX512_BF16); break;
#endif
#if HAVE_AVX512
        case ISA_AVX512: decode_all(DECODE_CALL, 1, ISA_AVX512); break;
#endif
        case ISA_AVX2: decode_all(DECODE_CALL, 1, ISA_AVX2); break;
        default: decode_all(DECODE_CALL, 1, ISA_SCALAR); break;
    }
}
