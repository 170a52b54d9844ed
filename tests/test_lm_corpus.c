/* test_lm_corpus - the word_language_model corpus loader (lm_corpus.h):
 * tokens, <eos>, vocabulary from train.txt, <unk> for the rest, batchify as
 * the example, and a clear error for each kind of bad file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "hash.h"
#include "lm_corpus.h"

static char g_dir[64];

static void put(const char *name, const char *data, size_t n) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) { perror(p); exit(2); }
    fwrite(data, 1, n, f);
    fclose(f);
}
#define PUT(name, lit) put(name, lit, sizeof(lit) - 1)

/* Loads g_dir expecting failure with `code` and a message containing each of want1, want2. */
static void expect_error(const char *what, ps_status code, const char *want1, const char *want2) {
    ps_lm_corpus *c = (ps_lm_corpus *)1;
    ps_err err = {0};
    ps_status st = ps_lm_corpus_load(g_dir, &c, &err);
    CHECK_MSG(st == code, "%s: status %s, want %s (%s)", what, ps_status_name(st), ps_status_name(code), err.msg);
    CHECK(c == NULL);
    CHECK_MSG(strstr(err.msg, want1) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err.msg, want1);
    if (want2) CHECK_MSG(strstr(err.msg, want2) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err.msg, want2);
    printf("%s -> %s\n", what, err.msg);
}

static void test_good(void) {
    PUT("train.txt", " the cat sat \n\nthe  dog\tsat on the mat\n");
    PUT("valid.txt", "the bird sat\n");
    PUT("test.txt", "a <unk> cat\r\nmat"); /* CRLF, no final newline */
    ps_lm_corpus *c = NULL;
    ps_err err = {0};
    CHECK_MSG(ps_lm_corpus_load(g_dir, &c, &err) == PS_OK, "%s", err.msg);
    if (!c) return;
    /* first appearance: the cat sat <eos> dog on mat, then <unk> */
    const char *vocab[] = {"the", "cat", "sat", "<eos>", "dog", "on", "mat", "<unk>"};
    CHECK(ps_lm_vocab_size(c) == 8);
    for (int i = 0; i < 8; i++) {
        CHECK_MSG(ps_lm_word(c, i) && !strcmp(ps_lm_word(c, i), vocab[i]), "id %d is %s", i, ps_lm_word(c, i));
        CHECK(ps_lm_word_id(c, vocab[i]) == i);
    }
    CHECK(ps_lm_word_id(c, "bird") == -1);
    CHECK(ps_lm_word(c, 8) == NULL);
    CHECK(ps_lm_eos_id(c) == 3 && ps_lm_unk_id(c) == 7);
    size_t n;
    const int64_t *t = ps_lm_tokens(c, PS_LM_TRAIN, &n);
    const int64_t want_train[] = {0, 1, 2, 3, 3, 0, 4, 2, 5, 0, 6, 3};
    CHECK(n == 12);
    CHECK(n == 12 && !memcmp(t, want_train, sizeof want_train));
    const int64_t *k = ps_lm_train_counts(c);
    CHECK(k[0] == 3 && k[2] == 2 && k[3] == 3 && k[7] == 0);
    t = ps_lm_tokens(c, PS_LM_VALID, &n);
    const int64_t want_valid[] = {0, 7, 2, 3};
    CHECK(n == 4 && !memcmp(t, want_valid, sizeof want_valid));
    t = ps_lm_tokens(c, PS_LM_TEST, &n);
    const int64_t want_test[] = {7, 7, 1, 3, 6, 3};
    CHECK(n == 6 && !memcmp(t, want_test, sizeof want_test));
    ps_lm_corpus_free(c);

    /* a training file that has <unk> keeps its id */
    PUT("train.txt", "x <unk> y\n");
    CHECK(ps_lm_corpus_load(g_dir, &c, &err) == PS_OK);
    if (c) {
        CHECK(ps_lm_unk_id(c) == 1 && ps_lm_vocab_size(c) == 4);
        ps_lm_corpus_free(c);
    }
    ps_lm_corpus_free(NULL);
}

/* batchify: torch's data.narrow(0, 0, nb*bsz).view(bsz, -1).t() */
static void test_batchify(void) {
    int64_t ids[11];
    for (int i = 0; i < 11; i++) ids[i] = 100 + i;
    size_t rows = 0;
    int64_t *m = ps_lm_batchify(ids, 11, 3, &rows);
    CHECK(m && rows == 3);
    /* columns: 100 101 102 | 103 104 105 | 106 107 108 */
    const int64_t want[] = {100, 103, 106, 101, 104, 107, 102, 105, 108};
    CHECK(m && !memcmp(m, want, sizeof want));
    free(m);
    CHECK(ps_lm_batchify(ids, 2, 3, &rows) == NULL);
    CHECK(ps_lm_batchify(ids, 2, 0, &rows) == NULL);
}

