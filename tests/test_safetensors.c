/* test_safetensors.c - common/safetensors: round trip, the PyTorch golden
 * file, and broken files that must be refused with a precise message.
 *
 * Usage: test_safetensors [golden-file]
 * The golden file defaults to $PS_GOLDEN_DIR/mnist_step.safetensors, else
 * tests/golden/mnist_step.safetensors (run from the repository root). It is
 * written by scripts/gen_golden.py; this test needs no Python.
 * PS_TEST_VERBOSE=1 prints every refusal message.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "safetensors.h"

static char tmpdir[256];

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) { free(b); b = NULL; }
    fclose(fp);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *fp = fopen(path, "wb");
    PS_ASSERT(fp);
    PS_ASSERT(fwrite(b, 1, n, fp) == n);
    PS_ASSERT(fclose(fp) == 0);
}

/* A file with header length hlen_override (or the real length when ~0) and
 * the given header text and data bytes. */
static void write_raw(const char *path, const char *header, const void *data, size_t dlen,
                      uint64_t hlen_override) {
    size_t hl = strlen(header);
    uint64_t n = hlen_override != UINT64_MAX ? hlen_override : hl;
    unsigned char *b = malloc(8 + hl + dlen + 1);
    PS_ASSERT(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    memcpy(b + 8, header, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    spit(path, b, 8 + hl + dlen);
    free(b);
}

static ps_st_tensor mk(const char *name, int dtype, int ndim, const int64_t *dims, void *data) {
    ps_st_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dtype;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    t.bytes = (size_t)ps_st_numel(&t) * ps_st_dtype_size(dtype);
    t.data = data;
    return t;
}

/* ------------------------------------------------------------------------- */

static void test_round_trip(void) {
    char path[512], tmp[520];
    tmp_path(path, sizeof path, "rt.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    float a[6] = { 1.5f, -2.25f, 3e-38f, 1e38f, -0.0f, 7.0f };
    int64_t b[5] = { 0, -1, INT64_MAX, INT64_MIN, 42 };
    double c[4] = { 3.141592653589793, -1e-300, 2.0, 0.5 };
    float s = 9.75f;
    float one = 4.0f;
    int64_t da[2] = { 2, 3 }, db[1] = { 5 }, dc[2] = { 2, 2 }, dz[2] = { 0, 4 }, d1[1] = { 1 };
    ps_st_tensor ts[] = {
        mk("fc.weight", PS_ST_F32, 2, da, a),
        mk("step", PS_ST_I64, 1, db, b),
        mk("pi", PS_ST_F64, 2, dc, c),
        mk("scalar", PS_ST_F32, 0, NULL, &s),
        mk("empty", PS_ST_F32, 2, dz, NULL),
        mk("odd \"name\" \\ caf\xc3\xa9", PS_ST_F32, 1, d1, &one),
    };
    size_t n = sizeof ts / sizeof ts[0];
    const char *meta[] = { "format", "pt", "note", "line1\nline2 \"quoted\" \\ tab\t", "empty", "", NULL };
    ps_err err = { 0 };

    CHECK(ps_st_write(path, ts, n, meta, &err) == PS_OK);
    CHECK_MSG(err.code == PS_OK, "%s", err.msg);
    CHECK(!file_exists(tmp));

    /* Header length: little-endian, a multiple of 8; header starts with '{'. */
    size_t flen = 0;
    unsigned char *raw = slurp(path, &flen);
    CHECK(raw != NULL && flen > 8);
    if (raw) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
        CHECK(hl % 8 == 0);
        CHECK(raw[8] == '{');
        CHECK(hl + 8 <= flen);
        /* data: 6*4 + 5*8 + 4*8 + 4 + 0 + 4 bytes */
        CHECK(flen - 8 - hl == 24 + 40 + 32 + 4 + 0 + 4);
    }
    free(raw);

    ps_st_file *f = ps_st_read(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    CHECK(ps_st_count(f) == n);
    for (size_t i = 0; i < n; i++) {
        const ps_st_tensor *t = ps_st_find(f, ts[i].name);
        CHECK_MSG(t != NULL, "missing %s", ts[i].name);
        if (!t) continue;
        CHECK(t->dtype == ts[i].dtype);
        CHECK(t->ndim == ts[i].ndim);
        for (int d = 0; d < t->ndim; d++) CHECK(t->dims[d] == ts[i].dims[d]);
        CHECK(t->bytes == ts[i].bytes);
        if (t->bytes) {
            CHECK(memcmp(t->data, ts[i].data, t->bytes) == 0);
            CHECK((uintptr_t)t->data % ps_st_dtype_size(t->dtype) == 0);
        }
    }
    /* File order: 8-byte dtypes first, then by name (like the reference). */
    const ps_st_tensor *t0 = ps_st_get(f, 0), *t1 = ps_st_get(f, 1);
    CHECK(t0 && !strcmp(t0->name, "pi"));
    CHECK(t1 && !strcmp(t1->name, "step"));
    CHECK(ps_st_get(f, n) == NULL);
    CHECK(ps_st_find(f, "nope") == NULL);
    CHECK(ps_st_metadata_count(f) == 3);
    const char *v = ps_st_metadata(f, "note");
    CHECK(v && !strcmp(v, meta[3]));
    v = ps_st_metadata(f, "format");
    CHECK(v && !strcmp(v, "pt"));
    v = ps_st_metadata(f, "empty");
    CHECK(v && !strcmp(v, ""));
    CHECK(ps_st_metadata(f, "absent") == NULL);
    CHECK(!strcmp(ps_st_metadata_key(f, 0), "format"));
    ps_st_free(f);

    /* Overwriting an existing file replaces it; no metadata is fine. */
    float z = 1.0f;
    ps_st_tensor one_t = mk("only", PS_ST_F32, 1, d1, &z);
    CHECK(ps_st_write(path, &one_t, 1, NULL, &err) == PS_OK);
    f = ps_st_read(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        CHECK(ps_st_count(f) == 1 && ps_st_metadata_count(f) == 0);
        CHECK(ps_st_find(f, "fc.weight") == NULL);
        ps_st_free(f);
    }
    ps_st_free(NULL);

    /* An empty file ({} header) round-trips too. */
    CHECK(ps_st_write(path, NULL, 0, NULL, &err) == PS_OK);
    f = ps_st_read(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) { CHECK(ps_st_count(f) == 0); ps_st_free(f); }
}

static void expect_write_error(const ps_st_tensor *ts, size_t n, const char *const *meta,
                               const char *want) {
    char path[512];
    tmp_path(path, sizeof path, "bad-write.safetensors");
    unlink(path);
    ps_err err = { 0 };
    ps_status st = ps_st_write(path, ts, n, meta, &err);
    CHECK_MSG(st == PS_ERR_INVALID_ARGUMENT, "write accepted, wanted '%s'", want);
    CHECK_MSG(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    CHECK(!file_exists(path));
}

static void test_write_refusals(void) {
    float a[2] = { 1, 2 };
    int64_t d2[1] = { 2 };
    ps_st_tensor ok = mk("a", PS_ST_F32, 1, d2, a);
    ps_st_tensor dup[2] = { ok, ok };
    expect_write_error(dup, 2, NULL, "duplicate tensor name 'a'");
    ps_st_tensor wrong = mk("w", PS_ST_F32, 1, d2, a);
    wrong.dims[0] = 3;
    expect_write_error(&wrong, 1, NULL, "tensor 'w': shape [3] of F32 does not match 8 bytes");
    ps_st_tensor meta = mk("__metadata__", PS_ST_F32, 1, d2, a);
    expect_write_error(&meta, 1, NULL, "invalid name '__metadata__'");
    ps_st_tensor bad = mk("b", PS_ST_F32, 1, d2, a);
    bad.dtype = 99;
    expect_write_error(&bad, 1, NULL, "tensor 'b': unknown dtype 99");
    const char *kv[] = { "k", "1", "k", "2", NULL };
    expect_write_error(&ok, 1, kv, "duplicate metadata key 'k'");
    const char *odd[] = { "k", NULL };
    expect_write_error(&ok, 1, odd, "metadata key 'k' has no value");
}

/* ------------------------------------------------------------------------- */

static void expect_read_error(const char *path, ps_status code, const char *want1, const char *want2) {
    ps_err err = { 0 };
    ps_st_file *f = ps_st_read(path, &err);
    CHECK_MSG(f == NULL, "%s was accepted (wanted '%s')", path, want1);
    ps_st_free(f);
    if (getenv("PS_TEST_VERBOSE")) printf("  refused: [%s] %s\n", ps_status_name(err.code), err.msg);
    CHECK_MSG(err.code == code, "%s: code %s, wanted %s (%s)", path, ps_status_name(err.code),
              ps_status_name(code), err.msg);
    CHECK_MSG(strncmp(err.msg, path, strlen(path)) == 0, "message '%s' does not start with the path", err.msg);
    CHECK_MSG(strstr(err.msg, want1) != NULL, "message '%s' lacks '%s'", err.msg, want1);
    if (want2) CHECK_MSG(strstr(err.msg, want2) != NULL, "message '%s' lacks '%s'", err.msg, want2);
}

static void test_broken_files(void) {
    char path[512];
    ps_err err = { 0 };
    unsigned char data[64];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;

    /* Truncated data: a valid file cut short. */
    tmp_path(path, sizeof path, "trunc.safetensors");
    float w[6] = { 1, 2, 3, 4, 5, 6 };
    int64_t d6[1] = { 6 };
    ps_st_tensor t = mk("layer.w", PS_ST_F32, 1, d6, w);
    CHECK(ps_st_write(path, &t, 1, NULL, &err) == PS_OK);
    size_t len = 0;
    unsigned char *whole = slurp(path, &len);
    PS_ASSERT(whole);
    spit(path, whole, len - 3);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'layer.w': data_offsets [0, 24] out of range",
                      "truncated");
    spit(path, whole, 5);
    expect_read_error(path, PS_ERR_FORMAT, "too short", NULL);
    spit(path, whole, 0);
    expect_read_error(path, PS_ERR_FORMAT, "too short", NULL);
    /* Cut inside the header: the header length no longer fits. */
    spit(path, whole, 20);
    expect_read_error(path, PS_ERR_FORMAT, "header length", "does not fit");
    free(whole);

    /* Header length larger than the file. */
    tmp_path(path, sizeof path, "hlen.safetensors");
    const char *good = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_raw(path, good, data, 8, 1u << 20);
    expect_read_error(path, PS_ERR_FORMAT, "header length 1048576", "does not fit");
    write_raw(path, good, data, 8, UINT64_MAX - 1);
    expect_read_error(path, PS_ERR_FORMAT, "header length", "does not fit");
    write_raw(path, good, data, 8, 0);
    expect_read_error(path, PS_ERR_FORMAT, "header length 0", NULL);
    /* ...and the same header with its right length is fine. */
    write_raw(path, good, data, 8, UINT64_MAX);
    ps_st_file *f = ps_st_read(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        const ps_st_tensor *x = ps_st_find(f, "x");
        CHECK(x && x->bytes == 8 && !memcmp(x->data, data, 8));
        ps_st_free(f);
    }

    /* Bad JSON. */
    tmp_path(path, sizeof path, "json.safetensors");
    static const struct { const char *hdr; const char *want1, *want2; } bad_json[] = {
        { "{\"x\" {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "header JSON", "expected ':'" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", "header JSON", "expected ',' or '}'" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}xx", "header JSON", "after the header object" },
        { "[\"x\"]                                                  ", "header JSON", "expected '{'" },
        { "{\"x:{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ", "header JSON", NULL },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", "tensor 'x'", "fraction" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", "tensor 'x'", "non-negative integer" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", "tensor 'x'", "unknown key \"extra\"" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}                    ", "tensor 'x'", "missing \"data_offsets\"" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", "tensor 'x'", "2 entries" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", "tensor 'x'", "more than 8" },
        { "{\"__metadata__\":{\"a\":1},\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "__metadata__", "must be a string" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", "duplicate tensor name 'x'", NULL },
        { "{\"x\\q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "invalid escape", NULL },
        { "{\"x\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "invalid UTF-8", NULL },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", "leading zero", NULL },
        { "", "header length 0", NULL },
    };
    for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
        write_raw(path, bad_json[i].hdr, data, 8, UINT64_MAX);
        expect_read_error(path, PS_ERR_FORMAT, bad_json[i].want1, bad_json[i].want2);
    }

    /* Unknown dtype. */
    tmp_path(path, sizeof path, "dtype.safetensors");
    write_raw(path, "{\"h\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", data, 8, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'h': unsupported dtype \"BF16\"", NULL);

    /* Overlapping offsets. */
    tmp_path(path, sizeof path, "overlap.safetensors");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]", NULL);

    /* Offsets out of range (past the end of the data buffer). */
    tmp_path(path, sizeof path, "range.safetensors");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", data, 16, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'b': data_offsets [8, 24] out of range", "holds only 16 bytes");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9223372036854775807,9223372036854775807]}}",
              data, 0, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'a'", "out of range");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data, 8, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'a'", "end before they begin");

    /* Gap between tensors, and bytes after the last one. */
    tmp_path(path, sizeof path, "gap.safetensors");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", data, 12, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'b'", "gap of 4 bytes");
    write_raw(path, good, data, 12, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "4 trailing bytes", NULL);

    /* Shape / size mismatch. */
    tmp_path(path, sizeof path, "shape.safetensors");
    write_raw(path, "{\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", data, 20, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 'fc1.weight': shape [2, 3] of F32 needs 24 bytes",
                      "span 20 bytes");
    write_raw(path, "{\"t\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,12]}}", data, 12, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 't': shape [3] of I64 needs 24 bytes", NULL);
    write_raw(path, "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
              data, 8, UINT64_MAX);
    expect_read_error(path, PS_ERR_FORMAT, "tensor 't'", "overflows");

    /* Missing file. */
    tmp_path(path, sizeof path, "does-not-exist.safetensors");
    expect_read_error(path, PS_ERR_NOT_FOUND, "cannot open", NULL);

    /* Valid oddities: escapes in names, a misaligned (but contiguous) I64,
     * a scalar, tabs and newlines between tokens. */
    tmp_path(path, sizeof path, "odd.safetensors");
    int64_t big = 0x0102030405060708;
    unsigned char buf[12];
    float fv = 2.5f;
    memcpy(buf, &fv, 4);
    memcpy(buf + 4, &big, 8);
    write_raw(path, "{\n\t\"caf\\u00e9 \\ud83d\\ude00\" : {\"shape\":[], \"dtype\":\"F32\", \"data_offsets\":[0,4]},\r\n"
                    " \"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[4,12]}, \"__metadata__\":{}}   ",
              buf, 12, UINT64_MAX);
    f = ps_st_read(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        const ps_st_tensor *a = ps_st_find(f, "caf\xc3\xa9 \xf0\x9f\x98\x80");
        const ps_st_tensor *i = ps_st_find(f, "i");
        CHECK(a && a->ndim == 0 && a->bytes == 4 && *(const float *)a->data == 2.5f);
        CHECK(i && (uintptr_t)i->data % 8 == 0 && *(const int64_t *)i->data == big);
        CHECK(ps_st_metadata_count(f) == 0);
        ps_st_free(f);
    }
}

