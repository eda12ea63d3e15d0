/* The entry table the LoRA kernels read (lora_f32.c, lora_bf16.c; built by pageserve_kernels/cpu_lora.py,
   whose ENTRY and field order these must equal), and the work items one call's threads share.

   One entry per (adapter group, layer, projection), ENTRY int64s:
     ROW_BEGIN, ROW_END   the group's rows: rows[ROW_BEGIN:ROW_END] (rows of the step, any order)
     A_ADDR, RANK         A (RANK, K) row-major (0: the adapter leaves this projection alone)
     N_SLICES             then per slice: START, END (output columns), R0, R1 (its columns of s),
                          B_ADDR (its B in the dtype's panels) */
#ifndef LORA_ENTRY_H
#define LORA_ENTRY_H

#include <stdint.h>
#include <stdlib.h>

enum { ROW_BEGIN, ROW_END, A_ADDR, RANK, N_SLICES, SLICES };
enum { START, END, R0, R1, B_ADDR, SLICE_FIELDS };
#define MAX_SLICES 4

struct lora_item {
    const int64_t *entry;
    int64_t slice; /* expand: which slice */
    int64_t at;    /* shrink: first column of s; expand: panel */
};

struct lora_work {
    struct lora_item *shrink, *expand;
    int64_t n_shrink, n_expand;
    int64_t n_rows; /* rows of s: every group's ROW_END at most */
    int64_t lds;    /* s's row stride: the largest RANK */
};

static inline void lora_work_free(struct lora_work *w) {
    free(w->shrink);
    free(w->expand);
}

/* Shrink items of `cols` columns of s, expand items of one `panel`-column panel of a slice. 0: no work. */
static inline int lora_work_plan(struct lora_work *w, const int64_t *entries, int64_t n_groups, int64_t entry_stride,
                                 int64_t cols, int64_t panel) {
    int64_t n_shrink = 0, n_expand = 0;
    w->n_rows = 0, w->lds = 1;
    for (int64_t g = 0; g < n_groups; g++) {
        const int64_t *e = entries + g * entry_stride;
        if (!e[A_ADDR] || e[ROW_END] <= e[ROW_BEGIN]) continue;
        n_shrink += (e[RANK] + cols - 1) / cols;
        for (int64_t i = 0; i < e[N_SLICES]; i++) {
            const int64_t *sl = e + SLICES + i * SLICE_FIELDS;
            n_expand += (sl[END] - sl[START] + panel - 1) / panel;
        }
        if (e[ROW_END] > w->n_rows) w->n_rows = e[ROW_END];
        if (e[RANK] > w->lds) w->lds = e[RANK];
    }
    if (!n_shrink) return 0;
    w->shrink = malloc(n_shrink * sizeof(struct lora_item));
    w->expand = malloc((n_expand ? n_expand : 1) * sizeof(struct lora_item));
    w->n_shrink = w->n_expand = 0;
    for (int64_t g = 0; g < n_groups; g++) {
        const int64_t *e = entries + g * entry_stride;
        if (!e[A_ADDR] || e[ROW_END] <= e[ROW_BEGIN]) continue;
        for (int64_t j = 0; j < e[RANK]; j += cols) w->shrink[w->n_shrink++] = (struct lora_item){e, 0, j};
        for (int64_t i = 0; i < e[N_SLICES]; i++) {
            const int64_t *sl = e + SLICES + i * SLICE_FIELDS;
            for (int64_t p = 0; p * panel < sl[END] - sl[START]; p++)
                w->expand[w->n_expand++] = (struct lora_item){e, i, p};
        }
    }
    return 1;
}

#endif
