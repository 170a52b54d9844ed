/* wire.h - nanopb messages <-> gRPC byte buffers, and tensor payloads.
 *
 * Contract:
 *  - ps_wire_decode() reads a received grpc_byte_buffer slice by slice (no
 *    flattening copy) into a nanopb struct; ps_wire_encode() sizes the
 *    message, encodes it into one freshly allocated slice and returns a new
 *    byte buffer that the caller owns (grpc_byte_buffer_destroy, or hand it
 *    to the rpc layer, which takes it).
 *  - Tensor data (ps_Tensor.data) and repeated tensors are nanopb callbacks.
 *    Bind them before encoding/decoding with the functions below. Nothing
 *    here keeps a pointer after encode/decode returns except the decoded
 *    buffers, which belong to the ps_wire_tensor_in / ps_wire_tensor_list
 *    they were decoded into and are released by its _free.
 *  - Tensors are little endian on the wire, float32 unless Tensor.dtype
 *    says INT64; this module requires a little-endian host (checked at
 *    compile time) and copies bytes as is. Decoded data lands in a `float *`
 *    buffer whatever the dtype: cast it to int64_t * for INT64 (the buffer
 *    is 64-byte aligned).
 *  - Errors: anything a peer can cause returns a status and a message in err
 *    that names what was wrong (INVALID_ARGUMENT for malformed protobuf or
 *    shapes that disagree with the data, RESOURCE_EXHAUSTED for payloads
 *    over the caller's limit or failed allocations). Never aborts on input.
 *
 * Typical server-side decode of a ForwardRequest:
 *
 *     ps_ForwardRequest req = ps_ForwardRequest_init_zero;
 *     ps_wire_tensor_in in;
 *     ps_wire_tensor_in_init(&in, max_bytes);
 *     in.err = &err;                      // precise message on refusal
 *     ps_wire_tensor_decode_bind(&req.input, &in);
 *     if (ps_wire_decode(request, ps_ForwardRequest_fields, &req, &err) ||
 *         ps_wire_tensor_check(&req.input, &in, "ForwardRequest.input", &err))
 *         -> reply with ps_grpc_from_status(err.code), err.msg
 *     ... use in.data (in.bytes bytes, 64-byte aligned) ...
 *     ps_wire_tensor_in_free(&in);        // always, also after errors
 *
 * Thread safety: no shared state; each struct is used by one thread.
 */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <pb.h>

#include "ps.pb.h"
#include "status.h"

#define PS_WIRE_MAX_DIMS 4   /* = max_count of Tensor.shape in ps.options */
#define PS_WIRE_NAME_MAX 128 /* = max_size of Tensor.name (incl. NUL) */

/* ---- whole messages ---------------------------------------------------- */

/* Decode bb (NULL = empty message = all defaults) into msg, a struct of the
 * type described by fields (e.g. ps_ForwardRequest_fields). msg should be
 * initialised (…_init_zero) with its callbacks bound beforehand.
 * Malformed input -> PS_ERR_INVALID_ARGUMENT "malformed protobuf: <nanopb error>".
 * When a bound callback refuses (tensor over its limit, ...) and was given
 * this same err, its more precise message and code are kept. */
ps_status ps_wire_decode(const grpc_byte_buffer *bb, const pb_msgdesc_t *fields,
                         void *msg, ps_err *err);

/* Encode msg into a new byte buffer *out (caller owns it). Bound encode
 * callbacks run twice (size pass, then write pass) and must be consistent.
 * On error *out is NULL. */
ps_status ps_wire_encode(const pb_msgdesc_t *fields, const void *msg,
                         grpc_byte_buffer **out, ps_err *err);

/* ---- one tensor, decode side ------------------------------------------- */

typedef struct ps_wire_tensor_in {
    float *data;      /* owned, 64-byte aligned, NULL when no data arrived */
    size_t bytes;     /* bytes in data (a multiple of 4) */
    size_t max_bytes; /* refuse larger payloads before allocating */
    int got;          /* how many times the data field was seen */
    ps_err *err;      /* optional: where the callback explains a refusal;
                         point it at the err given to ps_wire_decode */
} ps_wire_tensor_in;

/* Zero t and set its limit. err starts NULL. */
void ps_wire_tensor_in_init(ps_wire_tensor_in *t, size_t max_bytes);

/* Make decoding msg (usually &req.input) put Tensor.data into t: allocates
 * exactly the field's length (refusing > max_bytes or a length that is not a
 * multiple of 4 before allocating) and reads straight into it. A repeated
 * occurrence of the field replaces the previous data (protobuf "last wins"). */
void ps_wire_tensor_decode_bind(ps_Tensor *msg, ps_wire_tensor_in *t);

/* Bytes per element of a wire dtype (ps_DType value); 0 when unknown. */
size_t ps_wire_dtype_size(int dtype);
/* "float32", "int64"; "unknown" otherwise. */
const char *ps_wire_dtype_name(int dtype);

/* Validate a decoded tensor: a known dtype, 1..4 dims, every dim >= 1,
 * element count computed with overflow checks, count * dtype size == bytes
 * received. `what` names the field in messages ("ForwardRequest.input").
 * PS_ERR_INVALID_ARGUMENT on mismatch, with both sizes in the message. */
