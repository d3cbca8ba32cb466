/* ropelab's CPU RoPE kernel (ropelab/kernels/cpu_rope.py is its wrapper and documents the contract).
 *
 * For every row (i0, i1, i2) of x, viewed as [n0, n1, n2, d] with element strides and a contiguous last dim:
 *   a = x[pair first], b = x[pair second]   (style half: (i, i + r/2); interleaved: (2i, 2i + 1))
 *   y_a = a c - b s,  y_b = a s + b c       with c, s = the float32 table row of this token's position
 *   y[r:] = x[r:]                           (pass-through)
 * in float32, rounded once to x's dtype (bfloat16: round to nearest even, NaN kept quiet). The table row of
 * (i0, i1, i2) is cos + i0*ts0 + i1*ts1 + i2*ts2 (a stride of 0 repeats it: the tables broadcast).
 * Each pair is read before it is written and no other pair touches it, so out may be x (in place).
 * Vector ISAs: the row loop is cloned for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2, FMA, F16C) and picked at load
 * time by CPU features (target_clones; arch=haswell would test the CPU model, not its features), so the
 * library itself is built with portable flags.
 */
#include "cpu_dtypes.h"
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ROPELAB_MAX_HALF 2048

#if defined(__GNUC__) && defined(__linux__) && defined(__x86_64__)
#define ROPELAB_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ROPELAB_CLONES
#endif

int ropelab_has_f16(void) { return ROPELAB_HAS_F16; }

/* Rows [start, end) of the flattened (i0, i1, i2) range. */
ROPELAB_CLONES
static void rows(const char *x, char *out, const float *cos_t, const float *sin_t, int64_t start, int64_t end,
                 int64_t n1, int64_t n2, int64_t xs0, int64_t xs1, int64_t xs2, int64_t os0, int64_t os1,
                 int64_t os2, int64_t ts0, int64_t ts1, int64_t ts2, int64_t half, int64_t d, int interleaved,
                 int dtype) {
    const int64_t r = 2 * half;
    const int64_t esize = dtype == ROPELAB_F32 ? 4 : 2;
    /* The row's indices are stepped, not divided out per row: three 64-bit divisions cost about as much as
     * rotating a 128-wide bf16 row. */
    int64_t i2 = start % n2, i1 = (start / n2) % n1, i0 = (start / n2) / n1;
    for (int64_t row = start; row < end; ++row) {
        const char *xr = x + (i0 * xs0 + i1 * xs1 + i2 * xs2) * esize;
        char *orow = out + (i0 * os0 + i1 * os1 + i2 * os2) * esize;
        const float *c = cos_t + i0 * ts0 + i1 * ts1 + i2 * ts2;
        const float *s = sin_t + i0 * ts0 + i1 * ts1 + i2 * ts2;
        /* One loop per style with constant strides, so it vectorises. Pair i's two inputs are read before its
         * two outputs are written, and no other pair touches them: so out may be x (in place), and the loop
         * carries no dependence (ivdep tells the compiler what it cannot prove through char pointers). */
#define ROTATE(T, LD, ST)                                                                                      \
    do {                                                                                                       \
        const T *xt = (const T *)xr;                                                                           \
        T *ot = (T *)orow;                                                                                     \
        if (interleaved) {                                                                                     \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < half; ++i) {                                          \
                const float xa = LD(xt[2 * i]), xb = LD(xt[2 * i + 1]);                                        \
                const float ya = xa * c[i] - xb * s[i], yb = xa * s[i] + xb * c[i];                            \
                ot[2 * i] = ST(ya);                                                                            \
                ot[2 * i + 1] = ST(yb);                                                                        \
            }                                                                                                  \
        } else {                                                                                               \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < half; ++i) {                                          \
                const float xa = LD(xt[i]), xb = LD(xt[half + i]);                                             \
                const float ya = xa * c[i] - xb * s[i], yb = xa * s[i] + xb * c[i];                            \
                ot[i] = ST(ya);                                                                                \
                ot[half + i] = ST(yb);                                                                         \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)
#define ID(v) (v)
#define TO_F32(v) ((float)(v))
        if (dtype == ROPELAB_F32) ROTATE(float, ID, ID);
        else if (dtype == ROPELAB_BF16) ROTATE(uint16_t, ropelab_bf16_to_f32, ropelab_f32_to_bf16);
#ifdef __FLT16_MAX__
        else ROTATE(_Float16, TO_F32, (_Float16));
#endif
        if (r < d && orow != xr) memcpy(orow + r * esize, xr + r * esize, (size_t)((d - r) * esize));
        if (++i2 == n2) {
            i2 = 0;
            if (++i1 == n1) {
                i1 = 0;
                ++i0;
            }
        }
    }
}

