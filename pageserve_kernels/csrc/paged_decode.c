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
#include "softcap.h"   /* cap_scores */

/* The loop variants, chosen per call (cpu_decode.py picks one by timing those this build has).
   The kernel is compiled with -march=native on the host that runs it, so what the compiler may
   use here is what the CPU has; ISA_SCALAR is the specification every other variant is tested against. */
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_BF16 = 3 };
/* How the AVX-512 loops multiply a query by K (decode_avx512.h). */
enum { DOT_F32 = 0, DOT_BF16_SPLIT = 1, DOT_BF16_DP = 2 };
/* The softmax state of every (request, query head) row after the blocks shared_prefix.h tiles (filled only by
   AVX-512 builds): acc (n_req * n_q, hd) unnormalised outputs, m the rows' maxima, l their sums of exps. */
typedef struct {
    float *acc, *m, *l;
} PrefixState;
#if HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define HAVE_AVX512 1
#include "decode_avx512.h"
#include "shared_prefix.h" /* attend_shared_prefix: blocks groups of requests share, as tiles of their rows */
#else
#define HAVE_AVX512 0
#endif
#if HAVE_AVX512 && defined(__AVX512BF16__)
#define HAVE_AVX512_BF16 1
#else
#define HAVE_AVX512_BF16 0
#endif

#include "decode_vec.h" /* block_scores, softmax_row, block_values: the scalar and AVX2 loops */

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
    int64_t first;               /* the first block read here (those before it: shared_prefix.h) */
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
   slices, one for each of this block's heads (`part`), spread over that head's loop (line_run.h says
   why). Into L2 because of Little's law: a core tracks only ~16-24 outstanding L1 misses but ~48-64
   at L2, and a whole block's lines (96 in bfloat16, 192 in float32) asked into L1 at once queue behind
   those few slots: on an AMD EPYC with AVX512-BF16 (2 vCPUs, `python -m ops.bench.kernels.cpu_decode`,
   577 MB of K/V a step) the next block into L1 streamed 8.5-10 GB/s in bfloat16 (~66 ms a step) and
   11 GB/s in float32 (~102 ms); the block after next into L2, 15-17 GB/s in both (33-39 and 68 ms).
   Past the pass's last block the slices run on into the first blocks of what comes next, `then` in
   `then_cache`: the same task's V pool during the K pass, the next task's K pool during the V pass, so
   that no pass starts on two cold blocks. No division here (a 64-bit one takes ~15 cycles, and this
   runs before every head of every block): block indices, and slices of a length fixed per task. */
INLINE LineRun lines_ahead(const Task* t, const void* cache, const Task* then, const void* then_cache, int64_t b,
                           int64_t part) {
    const LineRun none = {NULL, 0};
    int64_t ahead = b + 2; /* the block after next */
    if (ahead >= t->blocks) {
        if (!then) return none;
        ahead += then->first - t->blocks;
        t = then, cache = then_cache;
    }
    if (ahead >= t->blocks) return none;
    const char* p = (const char*)at(cache, block_base(t, ahead), t->bf16);
    const int64_t n = t->S - ahead * t->bs < t->bs ? t->S - ahead * t->bs : t->bs;
    const int64_t lines = block_lines(t, n), from = t->slice * part;
    const int64_t to = from + t->slice < lines ? from + t->slice : lines;
    const LineRun run = {p + 64 * from, to > from ? to - from : 0};
    return run;
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
    for (int64_t b = t->first, s0 = b * t->bs; s0 < S; b++, s0 += t->bs) {
        const int64_t n = S - s0 < t->bs ? S - s0 : t->bs, base = block_base(t, b);
        for (int64_t h = 0; h < t->nh; h++) {
            LineRun ahead = lines_ahead(t, kc, t, vc, b, h);
#if HAVE_AVX512
            if (wide) {
                block_scores_512((const char*)qf + h * grp * hd * q_elem, q_elem, at(kc, base + h * hd, t->bf16),
                                 tok_stride, n, grp, hd, scores + h * grp * S, S, s0, post, mode, &ahead);
                continue;
            }
#endif
            block_scores(qf + h * grp * hd, at(kc, base + h * hd, t->bf16), tok_stride, n, grp, hd,
                         scores + h * grp * S, S, s0, t->bf16, vec, &ahead);
        }
    }
}

