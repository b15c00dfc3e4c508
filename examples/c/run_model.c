/*
 * run_model: loads a .kiln artifact through kiln's C API, prints its inputs and
 * outputs, fills the inputs from files or a fixed pattern, invokes it and prints the
 * output values.
 *
 *   run_model MODEL.kiln [--weights FILE] [--threads N] [--input I=FILE]...
 *             [--arena caller|allocator] [--all]
 *
 * --input I=FILE  input I (an index or a name) from FILE: its raw little-endian
 *                 bytes, exactly the input's byte size (NumPy: array.tofile(FILE));
 *                 the buffer is bound, not copied. Other inputs get the fixed pattern:
 *                 element k of input i is ((7k + 3i) mod 17) / 8 - 1 for floats,
 *                 (7k + 3i) mod 17 for integers, k mod 2 for booleans, written in
 *                 place into the instance's own buffer.
 * --arena         where the instance's arena lives: the caller's aligned memory, or
 *                 blocks from a counting allocator hook (default: the runtime's own).
 * --all           print every output value (default: the first 16).
 *
 * Output values are printed one per line as "NAME[k] = VALUE" (floats with 9
 * significant digits for f32 and 17 for f64: they read back exactly). Errors go to
 * stderr with the failing call, its status and kiln's message; the exit status is 1.
 *
 * Build (from the repository root, after `cargo build -p kiln-capi`):
 *   cc -std=c11 -Icrates/kiln-capi/include examples/c/run_model.c \
 *      target/debug/libkiln_capi.a -lpthread -ldl -lm -o run_model
 */
#include <kiln.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 64

static const char *status_name(kiln_status s) {
    switch (s) {
    case KILN_STATUS_OK: return "KILN_STATUS_OK";
    case KILN_STATUS_INVALID_ARGUMENT: return "KILN_STATUS_INVALID_ARGUMENT";
    case KILN_STATUS_INVALID_ARTIFACT: return "KILN_STATUS_INVALID_ARTIFACT";
    case KILN_STATUS_UNSUPPORTED: return "KILN_STATUS_UNSUPPORTED";
    case KILN_STATUS_WEIGHTS: return "KILN_STATUS_WEIGHTS";
    case KILN_STATUS_IO: return "KILN_STATUS_IO";
    case KILN_STATUS_OUT_OF_MEMORY: return "KILN_STATUS_OUT_OF_MEMORY";
    case KILN_STATUS_RUNTIME: return "KILN_STATUS_RUNTIME";
    case KILN_STATUS_NOT_FOUND: return "KILN_STATUS_NOT_FOUND";
    case KILN_STATUS_INTERNAL: return "KILN_STATUS_INTERNAL";
    default: return "an unknown status";
    }
}

/* Checks a kiln call: on failure prints the call, its status and the message, exits. */
#define CHECK(call)                                                                      \
    do {                                                                                 \
        kiln_status s_ = (call);                                                         \
        if (s_ != KILN_STATUS_OK) {                                                      \
            fprintf(stderr, "run_model: %s failed with %s: %s\n", #call, status_name(s_), \
                    kiln_last_error_message());                                          \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static void die(const char *what, const char *detail) {
    fprintf(stderr, "run_model: %s%s\n", what, detail);
    exit(1);
}

static const char *dtype_name(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_F32: return "f32";
    case KILN_DTYPE_F64: return "f64";
    case KILN_DTYPE_F16: return "f16";
    case KILN_DTYPE_BF16: return "bf16";
    case KILN_DTYPE_I8: return "i8";
    case KILN_DTYPE_U8: return "u8";
    case KILN_DTYPE_I16: return "i16";
    case KILN_DTYPE_U16: return "u16";
    case KILN_DTYPE_I32: return "i32";
    case KILN_DTYPE_U32: return "u32";
    case KILN_DTYPE_I64: return "i64";
    case KILN_DTYPE_U64: return "u64";
    case KILN_DTYPE_BOOL: return "bool";
    default: return "other";
    }
}

/* Bytes per element, 0 for the types this example does not fill or print. */
static size_t elem_size(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_BOOL: return 1;
    case KILN_DTYPE_I16: case KILN_DTYPE_U16: case KILN_DTYPE_F16: case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_F32: return 4;
    case KILN_DTYPE_I64: case KILN_DTYPE_U64: case KILN_DTYPE_F64: return 8;
    default: return 0;
    }
}

