/* lm_corpus.c - word_language_model's corpus (lm_corpus.h). */
#include "lm_corpus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"

struct ps_lm_corpus {
    char **words;          /* (nwords) each malloc'd, NUL-terminated */
    int64_t nwords, cap;
    int64_t *slots;        /* (nslots) open addressing: id + 1, 0 = empty */
    size_t nslots;
    int64_t *tok[3];       /* train, valid, test ids */
    size_t ntok[3], captok[3];
    int64_t *counts;       /* (nwords) occurrences in train.txt */
    int64_t eos, unk;
};

/* Slot of word s[0..n) : either holding it or the empty slot where it goes. */
static size_t find_slot(const ps_lm_corpus *c, const char *s, size_t n) {
    size_t mask = c->nslots - 1, i = (size_t)ps_hash_bytes(s, n) & mask;
    while (c->slots[i]) {
        const char *w = c->words[c->slots[i] - 1];
        if (!strncmp(w, s, n) && w[n] == '\0') return i;
        i = (i + 1) & mask;
    }
    return i;
}

static int64_t lookup(const ps_lm_corpus *c, const char *s, size_t n) {
    size_t i = find_slot(c, s, n);
    return c->slots[i] ? c->slots[i] - 1 : -1;
}

/* Grow the table to twice its size (keeps load <= 1/2). 0 on success. */
static int rehash(ps_lm_corpus *c) {
    size_t n = c->nslots ? c->nslots * 2 : 1024;
    int64_t *old = c->slots;
    size_t oldn = c->nslots;
    c->slots = calloc(n, sizeof *c->slots);
    if (!c->slots) { c->slots = old; return -1; }
    c->nslots = n;
    for (size_t i = 0; i < oldn; i++)
        if (old[i]) {
            const char *w = c->words[old[i] - 1];
            c->slots[find_slot(c, w, strlen(w))] = old[i];
        }
    free(old);
    return 0;
}

/* Id of s[0..n), added when absent. -1 when out of memory. */
static int64_t add_word(ps_lm_corpus *c, const char *s, size_t n) {
    if ((size_t)(c->nwords + 1) * 2 > c->nslots && rehash(c)) return -1;
    size_t slot = find_slot(c, s, n);
    if (c->slots[slot]) return c->slots[slot] - 1;
    if (c->nwords == c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 1024;
        char **w = realloc(c->words, (size_t)cap * sizeof *w);
        int64_t *k = realloc(c->counts, (size_t)cap * sizeof *k);
        if (w) c->words = w;
        if (k) c->counts = k;
        if (!w || !k) return -1;
        c->cap = cap;
    }
    char *w = malloc(n + 1);
    if (!w) return -1;
    memcpy(w, s, n);
    w[n] = '\0';
    c->words[c->nwords] = w;
    c->counts[c->nwords] = 0;
    c->slots[slot] = c->nwords + 1;
    return c->nwords++;
}

static int push_tok(ps_lm_corpus *c, int which, int64_t id) {
    if (c->ntok[which] == c->captok[which]) {
        size_t cap = c->captok[which] ? c->captok[which] * 2 : 65536;
        int64_t *t = realloc(c->tok[which], cap * sizeof *t);
        if (!t) return -1;
        c->tok[which] = t;
        c->captok[which] = cap;
    }
    c->tok[which][c->ntok[which]++] = id;
    return 0;
}

/* Length of the UTF-8 sequence at s (at most n bytes), 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char b = s[0];
    size_t len;
    uint32_t cp;
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) { len = 2; cp = b & 0x1f; }
    else if (b >= 0xe0 && b <= 0xef) { len = 3; cp = b & 0x0f; }
    else if (b >= 0xf0 && b <= 0xf4) { len = 4; cp = b & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

/* A corpus file: a regular file (not a FIFO that may never end or block,
 * not /dev/zero) of at most PS_LM_FILE_MAX bytes, read whole. */
static ps_status read_file(const char *path, char **buf, size_t *len, ps_err *err) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s%s", path,
                          strerror(errno), errno == ENOENT ? " (a corpus directory holds train.txt, valid.txt, test.txt)" : "");
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ps_err_set(err, PS_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: not a regular file (a %s); a corpus file is a text file", path,
                          S_ISDIR(sb.st_mode) ? "directory" : S_ISFIFO(sb.st_mode) ? "FIFO"
                          : S_ISCHR(sb.st_mode) ? "character device" : S_ISSOCK(sb.st_mode) ? "socket"
                                                                         : "block device or other special file");
    }
    if (sb.st_size > PS_LM_FILE_MAX) {
        close(fd);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: %lld bytes; a corpus file is at most %lld bytes (PS_LM_FILE_MAX): "
                          "split the corpus", path, (long long)sb.st_size, (long long)PS_LM_FILE_MAX);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory opening it", path);
    }
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap);
    int big = 0;
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        if (n > (size_t)PS_LM_FILE_MAX) { big = 1; break; }  /* it grew while read */
        char *nb = realloc(b, cap * 2);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (big) {
        free(b);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: more than %lld bytes (it grew while read); a corpus file is at most "
                          "%lld bytes", path, (long long)PS_LM_FILE_MAX, (long long)PS_LM_FILE_MAX);
    }
    if (!b) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory reading it", path);
    if (bad) { free(b); return ps_err_set(err, PS_ERR_IO, "%s: read error", path); }
    *buf = b;
    *len = n;
    return PS_OK;
}

