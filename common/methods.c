#include "methods.h"

#include <pthread.h>
#include <string.h>

#include "health.pb.h"
#include "ps.pb.h"

#define PSM(id, name, mut, res) \
    {id, "/ps.ParameterServer/" #name, #name, ps_##name##Request_fields, ps_##name##Response_fields, mut, res}

static const ps_method_desc table[PS_M_COUNT] = {
    PSM(PS_M_FORWARD, Forward, 1, 0),
    PSM(PS_M_BACKWARD, Backward, 1, 0),
    PSM(PS_M_GET_GRADIENTS, GetGradients, 0, 0),
    PSM(PS_M_STEP, Step, 1, 0),
    PSM(PS_M_LIST_PARAMETERS, ListParameters, 0, 0),
    PSM(PS_M_GET_PARAMETERS, GetParameters, 0, 0),
    PSM(PS_M_STATUS, Status, 0, 1),
    PSM(PS_M_PUSH_GRADIENTS, PushGradients, 1, 0),
    PSM(PS_M_REPORT_PARTIAL, ReportPartial, 1, 0),   /* a trainer's report: counters, trainer role */
    {PS_M_HEALTH_CHECK, "/grpc.health.v1.Health/Check", "Health/Check",
     grpc_health_v1_HealthCheckRequest_fields, grpc_health_v1_HealthCheckResponse_fields, 0, 1},
};

/* GetGradients reads a context's gradients: read-only for the weights, but
 * it names a context, so it is not for readers. The health check is for
 * anyone who may connect, readers included. */
static const char *reader_paths[PS_M_COUNT + 1];
static pthread_once_t reader_once = PTHREAD_ONCE_INIT;

static void reader_fill(void) {
    int n = 0;
    for (int i = 0; i < PS_M_COUNT; i++)
        if (!table[i].mutating && table[i].id != PS_M_GET_GRADIENTS)
            reader_paths[n++] = table[i].path;
    reader_paths[n] = NULL;
}

const ps_method_desc *ps_methods(void) { return table; }

const ps_method_desc *ps_method(ps_method_id id) {
    return (unsigned)id < PS_M_COUNT ? &table[id] : NULL;
}

const ps_method_desc *ps_method_by_path(const char *path) {
    for (int i = 0; i < PS_M_COUNT; i++)
        if (path && !strcmp(table[i].path, path)) return &table[i];
    return NULL;
}

const char *const *ps_method_reader_paths(void) {
    pthread_once(&reader_once, reader_fill);
    return reader_paths;
}
