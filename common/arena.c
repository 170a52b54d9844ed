/* arena.c - the bump allocator of the parsers (see arena.h). */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES 65536
#define ALIGN (_Alignof(max_align_t) > 16 ? _Alignof(max_align_t) : 16)

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct ps_arena {
    chunk *head;
    size_t total, cap;      /* bytes of chunks so far; the cap (0 = none) */
};

ps_arena *ps_arena_create(size_t cap) {
    ps_arena *a = calloc(1, sizeof *a);
    if (a) a->cap = cap;
    return a;
}

void *ps_arena_alloc(ps_arena *a, size_t n) {
    if (n > SIZE_MAX - ALIGN) return NULL;
    n = n ? (n + ALIGN - 1) & ~(size_t)(ALIGN - 1) : ALIGN;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        if (a->cap && (cap > a->cap || a->total > a->cap - cap)) return NULL;
        chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

char *ps_arena_strndup(ps_arena *a, const char *s, size_t n) {
    char *p = ps_arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void ps_arena_free(ps_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}