/* Tokenize one file into split `which`; train adds words, the others map
 * unknown words to <unk> (c->unk, set before they are read). */
static ps_status tokenize(ps_lm_corpus *c, const char *path, int which, ps_err *err) {
    char *buf = NULL;
    size_t len = 0;
    ps_status st = read_file(path, &buf, &len, err);
    if (st) return st;
    long line = 1;
    size_t i = 0, words = 0;
    while (i < len) {
        /* one line: [i, e) */
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        size_t j = i;
        while (j < e) {
            unsigned char ch = (unsigned char)buf[j];
            if (ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v') { j++; continue; }
            size_t w = j;
            while (j < e) {
                ch = (unsigned char)buf[j];
                if (ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v') break;
                if (ch == 0) {
                    st = ps_err_set(err, PS_ERR_FORMAT, "%s:%ld: NUL byte at offset %zu: not a text file", path, line, j);
                    goto out;
                }
                size_t u = utf8_len((const unsigned char *)buf + j, e - j);
                if (!u) {
                    st = ps_err_set(err, PS_ERR_FORMAT, "%s:%ld: byte 0x%02x at offset %zu is not UTF-8", path, line,
                                    ch, j);
                    goto out;
                }
                j += u;
            }
            if (j - w > PS_LM_WORD_MAX) {
                st = ps_err_set(err, PS_ERR_FORMAT, "%s:%ld: a word of %zu bytes (at most %d): \"%.40s...\"", path, line,
                                j - w, PS_LM_WORD_MAX, buf + w);
                goto out;
            }
            int64_t id = which == PS_LM_TRAIN ? add_word(c, buf + w, j - w) : lookup(c, buf + w, j - w);
            if (which != PS_LM_TRAIN && id < 0) id = c->unk;
            if (id < 0 || push_tok(c, which, id)) goto oom;
            if (which == PS_LM_TRAIN) c->counts[id]++;
            words++;
        }
        int64_t eos = which == PS_LM_TRAIN ? add_word(c, "<eos>", 5) : c->eos;
        if (eos < 0 || push_tok(c, which, eos)) goto oom;
        if (which == PS_LM_TRAIN) c->counts[eos]++, c->eos = eos;
        line++;
        i = e + 1;
    }
    if (which == PS_LM_TRAIN && !words)
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: no words (%ld lines): an empty training file", path, line - 1);
    else if (!c->ntok[which])
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: empty file", path);
    goto out;
oom:
    st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s:%ld: out of memory", path, line);
out:
    free(buf);
    return st;
}

ps_status ps_lm_corpus_load(const char *dir, ps_lm_corpus **out, ps_err *err) {
    static const char *const files[3] = {"train.txt", "valid.txt", "test.txt"};
    *out = NULL;
    ps_lm_corpus *c = calloc(1, sizeof *c);
    if (!c) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    c->eos = c->unk = -1;
    ps_status st = PS_OK;
    char path[4096];
    for (int k = 0; k < 3 && !st; k++) {
        if (snprintf(path, sizeof path, "%s/%s", dir, files[k]) >= (int)sizeof path) {
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "corpus directory name too long: %.64s...", dir);
            break;
        }
        st = tokenize(c, path, k, err);
        if (!st && k == PS_LM_TRAIN) {
            c->unk = add_word(c, "<unk>", 5);
            if (c->unk < 0) st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    if (st) { ps_lm_corpus_free(c); return st; }
    *out = c;
    return PS_OK;
}

void ps_lm_corpus_free(ps_lm_corpus *c) {
    if (!c) return;
    for (int64_t i = 0; i < c->nwords; i++) free(c->words[i]);
    free(c->words);
    free(c->counts);
    free(c->slots);
    for (int k = 0; k < 3; k++) free(c->tok[k]);
    free(c);
}

int64_t ps_lm_vocab_size(const ps_lm_corpus *c) { return c->nwords; }
int64_t ps_lm_word_id(const ps_lm_corpus *c, const char *word) { return lookup(c, word, strlen(word)); }
const char *ps_lm_word(const ps_lm_corpus *c, int64_t id) {
    return id >= 0 && id < c->nwords ? c->words[id] : NULL;
}
int64_t ps_lm_eos_id(const ps_lm_corpus *c) { return c->eos; }
int64_t ps_lm_unk_id(const ps_lm_corpus *c) { return c->unk; }

const int64_t *ps_lm_tokens(const ps_lm_corpus *c, int which, size_t *n) {
    PS_ASSERT(which >= 0 && which < 3);
    *n = c->ntok[which];
    return c->tok[which];
}

const int64_t *ps_lm_train_counts(const ps_lm_corpus *c) { return c->counts; }

int64_t *ps_lm_batchify(const int64_t *ids, size_t n, int bsz, size_t *nrows) {
    if (bsz <= 0 || n < (size_t)bsz) return NULL;
    size_t rows = n / (size_t)bsz;
    int64_t *m = malloc(rows * (size_t)bsz * sizeof *m);
    if (!m) return NULL;
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < bsz; j++) m[r * (size_t)bsz + (size_t)j] = ids[(size_t)j * rows + r];
    *nrows = rows;
    return m;
}
