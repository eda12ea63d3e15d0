/* Decode attention over the leading blocks that requests of a batch share (a common system prompt kept once
   by the prefix cache: one group of requests per prompt), as tiles of many requests' query rows at once;
   paged_decode.c includes this file where the build has AVX-512, and finishes each request over its own
   blocks from the state left here.

   Request by request, the shared keys are read (from the caches: they are shared) and multiplied once per
   request, each token's score a horizontal sum of partial products. Here a tile of TILE_REQUESTS requests'
   rows meets each block of 16 shared keys once: the keys transposed (bfloat16 pairs for AVX512-BF16's
   _mm512_dpbf16_ps, else float32), Q . K^T sixteen keys an instruction, the online softmax, and P . V in
   the six-row tiles of
   values_avx512.h, as the prompt kernel does. What a row takes on from here is its running maximum m, the
   sum l of exp(score - m) and the unnormalised output acc = sum exp(score - m) V; the request's own blocks
   then extend the same softmax (paged_decode.c's decode_task). */
#ifndef PAGESERVE_SHARED_PREFIX_H
#define PAGESERVE_SHARED_PREFIX_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attend_tiles.h"
#include "values_avx512.h"

#define TILE_REQUESTS 16
#define MIN_SHARING_REQUESTS 8 /* fewer requests than this make tiles no better than their own loops */

/* The softmax state of every (request, query head) row after the shared keys: acc (n_req * n_q, hd), m, l. */
typedef struct {
    float *acc, *m, *l;
} PrefixState;

/* Which requests share which blocks: requests grouped by their first block, in `order`; a group of at least
   MIN_SHARING_REQUESTS whose tables begin with the same blocks (whole blocks before each one's last token,
   32 tokens or more) is cut into tiles of TILE_REQUESTS; first[b], the blocks request b takes from its
   tile (0: none). */
typedef struct {
    int64_t *order, *first;        /* (n_req) each */
    int64_t *tile_from, *tile_to;  /* tile i: requests order[tile_from[i] .. tile_to[i] - 1] */
    int64_t tiles;
} Sharing;

/* (first block, request) pairs, by block then request. */
static int by_first_block(const void* a, const void* b) {
    const int64_t *x = (const int64_t*)a, *y = (const int64_t*)b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : x[1] < y[1] ? -1 : x[1] > y[1];
}

/* The blocks that requests order[i .. j-1] all begin with, whole blocks before each one's last token. */
INLINE int64_t common_blocks(const int64_t* order, int64_t i, int64_t j, const int64_t* tables, int64_t max_blocks,
                             const int64_t* seq_lens, int64_t bs) {
    const int64_t* lead = tables + order[i] * max_blocks;
    int64_t common = max_blocks;
    for (int64_t k = i; k < j; k++) {
        const int64_t b = order[k], whole = (seq_lens[b] - 1) / bs;
        common = whole < common ? whole : common;
        for (int64_t c = 0; c < common; c++)
            if (tables[b * max_blocks + c] != lead[c]) { common = c; break; }
    }
    return common;
}

