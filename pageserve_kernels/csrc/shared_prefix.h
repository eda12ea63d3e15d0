/* Decode attention over the leading blocks that requests of a batch share (a common system prompt kept once
   by the prefix cache: one group of requests per prompt), as tiles of many requests' query rows at once;
   paged_decode.c includes this file where the build has AVX-512, and finishes each request over its own
   blocks from the state left here.

   Request by request, the shared keys are read (from the caches: they are shared) and multiplied once per
   request, each token's score a horizontal sum of partial products. Here a tile of TILE_REQUESTS requests'
   rows meets each block of 16 shared keys once: the keys transposed (bfloat16 pairs for AVX512-BF16's
   _mm512_dpbf16_ps, else float32), Q . K^T sixteen keys an instruction, the online softmax, and P . V in
   the six-row tiles of values_avx512.h, as the prompt kernel does. What a row takes on from here is its running maximum m, the
   sum l of exp(score - m) and the unnormalised output acc = sum exp(score - m) V; the request's own blocks
   then extend the same softmax (paged_decode.c's decode_task; the state is its PrefixState). */
#ifndef PAGESERVE_SHARED_PREFIX_H
#define PAGESERVE_SHARED_PREFIX_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attend_tiles.h"
#include "softcap.h"
#include "values_avx512.h"

#define TILE_REQUESTS 16
/* Fewer requests than this make tiles no better than their own loops: on an AMD EPYC Zen 4 (2 threads,
   `cpu_decode --shared-prefix 384 --context 400 600 --requests R`, bfloat16) 8-10 requests ran even,
   12 in 4.4-4.6 ms a step against 5.2-5.5, 16 in 5.5-6.1 against 6.9-7.2. */
#define MIN_SHARING_REQUESTS 12

/* Which requests share which blocks: requests sorted by their block tables (whole blocks before each one's
   last token), so that those beginning with the same blocks stand together in `order`; runs of at least
   MIN_SHARING_REQUESTS of them beginning with the same 32 tokens or more are cut into tiles of
   TILE_REQUESTS, and first[b] is the blocks request b takes from its tile (0: none). */
typedef struct {
    int64_t *order, *first;        /* (n_req) each */
    int64_t *tile_from, *tile_to;  /* tile i: requests order[tile_from[i] .. tile_to[i] - 1] */
    int64_t tiles;
    int64_t min_tiles;             /* a run's tiles at least (as many as keep the threads busy), up to one a request */
} Sharing;

typedef struct {
    const int64_t* table;
    int64_t whole, b; /* blocks wholly before the request's last token; the request */
} TableKey;

/* The blocks two requests' tables begin with alike, among those wholly before each one's last token. */
INLINE int64_t common_prefix(const TableKey* x, const TableKey* y) {
    const int64_t n = x->whole < y->whole ? x->whole : y->whole;
    int64_t c = 0;
    while (c < n && x->table[c] == y->table[c]) c++;
    return c;
}

/* Lexicographic order of the tables' whole blocks, a shorter one first where one begins the other. */
static int by_table(const void* a, const void* b) {
    const TableKey *x = (const TableKey*)a, *y = (const TableKey*)b;
    const int64_t c = common_prefix(x, y);
    if (c < x->whole && c < y->whole) return x->table[c] < y->table[c] ? -1 : 1;
    return x->whole != y->whole ? (x->whole < y->whole ? -1 : 1) : (x->b < y->b ? -1 : x->b > y->b);
}

/* In sorted order the blocks requests i .. j-1 all begin with are the fewest any neighbours share:
   lcp[k] for neighbours k-1, k. Returns that count, and where the fewest are (*at: a place to cut). */
INLINE int64_t run_common(const int64_t* lcp, int64_t i, int64_t j, int64_t* at) {
    int64_t common = lcp[i + 1];
    *at = i + 1;
    for (int64_t k = i + 2; k < j; k++)
        if (lcp[k] < common) common = lcp[k], *at = k;
    return common;
}