/* Pass 2, over V: acc[r] += sum_s p[r, s] V[s]. */
INLINE void weigh_values(const Task* t, const void* vc, const float* scores, float* acc, int isa, const Task* next,
                         const void* kc) {
    const int64_t tok_stride = t->n_kv * t->hd, grp = t->grp, hd = t->hd, S = t->S;
    const int vec = isa >= ISA_AVX2, wide = isa >= ISA_AVX512;
    (void)wide; /* read by the AVX-512 loops only */
    for (int64_t b = t->first, s0 = b * t->bs; s0 < S; b++, s0 += t->bs) {
        const int64_t n = S - s0 < t->bs ? S - s0 : t->bs, base = block_base(t, b);
        for (int64_t h = 0; h < t->nh; h++) {
            const void* v = at(vc, base + h * hd, t->bf16);
            LineRun ahead = lines_ahead(t, vc, next, kc, b, h);
#if HAVE_AVX512
            if (wide) {
                weigh_block_512(grp, scores + h * grp * S + s0, S, v, tok_stride, t->bf16, n, acc + h * grp * hd, hd,
                                &ahead);
                continue;
            }
#endif
            block_values(acc + h * grp * hd, v, tok_stride, n, grp, hd, scores + h * grp * S, S, s0, t->bf16, vec,
                         &ahead);
        }
    }
}

/* One row's softmax over its n scores sc, continuing `prior`'s state for the row (index `at`) where given:
   the shared blocks' maximum, sum and unnormalised output, which then start the row's acc. 1 / the sum. */
INLINE float row_softmax(float* sc, int64_t n, float* acc, int64_t hd, const PrefixState* prior, int64_t at,
                         int isa) {
#if HAVE_AVX512
    if (isa >= ISA_AVX512) {
        const float m0 = prior ? prior->m[at] : -INFINITY;
        float m, sum = softmax_row_512(sc, n, m0, &m);
        if (prior) {
            const float c = expf(m0 - m);
            sum += prior->l[at] * c;
            for (int64_t d = 0; d < hd; d++) acc[d] = prior->acc[at * hd + d] * c;
        }
        return 1.f / sum;
    }
#endif
    (void)acc, (void)hd, (void)prior, (void)at; /* prior: AVX-512 only */
    return softmax_row(sc, n, isa >= ISA_AVX2);
}

/* One task t (a request's KV heads t->h0 ..: all of them unless the batch is too small to keep every
   thread busy), block by block from t->first, so each block's heads are read as one contiguous run; `next`
   is the task this thread takes after it (NULL: none), whose first K blocks the V pass's prefetches reach.
   `prior`: the state after the blocks before t->first (request b's rows), or NULL when there are none.
   qf, acc: (grp * nh, hd) scratch; scores: (grp * nh, S) scratch. `window` > 0: the row sees only its last
   `window` keys (t->first is then no earlier than the block holding the first of them: task_at), and the
   keys of that block before them get probability 0; `softcap` > 0: scores capped (softcap.h) first. */
INLINE void decode_task(const Task* t, const Task* next, const void* q, const void* kc, const void* vc, void* out,
                        int64_t row, int64_t b, const PrefixState* prior, float scale, int64_t window, float softcap,
                        int64_t q_stride, float* qf, float* acc, float* scores, int isa) {
    const int64_t grp = t->grp, hd = t->hd, S = t->S, rows = grp * t->nh, s_first = t->first * t->bs;
    const int64_t s_win = window > 0 && S - window > s_first ? S - window : s_first; /* first key seen */
    const int bf16 = t->bf16, mode = !bf16 ? DOT_F32 : isa == ISA_AVX512_BF16 ? DOT_BF16_DP : DOT_BF16_SPLIT;
    prepare_query(q, row * q_stride + t->h0 * grp * hd, rows, hd, scale, qf, bf16, isa >= ISA_AVX512, mode);
    for (int64_t r = 0; r < rows * hd; r++) acc[r] = 0.f;
    score_blocks(t, qf, kc, vc, scores, scale, isa, mode);
    float inv_sum[rows];
    for (int64_t r = 0; r < rows; r++) {
        if (softcap > 0.f) cap_scores(scores + r * S + s_win, S - s_win, softcap);
        inv_sum[r] = row_softmax(scores + r * S + s_win, S - s_win, acc + r * hd, hd, prior,
                                 b * t->n_kv * grp + t->h0 * grp + r, isa);
        for (int64_t s = s_first; s < s_win; s++) scores[r * S + s] = 0.f; /* before the window: unseen */
    }
    weigh_values(t, vc, scores, acc, isa, next, kc);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < hd; d++)
            store1(out, (row * t->n_kv * grp + t->h0 * grp + r) * hd + d, acc[r * hd + d] * inv_sum[r], bf16);
}

/* Task i: request i / n_split, per_task KV heads from (i % n_split) * per_task. */
/* With a window (> 0), reading starts at the block holding the request's first key inside it: the blocks before
   are never touched. */
INLINE Task task_at(int64_t i, const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_split,
                    int64_t per_task, int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, int bf16, int64_t first,
                    int64_t window) {
    const int64_t b = i / n_split;
    if (window > 0 && seq_lens[b] - window > first * bs) first = (seq_lens[b] - window) / bs;
    Task t = {tables + b * max_blocks, seq_lens[b], (i % n_split) * per_task, per_task, grp, n_kv, hd, bs, bf16,
              0, first, 0};
    t.blocks = (t.S + bs - 1) / bs;
    t.slice = (block_lines(&t, bs) + per_task - 1) / per_task;
    return t;
}

