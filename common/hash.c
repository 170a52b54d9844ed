/* hash.c - 64-bit FNV-1a (hash.h). */
#include "hash.h"

#include <string.h>

uint64_t ps_hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64's offset basis, 14695981039346656037 */
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL; /* its prime */
    return h;
}

uint64_t ps_hash_str(const char *s) { return ps_hash_bytes(s, strlen(s)); }
