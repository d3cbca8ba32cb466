/* ropelab's CPU kernel of the fused QK-RMSNorm + RoPE + KV-cache write (ropelab/kernels/qk_norm_rope.py is its
 * wrapper, checks every argument first and documents the contract).
 *
 * One pass per token-head row. Rows are numbered t * (Hq + 2 Hkv) + h: h < Hq a q head, then Hkv k heads, then
 * Hkv v heads. For a q or k row x of d elements (contiguous, element strides st/sh for token/head):
 *   ss = sum_j x_j^2 (float32),  rstd = 1 / sqrt(ss / d + eps),  xn_j = x_j * rstd * (w_j + w_offset)
 *   pairs (a, b) = (i, i + half) or (2i, 2i + 1):  y_a = xn_a c_i - xn_b s_i,  y_b = xn_a s_i + xn_b c_i
 *   y_j = xn_j for j >= 2 half
 * in float32, rounded once to the dtype (bfloat16: round to nearest even; NaN stays NaN), stored to the q or k
 * output [T, H, d] and, for k with slot >= 0, to the cache row [slot, h, :]. A v row is copied into its slot.
 * cos/sin are float32 [T, half] (row t is token t's position); the weights float32 [d].
 */
#include <math.h>
#include <stdint.h>
#include "cpu_dtypes.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define QKN_MAX_D 512

int ropelab_qkn_has_f16(void) { return ROPELAB_HAS_F16; }

static inline void qkn_load(const char *p, float *x, int64_t d, int dtype) {
    if (dtype == ROPELAB_F32) {
        memcpy(x, p, (size_t)d * 4);
    } else if (dtype == ROPELAB_BF16) {
        const uint16_t *h = (const uint16_t *)p;
        for (int64_t j = 0; j < d; ++j) x[j] = ropelab_bf16_to_f32(h[j]);
    } else {
#ifdef __FLT16_MAX__
        const _Float16 *h = (const _Float16 *)p;
        for (int64_t j = 0; j < d; ++j) x[j] = (float)h[j];
#endif
    }
}

static inline void qkn_store(char *p, const float *y, int64_t d, int dtype) {
    if (dtype == ROPELAB_F32) {
        memcpy(p, y, (size_t)d * 4);
    } else if (dtype == ROPELAB_BF16) {
        uint16_t *h = (uint16_t *)p;
        for (int64_t j = 0; j < d; ++j) h[j] = ropelab_f32_to_bf16(y[j]);
    } else {
#ifdef __FLT16_MAX__
        _Float16 *h = (_Float16 *)p;
        for (int64_t j = 0; j < d; ++j) h[j] = (_Float16)y[j];
#endif
    }
}

static void qkn_rows(const char *q, const char *k, const char *v, const float *wq, const float *wk,
                     const float *cos_t, const float *sin_t, const int64_t *slots, char *oq, char *ok, char *kc,
                     char *vc, int64_t lo, int64_t hi, int64_t hq, int64_t hkv, int64_t d, int64_t half,
                     int64_t qst, int64_t qsh, int64_t kst, int64_t ksh, int64_t vst, int64_t vsh, int64_t css,
                     int64_t csh, float eps, float w_offset, int interleaved, int dtype, int has_cache) {
    float x[QKN_MAX_D], y[QKN_MAX_D];
    const int64_t es = dtype == ROPELAB_F32 ? 4 : 2, per_token = hq + 2 * hkv;
    const int64_t step = interleaved ? 2 : 1, second = interleaved ? 1 : half, r = 2 * half;
    for (int64_t row = lo; row < hi; ++row) {
        const int64_t t = row / per_token, h = row % per_token;
        const int64_t slot = has_cache ? slots[t] : -1;
        if (h >= hq + hkv) { /* a v row: only the cache copy */
            const int64_t hv = h - hq - hkv;
            if (slot >= 0)
                memcpy(vc + (slot * css + hv * csh) * es, v + (t * vst + hv * vsh) * es, (size_t)(d * es));
            continue;
        }
        const int is_q = h < hq;
        const int64_t hh = is_q ? h : h - hq;
        const float *w = is_q ? wq : wk;
        qkn_load(is_q ? q + (t * qst + hh * qsh) * es : k + (t * kst + hh * ksh) * es, x, d, dtype);
        float ss = 0.0f;
        for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
        const float rstd = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t j = 0; j < d; ++j) x[j] = x[j] * rstd * (w[j] + w_offset);
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t i = 0; i < half; ++i) {
            const float a = x[i * step], b = x[i * step + second];
            y[i * step] = a * c[i] - b * s[i];
            y[i * step + second] = a * s[i] + b * c[i];
        }
        for (int64_t j = r; j < d; ++j) y[j] = x[j];
        qkn_store((is_q ? oq + (t * hq + hh) * d * es : ok + (t * hkv + hh) * d * es), y, d, dtype);
        if (!is_q && slot >= 0) qkn_store(kc + (slot * css + hh * csh) * es, y, d, dtype);
    }
}

/* Returns 0, or 1 for arguments the kernel does not take (the wrapper checks them first). */
int ropelab_qk_norm_rope(const void *q, const void *k, const void *v, const float *wq, const float *wk,
                         const float *cos_t, const float *sin_t, const int64_t *slots, void *oq, void *ok, void *kc,
                         void *vc, int64_t tokens, int64_t hq, int64_t hkv, int64_t d, int64_t half, int64_t qst,
                         int64_t qsh, int64_t kst, int64_t ksh, int64_t vst, int64_t vsh, int64_t css, int64_t csh,
                         float eps, float w_offset, int interleaved, int dtype, int has_cache, int nthreads) {
    if (d <= 0 || d > QKN_MAX_D || half < 0 || 2 * half > d || dtype < 0 || dtype > 2) return 1;
    if (dtype == ROPELAB_F16 && !ropelab_qkn_has_f16()) return 1;
    const int64_t n = tokens * (hq + (has_cache ? 2 : 1) * hkv);
    const int64_t per_token = hq + 2 * hkv;
    /* rows are numbered with the v heads included; without a cache they are skipped by the range below */
    const int64_t total = tokens * per_token;
    if (n <= 0) return 0;
    int64_t want = (n * d) / 32768; /* a decode step is not worth waking threads for */
    int nt = nthreads < 1 ? 1 : nthreads;
    if (want < nt) nt = want < 1 ? 1 : (int)want;
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            const int64_t i = omp_get_thread_num(), m = omp_get_num_threads();
            qkn_rows((const char *)q, (const char *)k, (const char *)v, wq, wk, cos_t, sin_t, slots, (char *)oq,
                     (char *)ok, (char *)kc, (char *)vc, total * i / m, total * (i + 1) / m, hq, hkv, d, half, qst,
                     qsh, kst, ksh, vst, vsh, css, csh, eps, w_offset, interleaved, dtype, has_cache);
        }
        return 0;
    }
#endif
    qkn_rows((const char *)q, (const char *)k, (const char *)v, wq, wk, cos_t, sin_t, slots, (char *)oq, (char *)ok,
             (char *)kc, (char *)vc, 0, total, hq, hkv, d, half, qst, qsh, kst, ksh, vst, vsh, css, csh, eps, w_offset,
             interleaved, dtype, has_cache);
    return 0;
}