ps_status ps_wire_tensor_check(const ps_Tensor *msg, const ps_wire_tensor_in *t,
                               const char *what, ps_err *err);

/* Release t->data; t can be reused after ps_wire_tensor_in_init. A buffer
 * of 64 KiB - 16 MiB is kept (up to 8 and 32 MiB in all, process-wide, the
 * oldest dropped first) for the next decode of the same padded size
 * (PS_WIRE_RECYCLE=0: freed at once). data taken over by the caller (set
 * to NULL here) may be free()d by it as usual. */
void ps_wire_tensor_in_free(ps_wire_tensor_in *t);
/* Bytes the recycled buffers above hold now. */
size_t ps_wire_recycled_bytes(void);

/* Element count of a shape: 1..4 dims, each >= 1, no overflow, and
 * count*4 fits in size_t. Returns PS_OK and *count, or INVALID_ARGUMENT
 * naming `what`. Shared by the checks above and usable by handlers. */
ps_status ps_wire_shape_count(const int64_t *dims, int ndim, const char *what,
                              size_t *count, ps_err *err);

/* ---- one tensor, encode side ------------------------------------------- */

/* Fill msg's name (NULL = "") and shape and bind an encode callback that
 * writes prod(dims)*4 bytes from data. name, dims and data are internal
 * values: ndim outside 1..4 or a name over 127 bytes is a bug (PS_ASSERT).
 * data must stay alive until ps_wire_encode returns; name and dims are
 * copied. For a ps_Tensor inside a message also set has_<field> = true. */
void ps_wire_tensor_encode_bind(ps_Tensor *msg, const char *name, int ndim,
                                const int64_t *dims, const float *data);

/* Same for a tensor of any wire dtype (ps_DType value): data holds
 * prod(dims) elements of it. */
void ps_wire_tensor_encode_bind_typed(ps_Tensor *msg, const char *name, int ndim,
                                      const int64_t *dims, const void *data, int dtype);

/* ---- repeated tensors / parameter infos, encode side ------------------- */

typedef struct ps_wire_named {
    const char *name;   /* "fc1.weight" */
    int ndim;           /* 1..4; 0: a scalar (a buffer such as num_batches_tracked) */
    int64_t dims[PS_WIRE_MAX_DIMS];
    const void *data;   /* prod(dims) elements of dtype; unused for parameter infos */
    const char *device; /* "cpu", ...; only for parameter infos (NULL = "") */
    const char *stage;  /* "conv", "fc"; only for parameter infos (NULL = "") */
    int dtype;          /* ps_DType value of data; 0 = float32 */
    int sparse;         /* parameter infos: row-sparse updates */
    int64_t row_offset; /* parameter infos: a shard's first global row ... */
    int64_t rows_total; /* ... of this many (0 = not a shard) */
    int buffer;         /* parameter infos: a buffer (not trained), of dtype */
} ps_wire_named;

typedef struct ps_wire_named_list {
    const ps_wire_named *items;
    size_t n;
} ps_wire_named_list;

/* Encode every item of list as a Tensor in the repeated field cb
 * (&resp.gradients of GetGradientsResponse, &resp.parameters of
 * GetParametersResponse). list and everything it points to must stay alive
 * until ps_wire_encode returns. */
void ps_wire_tensors_encode_bind(pb_callback_t *cb, const ps_wire_named_list *list);

/* Same for ParameterInfo (&resp.parameters of ListParametersResponse): name,
 * shape, device, stage; data is ignored. */
void ps_wire_params_encode_bind(pb_callback_t *cb, const ps_wire_named_list *list);

/* ---- repeated tensors / parameter infos, decode side (clients) --------- */

typedef struct ps_wire_tensor {
    char name[PS_WIRE_NAME_MAX];
    int ndim;
    int64_t dims[PS_WIRE_MAX_DIMS];
    int dtype;          /* ps_DType value */
    float *data;        /* owned, 64-byte aligned; NULL only if bytes == 0;
                           int64 elements when dtype is INT64 */
    size_t bytes;       /* = prod(dims) * dtype size, checked */
} ps_wire_tensor;

typedef struct ps_wire_tensor_list {
    ps_wire_tensor *items; /* owned */
    size_t n, cap;
    size_t max_total_bytes; /* data plus bookkeeping, refused beyond this */
    size_t total_bytes;
    ps_err *err;            /* optional, as in ps_wire_tensor_in */
} ps_wire_tensor_list;

void ps_wire_tensor_list_init(ps_wire_tensor_list *l, size_t max_total_bytes);
/* Decode each Tensor of the repeated field cb into l; each one is checked
 * as ps_wire_tensor_check does. */
void ps_wire_tensors_decode_bind(pb_callback_t *cb, ps_wire_tensor_list *l);
void ps_wire_tensor_list_free(ps_wire_tensor_list *l);

typedef struct ps_wire_param_list {
    ps_ParameterInfo *items; /* owned */
    size_t n, cap;
    size_t max_items;
    ps_err *err;             /* optional */
} ps_wire_param_list;

void ps_wire_param_list_init(ps_wire_param_list *l, size_t max_items);
void ps_wire_params_decode_bind(pb_callback_t *cb, ps_wire_param_list *l);
void ps_wire_param_list_free(ps_wire_param_list *l);

#endif
