/* onnx.h - reading an ONNX model (a ModelProto) with nanopb.
 *
 * The schema is Debian libonnx-dev's onnx.proto; the build generates its
 * nanopb descriptors (build/proto/onnx.pb.{c,h}, proto/onnx.options: every
 * variable-sized field is a callback, so nothing is bounded by a static
 * size and the recursive TypeProto and subgraph fields are skipped, never
 * followed).
 *
 * ps_onnx_parse reads a whole serialised ModelProto from memory - a file is
 * mapped, not read (ps_onnx_map_file) - into a ps_onnx_model: the opsets,
 * the main graph's inputs, outputs, initializers and nodes with their
 * attributes. Tensor values are not copied: an initializer's raw_data is a
 * pointer into the buffer (its pages are touched only when the weights are
 * loaded), and the typed fields (float_data, int64_data, ...) of small
 * tensors (Constant nodes, test data) are decoded into the model's arena.
 * So the buffer must outlive the model.
 *
 * Everything a file can get wrong is a PS_ERR_FORMAT or
 * PS_ERR_INVALID_ARGUMENT naming it (the node, the tensor, the byte offset
 * for malformed protobuf), never a crash: dimensions are bounded
 * (PS_ONNX_MAX_DIMS, sizes that overflow), a tensor's data must match its
 * dims and type, external data (data_location EXTERNAL) and sparse
 * initializers are refused, counts and name lengths are bounded.
 *
 * A ps_onnx_model owns its memory; ps_onnx_free(NULL) is a no-op.
 */
#ifndef PS_NN_ONNX_H
#define PS_NN_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PS_ONNX_MAX_DIMS 8

/* TensorProto.DataType values psd reads. */
enum {
    PS_ONNX_FLOAT = 1, PS_ONNX_UINT8 = 2, PS_ONNX_INT8 = 3, PS_ONNX_UINT16 = 4, PS_ONNX_INT16 = 5,
    PS_ONNX_INT32 = 6, PS_ONNX_INT64 = 7, PS_ONNX_STRING = 8, PS_ONNX_BOOL = 9, PS_ONNX_FLOAT16 = 10,
    PS_ONNX_DOUBLE = 11, PS_ONNX_UINT32 = 12, PS_ONNX_UINT64 = 13,
};

/* AttributeProto.AttributeType values. */
enum {
    PS_ONNX_ATTR_FLOAT = 1, PS_ONNX_ATTR_INT = 2, PS_ONNX_ATTR_STRING = 3, PS_ONNX_ATTR_TENSOR = 4,
    PS_ONNX_ATTR_GRAPH = 5, PS_ONNX_ATTR_FLOATS = 6, PS_ONNX_ATTR_INTS = 7, PS_ONNX_ATTR_STRINGS = 8,
};

typedef struct ps_onnx_tensor {
    const char *name;           /* "" when unnamed (a Constant's value) */
    int32_t dtype;              /* PS_ONNX_FLOAT, ... (0: not given) */
    int ndim;
    int64_t dims[PS_ONNX_MAX_DIMS];
    int64_t numel;              /* product of dims (1 for a scalar) */
    const uint8_t *raw;         /* raw_data: numel elements, little-endian, in the parsed buffer; or NULL */
    const void *typed;          /* float_data (float), int32_data (int32_t), int64_data (int64_t),
                                   double_data (double), uint64_data (uint64_t): numel decoded values in
                                   the arena; or NULL */
} ps_onnx_tensor;

typedef struct ps_onnx_attr {
    const char *name;
    int type;                   /* PS_ONNX_ATTR_* (0: not given; inferred from the field set) */
    float f;
    int64_t i;
    const char *s;              /* STRING: NUL-terminated copy */
    const ps_onnx_tensor *t;    /* TENSOR */
    int nfloats;
    const float *floats;
    int nints;
    const int64_t *ints;
    int nstrings;
} ps_onnx_attr;