static void print_info(const char *kind, size_t i, const kiln_tensor_info *t) {
    printf("%s %zu: %s %s [", kind, i, t->name, dtype_name(t->dtype));
    for (size_t d = 0; d < t->rank; d++) {
        printf("%s%llu", d ? ", " : "", (unsigned long long)t->dims[d]);
    }
    printf("] %zu bytes\n", t->byte_size);
}

/* f32 -> IEEE half (round to nearest even; the pattern's values are exact). */
static uint16_t f32_to_f16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    int32_t exp = (int32_t)((b >> 23) & 0xff) - 127 + 15;
    uint32_t man = b & 0x7fffffu;
    if (f == 0.0f) return sign;
    if (exp <= 0) return sign; /* Underflow: the pattern never gets here. */
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static double f16_to_f64(uint16_t h) {
    double sign = (h & 0x8000u) ? -1.0 : 1.0;
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ffu);
    if (e == 0) return sign * m / 16777216.0; /* m * 2^-24 */
    if (e == 31) return m == 0.0 ? sign * HUGE_VAL : NAN;
    double v = 1.0 + m / 1024.0;
    for (; e > 15; e--) v *= 2.0;
    for (; e < 15; e++) v /= 2.0;
    return sign * v;
}

/* Writes the fixed pattern of input `index` into `data` (`t` its info). */
static void fill_pattern(const kiln_tensor_info *t, size_t index, void *data) {
    size_t w = elem_size(t->dtype);
    if (w == 0) {
        memset(data, 0, t->byte_size);
        return;
    }
    size_t n = t->byte_size / w;
    unsigned char *p = (unsigned char *)data;
    for (size_t k = 0; k < n; k++) {
        uint64_t q = (7u * (uint64_t)k + 3u * (uint64_t)index) % 17u;
        double x = (double)q / 8.0 - 1.0;
        unsigned char *e = p + k * w;
        switch (t->dtype) {
        case KILN_DTYPE_F32: { float v = (float)x; memcpy(e, &v, 4); break; }
        case KILN_DTYPE_F64: memcpy(e, &x, 8); break;
        case KILN_DTYPE_F16: { uint16_t v = f32_to_f16((float)x); memcpy(e, &v, 2); break; }
        case KILN_DTYPE_BF16: {
            float v = (float)x; /* Exact in bf16: a few bits of mantissa. */
            uint32_t b;
            memcpy(&b, &v, 4);
            uint16_t h = (uint16_t)(b >> 16);
            memcpy(e, &h, 2);
            break;
        }
        case KILN_DTYPE_BOOL: e[0] = (unsigned char)(k % 2); break;
        default: {
            /* Integers, little-endian (the pattern is small and non-negative). */
            for (size_t b = 0; b < w; b++) e[b] = (unsigned char)(b < 8 ? (q >> (8 * b)) & 0xff : 0);
            break;
        }
        }
    }
}

