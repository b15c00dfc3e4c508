/*
 * The C API's error paths, called from C: NULL arguments, a truncated artifact, a
 * wrong input size. Prints one line per check, "ok NAME" or "FAIL NAME: ...", and
 * exits 1 if any failed. Usage: errors MODEL.kiln (a valid artifact, read from disk).
 * Valid C99 and C++: the test compiles it as both, which checks kiln.h in both.
 */
#include <kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void expect(const char *name, kiln_status got, kiln_status want, const char *text) {
    const char *msg = kiln_last_error_message();
    if (got != want || (text && !strstr(msg, text))) {
        printf("FAIL %s: status %d (want %d), message \"%s\" (want \"%s\")\n", name, (int)got, (int)want, msg,
               text ? text : "");
        failures++;
    } else {
        printf("ok %s\n", name);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = (unsigned char *)malloc((size_t)n);
    if (!bytes || fread(bytes, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);

    kiln_module *m = NULL;
    kiln_instance *inst = NULL;
    size_t count = 0;
    kiln_tensor_info info;

    expect("load_bytes NULL data", kiln_module_load_bytes(NULL, (size_t)n, NULL, 0, &m),
           KILN_STATUS_INVALID_ARGUMENT, "kiln_module_load_bytes: `data` is NULL");
    expect("load_bytes NULL out", kiln_module_load_bytes(bytes, (size_t)n, NULL, 0, NULL),
           KILN_STATUS_INVALID_ARGUMENT, "`out` is NULL");
    expect("load_file NULL path", kiln_module_load_file(NULL, NULL, &m), KILN_STATUS_INVALID_ARGUMENT,
           "kiln_module_load_file: `path` is NULL");
    expect("truncated", kiln_module_load_bytes(bytes, (size_t)n / 2, NULL, 0, &m), KILN_STATUS_INVALID_ARTIFACT,
           "kiln_module_load_bytes: bad container");
    expect("truncated leaves out alone", m == NULL ? KILN_STATUS_OK : KILN_STATUS_INTERNAL, KILN_STATUS_OK, NULL);
    expect("input_count NULL module", kiln_module_input_count(NULL, &count), KILN_STATUS_INVALID_ARGUMENT,
           "`module` is NULL");
    expect("input_info NULL module", kiln_module_input_info(NULL, 0, &info), KILN_STATUS_INVALID_ARGUMENT,
           "`module` is NULL");
    expect("instance_create NULL module", kiln_instance_create(NULL, 1, &inst), KILN_STATUS_INVALID_ARGUMENT,
           "`module` is NULL");
    expect("invoke NULL instance", kiln_instance_invoke(NULL), KILN_STATUS_INVALID_ARGUMENT,
           "kiln_instance_invoke: `instance` is NULL");
    expect("set_input NULL instance", kiln_instance_set_input(NULL, 0, bytes, 4), KILN_STATUS_INVALID_ARGUMENT,
           "`instance` is NULL");
    expect("output NULL instance", kiln_instance_output(NULL, 0, NULL, NULL), KILN_STATUS_INVALID_ARGUMENT, "NULL");
    kiln_module_free(NULL);
    kiln_instance_free(NULL);

    expect("load", kiln_module_load_bytes(bytes, (size_t)n, NULL, 0, &m), KILN_STATUS_OK, NULL);
    expect("input_info NULL info", kiln_module_input_info(m, 0, NULL), KILN_STATUS_INVALID_ARGUMENT,
           "`info` is NULL");
    expect("input_info", kiln_module_input_info(m, 0, &info), KILN_STATUS_OK, NULL);
    expect("create", kiln_instance_create(m, 1, &inst), KILN_STATUS_OK, NULL);
    expect("set_input NULL data", kiln_instance_set_input(inst, 0, NULL, info.byte_size),
           KILN_STATUS_INVALID_ARGUMENT, "`data` is NULL");
    float *x = (float *)calloc(info.byte_size / 4 + 1, 4);
    if (!x) return 2;
    expect("set_input wrong size", kiln_instance_set_input(inst, 0, x, info.byte_size + 4),
           KILN_STATUS_INVALID_ARGUMENT, "must be");
    expect("invoke unset input", kiln_instance_invoke(inst), KILN_STATUS_INVALID_ARGUMENT, "has no value");
    expect("set_input", kiln_instance_set_input(inst, 0, x, info.byte_size), KILN_STATUS_OK, NULL);
    expect("invoke", kiln_instance_invoke(inst), KILN_STATUS_OK, NULL);

    kiln_instance_free(inst);
    kiln_module_free(m);
    free(x);
    free(bytes);
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