/* The most shared blocks times requests that requests i .. j-1 can be tiled for: whole, or cut where
   neighbours share the fewest blocks and each part tiled as well as it can be. One request that shares only
   a block or two with the others, sorted next to them, would otherwise take their common prefix down to
   those blocks (a chat template's opening lines in a block of their own). */
static int64_t tiling_value(const int64_t* lcp, int64_t i, int64_t j, int64_t least) {
    if (j - i < MIN_SHARING_REQUESTS) return 0;
    int64_t at;
    const int64_t common = run_common(lcp, i, j, &at);
    const int64_t whole = common >= least ? (j - i) * common : 0;
    const int64_t cut = tiling_value(lcp, i, at, least) + tiling_value(lcp, at, j, least);
    return whole >= cut ? whole : cut;
}

static void tile_runs(Sharing* p, const int64_t* lcp, int64_t i, int64_t j, int64_t least) {
    if (j - i < MIN_SHARING_REQUESTS) return;
    int64_t at;
    const int64_t common = run_common(lcp, i, j, &at);
    const int64_t whole = common >= least ? (j - i) * common : 0;
    if (whole > 0 && whole >= tiling_value(lcp, i, at, least) + tiling_value(lcp, at, j, least)) {
        for (int64_t k = i; k < j; k++) p->first[p->order[k]] = common;
        const int64_t n = j - i, wanted = (n + TILE_REQUESTS - 1) / TILE_REQUESTS;
        int64_t count = wanted > p->min_tiles ? wanted : p->min_tiles;
        count = count < n ? count : n;
        for (int64_t t = 0; t < count; t++, p->tiles++) /* near-equal tiles */
            p->tile_from[p->tiles] = i + n * t / count, p->tile_to[p->tiles] = i + n * (t + 1) / count;
        return;
    }
    tile_runs(p, lcp, i, at, least);
    tile_runs(p, lcp, at, j, least);
}

INLINE Sharing plan_sharing(const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                            int64_t bs, int64_t min_tiles) {
    Sharing p = {(int64_t*)malloc(sizeof(int64_t) * n_req), (int64_t*)calloc(n_req, sizeof(int64_t)),
                 (int64_t*)malloc(sizeof(int64_t) * n_req), (int64_t*)malloc(sizeof(int64_t) * n_req), 0,
                 min_tiles};
    if (n_req < MIN_SHARING_REQUESTS) return p;
    TableKey* keys = (TableKey*)malloc(sizeof(TableKey) * n_req);
    int64_t* lcp = (int64_t*)malloc(sizeof(int64_t) * n_req);
    for (int64_t b = 0; b < n_req; b++) keys[b] = (TableKey){tables + b * max_blocks, (seq_lens[b] - 1) / bs, b};
    qsort(keys, n_req, sizeof(TableKey), by_table);
    for (int64_t k = 0; k < n_req; k++) {
        p.order[k] = keys[k].b;
        lcp[k] = k ? common_prefix(&keys[k - 1], &keys[k]) : 0;
    }
    tile_runs(&p, lcp, 0, n_req, (32 + bs - 1) / bs); /* 32 tokens or more */
    free(keys);
    free(lcp);
    return p;
}

INLINE void free_sharing(Sharing* p) { free(p->order), free(p->first), free(p->tile_from), free(p->tile_to); }

/* Per-thread scratch of prefix_tile for rows query rows and head size hd. */
typedef struct {
    float* qs;              /* (rows, hd) the queries: float32 (scaled), or (dp) bfloat16 pairs */
    float *o, *s, *mx, *sums; /* (rows, hd) outputs, (rows, 16) scores, (rows) maxima, (rows, 16) partial sums */
    float *kt, *vs;         /* a block of keys transposed into pairs, its values widened: (hd / 2, 16), (16, hd) */
} PrefixScratch;