/* bfloat16, style half, r/2 a multiple of 16, on a CPU with AVX512-BF16: the same rows, 16 pairs per step, rounded
 * to bfloat16 by the CPU's own instruction (VCVTNEPS2BF16). Its rounding is the software one's (nearest even; a
 * NaN keeps its top bits with the quiet bit set; infinities and zeros kept), except that it flushes float32
 * subnormals to zero: a vector holding one is rounded again in software, so the bits are
 * ropelab_f32_to_bf16's for every input (tests/test_cpu_kernel.py checks them on subnormals, NaNs and
 * infinities). The rounding is most of a bfloat16 decode step's time in software: about 80 instructions per 16
 * pairs with AVX2, against 2 here. */
#if defined(__GNUC__) && defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 10)
#include <immintrin.h>
#define ROPELAB_HAS_BF16_HW 1
#define ROPELAB_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* The rare vector holding a float32 subnormal, out of the hot loop: software rounding, lane by lane. */
ROPELAB_BF16_TARGET __attribute__((noinline, cold)) static void bf16_store16_soft(__m512 y, uint16_t *dst) {
    float f[16];
    _mm512_storeu_ps(f, y);
    for (int i = 0; i < 16; ++i) dst[i] = ropelab_f32_to_bf16(f[i]);
}

/* 16 float32 -> 16 bfloat16 at dst: the CPU's rounding, redone in software where a lane is subnormal. */
ROPELAB_BF16_TARGET static inline void bf16_store16(__m512 y, uint16_t *dst) {
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(y));
    const __m512i mag = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(0x7fffffff));
    /* subnormal: 0 < |y| < 2^-126, i.e. mag - 1 <= 0x007ffffe unsigned */
    const __mmask16 sub = _mm512_cmp_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)),
                                                _mm512_set1_epi32(0x007ffffe), _MM_CMPINT_LE);
    if (__builtin_expect(sub != 0, 0)) bf16_store16_soft(y, dst);
}

ROPELAB_BF16_TARGET static void bf16_round16_store(const float *in, uint16_t *out) {
    bf16_store16(_mm512_loadu_ps(in), out);
}

ROPELAB_BF16_TARGET static inline __m512 bf16_widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

ROPELAB_BF16_TARGET
static void rows_bf16_half_hw(const char *x, char *out, const float *cos_t, const float *sin_t, int64_t start,
                              int64_t end, int64_t n1, int64_t n2, int64_t xs0, int64_t xs1, int64_t xs2,
                              int64_t os0, int64_t os1, int64_t os2, int64_t ts0, int64_t ts1, int64_t ts2,
                              int64_t half, int64_t d) {
    const int64_t r = 2 * half;
    int64_t i2 = start % n2, i1 = (start / n2) % n1, i0 = (start / n2) / n1;
    for (int64_t row = start; row < end; ++row) {
        const uint16_t *xr = (const uint16_t *)x + (i0 * xs0 + i1 * xs1 + i2 * xs2);
        uint16_t *orow = (uint16_t *)out + (i0 * os0 + i1 * os1 + i2 * os2);
        const float *c = cos_t + i0 * ts0 + i1 * ts1 + i2 * ts2;
        const float *s = sin_t + i0 * ts0 + i1 * ts1 + i2 * ts2;
        for (int64_t i = 0; i < half; i += 16) {  /* all loads of the step before its stores: out may be x */
            const __m512 xa = bf16_widen16(xr + i), xb = bf16_widen16(xr + half + i);
            const __m512 cc = _mm512_loadu_ps(c + i), ss = _mm512_loadu_ps(s + i);
            const __m512 ya = _mm512_fmsub_ps(xa, cc, _mm512_mul_ps(xb, ss));
            const __m512 yb = _mm512_fmadd_ps(xa, ss, _mm512_mul_ps(xb, cc));
            bf16_store16(ya, orow + i);
            bf16_store16(yb, orow + half + i);
        }
        if (r < d && orow != xr) memcpy(orow + r, xr + r, (size_t)((d - r) * 2));
        if (++i2 == n2) {
            i2 = 0;
            if (++i1 == n1) {
                i1 = 0;
                ++i0;
            }
        }
    }
}