static void test_bad(void) {
    char p[128];
    PUT("train.txt", "a b\n");
    PUT("valid.txt", "a\n");
    PUT("test.txt", "b\n");
    snprintf(p, sizeof p, "%s/valid.txt", g_dir);
    unlink(p);
    expect_error("missing valid.txt", PS_ERR_NOT_FOUND, "valid.txt", "train.txt, valid.txt, test.txt");
    PUT("valid.txt", "a\n");
    put("train.txt", "a b\nc\0d\n", 8);
    expect_error("NUL byte", PS_ERR_FORMAT, "train.txt:2", "NUL byte");
    PUT("test.txt", "ok\nok\nbad \xff\xfe word\n");
    PUT("train.txt", "a b\n");
    expect_error("not UTF-8", PS_ERR_FORMAT, "test.txt:3", "0xff");
    PUT("test.txt", "caf\xc3\xa9 \xe2\x80\x94 fine\n"); /* valid UTF-8 passes */
    ps_lm_corpus *c = NULL;
    ps_err err = {0};
    CHECK_MSG(ps_lm_corpus_load(g_dir, &c, &err) == PS_OK, "%s", err.msg);
    ps_lm_corpus_free(c);
    PUT("test.txt", "truncated \xe2\x80\n");
    expect_error("truncated UTF-8", PS_ERR_FORMAT, "test.txt:1", "not UTF-8");
    PUT("test.txt", "b\n");
    char big[PS_LM_WORD_MAX + 8];
    memset(big, 'w', sizeof big - 1);
    big[sizeof big - 1] = '\n';
    put("train.txt", big, sizeof big);
    expect_error("word too long", PS_ERR_FORMAT, "train.txt:1", "bytes (at most 256)");
    PUT("train.txt", "\n  \n\n");
    expect_error("no training words", PS_ERR_FORMAT, "train.txt", "no words");
    PUT("train.txt", "a\n");
    PUT("valid.txt", "");
    expect_error("empty valid.txt", PS_ERR_FORMAT, "valid.txt", "empty");
    snprintf(p, sizeof p, "%s/nonexistent", g_dir);
    c = (ps_lm_corpus *)1;
    CHECK(ps_lm_corpus_load(p, &c, &err) == PS_ERR_NOT_FOUND && c == NULL);
    /* Regular files only, of bounded size: train.txt -> /dev/zero read until
     * memory ran out, a FIFO without a writer hung. Each is refused at once. */
    PUT("valid.txt", "a\n");
    snprintf(p, sizeof p, "%s/train.txt", g_dir);
    unlink(p);
    CHECK(symlink("/dev/zero", p) == 0);
    expect_error("train.txt -> /dev/zero", PS_ERR_FORMAT, "train.txt: not a regular file", "character device");
    unlink(p);
    CHECK(mkfifo(p, 0600) == 0);
    expect_error("train.txt a FIFO", PS_ERR_FORMAT, "train.txt: not a regular file", "FIFO");
    unlink(p);
    CHECK(mkdir(p, 0700) == 0);
    expect_error("train.txt a directory", PS_ERR_FORMAT, "not a regular file", "directory");
    rmdir(p);
    FILE *f = fopen(p, "wb");  /* sparse: no disk used */
    CHECK(f && ftruncate(fileno(f), (off_t)PS_LM_FILE_MAX + 1) == 0);
    if (f) fclose(f);
    expect_error("train.txt past the size cap", PS_ERR_FORMAT, "1073741825 bytes", "at most 1073741824 bytes");
    unlink(p);
    PUT("train.txt", "a\n");
}

/* the corpus's word table hashes with common/hash.h: FNV-1a 64's published
 * test vectors (Fowler, Noll, Vo) */
static void test_hash(void) {
    CHECK(ps_hash_bytes("", 0) == 0xcbf29ce484222325ULL);
    CHECK(ps_hash_str("a") == 0xaf63dc4c8601ec8cULL);
    CHECK(ps_hash_str("foobar") == 0x85944171f73967e8ULL);
    CHECK(ps_hash_bytes("foobar!", 6) == ps_hash_str("foobar"));
}

int main(void) {
    strcpy(g_dir, "/tmp/test_lm_corpus.XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_hash();
    test_good();
    test_batchify();
    test_bad();
    const char *f[] = {"train.txt", "valid.txt", "test.txt"};
    char p[128];
    for (int i = 0; i < 3; i++) { snprintf(p, sizeof p, "%s/%s", g_dir, f[i]); unlink(p); }
    rmdir(g_dir);
    return check_summary("test_lm_corpus");
}
