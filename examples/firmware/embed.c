/*
 * embed: a static binary with a kiln model linked in, run with no file system.
 *
 * The model comes from `kiln compile MODEL --emit object --symbol kiln_model -o model.o`
 * (or `--emit c-array -o model.c`): an object whose .rodata holds the artifact, 64-byte
 * aligned, as `kiln_model`, and its length as `kiln_model_len`. This program loads it in
 * place (kiln_module_load_bytes_nocopy: no copy, no file), fills every float input with
 * a fixed pattern, runs it on one thread and prints each output value as
 * "NAME[k] = VALUE" (9 significant digits: f32 values read back exactly).
 *
 * Input pattern: element k of input i is ((7k + 3i) mod 17) / 8 - 1.
 *
 * Build (see README.md beside this file):
 *   kiln compile lenet.onnx --emit object --symbol kiln_model -o model.o
 *   cc -std=c11 -static -Icrates/kiln-capi/include examples/firmware/embed.c model.o \
 *      target/debug/libkiln_capi.a -lpthread -ldl -lm -o embed
 */
#include <kiln.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Defined by the object `kiln compile --emit object` wrote. */
extern const unsigned char kiln_model[];
extern const unsigned long kiln_model_len;

/* Exits with the failing call, its status and kiln's message. */
#define CHECK(call)                                                                         \
    do {                                                                                    \
        kiln_status s_ = (call);                                                            \
        if (s_ != KILN_STATUS_OK) {                                                         \
            fprintf(stderr, "embed: %s failed (status %d): %s\n", #call, (int)s_,           \
                    kiln_last_error_message());                                             \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

int main(void) {
    kiln_module *m = NULL;
    kiln_instance *inst = NULL;
    size_t inputs = 0, outputs = 0;

    CHECK(kiln_module_load_bytes_nocopy(kiln_model, kiln_model_len, NULL, 0, &m));
    CHECK(kiln_instance_create(m, 1, &inst));
    CHECK(kiln_module_input_count(m, &inputs));
    CHECK(kiln_module_output_count(m, &outputs));
    for (size_t i = 0; i < inputs; i++) {
        kiln_tensor_info info;
        void *data = NULL;
        size_t len = 0;
        CHECK(kiln_module_input_info(m, i, &info));
        if (info.dtype != KILN_DTYPE_F32) {
            fprintf(stderr, "embed: input %s is not f32\n", info.name);
            return 1;
        }
        CHECK(kiln_instance_input_buffer(inst, i, &data, &len));
        float *x = data;
        for (size_t k = 0; k < len / sizeof(float); k++) {
            x[k] = (float)((7 * k + 3 * i) % 17) / 8.0f - 1.0f;
        }
    }
    CHECK(kiln_instance_invoke(inst));
    for (size_t o = 0; o < outputs; o++) {
        kiln_tensor_info info;
        const void *data = NULL;
        size_t len = 0;
        CHECK(kiln_module_output_info(m, o, &info));
        CHECK(kiln_instance_output(inst, o, &data, &len));
        if (info.dtype != KILN_DTYPE_F32) {
            printf("%s: %zu bytes (not f32)\n", info.name, len);
            continue;
        }
        const float *y = data;
        for (size_t k = 0; k < len / sizeof(float); k++) {
            printf("%s[%zu] = %.9g\n", info.name, k, (double)y[k]);
        }
    }
    kiln_instance_free(inst);
    kiln_module_free(m);
    return 0;
}
