/* hash.h - the house's one string hash: 64-bit FNV-1a, for hash tables
 * (the LM corpus's words, the ONNX importer's values) and keys (the rpc
 * layer's connections). Not for anything an attacker must not collide. */
#ifndef PS_HASH_H
#define PS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a of n bytes at p. */
uint64_t ps_hash_bytes(const void *p, size_t n);
/* FNV-1a of the NUL-terminated s (its bytes without the NUL). */
uint64_t ps_hash_str(const char *s);

#endif
