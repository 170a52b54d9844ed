/* fuzz_npz - libFuzzer target over the zip reader (trainer/zip.h) and
 * numpy's .npz archives on it (trainer/npy.h), and ps_data_load
 * (trainer/dataset.h) on the same file. Build and run: `make fuzz`.
 *
 * Properties checked on every input (a violation aborts = a finding):
 *  - ps_zip_open answers a handle or a message naming the file; for each
 *    member it lists, ps_zip_extract with no limit of its own answers its
 *    bytes (the CRC checked) or a message naming the file, and never
 *    allocates more than the file could inflate to (deflate's 1032:1):
 *    libFuzzer's -malloc_limit_mb (= -rss_limit_mb) turns a larger malloc
 *    into a finding;
 *  - ps_npz_load, by each member's name and with no name, and ps_data_load
 *    answer what fuzz_check_array (fuzz_data.h) accepts: an array
 *    consistent with its dims and dtype within the limit, or a message
 *    naming the file;
 *  - a member that extracts parses (ps_npy_parse) to the same answer as
 *    ps_npz_load by its name;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour. */
#include "fuzz.h"
#include "fuzz_data.h"

#include "dataset.h"
#include "npy.h"
#include "zip.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_files g_files;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_files_init(&g_files, "fuzz_npz", "in.npz", NULL);
    return 0;
}

/* the limit ps_npz_load gives the zip reader (npy.c: the data plus a header) */
#define ZIP_MAX (FUZZ_DATA_MAX + 65536 + 1024)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(g_files.in, data, size);
    ps_err e = {0};
    ps_zip *z = NULL;
    ps_status st = ps_zip_open(g_files.in, ZIP_MAX, &z, &e);
    if (st != PS_OK) {
        fuzz_require(z == NULL, "no handle on error", e.msg);
        fuzz_require(e.msg[0] && strstr(e.msg, g_files.in), "a zip error names the file", e.msg);
    } else {
        char names[256];
        fuzz_require(strlen(ps_zip_names(z, names, sizeof names)) < sizeof names, "the names fit", "");
        for (int i = 0; i < ps_zip_count(z) && i < 8; i++) {
            const char *name = ps_zip_name(z, i);
            fuzz_require(name != NULL, "every member has a name", "");
            void *buf = NULL;
            size_t len = 0;
            ps_err em = {0};
            ps_status sm = ps_zip_extract(z, name, SIZE_MAX, &buf, &len, &em);
            if (sm != PS_OK) {
                fuzz_require(em.msg[0] && strstr(em.msg, g_files.in), "a member's error names the file", em.msg);
                fuzz_require(buf == NULL, "no bytes on error", em.msg);
            } else {
                fuzz_require(len / 1032 <= size && (buf || !len), "a member no larger than deflate makes", name);
                volatile uint8_t sum = 0;
                for (size_t k = 0; k < len; k++) sum ^= ((const uint8_t *)buf)[k];
                (void)sum;
            }
            /* by name: a member NAME.npy is what NAME picks */
            size_t nl = strlen(name);
            if (nl > 4 && !strcmp(name + nl - 4, ".npy")) {
                ps_array a, b;
                ps_err ea = {0}, eb = {0};
                ps_status sa = ps_npz_load(g_files.in, name, FUZZ_DATA_MAX, &a, &ea);
                fuzz_check_array(sa, &a, &ea, g_files.in, FUZZ_DATA_MAX);
                if (sm == PS_OK && len <= ZIP_MAX) { /* by name, both read the first member of that name */
                    ps_status sb = ps_npy_parse(buf, len, g_files.in, FUZZ_DATA_MAX, &b, &eb);
                    fuzz_check_array(sb, &b, &eb, g_files.in, FUZZ_DATA_MAX);
                    fuzz_same_array(sa, &a, sb, &b, "ps_npz_load and the member parsed");
                    ps_array_free(&b);
                }
                ps_array_free(&a);
            }
            free(buf);
        }
        ps_zip_free(z);
    }
    ps_array a, c;
    ps_err ea = {0}, ec = {0};
    fuzz_check_array(ps_npz_load(g_files.in, NULL, FUZZ_DATA_MAX, &a, &ea), &a, &ea, g_files.in, FUZZ_DATA_MAX);
    fuzz_check_array(ps_data_load(g_files.in, FUZZ_DATA_MAX, &c, &ec), &c, &ec, g_files.in, FUZZ_DATA_MAX);
    ps_array_free(&a);
    ps_array_free(&c);
    return 0;
}