/* ------------------------------------------------------------------------- */

typedef struct { const char *name; int dtype; int ndim; int64_t dims[4]; } want_t;

static const char *const PARAMS[8] = {
    "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
};
static const int PARAM_NDIM[8] = { 4, 1, 4, 1, 2, 1, 2, 1 };
static const int64_t PARAM_DIMS[8][4] = {
    { 32, 1, 3, 3 }, { 32 }, { 64, 32, 3, 3 }, { 64 }, { 128, 9216 }, { 128 }, { 10, 128 }, { 10 },
};

static const ps_st_tensor *need(const ps_st_file *f, const char *name, int dtype, int ndim,
                                const int64_t *dims) {
    const ps_st_tensor *t = ps_st_find(f, name);
    CHECK_MSG(t != NULL, "golden: no tensor %s", name);
    if (!t) return NULL;
    int ok = t->dtype == dtype && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->dims[d] == dims[d];
    CHECK_MSG(ok, "golden: %s has the wrong dtype or shape", name);
    return ok ? t : NULL;
}

static void test_golden(const char *golden) {
    ps_err err = { 0 };
    ps_st_file *f = ps_st_read(golden, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;

    /* Names and shapes: 8 init + 8 final + 2 x (7 + 8) = 46. */
    CHECK(ps_st_count(f) == 46);
    char name[PS_ST_NAME_MAX];
    for (int p = 0; p < 8; p++) {
        static const char *const pre[] = { "init.", "final.", "step1.grad.", "step2.grad." };
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "%s%s", pre[k], PARAMS[p]);
            need(f, name, PS_ST_F32, PARAM_NDIM[p], PARAM_DIMS[p]);
        }
    }
    const int N = 8;
    for (int s = 1; s <= 2; s++) {
        int64_t din[4] = { N, 1, 28, 28 }, dn[1] = { N }, dm1[2] = { N, 64 }, dm2[2] = { N, 128 },
                dout[2] = { N, 10 }, d1[1] = { 1 };
        char pfx[24];
        snprintf(pfx, sizeof pfx, "step%d.", s);
#define NAME(x) (snprintf(name, sizeof name, "%s%s", pfx, x), name)
        need(f, NAME("input"), PS_ST_F32, 4, din);
        const ps_st_tensor *tg = need(f, NAME("target"), PS_ST_I64, 1, dn);
        const ps_st_tensor *m1 = need(f, NAME("mask1"), PS_ST_F32, 2, dm1);
        const ps_st_tensor *m2 = need(f, NAME("mask2"), PS_ST_F32, 2, dm2);
        const ps_st_tensor *out = need(f, NAME("output"), PS_ST_F32, 2, dout);
        const ps_st_tensor *loss = need(f, NAME("loss"), PS_ST_F32, 1, d1);
        const ps_st_tensor *go = need(f, NAME("grad_output"), PS_ST_F32, 2, dout);
#undef NAME
        if (!tg || !m1 || !m2 || !out || !loss || !go) continue;
        const int64_t *target = tg->data;
        const float *o = out->data, *g = go->data;
        double nll = 0;
        for (int i = 0; i < N; i++) {
            CHECK(target[i] >= 0 && target[i] < 10);
            double z = 0;
            for (int j = 0; j < 10; j++) {
                z += exp(o[i * 10 + j]);
                /* NLL gradient: -1/N at the target, 0 elsewhere. */
                CHECK(g[i * 10 + j] == (j == target[i] ? -1.0f / N : 0.0f));
            }
            CHECK_CLOSE(z, 1.0, 1e-5, 0);
            nll -= o[i * 10 + target[i]];
        }
        CHECK_CLOSE(((const float *)loss->data)[0], nll / N, 1e-6, 1e-6);
        /* Dropout masks: 0 or 1/(1-p). */
        int bad = 0;
        for (int64_t i = 0; i < ps_st_numel(m1); i++) {
            float v = ((const float *)m1->data)[i];
            bad += v != 0.0f && v != 1.0f / 0.75f;
        }
        for (int64_t i = 0; i < ps_st_numel(m2); i++) {
            float v = ((const float *)m2->data)[i];
            bad += v != 0.0f && v != 2.0f;
        }
        CHECK(bad == 0);
    }

    /* Metadata. */
    const char *layers = ps_st_metadata(f, "layers");
    CHECK(layers && strstr(layers, "conv1=Conv2d(1,32,3,1); relu; conv2=Conv2d(32,64,3,1); max_pool2d(2)"));
    const char *lr = ps_st_metadata(f, "lr"), *mom = ps_st_metadata(f, "momentum"),
               *wd = ps_st_metadata(f, "weight_decay"), *batch = ps_st_metadata(f, "batch");
    CHECK(lr && !strcmp(lr, "0.03"));
    CHECK(mom && !strcmp(mom, "0.9"));
    CHECK(wd && !strcmp(wd, "0.0001"));
    CHECK(batch && !strcmp(batch, "8"));
    CHECK(ps_st_metadata(f, "torch_version") != NULL);

    /* The stored gradients and torch.optim.SGD's rule give the final weights:
     * g' = g + wd*w; buf = g' (step 1), 0.9*buf + g' (step 2); w -= lr*buf. */
    double max_err = 0;
    for (int p = 0; p < 8; p++) {
        const ps_st_tensor *w0, *g1, *g2, *wf;
        snprintf(name, sizeof name, "init.%s", PARAMS[p]);  w0 = ps_st_find(f, name);
        snprintf(name, sizeof name, "step1.grad.%s", PARAMS[p]); g1 = ps_st_find(f, name);
        snprintf(name, sizeof name, "step2.grad.%s", PARAMS[p]); g2 = ps_st_find(f, name);
        snprintf(name, sizeof name, "final.%s", PARAMS[p]); wf = ps_st_find(f, name);
        if (!w0 || !g1 || !g2 || !wf) { CHECK(0); continue; }
        for (int64_t i = 0; i < ps_st_numel(w0); i++) {
            float w = ((const float *)w0->data)[i];
            float d = ((const float *)g1->data)[i] + 1e-4f * w;
            float buf = d;
            w = w - 0.03f * buf;
            d = ((const float *)g2->data)[i] + 1e-4f * w;
            buf = 0.9f * buf + d;
            w = w - 0.03f * buf;
            double e = fabs((double)w - ((const float *)wf->data)[i]);
            if (e > max_err) max_err = e;
        }
    }
    if (getenv("PS_TEST_VERBOSE")) printf("  golden: SGD replay max |diff| vs final.* = %g\n", max_err);
    CHECK_MSG(max_err < 1e-6, "SGD replay differs from final.* by %g", max_err);

    /* Writing the same tensors and metadata back gives the Python file byte
     * for byte (same order, same compact JSON, same padding). */
    size_t n = ps_st_count(f), nm = ps_st_metadata_count(f);
    ps_st_tensor *ts = malloc(n * sizeof *ts);
    const char **kv = malloc((2 * nm + 1) * sizeof *kv);
    PS_ASSERT(ts && kv);
    for (size_t i = 0; i < n; i++) ts[i] = *ps_st_get(f, i);
    for (size_t i = 0; i < nm; i++) { kv[2 * i] = ps_st_metadata_key(f, i); kv[2 * i + 1] = ps_st_metadata_value(f, i); }
    kv[2 * nm] = NULL;
    char path[512];
    tmp_path(path, sizeof path, "golden-copy.safetensors");
    CHECK(ps_st_write(path, ts, n, kv, &err) == PS_OK);
    size_t la = 0, lb = 0;
    unsigned char *a = slurp(golden, &la), *b = slurp(path, &lb);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0);
    free(a);
    free(b);
    free(ts);
    free(kv);
    ps_st_free(f);

    /* A truncated copy of the golden file is refused, naming the tensor. */
    a = slurp(golden, &la);
    if (a) {
        spit(path, a, la - 1000);
        free(a);
        expect_read_error(path, PS_ERR_FORMAT, "out of range", "truncated");
    }
    unlink(path);
}

