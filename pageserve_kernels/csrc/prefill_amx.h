/* The prompt kernel's two products on AMX tiles (bfloat16; prefill_attention.c includes this where the
   build has AMX-BF16, and runs it when asked: dot_products == 2). Per block of 16 keys, in row tiles of 16
   of the task's query rows:

     S (16 rows x 16 keys)  = Q (the rows' own bfloat16, 32 columns a tile) . K^T (gather_block's pairs kt2,
                              which are a right-hand tile as they lie), times the scale
     O (16 rows x hd) += P . V, P in two bfloat16 parts (hi = round(p), lo = round(p - hi): their sum is
                              p to ~2^-16, so the result stays within the float32 attention's tolerance),
                              V's token pairs interleaved (amx_gather_values), 16 output columns a tile

   The softmax between them is the AVX-512 one (online_softmax), on S in memory; O lives in the tiles' scratch
   as for the other paths, so moving a row's maximum rescales it there. Tile registers by role (literal
   numbers: GCC pastes them into the assembly); amx_tiles configures them once per thread and call. */
#ifndef PAGESERVE_PREFILL_AMX_H
#define PAGESERVE_PREFILL_AMX_H

#include "amx_tiles.h" /* amx_permitted, amx_configure */

#define T_OUT 0    /* 16 rows x 16 float32 of O */
#define T_P_HI 1   /* 16 rows x 16 keys, bfloat16 */
#define T_P_LO 2
#define T_V 3      /* 8 key pairs x 16 columns x 2 */
#define T_S 4      /* 16 rows x 16 keys, float32 */
#define T_Q 5      /* 16 rows x 32 columns, bfloat16 */
#define T_K 6      /* 16 column pairs x 16 keys x 2 */

static void amx_tiles(void) {
    const uint8_t rows[7] = {16, 16, 16, 8, 16, 16, 16};
    const uint16_t colsb[7] = {64, 32, 32, 64, 64, 64, 64};
    amx_configure(7, rows, colsb);
}

/* s[r][0:16] = scale * q_r . k_j for r < rows (whole tiles of 16 are computed: qb and s have room). */
static void amx_scores(int64_t rows, const uint16_t *qb, int64_t hd, const uint32_t *kt2, float scale, float *s) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        _tile_zero(T_S);
        for (int64_t c = 0; c < hd / 32; c++) {
            _tile_loadd(T_Q, qb + r0 * hd + 32 * c, hd * 2);
            _tile_loadd(T_K, kt2 + 256 * c, 64);
            _tile_dpbf16ps(T_S, T_Q, T_K);
        }
        _tile_stored(T_S, s + r0 * 16, 64);
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++) _mm512_storeu_ps(s + r * 16, _mm512_mul_ps(_mm512_loadu_ps(s + r * 16), sc));
}

/* vt[c][p][2 col + e] = V[key 2p + e][16c + col] for the n keys of a block (slots[j] its cache row), 0 past n. */
static void amx_gather_values(const uint16_t *vc, const int64_t *slots, int64_t n, int64_t hd, uint16_t *vt) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t p = 0; p < 8; p++)
        for (int64_t c = 0; c < hd / 32; c++) {
            const __m512i a = 2 * p < n ? _mm512_loadu_si512(vc + slots[2 * p] * hd + 32 * c) : _mm512_setzero_si512();
            const __m512i b = 2 * p + 1 < n ? _mm512_loadu_si512(vc + slots[2 * p + 1] * hd + 32 * c)
                                            : _mm512_setzero_si512();
            _mm512_store_si512(vt + ((2 * c) * 8 + p) * 32, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_store_si512(vt + ((2 * c + 1) * 8 + p) * 32, _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* o[r] += p[r][0:16] . V for r < rows; p rows 16 apart (masked keys 0), o rows hd apart; pt scratch 2 x 256. */
static void amx_values(int64_t rows, const float *p, const uint16_t *vt, float *o, int64_t hd, uint16_t *pt) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        for (int64_t r = 0; r < 16; r++) {
            const __m512 v = r0 + r < rows ? _mm512_loadu_ps(p + (r0 + r) * 16) : _mm512_setzero_ps();
            const __m256bh h = _mm512_cvtneps_pbh(v);
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
            _mm256_store_si256((__m256i *)(pt + 16 * r), (__m256i)h);
            _mm256_store_si256((__m256i *)(pt + 256 + 16 * r), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
        }
        _tile_loadd(T_P_HI, pt, 32);
        _tile_loadd(T_P_LO, pt + 256, 32);
        for (int64_t c = 0; c < hd / 16; c++) {
            _tile_loadd(T_OUT, o + r0 * hd + 16 * c, hd * 4);
            _tile_loadd(T_V, vt + c * 8 * 32, 64);
            _tile_dpbf16ps(T_OUT, T_P_HI, T_V);
            _tile_dpbf16ps(T_OUT, T_P_LO, T_V);
            _tile_stored(T_OUT, o + r0 * hd + 16 * c, hd * 4);
        }
    }
}

#endif
