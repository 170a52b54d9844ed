/* fuzz_npy - libFuzzer target over numpy's .npy reader (trainer/npy.h):
 * ps_npy_load on a file, raw or gzip'ed, ps_npy_parse on the same bytes in
 * memory (what an .npz member goes through), and ps_data_load
 * (trainer/dataset.h) on the file. Build and run: `make fuzz`.
 *
 * The first input byte is a mode: bit 0 set, the rest is written gzip'ed
 * (a valid gzip stream around it); else as is.
 *
 * Properties checked on every input (a violation aborts = a finding):
 *  - every answer passes fuzz_check_array (fuzz_data.h): an array
 *    consistent with its dims and dtype within the limit, or a message
 *    naming the file;
 *  - the streaming reader (ps_npy_load, through zlib) and the in-memory
 *    parser (ps_npy_parse) agree: both refuse, or both give the same
 *    array (unless the bytes are themselves gzip, which only the reader
 *    unpacks);
 *  - ps_data_load agrees with them whenever it recognises the file as .npy;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour. */
#include "fuzz.h"
#include "fuzz_data.h"

#include "dataset.h"
#include "npy.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_files g_files;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_files_init(&g_files, "fuzz_npy", "in.npy", NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    if (data[0] & 1) fuzz_write_gz(g_files.in, body, len);
    else fuzz_write(g_files.in, body, len);

    ps_array a, b, c;
    ps_err e1 = {0}, e2 = {0}, e3 = {0};
    ps_status s1 = ps_npy_load(g_files.in, FUZZ_DATA_MAX, &a, &e1);
    fuzz_check_array(s1, &a, &e1, g_files.in, FUZZ_DATA_MAX);
    /* the parser gets a copy of exactly len bytes: ASan sees a read past them */
    uint8_t *copy = malloc(len ? len : 1);
    fuzz_require(copy != NULL, "memory", "");
    if (len) memcpy(copy, body, len);
    ps_status s2 = ps_npy_parse(copy, len, g_files.in, FUZZ_DATA_MAX, &b, &e2);
    free(copy);
    fuzz_check_array(s2, &b, &e2, g_files.in, FUZZ_DATA_MAX);
    /* the file reader gunzips (zlib sees the magic 1f 8b), the parser takes bytes as they are */
    int gzip_body = len >= 2 && body[0] == 0x1f && body[1] == 0x8b;
    if (!gzip_body) fuzz_same_array(s1, &a, s2, &b, "ps_npy_load and ps_npy_parse");

    ps_status s3 = ps_data_load(g_files.in, FUZZ_DATA_MAX, &c, &e3);
    fuzz_check_array(s3, &c, &e3, g_files.in, FUZZ_DATA_MAX);
    ps_err ef = {0};
    const char *fmt = ps_data_format(g_files.in, &ef);
    if (fmt && !strcmp(fmt, "npy")) fuzz_same_array(s1, &a, s3, &c, "ps_npy_load and ps_data_load");
    ps_array_free(&a);
    ps_array_free(&b);
    ps_array_free(&c);
    return 0;
}
