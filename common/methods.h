/* methods.h - the one table of psd's RPC methods.
 *
 * Every method psd serves is one row: its path, its request and response
 * message descriptors, and what it does to psd's state. The server binds a
 * handler to each row (server/service.c, by id), the security module derives
 * the "reader" role from the read-only rows, the client takes paths and
 * descriptors from here, and the metrics name methods by their short name.
 * Adding an RPC is adding a row here and a handler there.
 */
#ifndef PS_METHODS_H
#define PS_METHODS_H

#include <pb.h>

typedef enum {
    PS_M_FORWARD = 0,
    PS_M_BACKWARD,
    PS_M_GET_GRADIENTS,
    PS_M_STEP,
    PS_M_LIST_PARAMETERS,
    PS_M_GET_PARAMETERS,
    PS_M_STATUS,
    PS_M_PUSH_GRADIENTS,
    PS_M_REPORT_PARTIAL,
    PS_M_HEALTH_CHECK,
    PS_M_COUNT
} ps_method_id;

typedef struct ps_method_desc {
    ps_method_id id;
    const char *path;             /* "/ps.ParameterServer/Forward" */
    const char *name;             /* "Forward" */
    const pb_msgdesc_t *request;  /* nanopb descriptors */
    const pb_msgdesc_t *response;
    int mutating;                 /* 1: changes training state (contexts, weights);
                                     0: read-only, allowed to the "reader" role */
    int reserved;                 /* 1: served by the reserved pool (health, Status):
                                     answered even while every worker is busy */
} ps_method_desc;

/* The table, PS_M_COUNT rows indexed by ps_method_id. */
const ps_method_desc *ps_methods(void);
const ps_method_desc *ps_method(ps_method_id id);
/* Row of a path, or NULL. */
const ps_method_desc *ps_method_by_path(const char *path);
/* NULL-terminated paths of the read-only methods (static storage). */
const char *const *ps_method_reader_paths(void);

#endif