INLINE PrefixScratch prefix_scratch(int64_t rows, int64_t hd) {
    PrefixScratch w = {(float*)aligned_alloc(64, sizeof(float) * rows * hd),
                       (float*)aligned_alloc(64, sizeof(float) * rows * hd),
                       (float*)aligned_alloc(64, sizeof(float) * rows * 16), (float*)malloc(sizeof(float) * rows),
                       (float*)malloc(sizeof(float) * rows * 16), (float*)aligned_alloc(64, sizeof(float) * hd * 16),
                       (float*)aligned_alloc(64, sizeof(float) * hd * 16)};
    return w;
}

INLINE void free_prefix_scratch(PrefixScratch* w) {
    free(w->qs), free(w->o), free(w->s), free(w->mx), free(w->sums), free(w->kt), free(w->vs);
}

/* Requests tile[0 .. count-1], KV head h, over the first `blocks` blocks of `table` (which all of them
   share): row r = k * grp + g is query head h * grp + g of request tile[k], whose query is row rows_of[b].
   dp: bfloat16 products by AVX512-BF16 (bf16 tensors only). */
INLINE void prefix_tile(const void* q, int64_t q_stride, const int64_t* rows_of, const void* kc, const void* vc,
                        const int64_t* table, int64_t blocks, const int64_t* tile, int64_t count, int64_t h,
                        int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, float scale, PrefixScratch* w,
                        PrefixState* state, float softcap, int bf16, int dp) {
    const int64_t rows = count * grp, n_q = n_kv * grp, keys = blocks * bs;
    for (int64_t r = 0; r < rows; r++)
        start_row(q, rows_of[tile[r / grp]] * q_stride + (h * grp + r % grp) * hd, r, hd, scale, w->qs, w->o, w->mx,
                  w->sums, bf16, dp);
    for (int64_t s0 = 0; s0 < keys; s0 += 16) {
        const int64_t n = keys - s0 < 16 ? keys - s0 : 16;
        int64_t slots[16];
        key_slots(table, s0, n, bs, n_kv, h, slots);
        gather_block(kc, vc, slots, n, hd, w->kt, w->vs, bf16, dp);
#if HAVE_DPBF16
        if (dp) scores_dpbf16(rows, (const uint32_t*)w->qs, hd / 2, (const uint32_t*)w->kt, scale, w->s);
        else
#endif
            scores_f32_512(rows, w->qs, hd, w->kt, w->s);
        if (softcap > 0.f) cap_scores(w->s, rows * 16, softcap);
        for (int64_t r = 0; r < rows; r++) online_softmax(w->s + r * 16, 0, n, w->mx + r, w->sums + 16 * r, w->o + r * hd, hd);
        weigh_block_512(rows, w->s, 16, w->vs, hd, 0, n, w->o, hd, NULL);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = tile[r / grp] * n_q + h * grp + r % grp;
        memcpy(state->acc + at * hd, w->o + r * hd, hd * sizeof(float));
        state->m[at] = w->mx[r], state->l[at] = lanes_sum(w->sums + 16 * r);
    }
}

/* The rows of every tile of `sharing` over its shared blocks, a task a tile and KV head, spread over the
   threads of the enclosing parallel region (which wait for each other at its end). */
INLINE void attend_shared_prefix(const void* q, int64_t q_stride, const int64_t* rows_of, const void* kc,
                                 const void* vc, const int64_t* tables, int64_t max_blocks, const Sharing* sharing,
                                 int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, float scale, PrefixState* state,
                                 float softcap, int bf16, int dp) {
    PrefixScratch w = prefix_scratch(TILE_REQUESTS * grp, hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < sharing->tiles * n_kv; i++) {
        const int64_t from = sharing->tile_from[i / n_kv], count = sharing->tile_to[i / n_kv] - from;
        const int64_t* tile = sharing->order + from;
        prefix_tile(q, q_stride, rows_of, kc, vc, tables + tile[0] * max_blocks, sharing->first[tile[0]], tile, count,
                    i % n_kv, grp, n_kv, hd, bs, scale, &w, state, softcap, bf16, dp);
    }
    free_prefix_scratch(&w);
}

#endif