typedef struct ps_onnx_node {
    const char *name;           /* "" when unnamed */
    const char *op_type;
    const char *domain;         /* "" or "ai.onnx": the default domain */
    int nin, nout;
    const char *const *in;      /* "" for an omitted optional input */
    const char *const *out;
    int nattr;
    const ps_onnx_attr *attrs;
} ps_onnx_node;

/* A graph input or output (ValueInfoProto) with its tensor type. */
typedef struct ps_onnx_value {
    const char *name;
    int32_t elem_type;          /* 0 when not a tensor or not given */
    int has_shape;
    int ndim;
    int64_t dims[PS_ONNX_MAX_DIMS];      /* -1 where the dimension is symbolic or not given */
    const char *dim_param[PS_ONNX_MAX_DIMS]; /* its symbol, or NULL */
} ps_onnx_value;

typedef struct ps_onnx_opset {
    const char *domain;
    int64_t version;
} ps_onnx_opset;

typedef struct ps_onnx_model {
    int64_t ir_version;
    int64_t opset;              /* version of the default domain ("" / "ai.onnx"); 0 if not imported */
    int nopsets;
    const ps_onnx_opset *opsets;
    const char *producer;       /* producer_name producer_version */
    const char *graph_name;
    int nnodes;
    const ps_onnx_node *nodes;
    int ninits;
    const ps_onnx_tensor *inits;
    int ninputs;                /* every graph input, initializers included (IR < 4 lists them) */
    const ps_onnx_value *inputs;
    int noutputs;
    const ps_onnx_value *outputs;
    struct ps_arena *arena;
} ps_onnx_model;

/* Limits: larger is refused as an absurd file. */
#define PS_ONNX_MAX_NODES (1 << 20)
#define PS_ONNX_MAX_NAME 4096
#define PS_ONNX_MAX_LIST (1 << 16)      /* inputs/outputs of a node, attributes, ints of an attribute */
#define PS_ONNX_MAX_TYPED (1 << 24)     /* values in a typed (non-raw) tensor field */
#define PS_ONNX_MAX_NUMEL ((int64_t)1 << 40)

/* Parse a serialised ModelProto (len bytes at buf, which must outlive the
 * model). label names it in errors ("model.onnx: ..."). */
ps_onnx_model *ps_onnx_parse(const void *buf, size_t len, const char *label, ps_err *err);
void ps_onnx_free(ps_onnx_model *m);

/* A serialised TensorProto on its own (the backend tests' input_0.pb). The
 * returned tensor lives in *arena_out's memory: free with ps_onnx_free_tensor. */
ps_onnx_tensor *ps_onnx_parse_tensor(const void *buf, size_t len, const char *label, ps_err *err);
void ps_onnx_free_tensor(ps_onnx_tensor *t);

/* A file mapped read-only (PS_ERR_NOT_FOUND / PS_ERR_IO naming it);
 * ps_onnx_unmap(NULL) is a no-op. */
typedef struct ps_onnx_file {
    const void *data;
    size_t len;
} ps_onnx_file;
ps_onnx_file *ps_onnx_map_file(const char *path, ps_err *err);
void ps_onnx_unmap(ps_onnx_file *f);

/* Bytes per element of dtype; 0 for types psd cannot read (string, complex). */
size_t ps_onnx_dtype_size(int32_t dtype);
const char *ps_onnx_dtype_name(int32_t dtype);

/* Tensor t's values as float32 (from float, double, float16, or integer
 * types) / as int64 (from integer types), n = t->numel of them into dst.
 * PS_ERR_INVALID_ARGUMENT naming the tensor when its type cannot be read so. */
ps_status ps_onnx_tensor_floats(const ps_onnx_tensor *t, float *dst, ps_err *err);
ps_status ps_onnx_tensor_int64s(const ps_onnx_tensor *t, int64_t *dst, ps_err *err);

/* The attribute of node n with that name, or NULL. */
const ps_onnx_attr *ps_onnx_attr_find(const ps_onnx_node *n, const char *name);

#endif
