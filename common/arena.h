/* arena.h - a bump allocator for parsers that build a tree of small
 * objects and free it all at once (model files, ONNX models).
 *
 * Memory comes in chunks of 64 KiB (or one allocation's size when larger);
 * every allocation is zero-filled and aligned for any type (max_align_t),
 * and lives until ps_arena_free. A cap (bytes of chunks in all; 0 = none)
 * bounds what a hostile input can make the arena take: an allocation past
 * it returns NULL, as one that malloc refuses does.
 */
#ifndef PS_ARENA_H
#define PS_ARENA_H

#include <stddef.h>

typedef struct ps_arena ps_arena;

ps_arena *ps_arena_create(size_t cap);   /* NULL when out of memory */
/* n zero-filled bytes (n 0 gives a valid distinct block); NULL when out of
 * memory or past the cap. */
void *ps_arena_alloc(ps_arena *a, size_t n);
/* s[0..n) and a NUL in the arena. */
char *ps_arena_strndup(ps_arena *a, const char *s, size_t n);
void ps_arena_free(ps_arena *a);         /* NULL ok */

#endif
