/* The machine's own limits, for reading kiln's benchmarks against:
 *   fma:   one core's f32 FMA throughput, 12 independent AVX2 accumulators (8 lanes,
 *          2 flops per lane per FMA), the loop the issue names as the peak;
 *   fma512: the same with AVX-512 (16 lanes) where the CPU has AVX-512 F, else 0 (a core
 *          with two 512-bit FMA pipes, as many Xeons, doubles the AVX2 figure; a core
 *          that splits them in halves, as Zen 4, does not);
 *   triad: one core's memory bandwidth, a[i] = b[i] + s*c[i] over 3 x 32 MiB
 *          (bytes moved: 3 arrays; the best of 10 passes).
 * Prints one line each: `fma GFLOP/s`, `fma512 GFLOP/s`, `triad GB/s`.
 *
 * `peaks jitter MS N [BYTES] [--reps R] [--samples]` instead times N calls (after N/5 warm-up calls) of a
 * fixed piece of work shaped like one inference: it reads a buffer of BYTES (a model's
 * constants, arena, inputs and outputs: what its call walks), then runs FMAs at full
 * throughput on 16 KiB that stay in L1 for the rest of about MS milliseconds. It prints
 * `reps R` (the FMA passes it calibrated for MS, or was given, so that every round of a
 * benchmark times the same work), `median MS`, `p99 MS` and, with --samples, every call:
 * the spread this machine gives a single-threaded call of that length and footprint
 * (timer ticks, other tenants' use of the core, the shared L3 and memory), which no
 * engine can go below. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ACC(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* One core's FMA throughput with vectors of type VT (LANES floats): twelve independent
 * chains in registers (an FMA chain cannot be folded), the best of three passes.
 * noinline: inlined into main, gcc spilled the accumulators (half the peak). */
#define FMA_PEAK(NAME, TARGET, VT, SET1, LANES)                                      \
    __attribute__((target(TARGET), noinline)) static double NAME(void) {                \
        VT x = SET1(1.0000001f), y = SET1(0.9999999f);                                  \
        ACC(DECL_##NAME)                                                                \
        long n = 50000000;                                                              \
        double best = 0;                                                                \
        for (int rep = 0; rep < 3; rep++) {                                             \
            double t0 = now();                                                          \
            for (long i = 0; i < n; i++) {                                              \
                ACC(STEP_##NAME)                                                        \
            }                                                                           \
            double t = now() - t0, g = n * 12.0 * 2.0 * LANES / t / 1e9;               \
            if (g > best) best = g;                                                     \
        }                                                                               \
        float s = 0;                                                                    \
        ACC(SUM_##NAME)                                                                 \
        if (s == 12345.f) printf("!");                                                  \
        return best;                                                                    \
    }
#define DECL_fma_peak(i) __m256 a##i = _mm256_set1_ps((float)i);
#define STEP_fma_peak(i) a##i = _mm256_fmadd_ps(a##i, x, y);
#define SUM_fma_peak(i) s += a##i[0];
FMA_PEAK(fma_peak, "avx2,fma", __m256, _mm256_set1_ps, 8)
#define DECL_fma512_peak(i) __m512 a##i = _mm512_set1_ps((float)i);
#define STEP_fma512_peak(i) a##i = _mm512_fmadd_ps(a##i, x, y);
#define SUM_fma512_peak(i) s += a##i[0];
FMA_PEAK(fma512_peak, "avx512f", __m512, _mm512_set1_ps, 16)

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

/* One unit of fixed work: a read of the footprint buffer (8 independent sums, so the
 * loads stream as a kernel's do), then `reps` passes of 12 independent FMA chains over
 * a 16 KiB block that stays in L1 (the core's arithmetic at full throughput, as a
 * contraction kernel's). */
static float jitter_l1[4096] __attribute__((aligned(64)));
static float *jitter_mem;
static long jitter_floats;
__attribute__((target("avx2,fma"), noinline)) static float unit(long reps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    for (long i = 0; i + 64 <= jitter_floats; i += 64) {
        const float *p = jitter_mem + i;
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + 24));
        s4 = _mm256_add_ps(s4, _mm256_load_ps(p + 32));
        s5 = _mm256_add_ps(s5, _mm256_load_ps(p + 40));
        s6 = _mm256_add_ps(s6, _mm256_load_ps(p + 48));
        s7 = _mm256_add_ps(s7, _mm256_load_ps(p + 56));
    }
    __m256 y = _mm256_set1_ps(0.9999999f);
#define DECL_J(i) __m256 a##i = _mm256_set1_ps((float)i);
#define STEP_J(i) a##i = _mm256_fmadd_ps(a##i, y, x);
#define SUM_J(i) s0 = _mm256_add_ps(s0, a##i);
    ACC(DECL_J)
    for (long r = 0; r < reps; r++)
        for (int j = 0; j < 4096; j += 8) {
            __m256 x = _mm256_load_ps(jitter_l1 + j);
            ACC(STEP_J)
        }
    ACC(SUM_J)
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                             _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    return s[0];
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double best_of(long reps, int tries, volatile float *sink) {
    double best = 1e9;
    for (int i = 0; i < tries; i++) {
        double t0 = now();
        *sink += unit(reps);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

static int jitter(double ms, long n, double bytes, long reps, int samples) {
    volatile float sink = 0;
    jitter_floats = (long)(bytes / 4) / 64 * 64;
    size_t len = (size_t)(jitter_floats + 64) * 4;
    jitter_mem = aligned_alloc(2 << 20, (len + (2 << 20) - 1) / (2 << 20) * (2 << 20));
    if (!jitter_mem) return 1;
#ifdef MADV_HUGEPAGE
    madvise(jitter_mem, len, MADV_HUGEPAGE); /* as kiln asks for its constants and arena */
#endif
    for (long i = 0; i < jitter_floats + 64; i++) jitter_mem[i] = 1e-3f * (float)(i & 1023);
    /* Calibrate (unless given): the read alone, then FMA passes for the rest of ms. */
    if (reps < 0) {
        double read = best_of(0, 5, &sink), pass = best_of(64, 5, &sink) - read;
        reps = ms / 1e3 > read && pass > 0 ? (long)((ms / 1e3 - read) / (pass / 64)) : 0;
    }
    double *t = malloc(n * sizeof *t);
    if (!t) return 1;
    for (long i = 0; i < n / 5; i++) sink += unit(reps);
    for (long i = 0; i < n; i++) {
        double t0 = now();
        sink += unit(reps);
        t[i] = (now() - t0) * 1e3;
    }
    if (samples) {
        printf("samples");
        for (long i = 0; i < n; i++) printf(" %.6f", t[i]);
        printf("\n");
    }
    qsort(t, n, sizeof *t, cmp);
    printf("reps %ld\nmedian %.6f\np99 %.6f\n", reps, t[n / 2], t[n * 99 / 100 < n - 1 ? n * 99 / 100 : n - 1]);
    free(t);
    free(jitter_mem);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "jitter")) {
        double bytes = 0;
        long reps = -1;
        int samples = 0;
        for (int i = 4; i < argc; i++) {
            if (!strcmp(argv[i], "--samples")) samples = 1;
            else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atol(argv[++i]);
            else bytes = atof(argv[i]);
        }
        return jitter(atof(argv[2]), atol(argv[3]), bytes, reps, samples);
    }
    double f = fma_peak();
    __builtin_cpu_init();
    double f512 = __builtin_cpu_supports("avx512f") ? fma512_peak() : 0;
    printf("fma %.1f\nfma512 %.1f\ntriad %.1f\n", f, f512, triad());
    return 0;
}
