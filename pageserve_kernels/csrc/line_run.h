/* Cache lines to ask for while a loop computes, a few at each of its steps instead of all at once
   (paged_decode.c fills a LineRun with the block after next; the decode loops and values_avx512.h spend it).

   Why spread: a software prefetch that goes to memory holds one of the core's ~16 L1 fill buffers until its
   line arrives (~100 ns), and the loop's own loads of the current block (L2 hits) need those same buffers.
   A burst of 32 prefetches before each head (the whole slice at once) filled them, and the head's loads
   waited behind the burst: on an Intel Xeon with AMX (2 vCPUs) half the kernel's samples sat on the
   prefetch instructions and compute and memory ran one after the other. Asked a few lines per token,
   the loads slip in between. `python -m ops.bench.kernels.cpu_decode` there, ms a step, alternated: bfloat16
   avx512_bf16 52-55 -> 46-48, avx2 62-63 -> 57; float32 avx512 81-85 -> 74-75, avx2 84-87 -> 82-85. Prefetch
   distance 1 to 4 blocks made no difference, nor did asking into L1; every other line (the adjacent-line
   prefetcher to fill in) or the first lines of each page (the streamer) were slower. */
#ifndef PAGESERVE_LINE_RUN_H
#define PAGESERVE_LINE_RUN_H

#include <stdint.h>

#include "bf16_elem.h" /* INLINE */

typedef struct {
    const char* next; /* the next line to ask for */
    int64_t left;     /* lines still to ask for */
} LineRun;

/* Lines to ask for at each of `steps` steps so that the run is spent by the last one (0 for no run). */
INLINE int64_t lines_per_step(const LineRun* run, int64_t steps) {
    return run && steps > 0 ? (run->left + steps - 1) / steps : 0;
}

/* Ask for the run's next `count` lines into L2 (prefetcht1), fewer where it has fewer left. */
INLINE void ask_lines(LineRun* run, int64_t count) {
    for (; count > 0 && run->left > 0; count--, run->left--, run->next += 64) __builtin_prefetch(run->next, 0, 2);
}

#endif
