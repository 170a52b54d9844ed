/* textbuf.c - growing text buffer with JSON helpers (textbuf.h). */
#include "textbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int grow(ps_textbuf *b, size_t need) {
    if (b->oom) return 0;
    if (b->len + need < b->cap) return 1;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap <= b->len + need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void ps_textbuf_printf(ps_textbuf *b, const char *fmt, ...) {
    if (!grow(b, 64)) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        if (!grow(b, (size_t)n + 1)) return;
    }
}

void ps_textbuf_json_str(ps_textbuf *b, const char *s) {
    if (!grow(b, strlen(s) * 6 + 3)) return;
    char *o = b->p + b->len;
    *o++ = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *o++ = '\\';
            *o++ = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            o += sprintf(o, "\\u%04x", *c);
        } else {
            *o++ = (char)*c;
        }
    }
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

void ps_textbuf_json_num(ps_textbuf *b, double v) {
    if (!isfinite(v)) ps_textbuf_printf(b, "null");
    else if (v == (double)(long long)v && fabs(v) < 1e15) ps_textbuf_printf(b, "%lld", (long long)v);
    else ps_textbuf_printf(b, "%.15g", v);
}

char *ps_textbuf_take(ps_textbuf *b, size_t *len) {
    char *p = NULL;
    if (!b->oom && grow(b, 1)) {
        b->p[b->len] = '\0';
        p = b->p;
        if (len) *len = b->len;
    } else {
        free(b->p);
    }
    *b = (ps_textbuf){0};
    return p;
}
