/* test_idx.c - IDX loading (raw, gzip, every broken-file case), the MNIST
 * split loader, batching and the seeded shuffle. Broken files are written
 * into a fresh mkdtemp directory at run time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "idx.h"
#include "mnist.h"
#include "support/tmpdir.h"

static char g_dir[] = "/tmp/ps_test_idx_XXXXXX";

static void join(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Header bytes for dtype/ndim/dims (big-endian). Returns its length. */
static size_t make_header(unsigned char *h, int b0, int b1, int dtype, int ndim,
                          const uint32_t *dims) {
    h[0] = (unsigned char)b0; h[1] = (unsigned char)b1;
    h[2] = (unsigned char)dtype; h[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        h[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        h[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        h[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        h[7 + 4 * i] = (unsigned char)dims[i];
    }
    return 4 + 4 * (size_t)ndim;
}

/* Write header + data (+ trailing extra bytes), raw or gzip'ed. */
static void write_file(const char *name, int gzip, int b0, int dtype, int ndim,
                       const uint32_t *dims, const uint8_t *data, size_t n, size_t extra) {
    char path[512];
    join(path, sizeof path, name);
    unsigned char h[4 + 4 * 8];
    size_t hl = make_header(h, b0, 0, dtype, ndim, dims);
    uint8_t *pad = calloc(extra ? extra : 1, 1);
    if (gzip) {
        gzFile gz = gzopen(path, "wb");
        if (!gz) { perror(path); exit(2); }
        gzwrite(gz, h, (unsigned)hl);
        if (n) gzwrite(gz, data, (unsigned)n);
        if (extra) gzwrite(gz, pad, (unsigned)extra);
        gzclose(gz);
    } else {
        FILE *f = fopen(path, "wb");
        if (!f) { perror(path); exit(2); }
        fwrite(h, 1, hl, f);
        if (n) fwrite(data, 1, n, f);
        if (extra) fwrite(pad, 1, extra, f);
        fclose(f);
    }
    free(pad);
}

/* Load name from g_dir and expect failure with code and every needle in
 * the message (the path always among them). */
static void expect_fail(const char *name, ps_status code, const char *n1, const char *n2) {
    char path[512];
    join(path, sizeof path, name);
    ps_idx x;
    ps_err e;
    ps_err_clear(&e);
    ps_status st = ps_idx_load(path, &x, &e);
    CHECK_MSG(st == code, "%s: got %s, want %s (%s)", name, ps_status_name(st),
              ps_status_name(code), e.msg);
    CHECK_MSG(strstr(e.msg, path) != NULL, "%s: message lacks the path: %s", name, e.msg);
    if (n1) CHECK_MSG(strstr(e.msg, n1) != NULL, "%s: message lacks '%s': %s", name, n1, e.msg);
    if (n2) CHECK_MSG(strstr(e.msg, n2) != NULL, "%s: message lacks '%s': %s", name, n2, e.msg);
    CHECK(x.data == NULL && x.size == 0 && x.ndim == 0);
}

static uint8_t g_pix[2 * 3 * 4];

static void test_idx_good(void) {
    for (size_t i = 0; i < sizeof g_pix; i++) g_pix[i] = (uint8_t)(i * 11);
    uint32_t dims[3] = {2, 3, 4};
    write_file("good", 0, 0, 0x08, 3, dims, g_pix, sizeof g_pix, 0);
    write_file("good.gz", 1, 0, 0x08, 3, dims, g_pix, sizeof g_pix, 0);
    const char *names[2] = {"good", "good.gz"};
    for (int k = 0; k < 2; k++) {
        char path[512];
        join(path, sizeof path, names[k]);
        ps_idx x;
        ps_err e;
        ps_err_clear(&e);
        CHECK_MSG(ps_idx_load(path, &x, &e) == PS_OK, "%s", e.msg);
        CHECK(x.ndim == 3);
        CHECK(x.dims[0] == 2 && x.dims[1] == 3 && x.dims[2] == 4 && x.dims[3] == 0);
        CHECK(x.size == 24);
        CHECK(x.data && memcmp(x.data, g_pix, sizeof g_pix) == 0);
        CHECK(x.data && x.data[23] == (uint8_t)(23 * 11));
        ps_idx_free(&x);
        CHECK(x.data == NULL && x.size == 0);
    }
    /* A 1-D file with a dimension above 2^24 in big-endian order: only a
     * correct byte order gives 70000. */
    uint32_t d1[1] = {70000};
    uint8_t *big = malloc(70000);
    for (int i = 0; i < 70000; i++) big[i] = (uint8_t)(i % 7);
    write_file("big1d.gz", 1, 0, 0x08, 1, d1, big, 70000, 0);
    char path[512];
    join(path, sizeof path, "big1d.gz");
    ps_idx x;
    ps_err e;
    CHECK(ps_idx_load(path, &x, &e) == PS_OK);
    CHECK(x.ndim == 1 && x.dims[0] == 70000 && x.size == 70000);
    CHECK(x.data && x.data[69999] == 69999 % 7 && x.data[12345] == 12345 % 7);
    ps_idx_free(&x);
    free(big);
    ps_idx_free(NULL);
}

static void test_idx_bad(void) {
    uint32_t dims[3] = {2, 3, 4};
    write_file("badmagic", 0, 1, 0x08, 3, dims, g_pix, sizeof g_pix, 0);
    expect_fail("badmagic", PS_ERR_FORMAT, "magic is 01 00 08 03", NULL);

    write_file("float32", 0, 0, 0x0D, 3, dims, g_pix, sizeof g_pix, 0);
    expect_fail("float32", PS_ERR_UNIMPLEMENTED, "0x0d", "float32");

    write_file("ndim0", 0, 0, 0x08, 0, dims, g_pix, sizeof g_pix, 0);
    expect_fail("ndim0", PS_ERR_FORMAT, "declares 0 dimensions", "1..4");
    uint32_t d5[5] = {1, 1, 1, 1, 24};
    write_file("ndim5", 0, 0, 0x08, 5, d5, g_pix, sizeof g_pix, 0);
    expect_fail("ndim5", PS_ERR_FORMAT, "declares 5 dimensions", NULL);

    uint32_t dz[3] = {2, 0, 4};
    write_file("zerodim", 0, 0, 0x08, 3, dz, g_pix, 0, 0);
    expect_fail("zerodim", PS_ERR_FORMAT, "dimension 1 is 0", NULL);

    uint32_t dhuge[3] = {65536, 65536, 2};
    write_file("huge", 0, 0, 0x08, 3, dhuge, g_pix, sizeof g_pix, 0);
    expect_fail("huge", PS_ERR_RESOURCE_EXHAUSTED, "refusing", NULL);

    write_file("truncated", 0, 0, 0x08, 3, dims, g_pix, 20, 0);
    expect_fail("truncated", PS_ERR_FORMAT, "2x3x4 need 24 bytes, got 20", NULL);
    write_file("truncated.gz", 1, 0, 0x08, 3, dims, g_pix, 20, 0);
    expect_fail("truncated.gz", PS_ERR_FORMAT, "need 24 bytes, got 20", "(gzip)");

    write_file("trailing", 0, 0, 0x08, 3, dims, g_pix, sizeof g_pix, 3);
    expect_fail("trailing", PS_ERR_FORMAT, "3 trailing bytes", "24 data bytes");
    write_file("trailing.gz", 1, 0, 0x08, 3, dims, g_pix, sizeof g_pix, 1);
    expect_fail("trailing.gz", PS_ERR_FORMAT, "1 trailing bytes", NULL);
    /* Trailing bytes are counted up to 1 MiB, not inflated to the end: a
     * small gzip file can hold gigabytes of zeros. */
    write_file("trailing_big.gz", 1, 0, 0x08, 3, dims, g_pix, sizeof g_pix, (3 << 20) / 2);
    expect_fail("trailing_big.gz", PS_ERR_FORMAT, "more than 1 MiB of trailing bytes", "24 data bytes");

    /* Header cut inside the dimensions, and a file shorter than the magic. */
    char path[512];
    join(path, sizeof path, "shorthdr");
    FILE *f = fopen(path, "wb");
    fwrite("\0\0\x08\x03\0\0\0\x02\0\0", 1, 10, f);
    fclose(f);
    expect_fail("shorthdr", PS_ERR_FORMAT, "expected 12 bytes of dimensions, got 6", NULL);
    join(path, sizeof path, "tiny");
    f = fopen(path, "wb");
    fwrite("\0\0", 1, 2, f);
    fclose(f);
    expect_fail("tiny", PS_ERR_FORMAT, "got 2 bytes", NULL);

    /* A gzip stream cut in the middle: zlib reports it, we pass it on. */
    char gpath[512];
    join(gpath, sizeof gpath, "big1d.gz");
    f = fopen(gpath, "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    join(path, sizeof path, "cutgzip.gz");
    f = fopen(path, "wb");
    fwrite(buf, 1, n / 2, f);
    fclose(f);
    expect_fail("cutgzip.gz", PS_ERR_FORMAT, "(gzip)", NULL);

    expect_fail("does-not-exist", PS_ERR_NOT_FOUND, "cannot open", NULL);
}

/* An MNIST-like directory: 5 images of 4x3, labels as given. */
static void make_split(const char *sub, const char *prefix, int gzip_labels, uint32_t nimg,
                       const uint8_t *labels, uint32_t nlbl, int img_ndim) {
    char d[512];
    join(d, sizeof d, sub);
    if (access(d, F_OK) != 0 && mkdir(d, 0700) != 0) { perror(d); exit(2); }
    uint8_t img[5 * 4 * 3];
    for (size_t i = 0; i < sizeof img; i++) img[i] = (uint8_t)(i * 4);
    img[0] = 0; img[1] = 255; img[2] = 128;
    char name[512];
    uint32_t dims[3] = {nimg, 4, 3};
    uint32_t dims2[2] = {nimg, 12};
    snprintf(name, sizeof name, "%s/%s-images-idx3-ubyte", sub, prefix);
    if (img_ndim == 3) write_file(name, 0, 0, 0x08, 3, dims, img, (size_t)nimg * 12, 0);
    else write_file(name, 0, 0, 0x08, 2, dims2, img, (size_t)nimg * 12, 0);
    snprintf(name, sizeof name, "%s/%s-labels-idx1-ubyte%s", sub, prefix, gzip_labels ? ".gz" : "");
    write_file(name, gzip_labels, 0, 0x08, 1, &nlbl, labels, nlbl, 0);
}

static void expect_mnist_fail(const char *sub, const char *split, ps_status code,
                              const char *n1, const char *n2) {
    char d[512];
    join(d, sizeof d, sub);
    ps_mnist m;
    ps_err e;
    ps_err_clear(&e);
    ps_status st = ps_mnist_load(d, split, &m, &e);
    CHECK_MSG(st == code, "%s/%s: got %s, want %s (%s)", sub, split, ps_status_name(st),
              ps_status_name(code), e.msg);
    if (n1) CHECK_MSG(strstr(e.msg, n1) != NULL, "message lacks '%s': %s", n1, e.msg);
    if (n2) CHECK_MSG(strstr(e.msg, n2) != NULL, "message lacks '%s': %s", n2, e.msg);
    CHECK(m.images == NULL && m.labels == NULL && m.n == 0);
}

static void test_mnist(void) {
    const uint8_t labels[5] = {3, 0, 9, 1, 7};
    make_split("ok", "train", 1, 5, labels, 5, 3);
    char d[512];
    join(d, sizeof d, "ok");
    ps_mnist m;
    ps_err e;
    ps_err_clear(&e);
    CHECK_MSG(ps_mnist_load(d, "train", &m, &e) == PS_OK, "%s", e.msg);
    CHECK(m.n == 5 && m.rows == 4 && m.cols == 3);
    CHECK(m.labels && m.labels[0] == 3 && m.labels[2] == 9 && m.labels[4] == 7);
    CHECK_CLOSE(m.images[0], -0.4242129, 1e-6, 0);  /* (0 - 0.1307) / 0.3081 */
    CHECK_CLOSE(m.images[1], 2.8214867, 1e-6, 0);   /* (1 - 0.1307) / 0.3081 */
    CHECK_CLOSE(m.images[2], 1.2050011, 1e-6, 0);    /* (128/255 - 0.1307) / 0.3081 */
    CHECK_CLOSE(m.images[59], (59 * 4 / 255.0 - 0.1307) / 0.3081, 1e-6, 0);

    uint32_t idx[3] = {4, 0, 2};
    float x[3 * 12];
    int64_t y[3];
    CHECK(ps_mnist_batch(&m, idx, 3, x, y, &e) == PS_OK);
    CHECK(y[0] == 7 && y[1] == 3 && y[2] == 9);
    CHECK(x[0] == m.images[48] && x[11] == m.images[59]);
    CHECK(x[12] == m.images[0] && x[13] == m.images[1] && x[24] == m.images[24]);
    uint32_t badidx[2] = {1, 5};
    CHECK(ps_mnist_batch(&m, badidx, 2, x, y, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e.msg, "index 5 at position 1") != NULL, "%s", e.msg);
    ps_mnist_free(&m);
    CHECK(m.images == NULL && m.n == 0);
    ps_mnist_free(NULL);

    expect_mnist_fail("ok", "test", PS_ERR_NOT_FOUND, "t10k-images-idx3-ubyte.gz", "fetch-mnist");
    expect_mnist_fail("ok", "validation", PS_ERR_INVALID_ARGUMENT, "'validation'", NULL);

    const uint8_t bad_labels[5] = {3, 0, 10, 1, 7};
    make_split("badlabel", "t10k", 0, 5, bad_labels, 5, 3);
    expect_mnist_fail("badlabel", "test", PS_ERR_FORMAT, "label 2 is 10", "t10k-labels-idx1-ubyte");

    make_split("mismatch", "train", 1, 5, labels, 4, 3);
    expect_mnist_fail("mismatch", "train", PS_ERR_FORMAT, "holds 5 images", "holds 4 labels");

    make_split("flat", "train", 0, 5, labels, 5, 2);
    expect_mnist_fail("flat", "train", PS_ERR_FORMAT, "must have 3 dimensions", "has 2");
}

static void test_shuffle(void) {
    uint64_t s = 0;
    CHECK(ps_splitmix64(&s) == 0xe220a8397b1dcdafULL);
    CHECK(ps_splitmix64(&s) == 0x6e789e6aa1b965f4ULL);
    CHECK(ps_splitmix64(&s) == 0x06c45d188009454fULL);
    s = 99;
    CHECK(ps_splitmix64_below(&s, 1) == 0);

    /* Expected permutations from an independent Python implementation. */
    uint32_t a[10];
    ps_iota_u32(a, 10);
    ps_shuffle_u32(a, 10, 42);
    const uint32_t want42[10] = {0, 9, 5, 8, 6, 4, 7, 2, 1, 3};
    CHECK(memcmp(a, want42, sizeof a) == 0);
    ps_iota_u32(a, 10);
    ps_shuffle_u32(a, 10, 0);
    const uint32_t want0[10] = {6, 3, 2, 9, 8, 1, 4, 7, 0, 5};
    CHECK(memcmp(a, want0, sizeof a) == 0);

    /* A permutation, and one that moves things. */
    enum { N = 1000 };
    static uint32_t p[N];
    static int seen[N];
    ps_iota_u32(p, N);
    ps_shuffle_u32(p, N, 7);
    int fixed = 0, ok = 1;
    for (int i = 0; i < N; i++) {
        if (p[i] >= N || seen[p[i]]++) ok = 0;
        else if (p[i] == (uint32_t)i) fixed++;
    }
    CHECK(ok);
    CHECK(fixed < 20);
    ps_shuffle_u32(p, 0, 1); /* no-ops */
    ps_shuffle_u32(p, 1, 1);
    CHECK(ok);
}

/* Real data when it is there: Debian's Fashion-MNIST (gzip, 10000 test
 * images, 1000 per class) and the repository's data/mnist. */
static void test_real_data(void) {
    const char *fm = "/usr/share/datasets/fashion-mnist";
    if (access(fm, F_OK) == 0) {
        ps_mnist m;
        ps_err e;
        CHECK_MSG(ps_mnist_load(fm, "test", &m, &e) == PS_OK, "%s", e.msg);
        CHECK(m.n == 10000 && m.rows == 28 && m.cols == 28);
        int count[10] = {0};
        for (uint32_t i = 0; i < m.n; i++) count[m.labels[i]]++;
        for (int c = 0; c < 10; c++) CHECK(count[c] == 1000);
        ps_mnist_free(&m);
    } else {
        printf("test_idx: note: %s absent, Fashion-MNIST check not run\n", fm);
    }
    if (access("data/mnist/train-images-idx3-ubyte", F_OK) == 0) {
        ps_mnist m;
        ps_err e;
        CHECK_MSG(ps_mnist_load("data/mnist", "train", &m, &e) == PS_OK, "%s", e.msg);
        CHECK(m.n == 8000 && m.rows == 28 && m.cols == 28);
        /* The fixed split of scripts/mnist_json_to_idx.py: g % 5 == 4 is
         * test, classes interleaved round-robin. */
        static const int train_count[10] = {801, 902, 793, 825, 784, 691, 811, 856, 755, 782};
        static const int test_count[10] = {200, 225, 198, 207, 196, 172, 203, 214, 189, 196};
        int count[10] = {0};
        for (uint32_t i = 0; i < m.n; i++) count[m.labels[i]]++;
        CHECK(memcmp(count, train_count, sizeof count) == 0);
        for (int i = 0; i < 20 && m.labels; i++) CHECK(m.labels[i] == i % 10);
        ps_mnist_free(&m);
        CHECK_MSG(ps_mnist_load("data/mnist", "test", &m, &e) == PS_OK, "%s", e.msg);
        CHECK(m.n == 2000 && m.rows == 28 && m.cols == 28);
        memset(count, 0, sizeof count);
        for (uint32_t i = 0; i < m.n; i++) count[m.labels[i]]++;
        CHECK(memcmp(count, test_count, sizeof count) == 0);
        ps_mnist_free(&m);
    } else {
        printf("test_idx: note: data/mnist absent (scripts/fetch-mnist.sh), check not run\n");
    }
}

int main(void) {
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_idx_good();
    test_idx_bad();
    test_mnist();
    test_shuffle();
    test_real_data();
    test_rmtree(g_dir);
    return check_summary("test_idx");
}
