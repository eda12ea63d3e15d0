/* AMX tile registers on Linux: asking for their state, and configuring them (palette 1). Shared by the
   kernels that use tiles (gemm_bf16.c's gemm_bf16_amx, prefill_amx.h); included only where the build has
   AMX-BF16. GCC's tile intrinsics paste the tile number into the assembly, so callers name tiles by
   literal numbers. */
#ifndef PAGESERVE_AMX_TILES_H
#define PAGESERVE_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18), Linux 5.16+: a process must ask once, or its
   first tile instruction faults. 1 granted, 0 refused (an older kernel, or no AMX). */
static int amx_permitted(void) {
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return granted;
}

/* Tiles 0 .. n-1 of rows[t] rows of colsb[t] bytes, for this thread until it loads another configuration
   (oneDNN, on the same OpenMP threads, loads its own: configure at the start of every call). */
static void amx_configure(int n, const uint8_t *rows, const uint16_t *colsb) {
    struct __attribute__((aligned(64))) {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } c = {0};
    c.palette = 1;
    for (int t = 0; t < n; t++) c.rows[t] = rows[t], c.colsb[t] = colsb[t];
    _tile_loadconfig(&c);
}

#endif
