/* ps_client.h - typed client of psd's ParameterServer service.
 *
 * Wraps rpc.h + wire.h: each call encodes the request, performs the RPC with
 * the client's deadline, and decodes the reply. A non-OK gRPC status becomes
 * a ps_status with the server's message, prefixed with the method name, so
 * a trainer can print exactly what the server refused and why.
 * One ps_client per thread (or external locking).
 */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H

#include <stdint.h>

#include "rpc.h"
#include "status.h"
#include "wire.h"

typedef struct ps_client ps_client;

ps_client *ps_client_create(const char *target, int timeout_ms, int max_message_bytes, ps_err *err);
/* With TLS / a token (rpc.h; NULL = plaintext, loopback only). */
ps_client *ps_client_create_secure(const char *target, int timeout_ms, int max_message_bytes,
                                   const ps_rpc_security *sec, ps_err *err);
void ps_client_free(ps_client *c);
const char *ps_client_target(const ps_client *c);

/* x is (n, c, h, w); out receives n*out_size floats (out_cap floats room). */
ps_status ps_client_forward(ps_client *c, uint64_t ctx, uint32_t rank, int train, const float *x,
                            int n, int ch, int h, int w, float *out, int64_t out_cap,
                            int64_t *out_cols, uint64_t *version, ps_err *err);
/* grad is (n, cols). With step != 0 the server also applies the optimizer. */
ps_status ps_client_backward(ps_client *c, uint64_t ctx, const float *grad, int n, int cols, int step,
                             uint64_t *version, ps_err *err);
ps_status ps_client_step(ps_client *c, uint64_t ctx, uint64_t *version, ps_err *err);
/* Gradients of the context, decoded into list (caller frees with
 * ps_wire_tensor_list_free). */
ps_status ps_client_get_gradients(ps_client *c, uint64_t ctx, ps_wire_tensor_list *list, ps_err *err);
ps_status ps_client_list_parameters(ps_client *c, ps_wire_param_list *list, char *model, size_t model_len,
                                    ps_err *err);
ps_status ps_client_get_parameters(ps_client *c, ps_wire_tensor_list *list, uint64_t *version, ps_err *err);
ps_status ps_client_status(ps_client *c, ps_StatusResponse *out, ps_err *err);

#endif
