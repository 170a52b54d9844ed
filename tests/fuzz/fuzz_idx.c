/* fuzz_idx - libFuzzer target over the IDX reader (trainer/idx.h), raw and
 * gzip'ed, and ps_data_load (trainer/dataset.h) on the same file: what
 * `ps-train fit --inputs/--labels` and `ps-train mnist` read. Build and
 * run: `make fuzz`.
 *
 * The first input byte is a mode: bit 0 set, the rest is written gzip'ed
 * (a valid gzip stream around it, so the fuzzer reaches the header checks
 * through zlib); else as is (corrupt and truncated gzip streams included).
 *
 * Properties checked on every input (a violation aborts = a finding):
 *  - ps_idx_load_any and ps_idx_load answer an array or a message naming
 *    the file; what they accept is consistent: 1..4 non-zero dims whose
 *    product times the type's size is the data's bytes, within the limit,
 *    ubyte only for ps_idx_load;
 *  - ps_data_load on the file agrees with ps_idx_load_any whenever the
 *    file is recognised as IDX, and its answer passes fuzz_check_array;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour. */
#include "fuzz.h"
#include "fuzz_data.h"

#include "dataset.h"
#include "idx.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_files g_files;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_files_init(&g_files, "fuzz_idx", "in-idx3-ubyte", NULL);
    return 0;
}

static void check_idx(ps_status st, const ps_idx *x, const ps_err *err, int ubyte_only) {
    if (st != PS_OK) {
        fuzz_require(err->msg[0] && strstr(err->msg, g_files.in), "an IDX error names the file", err->msg);
        fuzz_require(x->data == NULL && x->ndim == 0, "a refused IDX is left zeroed", err->msg);
        return;
    }
    fuzz_require(x->ndim >= 1 && x->ndim <= PS_IDX_MAX_DIMS, "1..4 dims", "");
    fuzz_require(!ubyte_only || x->dtype == PS_IDX_DTYPE_UBYTE, "ps_idx_load: unsigned bytes only", "");
    fuzz_require(x->esize == ps_idx_dtype_size(x->dtype) && x->esize, "a known type", "");
    uint64_t n = 1;
    for (int i = 0; i < x->ndim; i++) {
        fuzz_require(x->dims[i] > 0, "dims non-zero", "");
        n *= x->dims[i];
    }
    fuzz_require(x->size == n && x->bytes == n * x->esize, "size and bytes match the dims", "");
    fuzz_require(x->bytes <= (ubyte_only ? PS_IDX_MAX_BYTES : FUZZ_DATA_MAX), "within the limit", "");
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < x->bytes; i++) sum ^= x->data[i];
    (void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) fuzz_write_gz(g_files.in, data + 1, size - 1);
    else fuzz_write(g_files.in, data + 1, size - 1);

    ps_idx x, u;
    ps_err e1 = {0}, e2 = {0}, e3 = {0};
    ps_status s1 = ps_idx_load_any(g_files.in, FUZZ_DATA_MAX, &x, &e1);
    check_idx(s1, &x, &e1, 0);
    ps_status s2 = ps_idx_load(g_files.in, &u, &e2);
    check_idx(s2, &u, &e2, 1);
    if (s1 == PS_OK && s2 == PS_OK)
        fuzz_require(x.bytes == u.bytes && !memcmp(x.data, u.data, x.bytes), "both IDX loads read the same", "");

    ps_array a;
    ps_status s3 = ps_data_load(g_files.in, FUZZ_DATA_MAX, &a, &e3);
    fuzz_check_array(s3, &a, &e3, g_files.in, FUZZ_DATA_MAX);
    ps_err ef = {0};
    const char *fmt = ps_data_format(g_files.in, &ef);
    if (fmt && !strcmp(fmt, "IDX")) {
        fuzz_require((s1 == PS_OK) == (s3 == PS_OK), "ps_data_load agrees with ps_idx_load_any", e3.msg);
        if (s1 == PS_OK)
            fuzz_require(a.ndim == x.ndim && a.bytes == x.bytes && !memcmp(a.data, x.data, x.bytes),
                         "ps_data_load reads what ps_idx_load_any reads", "");
    }
    ps_array_free(&a);
    ps_idx_free(&x);
    ps_idx_free(&u);
    return 0;
}