static void print_values(const kiln_tensor_info *t, const void *data, int all) {
    size_t w = elem_size(t->dtype);
    if (w == 0) {
        printf("%s: (values of this dtype are not printed)\n", t->name);
        return;
    }
    size_t n = t->byte_size / w;
    size_t shown = all || n <= 16 ? n : 16;
    const unsigned char *p = (const unsigned char *)data;
    for (size_t k = 0; k < shown; k++) {
        const unsigned char *e = p + k * w;
        printf("%s[%zu] = ", t->name, k);
        switch (t->dtype) {
        case KILN_DTYPE_F32: { float v; memcpy(&v, e, 4); printf("%.9g\n", (double)v); break; }
        case KILN_DTYPE_F64: { double v; memcpy(&v, e, 8); printf("%.17g\n", v); break; }
        case KILN_DTYPE_F16: { uint16_t v; memcpy(&v, e, 2); printf("%.9g\n", f16_to_f64(v)); break; }
        case KILN_DTYPE_BF16: {
            uint16_t h;
            memcpy(&h, e, 2);
            uint32_t b = (uint32_t)h << 16;
            float v;
            memcpy(&v, &b, 4);
            printf("%.9g\n", (double)v);
            break;
        }
        case KILN_DTYPE_I8: printf("%d\n", (int)(int8_t)e[0]); break;
        case KILN_DTYPE_U8: case KILN_DTYPE_BOOL: printf("%u\n", (unsigned)e[0]); break;
        case KILN_DTYPE_I16: { int16_t v; memcpy(&v, e, 2); printf("%d\n", (int)v); break; }
        case KILN_DTYPE_U16: { uint16_t v; memcpy(&v, e, 2); printf("%u\n", (unsigned)v); break; }
        case KILN_DTYPE_I32: { int32_t v; memcpy(&v, e, 4); printf("%ld\n", (long)v); break; }
        case KILN_DTYPE_U32: { uint32_t v; memcpy(&v, e, 4); printf("%lu\n", (unsigned long)v); break; }
        case KILN_DTYPE_I64: { int64_t v; memcpy(&v, e, 8); printf("%lld\n", (long long)v); break; }
        case KILN_DTYPE_U64: { uint64_t v; memcpy(&v, e, 8); printf("%llu\n", (unsigned long long)v); break; }
        default: printf("?\n"); break;
        }
    }
    if (shown < n) printf("%s: ... %zu more (--all prints them)\n", t->name, n - shown);
}

/* Reads a whole file into a malloc'd buffer. */
static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open ", path);
    if (fseek(f, 0, SEEK_END) != 0) die("cannot seek ", path);
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) die("cannot size ", path);
    void *buf = malloc(size > 0 ? (size_t)size : 1);
    if (!buf) die("out of memory reading ", path);
    if ((size_t)size != fread(buf, 1, (size_t)size, f)) die("cannot read ", path);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* A kiln_allocator that counts what it hands out. */
typedef struct {
    size_t live_blocks;
    size_t live_bytes;
    size_t total_blocks;
} counting;

static void *counting_alloc(void *ctx, size_t size, size_t align) {
    counting *c = (counting *)ctx;
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t rounded = (size + align - 1) / align * align;
    void *p = aligned_alloc(align < sizeof(void *) ? sizeof(void *) : align, rounded);
    if (p) {
        c->live_blocks++;
        c->live_bytes += size;
        c->total_blocks++;
    }
    return p;
}