INLINE void decode_all(const void* q, const void* kc, const void* vc, void* out, const int64_t* rows,
                       const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                       int64_t n_q, int64_t n_kv, int64_t hd, int64_t bs, float scale, int64_t max_seq,
                       int nthreads, int64_t q_stride, int64_t window, float softcap, int bf16, int isa) {
    const int64_t grp = n_q / n_kv;
    /* Whole requests stream best; split by KV head only when requests alone leave threads idle. */
    const int64_t per_task = n_req >= 4 * nthreads ? n_kv : 1, n_split = n_kv / per_task;
    const int64_t rows_per_task = grp * per_task, n_tasks = n_req * n_split;
    /* Tasks are handed out in order, one at a time as by schedule(dynamic, 1), but each thread claims
       its next task when it starts one, so that it knows where to prefetch past this one's end. */
    int64_t claimed = 0;
    const int64_t* first = NULL; /* blocks of request b done by shared_prefix.h (NULL: none) */
    PrefixState prior = {0};
#if HAVE_AVX512
    /* Blocks that groups of requests share (a common system prompt) go first, as tiles of their rows. */
    Sharing sharing = {0};
    if (isa >= ISA_AVX512 && window == 0) /* a tile a task for each KV head: two tasks a thread at least;
                                            none with a window, which starts each request past its own blocks */
        sharing = plan_sharing(tables, max_blocks, seq_lens, n_req, bs, (2 * nthreads + n_kv - 1) / n_kv);
    if (sharing.tiles) {
        first = sharing.first;
        prior.acc = (float*)malloc(sizeof(float) * n_req * n_q * hd);
        prior.m = (float*)malloc(sizeof(float) * n_req * n_q), prior.l = (float*)malloc(sizeof(float) * n_req * n_q);
    }
#endif
#pragma omp parallel num_threads(nthreads)
    {
#if HAVE_AVX512
        if (sharing.tiles) /* all threads, then a barrier */
            attend_shared_prefix(q, q_stride, rows, kc, vc, tables, max_blocks, &sharing, grp, n_kv, hd, bs, scale,
                                 &prior, softcap, bf16, isa == ISA_AVX512_BF16);
#endif
        float* scores = (float*)malloc(sizeof(float) * rows_per_task * (max_seq > 0 ? max_seq : 1));
        float* qf = (float*)malloc(sizeof(float) * rows_per_task * hd);
        float* acc = (float*)malloc(sizeof(float) * rows_per_task * hd);
#define TASK_AT(i) task_at(i, tables, max_blocks, seq_lens, n_split, per_task, grp, n_kv, hd, bs, bf16, \
                           first ? first[(i) / n_split] : 0, window)
        int64_t i = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
        Task t = i < n_tasks ? TASK_AT(i) : (Task){0};
        while (i < n_tasks) {
            const int64_t j = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
            const Task after = j < n_tasks ? TASK_AT(j) : t;
            decode_task(&t, j < n_tasks ? &after : NULL, q, kc, vc, out, rows[i / n_split], i / n_split,
                        first && first[i / n_split] ? &prior : NULL, scale, window, softcap, q_stride, qf, acc,
                        scores, isa);
            i = j, t = after;
        }
#undef TASK_AT
        free(scores);
        free(qf);
        free(acc);
    }
    free(prior.acc), free(prior.m), free(prior.l);
#if HAVE_AVX512
    free_sharing(&sharing); /* free(NULL) where no plan was made */
#endif
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
    int64_t hd, int64_t bs, float scale, int64_t max_seq, int nthreads, int64_t q_stride, int isa, int64_t window, \
    float softcap
#define DECODE_CALL q, kc, vc, out, rows, tables, max_blocks, seq_lens, n_req, n_q, n_kv, hd, bs, scale, max_seq, \
    nthreads, q_stride, window, softcap

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

/* The AVX-512 variants' plan for a batch's shared blocks (shared_prefix.h's plan_sharing): first[b], the blocks
   request b reads as part of a tile; returns the tiles, or -1 in a build without those variants. */
int64_t paged_decode_sharing(const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                             int64_t bs, int64_t* first) {
#if HAVE_AVX512
    Sharing sharing = plan_sharing(tables, max_blocks, seq_lens, n_req, bs, 1);
    memcpy(first, sharing.first, sizeof(int64_t) * n_req);
    const int64_t tiles = sharing.tiles;
    free_sharing(&sharing);
    return tiles;
#else
    (void)tables, (void)max_blocks, (void)seq_lens, (void)n_req, (void)bs, (void)first;
    return -1;
#endif
}