static void rm_tmpdir(void) {
    static const char *const files[] = {
        "rt.safetensors", "bad-write.safetensors", "trunc.safetensors", "hlen.safetensors",
        "json.safetensors", "dtype.safetensors", "overlap.safetensors", "range.safetensors",
        "gap.safetensors", "shape.safetensors", "odd.safetensors", "golden-copy.safetensors",
    };
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        tmp_path(path, sizeof path, files[i]);
        unlink(path);
    }
    rmdir(tmpdir);
}

/* 150,000 tensors: writing and reading take O(n log n), not a quadratic
 * duplicate check (that took 42 s for reading alone); duplicates are still
 * found. The bound is loose: a quadratic pass is ~1.1e10 string compares (~25 s
 * each way on the 2-vCPU VM before the fix), the sorted one ~0.3 s. */
static void test_many_tensors(void) {
    enum { N = 150000 };
    ps_st_tensor *t = calloc(N, sizeof *t);
    static float one = 1.0f;
    CHECK(t != NULL);
    if (!t) return;
    for (int i = 0; i < N; i++) {
        snprintf(t[i].name, sizeof t[i].name, "layers.%05d.weight", i);
        t[i].dtype = PS_ST_F32;
        t[i].ndim = 1;
        t[i].dims[0] = 1;
        t[i].data = &one;
        t[i].bytes = sizeof one;
    }
    char path[512];
    tmp_path(path, sizeof path, "many.safetensors");
    ps_err e = {0};
    struct timespec a, b, c;
    /* CPU time, not wall time: a loaded machine stretches the latter, while a
     * quadratic name check costs seconds of CPU wherever it runs. */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    CHECK_MSG(ps_st_write(path, t, N, NULL, &e) == PS_OK, "%s", e.msg);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    ps_st_file *f = ps_st_read(path, &e);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    double tw = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    double tr = (double)(c.tv_sec - b.tv_sec) + (c.tv_nsec - b.tv_nsec) * 1e-9;
    printf("test_safetensors: %d tensors written in %.2f s, read in %.2f s of CPU\n", N, tw, tr);
    CHECK_MSG(f != NULL, "%s", e.msg);
    CHECK_MSG(tw + tr < 8, "write %.1f s, read %.1f s of CPU: quadratic? (about 0.3 s in all on a 2-vCPU VM)", tw, tr);
    ps_st_free(f);
    snprintf(t[N - 1].name, sizeof t[N - 1].name, "layers.%05d.weight", 17);
    e.msg[0] = '\0';
    CHECK(ps_st_write(path, t, N, NULL, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.msg, "duplicate tensor name 'layers.00017.weight'") != NULL);
    unlink(path);
    free(t);
}

int main(int argc, char **argv) {
    const char *td = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_safetensors.XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    char golden[512];
    const char *gd = getenv("PS_GOLDEN_DIR");
    if (argc > 1) snprintf(golden, sizeof golden, "%s", argv[1]);
    else snprintf(golden, sizeof golden, "%s/mnist_step.safetensors", gd && *gd ? gd : "tests/golden");

    test_round_trip();
    test_write_refusals();
    test_broken_files();
    test_many_tensors();
    test_golden(golden);
    rm_tmpdir();
    return check_summary("test_safetensors");
}
