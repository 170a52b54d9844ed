/* methods.c - the ps_method_desc rows made from PS_METHODS (methods.h),
 * and the lookups the client, the server and the security module use. */
#include "methods.h"

#include <pthread.h>
#include <string.h>

static const ps_method_desc table[PS_M_COUNT] = {
#define PS_METHOD_ROW(ID, Fn, name, path, Req, Resp, flags) \
    {PS_M_##ID, path, name, Req##_fields, Resp##_fields, sizeof(Req), sizeof(Resp), flags},
    PS_METHODS(PS_METHOD_ROW)
#undef PS_METHOD_ROW
};

static const char *reader_paths[PS_M_COUNT + 1];
static pthread_once_t reader_once = PTHREAD_ONCE_INIT;

static void reader_fill(void) {
    int n = 0;
    for (int i = 0; i < PS_M_COUNT; i++)
        if (table[i].flags & PS_MF_READER) reader_paths[n++] = table[i].path;
    reader_paths[n] = NULL;
}

const ps_method_desc *ps_method(ps_method_id id) {
    return (unsigned)id < PS_M_COUNT ? &table[id] : NULL;
}

const char *const *ps_method_reader_paths(void) {
    pthread_once(&reader_once, reader_fill);
    return reader_paths;
}
