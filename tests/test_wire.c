/* test_wire.c - nanopb <-> grpc_byte_buffer glue: round trips of every
 * message, large and many-slice tensors, and refusal of bad input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <pb_encode.h>

#include "check.h"
#include "wire.h"

/* ---- helpers ----------------------------------------------------------- */

static float *make_data(size_t n, uint32_t seed) {
    float *p = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(int32_t)seed / 1e6f;
    }
    return p;
}

static grpc_byte_buffer *encode(const pb_msgdesc_t *f, const void *msg) {
    grpc_byte_buffer *bb = NULL;
    ps_err err;
    ps_status st = ps_wire_encode(f, msg, &bb, &err);
    CHECK_MSG(st == PS_OK && bb, "encode: %s", err.msg);
    return bb;
}

/* Flatten a byte buffer (test only; the library never does this). */
static grpc_slice flat(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return s;
}

/* Re-split a buffer into many odd-sized slices to exercise slice-by-slice
 * reading (received messages arrive that way). */
static grpc_byte_buffer *resplit(grpc_byte_buffer *bb) {
    grpc_slice all = flat(bb);
    size_t len = GRPC_SLICE_LENGTH(all), off = 0, n = 0;
    grpc_slice *sl = malloc(sizeof(grpc_slice) * (len / 3 + 8));
    size_t sizes[] = {1, 7, 3, 64, 1000, 4093, 65536, 200000};
    while (off < len) {
        size_t k = sizes[n % 8];
        if (k > len - off) k = len - off;
        sl[n++] = grpc_slice_from_copied_buffer((const char *)GRPC_SLICE_START_PTR(all) + off, k);
        off += k;
    }
    grpc_byte_buffer *out = grpc_raw_byte_buffer_create(sl, n);
    for (size_t i = 0; i < n; i++) grpc_slice_unref(sl[i]);
    free(sl);
    grpc_slice_unref(all);
    return out;
}

