/* fuzz_config - libFuzzer target over the configuration: the YAML loader
 * and the setter every key and flag goes through (config.h), fed a config
 * file made from the fuzz input. Build and run: `make fuzz`.
 *
 * Properties checked on every input (a violation aborts = a finding):
 *  - ps_config_load answers PS_OK, or an error with a non-empty,
 *    NUL-terminated message;
 *  - a config that loads round-trips: ps_config_print writes YAML that
 *    ps_config_load reads back into the same bytes (memcmp), so what
 *    `psd --print-config` shows is what runs;
 *  - the checks across keys (ps_config_check_cluster) answer without
 *    crashing, with a message when they refuse;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour. */
#include <string.h>

#include "config.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_files g_files;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_files_init(&g_files, "fuzz_config", "in.yaml", "out.yaml");
    ps_log_set_level(PS_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(g_files.in, data, size);
    static ps_config c, back;  /* large: not on the fuzzer's stack */
    ps_config_defaults(&c);
    ps_err err = {0};
    if (ps_config_load(&c, g_files.in, &err) != PS_OK) {
        fuzz_require(memchr(err.msg, 0, sizeof err.msg) != NULL && err.msg[0], "an error has a message", err.msg);
        return 0;
    }
    FILE *f = fopen(g_files.out, "w");
    fuzz_require(f != NULL, "temporary file", g_files.out);
    ps_config_print(&c, f);
    fclose(f);
    ps_config_defaults(&back);
    ps_err e2 = {0};
    fuzz_require(ps_config_load(&back, g_files.out, &e2) == PS_OK, "the printed config loads", e2.msg);
    fuzz_require(memcmp(&c, &back, sizeof c) == 0, "the printed config loads into the same values", g_files.out);
    ps_err e3 = {0};
    if (ps_config_check_cluster(&c, &e3) != PS_OK)
        fuzz_require(e3.msg[0] != '\0', "a refused cluster has a message", e3.msg);
    return 0;
}
