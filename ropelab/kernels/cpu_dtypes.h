/* The element types of ropelab's CPU kernels (cpu_rope.c, cpu_qk_norm_rope.c) and their exact conversions to
 * and from float32: one home for the rounding every kernel shares.
 *
 * bfloat16 is the top half of a float32, so widening is a 16-bit shift (exact) and narrowing rounds to nearest,
 * ties to even, with a NaN kept a (quiet) NaN: torch's own rounding (c10/util/BFloat16.h, round_to_nearest_even).
 * float16 is the compiler's _Float16 where it has one (ROPELAB_HAS_F16); the Python side asks the library
 * (ropelab_has_f16 / ropelab_qkn_has_f16) and keeps float16 on the torch path otherwise.
 *
 * Included by the kernels' sources; ropelab.kernels.cpu_build hashes it with them, so an edit here rebuilds both.
 */
#ifndef ROPELAB_CPU_DTYPES_H
#define ROPELAB_CPU_DTYPES_H

#include <stdint.h>
#include <string.h>

/* The dtype codes the Python wrappers pass (ropelab.kernels.cpu_rope.DTYPES). */
enum { ROPELAB_F32 = 0, ROPELAB_BF16 = 1, ROPELAB_F16 = 2 };

#ifdef __FLT16_MAX__
#define ROPELAB_HAS_F16 1
#else
#define ROPELAB_HAS_F16 0
#endif

static inline float ropelab_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t ropelab_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    /* NaN stays a (quiet) NaN; else round to nearest even. A select, not a branch, so loops vectorise. */
    const uint32_t nan = (uint32_t)((u >> 16) | 0x0040u), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif
