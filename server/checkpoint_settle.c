/* checkpoint_settle.c - the finished contexts' records a checkpoint
 * carries in its metadata psd.settle (checkpoint.h, ctx_table.h): their
 * text, strictly parsed back. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_impl.h"

void ps_ckpt_settle_free(ps_ckpt_settle *s) {
    if (!s) return;
    free(s->rec);
    *s = (ps_ckpt_settle){0};
}

/* "<id, 16 hex>:<version>[s|d]" separated by single spaces, oldest first;
 * NULL when out of memory. */
char *ckpt_settle_encode(const ps_ctx_finished *r, size_t n) {
    size_t cap = n * 40 + 1, o = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%016" PRIx64 ":%" PRIu64 "%s", i ? " " : "", r[i].id,
                              r[i].version, r[i].how == PS_CTX_SKIPPED ? "s" : r[i].how == PS_CTX_DROPPED ? "d" : "");
    return buf;
}

/* Strictly the format above; every version <= max_version, at most
 * PS_CKPT_SETTLE_MAX records. */
ps_status ckpt_settle_decode(const char *path, const char *s, uint64_t max_version, ps_ckpt_settle *out,
                               ps_err *err) {
    size_t n = *s ? 1 : 0;
    for (const char *p = s; *p; p++) n += *p == ' ';
    if (n > PS_CKPT_SETTLE_MAX)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle holds %zu records (at most %d)", path, n,
                          PS_CKPT_SETTLE_MAX);
    ps_ctx_finished *r = n ? malloc(n * sizeof *r) : NULL;
    if (n && !r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory reading psd.settle", path);
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        size_t hex = strspn(p, "0123456789abcdef");
        if (hex != 16 || p[16] != ':' || p[17] < '0' || p[17] > '9') goto bad;
        r[i].id = strtoull(p, NULL, 16);
        errno = 0;
        r[i].version = strtoull(p + 17, &end, 10);
        if (errno || end - (p + 17) > 20 || r[i].version > max_version) goto bad;
        r[i].how = *end == 's' ? PS_CTX_SKIPPED : *end == 'd' ? PS_CTX_DROPPED : PS_CTX_APPLIED;
        if (*end == 's' || *end == 'd') end++;
        if (i + 1 < n ? *end != ' ' : *end != '\0') goto bad;
        p = end + 1;
        continue;
    bad:
        free(r);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle: record %zu is not <16 hex digits>:<version "
                          "<= %" PRIu64 ">[s|d]", path, i, max_version);
    }
    out->rec = r;
    out->n = n;
    return PS_OK;
}