INLINE Sharing plan_sharing(const int64_t* tables, int64_t max_blocks, const int64_t* seq_lens, int64_t n_req,
                            int64_t bs) {
    Sharing p = {(int64_t*)malloc(sizeof(int64_t) * n_req), (int64_t*)calloc(n_req, sizeof(int64_t)),
                 (int64_t*)malloc(sizeof(int64_t) * n_req), (int64_t*)malloc(sizeof(int64_t) * n_req), 0};
    if (n_req < MIN_SHARING_REQUESTS) return p;
    int64_t* keyed = (int64_t*)malloc(sizeof(int64_t) * 2 * n_req);
    for (int64_t b = 0; b < n_req; b++) keyed[2 * b] = tables[b * max_blocks], keyed[2 * b + 1] = b;
    qsort(keyed, n_req, 2 * sizeof(int64_t), by_first_block);
    for (int64_t k = 0; k < n_req; k++) p.order[k] = keyed[2 * k + 1];
    free(keyed);
    for (int64_t i = 0, j; i < n_req; i = j) {
        const int64_t block = tables[p.order[i] * max_blocks];
        for (j = i + 1; j < n_req && tables[p.order[j] * max_blocks] == block; j++) {}
        const int64_t common = j - i >= MIN_SHARING_REQUESTS ? common_blocks(p.order, i, j, tables, max_blocks,
                                                                              seq_lens, bs) : 0;
        if (common * bs < 32) continue;
        for (int64_t k = i; k < j; k++) p.first[p.order[k]] = common;
        for (int64_t k = i; k < j; k += TILE_REQUESTS, p.tiles++)
            p.tile_from[p.tiles] = k, p.tile_to[p.tiles] = k + TILE_REQUESTS < j ? k + TILE_REQUESTS : j;
    }
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
                        PrefixState* state, int bf16, int dp) {
    const int64_t rows = count * grp, n_q = n_kv * grp, keys = blocks * bs;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = tile[r / grp], g = r % grp, src = rows_of[b] * q_stride + (h * grp + g) * hd;
        if (dp) memcpy((uint16_t*)w->qs + r * hd, (const uint16_t*)q + src, hd * sizeof(uint16_t));
        else for (int64_t d = 0; d < hd; d++) w->qs[r * hd + d] = load1(q, src + d, bf16) * scale;
        memset(w->o + r * hd, 0, hd * sizeof(float));
        w->mx[r] = -INFINITY;
        memset(w->sums + 16 * r, 0, 16 * sizeof(float));
    }
    for (int64_t s0 = 0; s0 < keys; s0 += 16) {
        const int64_t n = keys - s0 < 16 ? keys - s0 : 16;
        int64_t slots[16], block = s0 / bs, offset = s0 % bs;
        for (int64_t j = 0; j < n; j++) {
            slots[j] = (table[block] * bs + offset) * n_kv + h;
            if (++offset == bs) offset = 0, block++;
        }
        gather_block(kc, vc, slots, n, hd, w->kt, w->vs, bf16, dp);
#if HAVE_DPBF16
        if (dp) scores_dpbf16(rows, (const uint32_t*)w->qs, hd / 2, (const uint32_t*)w->kt, scale, w->s);
        else
#endif
            scores_f32_512(rows, w->qs, hd, w->kt, w->s);
        for (int64_t r = 0; r < rows; r++) online_softmax(w->s + r * 16, n, w->mx + r, w->sums + 16 * r, w->o + r * hd, hd);
        weigh_block_512(rows, w->s, 16, w->vs, hd, 0, n, w->o, hd);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = tile[r / grp] * n_q + h * grp + r % grp;
        float l = 0.f;
        for (int j = 0; j < 16; j++) l += w->sums[16 * r + j];
        memcpy(state->acc + at * hd, w->o + r * hd, hd * sizeof(float));
        state->m[at] = w->mx[r], state->l[at] = l;
    }
}

/* The rows of every tile of `sharing` over its shared blocks, a task a tile and KV head, spread over the
   threads of the enclosing parallel region (which wait for each other at its end). */
INLINE void attend_shared_prefix(const void* q, int64_t q_stride, const int64_t* rows_of, const void* kc,
                                 const void* vc, const int64_t* tables, int64_t max_blocks, const Sharing* sharing,
                                 int64_t grp, int64_t n_kv, int64_t hd, int64_t bs, float scale, PrefixState* state,
                                 int bf16, int dp) {
    PrefixScratch w = prefix_scratch(TILE_REQUESTS * grp, hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < sharing->tiles * n_kv; i++) {
        const int64_t from = sharing->tile_from[i / n_kv], count = sharing->tile_to[i / n_kv] - from;
        const int64_t* tile = sharing->order + from;
        prefix_tile(q, q_stride, rows_of, kc, vc, tables + tile[0] * max_blocks, sharing->first[tile[0]], tile, count,
                    i % n_kv, grp, n_kv, hd, bs, scale, &w, state, bf16, dp);
    }
    free_prefix_scratch(&w);
}

#endif
