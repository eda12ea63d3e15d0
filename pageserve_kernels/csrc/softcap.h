/* Logit soft-capping (Gemma 2's attention): scaled scores become softcap * tanh(score / softcap), before the
   mask and the softmax, shared by the decode and prompt kernels. Called only where a layer caps (softcap > 0),
   so layers without it pay nothing per score. */
#ifndef PAGESERVE_SOFTCAP_H
#define PAGESERVE_SOFTCAP_H

#include <math.h>
#include <stdint.h>

static inline void cap_scores(float* sc, int64_t n, float softcap) {
    const float inv = 1.f / softcap;
    for (int64_t i = 0; i < n; i++) sc[i] = softcap * tanhf(sc[i] * inv);
}

#endif