static grpc_byte_buffer *from_bytes(const void *p, size_t n) {
    grpc_slice s = grpc_slice_from_copied_buffer(p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* ---- one-tensor messages ----------------------------------------------- */

static void test_forward_roundtrip(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int split) {
    int64_t dims[4] = {d0, d1, d2, d3};
    size_t n = (size_t)(d0 * d1 * d2 * d3);
    float *data = make_data(n, 42);
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = 0x123456789abcULL;
    req.train = true;
    req.trainer_rank = 3;
    req.has_input = true;
    ps_wire_tensor_encode_bind(&req.input, "input", 4, dims, data);
    grpc_byte_buffer *bb = encode(ps_ForwardRequest_fields, &req);
    if (split) {
        grpc_byte_buffer *b2 = resplit(bb);
        grpc_byte_buffer_destroy(bb);
        bb = b2;
    }

    ps_err err;
    ps_ForwardRequest got = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, 64u << 20);
    in.err = &err;
    ps_wire_tensor_decode_bind(&got.input, &in);
    CHECK(ps_wire_decode(bb, ps_ForwardRequest_fields, &got, &err) == PS_OK);
    CHECK(ps_wire_tensor_check(&got.input, &in, "ForwardRequest.input", &err) == PS_OK);
    CHECK(got.context_id == req.context_id && got.train && got.trainer_rank == 3);
    CHECK(got.has_input && strcmp(got.input.name, "input") == 0);
    CHECK(got.input.shape_count == 4 && got.input.shape[0] == d0 && got.input.shape[3] == d3);
    CHECK(in.bytes == n * 4 && in.got == 1);
    CHECK(in.data && ((uintptr_t)in.data % 64) == 0);
    CHECK(in.data && memcmp(in.data, data, n * 4) == 0);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    free(data);
}

/* Decode one ForwardRequest of n floats (seed) into in (caller frees). */
static void decode_input(ps_wire_tensor_in *in, int64_t d0, int64_t d1, uint32_t seed) {
    int64_t dims[4] = {d0, d1, 1, 1};
    size_t n = (size_t)(d0 * d1);
    float *data = make_data(n, seed);
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.has_input = true;
    ps_wire_tensor_encode_bind(&req.input, "x", 4, dims, data);
    grpc_byte_buffer *one = encode(ps_ForwardRequest_fields, &req), *bb = resplit(one);
    grpc_byte_buffer_destroy(one);
    ps_err err;
    ps_ForwardRequest got = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in_init(in, 64u << 20);
    in->err = &err;
    ps_wire_tensor_decode_bind(&got.input, in);
    CHECK(ps_wire_decode(bb, ps_ForwardRequest_fields, &got, &err) == PS_OK);
    CHECK(in->bytes == n * 4 && in->data && ((uintptr_t)in->data % 64) == 0);
    CHECK(in->data && memcmp(in->data, data, n * 4) == 0);   /* nothing of a recycled buffer's old content */
    in->err = NULL;
    grpc_byte_buffer_destroy(bb);
    free(data);
}

/* Large decoded tensors are recycled: a freed one is the next decode's
 * buffer of the same padded size (and only of that size), holding the new
 * data; small ones are not kept. PS_WIRE_RECYCLE is unset (main). */
static void test_recycled_buffers(void) {
    ps_wire_tensor_in a, b, c;
    decode_input(&a, 64, 784, 1);          /* 200,704 bytes: the small ResNet's batch of 64 */
    float *pa = a.data;
    ps_wire_tensor_in_free(&a);
    CHECK(a.data == NULL && a.bytes == 0);
    void *other = malloc(64 * 784 * 4);    /* without the recycling, malloc would hand out pa here */
    CHECK(other != (void *)pa);
    decode_input(&b, 64, 784, 2);
    CHECK(b.data == pa);                   /* the same buffer again */
    free(other);
    decode_input(&c, 64, 784, 3);          /* another of the same size while b is held: a new one */
    CHECK(c.data != pa);
    ps_wire_tensor_in_free(&c);
    ps_wire_tensor_in_free(&b);
    decode_input(&a, 65, 784, 4);          /* another padded size: not b's (nor c's) */
    CHECK(a.data != pa);
    ps_wire_tensor_in_free(&a);
    decode_input(&a, 64, 784, 5);          /* the newest of that size: b's buffer, freed last */
    CHECK(a.data == pa);
    float *taken = a.data;                 /* taken over by a holder that free()s it: allowed */
    a.data = NULL;
    free(taken);
    ps_wire_tensor_in_free(&a);
    decode_input(&a, 4, 64, 6);            /* 1 KiB: below the recycled sizes */
    float *small = a.data;
    ps_wire_tensor_in_free(&a);
    decode_input(&b, 64, 784, 7);          /* c's buffer or a new one; never the small one */
    CHECK(b.data != small || b.data == NULL);
    ps_wire_tensor_in_free(&b);
    /* more than the list holds: the oldest go, every decode still right */
    ps_wire_tensor_in many[12];
    for (int i = 0; i < 12; i++) decode_input(&many[i], 64, 784, 100 + (uint32_t)i);
    for (int i = 0; i < 12; i++) ps_wire_tensor_in_free(&many[i]);
    for (int i = 0; i < 12; i++) decode_input(&many[i], 64, 784, 200 + (uint32_t)i);
    for (int i = 0; i < 12; i++) ps_wire_tensor_in_free(&many[i]);
    CHECK(ps_wire_recycled_bytes() <= (size_t)8 * 200704);
    /* large ones: no more than 32 MiB kept in all, however many sizes */
    ps_wire_tensor_in big[4];
    for (int i = 0; i < 4; i++) decode_input(&big[i], 1024 + i, 3072, 300 + (uint32_t)i);   /* ~12 MiB each */
    for (int i = 0; i < 4; i++) ps_wire_tensor_in_free(&big[i]);
    size_t kept = ps_wire_recycled_bytes();
    CHECK(kept >= (size_t)12 << 20 && kept <= (size_t)32 << 20);
    decode_input(&big[0], 1027, 3072, 400);   /* the newest size is still there */
    CHECK(ps_wire_recycled_bytes() < kept);
    ps_wire_tensor_in_free(&big[0]);
}

static void test_forward_response_and_backward(void) {
    int64_t dims[2] = {64, 10};
    float *data = make_data(640, 7);
    ps_err err;

    ps_ForwardResponse fr = ps_ForwardResponse_init_zero;
    fr.has_output = true;
    fr.model_version = 99;
    ps_wire_tensor_encode_bind(&fr.output, NULL, 2, dims, data);
    grpc_byte_buffer *bb = encode(ps_ForwardResponse_fields, &fr);
    ps_ForwardResponse fr2 = ps_ForwardResponse_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, 1 << 20);
    ps_wire_tensor_decode_bind(&fr2.output, &in);
    CHECK(ps_wire_decode(bb, ps_ForwardResponse_fields, &fr2, &err) == PS_OK);
    CHECK(ps_wire_tensor_check(&fr2.output, &in, "ForwardResponse.output", &err) == PS_OK);
    CHECK(fr2.model_version == 99 && fr2.output.name[0] == '\0');
    CHECK(in.bytes == 640 * 4 && memcmp(in.data, data, 640 * 4) == 0);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    ps_BackwardRequest br = ps_BackwardRequest_init_zero;
    br.context_id = 17;
    br.step = true;
    br.has_grad_output = true;
    ps_wire_tensor_encode_bind(&br.grad_output, "grad", 2, dims, data);
    bb = encode(ps_BackwardRequest_fields, &br);
    ps_BackwardRequest br2 = ps_BackwardRequest_init_zero;
    ps_wire_tensor_in_init(&in, 1 << 20);
    ps_wire_tensor_decode_bind(&br2.grad_output, &in);
    CHECK(ps_wire_decode(bb, ps_BackwardRequest_fields, &br2, &err) == PS_OK);
    CHECK(ps_wire_tensor_check(&br2.grad_output, &in, "BackwardRequest.grad_output", &err) == PS_OK);
    CHECK(br2.context_id == 17 && br2.step && strcmp(br2.grad_output.name, "grad") == 0);
    CHECK(in.bytes == 640 * 4 && memcmp(in.data, data, 640 * 4) == 0);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    free(data);
}