static void counting_free(void *ctx, void *p, size_t size, size_t align) {
    counting *c = (counting *)ctx;
    (void)align;
    c->live_blocks--;
    c->live_bytes -= size;
    free(p);
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *weights_path = NULL, *arena_mode = NULL;
    const char *file_specs[MAX_FILES];
    size_t n_files = 0, threads = 1;
    int all = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--weights") && a + 1 < argc) {
            weights_path = argv[++a];
        } else if (!strcmp(argv[a], "--threads") && a + 1 < argc) {
            threads = (size_t)strtoul(argv[++a], NULL, 10);
        } else if (!strcmp(argv[a], "--input") && a + 1 < argc) {
            if (n_files == MAX_FILES) die("too many --input options", "");
            file_specs[n_files++] = argv[++a];
        } else if (!strcmp(argv[a], "--arena") && a + 1 < argc) {
            arena_mode = argv[++a];
        } else if (!strcmp(argv[a], "--all")) {
            all = 1;
        } else if (argv[a][0] == '-' || model_path) {
            die("usage: run_model MODEL.kiln [--weights FILE] [--threads N] [--input I=FILE]... "
                "[--arena caller|allocator] [--all]; unexpected ", argv[a]);
        } else {
            model_path = argv[a];
        }
    }
    if (!model_path) die("usage: run_model MODEL.kiln [options] (see the comment at the top of run_model.c)", "");

    /* The header and the library must agree on the major version. */
    if ((kiln_capi_version() >> 16) != KILN_CAPI_VERSION_MAJOR) die("libkiln_capi does not match kiln.h", "");
    printf("%s\n", kiln_version());

    kiln_module *m = NULL;
    CHECK(kiln_module_load_file(model_path, weights_path, &m));

    size_t n_in = 0, n_out = 0;
    CHECK(kiln_module_input_count(m, &n_in));
    CHECK(kiln_module_output_count(m, &n_out));
    for (size_t i = 0; i < n_in; i++) {
        kiln_tensor_info t;
        CHECK(kiln_module_input_info(m, i, &t));
        print_info("input", i, &t);
    }
    for (size_t i = 0; i < n_out; i++) {
        kiln_tensor_info t;
        CHECK(kiln_module_output_info(m, i, &t));
        print_info("output", i, &t);
    }

    /* The instance: its arena from the runtime, the caller, or the caller's allocator. */
    kiln_instance *inst = NULL;
    void *arena = NULL;
    counting counts = {0, 0, 0};
    if (!arena_mode) {
        CHECK(kiln_instance_create(m, threads, &inst));
    } else if (!strcmp(arena_mode, "caller")) {
        size_t size = 0, align = 0;
        CHECK(kiln_module_arena_size(m, &size));
        CHECK(kiln_module_arena_align(m, &align));
        size_t rounded = (size + align - 1) / align * align;
        arena = aligned_alloc(align < sizeof(void *) ? sizeof(void *) : align, rounded ? rounded : align);
        if (!arena) die("out of memory for the arena", "");
        printf("arena: %zu bytes aligned to %zu, the caller's\n", size, align);
        CHECK(kiln_instance_create_in(m, arena, size, threads, &inst));
    } else if (!strcmp(arena_mode, "allocator")) {
        kiln_allocator alloc = {counting_alloc, counting_free, &counts};
        CHECK(kiln_instance_create_with_allocator(m, &alloc, threads, &inst));
        printf("allocator: %zu blocks, %zu bytes live\n", counts.live_blocks, counts.live_bytes);
    } else {
        die("--arena takes caller or allocator, not ", arena_mode);
    }
    /* Inputs from files are bound in place (no copy); the rest get the pattern, written
       in place into the instance's own buffers. */
    void *files[MAX_FILES];
    unsigned char *bound = calloc(n_in ? n_in : 1, 1);
    if (!bound) die("out of memory", "");
    for (size_t f = 0; f < n_files; f++) {
        const char *eq = strchr(file_specs[f], '=');
        if (!eq) die("--input expects I=FILE, got ", file_specs[f]);
        char key[256];
        size_t klen = (size_t)(eq - file_specs[f]);
        if (klen >= sizeof key) die("--input name too long: ", file_specs[f]);
        memcpy(key, file_specs[f], klen);
        key[klen] = '\0';
        char *end = NULL;
        size_t index = (size_t)strtoul(key, &end, 10);
        if (end == key || *end != '\0') CHECK(kiln_module_input_index(m, key, &index)); /* A name. */
        size_t len = 0;
        files[f] = read_file(eq + 1, &len);
        CHECK(kiln_instance_bind_input(inst, index, files[f], len));
        bound[index] = 1; /* In range: the bind checked it. */
    }
    for (size_t i = 0; i < n_in; i++) {
        if (bound[i]) continue;
        kiln_tensor_info t;
        CHECK(kiln_module_input_info(m, i, &t));
        void *buf = NULL;
        size_t len = 0;
        CHECK(kiln_instance_input_buffer(inst, i, &buf, &len));
        fill_pattern(&t, i, buf);
    }

    CHECK(kiln_instance_invoke(inst));

    for (size_t o = 0; o < n_out; o++) {
        kiln_tensor_info t;
        CHECK(kiln_module_output_info(m, o, &t));
        const void *data = NULL;
        size_t len = 0;
        CHECK(kiln_instance_output(inst, o, &data, &len)); /* In place: no copy. */
        print_values(&t, data, all);
    }

    /* In either order: an instance keeps its module alive. */
    kiln_module_free(m);
    kiln_instance_free(inst);
    free(bound);
    for (size_t f = 0; f < n_files; f++) free(files[f]);
    free(arena);
    if (arena_mode && !strcmp(arena_mode, "allocator")) {
        printf("allocator: %zu blocks, %zu bytes live after free\n", counts.live_blocks, counts.live_bytes);
    }
    return 0;
}
