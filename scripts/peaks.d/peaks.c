/* The machine's own limits, for reading kiln's benchmarks against:
 *   fma:   one core's f32 FMA throughput, 12 independent AVX2 accumulators (8 lanes,
 *          2 flops per lane per FMA), the loop the issue names as the peak;
 *   fma512: the same with AVX-512 (16 lanes) where the CPU has AVX-512 F, else 0 (a core
 *          with two 512-bit FMA pipes, as many Xeons, doubles the AVX2 figure; a core
 *          that splits them in halves, as Zen 4, does not);
 *   int8:  one core's exact 8-bit product throughput without VNNI, as kiln's AVX2
 *          integer microkernel computes it: operands widened to 16 bits, `vpmaddwd`
 *          (8 lanes, two multiply-adds each) and `vpaddd`, 12 accumulators; in GOP/s
 *          (2 ops a multiply-add, as flops count an FMA), to set beside `fma`;
 *   vnni:  the same with AVX-512 VNNI's `vpdpbusd` (16 lanes, four multiply-adds each)
 *          where the CPU has it, else 0;
 *   triad: one core's memory bandwidth, a[i] = b[i] + s*c[i] over 3 x 32 MiB
 *          (bytes moved: 3 arrays; the best of 10 passes).
 * Prints one line each: `fma GFLOP/s`, `fma512 GFLOP/s`, `int8 GOP/s`, `vnni GOP/s`,
 * `triad GB/s`. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ACC(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* One core's throughput of STEP on vectors of type VT (OPS operations a step and
 * accumulator): twelve independent
 * chains in registers (an FMA chain cannot be folded), the best of three passes.
 * noinline: inlined into main, gcc spilled the accumulators (half the peak). */
#define FMA_PEAK(NAME, TARGET, VT, SET1, X, Y, OPS)                                  \
    __attribute__((target(TARGET), noinline)) static double NAME(void) {                \
        VT x = SET1(X), y = SET1(Y);                                                    \
        ACC(DECL_##NAME)                                                                \
        long n = 50000000;                                                              \
        double best = 0;                                                                \
        for (int rep = 0; rep < 3; rep++) {                                             \
            double t0 = now();                                                          \
            for (long i = 0; i < n; i++) {                                              \
                ACC(STEP_##NAME)                                                        \
            }                                                                           \
            double t = now() - t0, g = n * 12.0 * (OPS) / t / 1e9;                     \
            if (g > best) best = g;                                                     \
        }                                                                               \
        double s = 0;                                                                   \
        ACC(SUM_##NAME)                                                                 \
        if (s == 12345.f) printf("!");                                                  \
        return best;                                                                    \
    }
#define DECL_fma_peak(i) __m256 a##i = _mm256_set1_ps((float)i);
#define STEP_fma_peak(i) a##i = _mm256_fmadd_ps(a##i, x, y);
#define SUM_fma_peak(i) s += a##i[0];
FMA_PEAK(fma_peak, "avx2,fma", __m256, _mm256_set1_ps, 1.0000001f, 0.9999999f, 2 * 8)
#define DECL_fma512_peak(i) __m512 a##i = _mm512_set1_ps((float)i);
#define STEP_fma512_peak(i) a##i = _mm512_fmadd_ps(a##i, x, y);
#define SUM_fma512_peak(i) s += a##i[0];
FMA_PEAK(fma512_peak, "avx512f", __m512, _mm512_set1_ps, 1.0000001f, 0.9999999f, 2 * 16)
/* (Each chain's product reads its own accumulator, so no two chains compute the same
 * product; the 16-bit halves wrap, which changes nothing in the timing.) */
#define DECL_int8_peak(i) __m256i a##i = _mm256_set1_epi32(i + 1);
#define STEP_int8_peak(i) a##i = _mm256_add_epi32(_mm256_madd_epi16(a##i, x), y);
#define SUM_int8_peak(i) s += a##i[0];
FMA_PEAK(int8_peak, "avx2", __m256i, _mm256_set1_epi16, 3, 5, 2 * 16)
#define DECL_vnni_peak(i) __m512i a##i = _mm512_set1_epi32(i);
#define STEP_vnni_peak(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
#define SUM_vnni_peak(i) s += a##i[0];
FMA_PEAK(vnni_peak, "avx512f,avx512vnni", __m512i, _mm512_set1_epi8, 3, 5, 2 * 64)

static double triad(void) {
    size_t n = 8u << 20; /* 8 Mi floats = 32 MiB per array */
    float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4), *c = aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; i++) { a[i] = 0; b[i] = (float)i; c[i] = 1.f; }
    double best = 0;
    for (int rep = 0; rep < 10; rep++) {
        double t0 = now();
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.f * c[i];
        double t = now() - t0, g = 3.0 * n * 4 / t / 1e9;
        if (g > best) best = g;
    }
    if (a[n / 2] == -1.f) printf("!");
    free(a); free(b); free(c);
    return best;
}

int main(void) {
    double f = fma_peak();
    __builtin_cpu_init();
    double f512 = __builtin_cpu_supports("avx512f") ? fma512_peak() : 0;
    double i8 = int8_peak();
    double vnni = __builtin_cpu_supports("avx512vnni") ? vnni_peak() : 0;
    printf("fma %.1f\nfma512 %.1f\nint8 %.1f\nvnni %.1f\ntriad %.1f\n", f, f512, i8, vnni, triad());
    return 0;
}