/* ---- scalar-only messages ---------------------------------------------- */

static void test_small_messages(void) {
    ps_err err;
    grpc_byte_buffer *bb;

    ps_BackwardResponse a = {.model_version = 5}, a2 = ps_BackwardResponse_init_zero;
    bb = encode(ps_BackwardResponse_fields, &a);
    CHECK(ps_wire_decode(bb, ps_BackwardResponse_fields, &a2, &err) == PS_OK && a2.model_version == 5);
    grpc_byte_buffer_destroy(bb);

    ps_GetGradientsRequest g = {.context_id = UINT64_MAX}, g2 = ps_GetGradientsRequest_init_zero;
    bb = encode(ps_GetGradientsRequest_fields, &g);
    CHECK(ps_wire_decode(bb, ps_GetGradientsRequest_fields, &g2, &err) == PS_OK && g2.context_id == UINT64_MAX);
    grpc_byte_buffer_destroy(bb);

    ps_StepRequest s = {.context_id = 77}, s2 = ps_StepRequest_init_zero;
    bb = encode(ps_StepRequest_fields, &s);
    CHECK(ps_wire_decode(bb, ps_StepRequest_fields, &s2, &err) == PS_OK && s2.context_id == 77);
    grpc_byte_buffer_destroy(bb);

    ps_StepResponse r = {.model_version = 1234567}, r2 = ps_StepResponse_init_zero;
    bb = encode(ps_StepResponse_fields, &r);
    CHECK(ps_wire_decode(bb, ps_StepResponse_fields, &r2, &err) == PS_OK && r2.model_version == 1234567);
    grpc_byte_buffer_destroy(bb);

    /* Empty messages: zero bytes on the wire, and NULL decodes as empty. */
    ps_ListParametersRequest lp = ps_ListParametersRequest_init_zero;
    bb = encode(ps_ListParametersRequest_fields, &lp);
    CHECK(grpc_byte_buffer_length(bb) == 0);
    CHECK(ps_wire_decode(bb, ps_ListParametersRequest_fields, &lp, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    ps_GetParametersRequest gp = ps_GetParametersRequest_init_zero;
    bb = encode(ps_GetParametersRequest_fields, &gp);
    CHECK(ps_wire_decode(bb, ps_GetParametersRequest_fields, &gp, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    ps_StatusRequest sr = ps_StatusRequest_init_zero;
    bb = encode(ps_StatusRequest_fields, &sr);
    CHECK(ps_wire_decode(bb, ps_StatusRequest_fields, &sr, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    CHECK(ps_wire_decode(NULL, ps_StatusRequest_fields, &sr, &err) == PS_OK);
    ps_StepRequest s3 = {.context_id = 9};
    CHECK(ps_wire_decode(NULL, ps_StepRequest_fields, &s3, &err) == PS_OK);

    ps_StatusResponse st = ps_StatusResponse_init_zero, st2 = ps_StatusResponse_init_zero;
    strcpy(st.version, "0.1.0");
    strcpy(st.model, "mnist_cnn");
    st.uptime_s = 12.5;
    st.model_version = 10;
    st.live_contexts = 2;
    st.expired_contexts = 3;
    st.trainers_seen = 4;
    st.samples = 640;
    strcpy(st.consistency, "bounded staleness 0: every step sees all earlier steps");
    bb = encode(ps_StatusResponse_fields, &st);
    grpc_byte_buffer *bs = resplit(bb);
    CHECK(ps_wire_decode(bs, ps_StatusResponse_fields, &st2, &err) == PS_OK);
    CHECK(memcmp(&st, &st2, sizeof st) == 0);
    grpc_byte_buffer_destroy(bs);
    grpc_byte_buffer_destroy(bb);
}

/* ---- repeated tensors: the MNIST CNN's parameters ---------------------- */

static const struct { const char *name; int ndim; int64_t dims[4]; const char *stage; } mnist[] = {
    {"conv1.weight", 4, {32, 1, 3, 3}, "conv"},
    {"conv1.bias", 1, {32}, "conv"},
    {"conv2.weight", 4, {64, 32, 3, 3}, "conv"},
    {"conv2.bias", 1, {64}, "conv"},
    {"fc1.weight", 2, {128, 9216}, "fc"},
    {"fc1.bias", 1, {128}, "fc"},
    {"fc2.weight", 2, {10, 128}, "fc"},
    {"fc2.bias", 1, {10}, "fc"},
};
#define NMNIST (sizeof mnist / sizeof mnist[0])

static size_t count_of(int ndim, const int64_t *d) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)d[i];
    return n;
}

static void test_mnist_gradients(void) {
    ps_wire_named items[NMNIST];
    float *bufs[NMNIST];
    size_t total = 0;
    for (size_t i = 0; i < NMNIST; i++) {
        size_t n = count_of(mnist[i].ndim, mnist[i].dims);
        bufs[i] = make_data(n, (uint32_t)i + 1);
        items[i] = (ps_wire_named){mnist[i].name, mnist[i].ndim, {0}, bufs[i], "cpu", mnist[i].stage};
        memcpy(items[i].dims, mnist[i].dims, sizeof items[i].dims);
        total += n * 4;
    }
    CHECK(total == 4 * 1199882); /* PyTorch's MNIST example net */
    ps_wire_named_list list = {items, NMNIST};
    ps_err err;

    /* GetGradientsResponse */
    ps_GetGradientsResponse g = ps_GetGradientsResponse_init_zero;
    ps_wire_tensors_encode_bind(&g.gradients, &list);
    grpc_byte_buffer *bb = encode(ps_GetGradientsResponse_fields, &g);
    CHECK(grpc_byte_buffer_length(bb) > total);
    grpc_byte_buffer *bs = resplit(bb);
    ps_GetGradientsResponse g2 = ps_GetGradientsResponse_init_zero;
    ps_wire_tensor_list tl;
    ps_wire_tensor_list_init(&tl, 64u << 20);
    tl.err = &err;
    ps_wire_tensors_decode_bind(&g2.gradients, &tl);
    CHECK_MSG(ps_wire_decode(bs, ps_GetGradientsResponse_fields, &g2, &err) == PS_OK, "%s", err.msg);
    CHECK(tl.n == NMNIST);
    for (size_t i = 0; i < tl.n && i < NMNIST; i++) {
        size_t n = count_of(mnist[i].ndim, mnist[i].dims);
        CHECK(strcmp(tl.items[i].name, mnist[i].name) == 0);
        CHECK(tl.items[i].ndim == mnist[i].ndim);
        CHECK(memcmp(tl.items[i].dims, mnist[i].dims, sizeof(int64_t) * (size_t)mnist[i].ndim) == 0);
        CHECK(tl.items[i].bytes == n * 4);
        CHECK(memcmp(tl.items[i].data, bufs[i], n * 4) == 0);
        CHECK(((uintptr_t)tl.items[i].data % 64) == 0);
    }
    ps_wire_tensor_list_free(&tl);

    /* The same with a total limit too small for fc1.weight: refused. */
    ps_GetGradientsResponse g3 = ps_GetGradientsResponse_init_zero;
    ps_wire_tensor_list_init(&tl, 1u << 20);
    tl.err = &err;
    ps_wire_tensors_decode_bind(&g3.gradients, &tl);
    CHECK(ps_wire_decode(bb, ps_GetGradientsResponse_fields, &g3, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "4718592") != NULL, "%s", err.msg);
    CHECK(tl.n == 4); /* the four conv tensors fit */
    ps_wire_tensor_list_free(&tl);
    grpc_byte_buffer_destroy(bs);
    grpc_byte_buffer_destroy(bb);

    /* GetParametersResponse */
    ps_GetParametersResponse p = ps_GetParametersResponse_init_zero;
    p.model_version = 31;
    ps_wire_tensors_encode_bind(&p.parameters, &list);
    bb = encode(ps_GetParametersResponse_fields, &p);
    ps_GetParametersResponse p2 = ps_GetParametersResponse_init_zero;
    ps_wire_tensor_list_init(&tl, 64u << 20);
    ps_wire_tensors_decode_bind(&p2.parameters, &tl);
    CHECK(ps_wire_decode(bb, ps_GetParametersResponse_fields, &p2, &err) == PS_OK);
    CHECK(p2.model_version == 31 && tl.n == NMNIST);
    int same = tl.n == NMNIST;
    for (size_t i = 0; same && i < NMNIST; i++)
        same = tl.items[i].bytes == count_of(mnist[i].ndim, mnist[i].dims) * 4 &&
               memcmp(tl.items[i].data, bufs[i], tl.items[i].bytes) == 0;
    CHECK(same);
    ps_wire_tensor_list_free(&tl);
    grpc_byte_buffer_destroy(bb);

    /* ListParametersResponse */
    ps_ListParametersResponse l = ps_ListParametersResponse_init_zero;
    strcpy(l.model, "mnist_cnn");
    ps_wire_params_encode_bind(&l.parameters, &list);
    bb = encode(ps_ListParametersResponse_fields, &l);
    CHECK(grpc_byte_buffer_length(bb) < 1000); /* no tensor data */
    ps_ListParametersResponse l2 = ps_ListParametersResponse_init_zero;
    ps_wire_param_list pl;
    ps_wire_param_list_init(&pl, 64);
    ps_wire_params_decode_bind(&l2.parameters, &pl);
    CHECK(ps_wire_decode(bb, ps_ListParametersResponse_fields, &l2, &err) == PS_OK);
    CHECK(strcmp(l2.model, "mnist_cnn") == 0 && pl.n == NMNIST);
    for (size_t i = 0; i < pl.n && i < NMNIST; i++) {
        CHECK(strcmp(pl.items[i].name, mnist[i].name) == 0);
        CHECK(strcmp(pl.items[i].device, "cpu") == 0);
        CHECK(strcmp(pl.items[i].stage, mnist[i].stage) == 0);
        CHECK((int)pl.items[i].shape_count == mnist[i].ndim);
        CHECK(pl.items[i].shape[0] == mnist[i].dims[0]);
    }
    ps_wire_param_list_free(&pl);
    ps_wire_param_list_init(&pl, 3);
    pl.err = &err;
    ps_wire_params_decode_bind(&l2.parameters, &pl);
    CHECK(ps_wire_decode(bb, ps_ListParametersResponse_fields, &l2, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    ps_wire_param_list_free(&pl);
    grpc_byte_buffer_destroy(bb);

    for (size_t i = 0; i < NMNIST; i++) free(bufs[i]);
}

/* ---- bad input --------------------------------------------------------- */

/* Writes a Tensor.data field of raw->n bytes regardless of the shape. */
typedef struct raw_bytes { const void *p; size_t n; } raw_bytes;
static bool raw_encode(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
    const raw_bytes *r = *arg;
    return pb_encode_tag_for_field(s, f) && pb_encode_string(s, r->p, r->n);
}

static grpc_byte_buffer *forward_with(int ndim, const int64_t *dims, const void *p, size_t n) {
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.has_input = true;
    req.input.shape_count = (pb_size_t)ndim;
    memcpy(req.input.shape, dims, (size_t)ndim * sizeof(int64_t));
    raw_bytes r = {p, n};
    req.input.data.funcs.encode = raw_encode;
    req.input.data.arg = &r;
    return encode(ps_ForwardRequest_fields, &req);
}

/* Decode a ForwardRequest the way a handler does; returns the status. */
static ps_status decode_forward(grpc_byte_buffer *bb, size_t max_bytes, ps_wire_tensor_in *in,
                                ps_err *err) {
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in_init(in, max_bytes);
    in->err = err;
    ps_wire_tensor_decode_bind(&req.input, in);
    ps_status st = ps_wire_decode(bb, ps_ForwardRequest_fields, &req, err);
    if (st == PS_OK) st = ps_wire_tensor_check(&req.input, in, "ForwardRequest.input", err);
    return st;
}

static void test_bad_input(void) {
    ps_err err;
    ps_wire_tensor_in in;
    int64_t dims[4] = {2, 3, 4, 5};
    float *data = make_data(120, 3);

    /* Truncated: a valid message cut short, at several points. */
    grpc_byte_buffer *bb = forward_with(4, dims, data, 480);
    grpc_slice all = flat(bb);
    size_t len = GRPC_SLICE_LENGTH(all);
    size_t cuts[] = {1, 5, len / 2, len - 1};
    for (size_t i = 0; i < 4; i++) {
        grpc_byte_buffer *t = from_bytes(GRPC_SLICE_START_PTR(all), cuts[i]);
        ps_status st = decode_forward(t, 1 << 20, &in, &err);
        CHECK_MSG(st == PS_ERR_INVALID_ARGUMENT, "cut at %zu: %s %s", cuts[i], ps_status_name(st), err.msg);
        CHECK(strstr(err.msg, "malformed") != NULL);
        CHECK(in.data == NULL); /* freed or never allocated */
        ps_wire_tensor_in_free(&in);
        grpc_byte_buffer_destroy(t);
    }
    grpc_slice_unref(all);
    grpc_byte_buffer_destroy(bb);

    /* Garbage. */
    unsigned char junk[64];
    memset(junk, 0xff, sizeof junk);
    bb = from_bytes(junk, sizeof junk);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + 11);
    bb = from_bytes(junk, sizeof junk);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Shape (2,3,4,5) = 480 bytes, but 400 bytes of data. */
    bb = forward_with(4, dims, data, 400);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "480") && strstr(err.msg, "400") &&
              strstr(err.msg, "ForwardRequest.input"), "%s", err.msg);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Data not a whole number of floats. */
    bb = forward_with(4, dims, data, 479);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK(in.data == NULL && in.got == 0);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Absurd shape: 10^12 elements declared, 16 bytes sent. Nothing is
     * allocated from the shape; the check refuses with both sizes. */
    int64_t huge[2] = {1000000, 1000000};
    bb = forward_with(2, huge, data, 16);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "4000000000000") && strstr(err.msg, "16 bytes"), "%s", err.msg);
    CHECK(in.bytes == 16);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Element count overflowing size_t, zero and negative dims, no dims, 5 dims. */
    int64_t ovf[4] = {INT64_MAX, INT64_MAX, 4, 4};
    bb = forward_with(4, ovf, data, 16);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "too large") != NULL, "%s", err.msg);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    int64_t zero[2] = {4, 0}, neg[2] = {-4, -1};
    bb = forward_with(2, zero, data, 16);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    bb = forward_with(2, neg, data, 16);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    bb = forward_with(0, dims, data, 16);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "0 dims") != NULL, "%s", err.msg);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    /* A fifth shape entry overflows the nanopb array: malformed. */
    unsigned char five[] = {0x12, 0x0d, 0x12, 0x05, 1, 1, 1, 1, 1, 0x1a, 0x04, 0, 0, 0, 0};
    bb = from_bytes(five, sizeof five);
    CHECK(decode_forward(bb, 1 << 20, &in, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Over max_bytes: refused before allocating, message names both sizes. */
    size_t big = 1 << 20;
    float *bigdata = make_data(big / 4, 5);
    int64_t bd[1] = {(int64_t)(big / 4)};
    bb = forward_with(1, bd, bigdata, big);
    CHECK(decode_forward(bb, 1000, &in, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "1048576") && strstr(err.msg, "1000"), "%s", err.msg);
    CHECK(in.data == NULL && in.got == 0);
    ps_wire_tensor_in_free(&in);
    /* Without in.err the nanopb text still says what happened. */
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in_init(&in, 1000);
    ps_wire_tensor_decode_bind(&req.input, &in);
    CHECK(ps_wire_decode(bb, ps_ForwardRequest_fields, &req, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "limit") != NULL, "%s", err.msg);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
    free(bigdata);

    /* A tensor list whose second entry lies about its shape. */
    ps_GetGradientsResponse g = ps_GetGradientsResponse_init_zero;
    float two[2] = {1, 2};
    ps_wire_named items[2] = {{"a", 1, {2}, two, NULL, NULL}, {"b", 1, {2}, two, NULL, NULL}};
    ps_wire_named_list list = {items, 2};
    ps_wire_tensors_encode_bind(&g.gradients, &list);
    bb = encode(ps_GetGradientsResponse_fields, &g);
    grpc_slice s = flat(bb);
    grpc_byte_buffer_destroy(bb);
    /* Second tensor's shape varint 2 -> 3 (layout: 0a len 0a 01 'b' 12 01 02 ...). */
    unsigned char *b = GRPC_SLICE_START_PTR(s);
    size_t sl = GRPC_SLICE_LENGTH(s), first = (size_t)b[1] + 2;
    CHECK(b[first + 2] == 0x0a && b[first + 4] == 'b' && b[first + 5] == 0x12 && b[first + 7] == 2);
    b[first + 7] = 3;
    bb = from_bytes(b, sl);
    grpc_slice_unref(s);
    ps_wire_tensor_list tl;
    ps_wire_tensor_list_init(&tl, 1 << 20);
    tl.err = &err;
    ps_GetGradientsResponse g2 = ps_GetGradientsResponse_init_zero;
    ps_wire_tensors_decode_bind(&g2.gradients, &tl);
    CHECK(ps_wire_decode(bb, ps_GetGradientsResponse_fields, &g2, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "tensor 1 (\"b\")") && strstr(err.msg, "12 bytes") &&
              strstr(err.msg, "8 bytes"), "%s", err.msg);
    CHECK(tl.n == 1);
    ps_wire_tensor_list_free(&tl);
    grpc_byte_buffer_destroy(bb);

    free(data);
}

/* Typed tensors: an INT64 input round-trips with its dtype; a shape that
 * would fit float32 but not int64 is refused naming the dtype; an unknown
 * dtype is refused; an old client's tensor (no dtype field) reads as
 * FLOAT32. The new Forward/Backward fields and repeated gradients survive. */
static void test_dtypes_and_stage_fields(void) {
    ps_err err = {0};
    int64_t ids[6] = {0, 1, 9999, -1, INT64_MAX, 42};
    int64_t dims[2] = {2, 3};
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = 5;
    req.train = true;
    req.seq = 7;
    snprintf(req.stage, sizeof req.stage, "emb");
    req.has_input = true;
    ps_wire_tensor_encode_bind_typed(&req.input, "ids", 2, dims, ids, ps_DType_INT64);
    grpc_byte_buffer *bb = encode(ps_ForwardRequest_fields, &req);
    ps_ForwardRequest got = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, 1 << 20);
    ps_wire_tensor_decode_bind(&got.input, &in);
    CHECK(ps_wire_decode(bb, ps_ForwardRequest_fields, &got, &err) == PS_OK);
    CHECK(ps_wire_tensor_check(&got.input, &in, "ForwardRequest.input", &err) == PS_OK);
    CHECK(got.input.dtype == ps_DType_INT64 && got.seq == 7 && !strcmp(got.stage, "emb"));
    CHECK(in.bytes == sizeof ids && memcmp(in.data, ids, sizeof ids) == 0);
    /* The same bytes claimed as a (2, 6) int64 tensor: 96 bytes needed. */
    got.input.shape[1] = 6;
    CHECK(ps_wire_tensor_check(&got.input, &in, "ForwardRequest.input", &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "int64") && strstr(err.msg, "96 bytes"), "%s", err.msg);
    /* As float32 the 48 bytes are 12 values: (2, 6) float32 passes. */
    got.input.dtype = ps_DType_FLOAT32;
    CHECK(ps_wire_tensor_check(&got.input, &in, "ForwardRequest.input", &err) == PS_OK);
    got.input.dtype = (ps_DType)9;
    CHECK(ps_wire_tensor_check(&got.input, &in, "ForwardRequest.input", &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "dtype 9"), "%s", err.msg);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);

    /* Backward with more forwards and input gradients in the reply. */
    float g0[2] = {1, 2}, g1[2] = {3, 4}, g2[2] = {5, 6};
    int64_t gd[2] = {1, 2};
    ps_wire_named more[2] = {{.name = "", .ndim = 2, .dims = {1, 2}, .data = g1},
                             {.name = "", .ndim = 2, .dims = {1, 2}, .data = g2}};
    ps_wire_named_list ml = {more, 2};
    ps_BackwardRequest br = ps_BackwardRequest_init_zero;
    br.context_id = 9;
    br.seq = 1;
    br.want_input_grad = true;
    br.more_seqs_count = 2;
    br.more_seqs[0] = 2;
    br.more_seqs[1] = 3;
    br.has_grad_output = true;
    ps_wire_tensor_encode_bind(&br.grad_output, NULL, 2, gd, g0);
    ps_wire_tensors_encode_bind(&br.more_grad_outputs, &ml);
    bb = encode(ps_BackwardRequest_fields, &br);
    ps_BackwardRequest b2 = ps_BackwardRequest_init_zero;
    ps_wire_tensor_in_init(&in, 1 << 20);
    ps_wire_tensor_decode_bind(&b2.grad_output, &in);
    ps_wire_tensor_list l;
    ps_wire_tensor_list_init(&l, 1 << 20);
    ps_wire_tensors_decode_bind(&b2.more_grad_outputs, &l);
    CHECK(ps_wire_decode(bb, ps_BackwardRequest_fields, &b2, &err) == PS_OK);
    CHECK(b2.want_input_grad && b2.seq == 1 && b2.more_seqs_count == 2 && b2.more_seqs[1] == 3);
    CHECK(l.n == 2 && l.items[1].dtype == ps_DType_FLOAT32 && l.items[1].data[1] == 6.0f);
    CHECK(in.bytes == 8 && in.data[1] == 2.0f);
    ps_wire_tensor_list_free(&l);
    ps_wire_tensor_in_free(&in);
    grpc_byte_buffer_destroy(bb);
}

int main(void) {
    unsetenv("PS_WIRE_RECYCLE");   /* test_recycled_buffers: the default */
    grpc_init();
    test_dtypes_and_stage_fields();
    test_forward_roundtrip(64, 1, 28, 28, 0);
    test_forward_roundtrip(64, 1, 28, 28, 1);
    /* 5 MiB tensor: 1310720 floats, both as one slice and many slices. */
    test_forward_roundtrip(5, 1024, 16, 16, 0);
    test_forward_roundtrip(5, 1024, 16, 16, 1);
    test_forward_response_and_backward();
    test_recycled_buffers();
    test_small_messages();
    test_mnist_gradients();
    test_bad_input();
    grpc_shutdown();
    return check_summary("test_wire");
}