static int bf16_hw(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && getenv("ROPELAB_CPU_NO_BF16_HW") == NULL;
    return known;
}
#else
#define ROPELAB_HAS_BF16_HW 0
static int bf16_hw(void) { return 0; }
#endif

/* Whether bfloat16 rows of style half with r/2 % 16 == 0 round with the CPU's instruction (rows_bf16_half_hw). */
int ropelab_bf16_hw(void) { return bf16_hw(); }

/* The rounding of 16-element groups of float32 to bfloat16 by the path the kernel takes here (the CPU's
 * instruction where ropelab_bf16_hw(), else software), for tests: n a multiple of 16. */
void ropelab_round_bf16(const float *in, uint16_t *out, int64_t n) {
#if ROPELAB_HAS_BF16_HW
    if (bf16_hw()) {
        for (int64_t i = 0; i + 16 <= n; i += 16) bf16_round16_store(in + i, out + i);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = ropelab_f32_to_bf16(in[i]);
}

/* Returns 0, or 1 for arguments the kernel does not take (the wrapper checks them first). */
int ropelab_rope(const void *x, void *out, const float *cos_t, const float *sin_t, int64_t n0, int64_t n1,
                 int64_t n2, int64_t xs0, int64_t xs1, int64_t xs2, int64_t os0, int64_t os1, int64_t os2,
                 int64_t ts0, int64_t ts1, int64_t ts2, int64_t half, int64_t d, int interleaved, int dtype,
                 int nthreads) {
    if (half < 0 || half > ROPELAB_MAX_HALF || 2 * half > d || dtype < 0 || dtype > 2) return 1;
    if (dtype == ROPELAB_F16 && !ropelab_has_f16()) return 1;
    const int64_t n = n0 * n1 * n2;
    if (n <= 0) return 0;
#if ROPELAB_HAS_BF16_HW
#define ROWS(lo, hi)                                                                                           \
    (hw ? rows_bf16_half_hw((const char *)x, (char *)out, cos_t, sin_t, (lo), (hi), n1, n2, xs0, xs1, xs2, os0, \
                            os1, os2, ts0, ts1, ts2, half, d)                                                  \
        : rows((const char *)x, (char *)out, cos_t, sin_t, (lo), (hi), n1, n2, xs0, xs1, xs2, os0, os1, os2,  \
               ts0, ts1, ts2, half, d, interleaved, dtype))
#else
#define ROWS(lo, hi)                                                                                           \
    rows((const char *)x, (char *)out, cos_t, sin_t, (lo), (hi), n1, n2, xs0, xs1, xs2, os0, os1, os2, ts0, ts1, \
         ts2, half, d, interleaved, dtype)
#endif
    const int hw = dtype == ROPELAB_BF16 && !interleaved && half % 16 == 0 && half > 0 && bf16_hw();
    /* Small work (a decode step) is not worth waking threads for: 32 KiB of elements per thread at least. */
    int64_t want = (n * d) / 32768;
    int nt = nthreads < 1 ? 1 : nthreads;
    if (want < nt) nt = want < 1 ? 1 : (int)want;
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
            const int64_t lo = n * t / k, hi = n * (t + 1) / k;
            ROWS(lo, hi);
        }
        return 0;
    }
#endif
    ROWS(0, n);
    return 0;
#undef ROWS
}

/* ropelab_rope with its arguments packed in one int64 array, in ropelab_rope's order (the four pointers as
 * integers first): a decode step's call from Python converts one pointer instead of 21 arguments (measured: about
 * 2.5 us for ctypes to convert 21 arguments, against a 3.6 us copy of a decode step's q). */
int ropelab_rope_packed(const int64_t *a) {
    return ropelab_rope((const void *)(intptr_t)a[0], (void *)(intptr_t)a[1], (const float *)(intptr_t)a[2],
                        (const float *)(intptr_t)a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
                        a[14], a[15], a[16], a[17], (int)a[18], (int)a[19], (int)a[20]);
}
