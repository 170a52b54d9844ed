/* fuzz_service - libFuzzer target over psd's request decoding and
 * validation: every row of the method table (methods.h), through the one
 * dispatch path the rpc layer calls, fed byte buffers built from the fuzz
 * input, plus the tokens-file parser. Build and run: `make fuzz`
 * (FUZZ_SECONDS=60 by default).
 *
 * Input: a sequence of records, each
 *     byte 0   selector: low 4 bits modulo (PS_M_COUNT + 1) pick the
 *              method by id, PS_M_COUNT = the tokens parser;
 *              bits 4-5 how many slices the payload is split into (1-4),
 *              bit 6 the nonfinite policy of this input's service (skip;
 *              read from the first record)
 *     byte 1-2 payload length, little endian (cut to what is left)
 *     payload  the request message bytes
 * so one input can open a context with Forward, then Backward, GetGradients
 * and Step it. Each input gets a fresh service (contexts, counters) over one
 * model made once, with small limits (64 KiB messages, 8 contexts) so
 * memory stays bounded. tests/fuzz/make_corpus.py writes the seeds.
 *
 * Properties checked on every call (a violation aborts = a finding):
 *  - a handler answers OK with a response, or a non-OK code with a
 *    non-empty, NUL-terminated message; never both a response and an error;
 *  - an OK response is a well-formed protobuf of the method's reply type;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour.
 * The model's weights must stay finite whatever was sent. */
#include <grpc/grpc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "methods.h"
#include "model.h"
#include "security.h"
#include "service.h"
#include "wire.h"

static ps_model *g_model;  /* made once: building it per input would dominate */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    grpc_init();
    ps_err err = {0};
    ps_model_opts mo = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 1, .compute_threads = 1,
                        .lr = 0.03f};
    g_model = ps_model_create(&mo, &err);
    if (!g_model) {
        fprintf(stderr, "fuzz_service: %s\n", err.msg);
        abort();
    }
    return 0;
}

static void call_handler(ps_service *svc, const ps_rpc_method *m, const uint8_t *p, size_t n, int nslices) {
    grpc_slice sl[4];
    size_t off = 0;
    for (int i = 0; i < nslices; i++) {
        size_t len = i == nslices - 1 ? n - off : (n - off) / 2;
        sl[i] = grpc_slice_from_copied_buffer((const char *)p + off, len);
        off += len;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, (size_t)nslices);
    for (int i = 0; i < nslices; i++) grpc_slice_unref(sl[i]);
    grpc_byte_buffer *resp = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    char details[PS_RPC_DETAILS_MAX];
    details[0] = '\0';
    ps_rpc_call_info info = {m->path, "fuzz", gpr_inf_future(GPR_CLOCK_MONOTONIC), "fuzzer", NULL, m->id, "fuzz"};
    m->fn(svc, &info, bb, &resp, &code, details, sizeof details);
    fuzz_require(memchr(details, 0, sizeof details) != NULL, "details NUL-terminated", "");
    if (code == GRPC_STATUS_OK) {
        /* Decode the reply back with the row's descriptor (callback fields
         * left unbound are skipped); Forward's tensor goes through the real
         * decoder. */
        const ps_method_desc *d = ps_method((ps_method_id)m->id);
        void *r = calloc(1, d->response_size);
        fuzz_require(r != NULL, "reply buffer", "out of memory");
        ps_err err = {0};
        ps_wire_tensor_in in;
        ps_wire_tensor_in_init(&in, 1 << 20);
        ps_ForwardResponse *fw = d->id == PS_M_FORWARD ? r : NULL;
        if (fw) ps_wire_tensor_decode_bind(&fw->output, &in);
        fuzz_require(ps_wire_decode(resp, d->response, r, &err) == PS_OK, "reply decodes", err.msg);
        if (fw && fw->has_output)
            fuzz_require(ps_wire_tensor_check(&fw->output, &in, "out", &err) == PS_OK, "reply tensor", err.msg);
        ps_wire_tensor_in_free(&in);
        free(r);
    } else {
        fuzz_require(details[0] != '\0', "an error has a message", details);
        fuzz_require(resp == NULL, "no response with an error", details);
    }
    if (resp) grpc_byte_buffer_destroy(resp);
    grpc_byte_buffer_destroy(bb);
}

static void parse_tokens(const uint8_t *p, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, p, n);
    text[n] = '\0';
    ps_rpc_token *t = NULL;
    int cnt = 0;
    ps_err err = {0};
    ps_status st = ps_security_parse_tokens(text, "fuzz", &t, &cnt, &err);
    fuzz_require(st == PS_OK ? (t && cnt > 0) : (!t && cnt == 0 && err.msg[0]), "tokens parser contract", err.msg);
    for (int i = 0; i < cnt; i++)
        fuzz_require(strlen(t[i].token) >= 16 && strlen(t[i].name) >= 1, "tokens parser checks", t[i].name);
    free(t);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ps_err err = {0};
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 8, .max_message_bytes = 64 << 10,
                          .nonfinite_policy = (ps_nonfinite_policy)((data[0] >> 6) & 1)};
    ps_service *svc = ps_service_create(g_model, &so, &err);
    if (!svc) abort();
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    size_t i = 0;
    for (int rec = 0; rec < 16 && i < size; rec++) {
        uint8_t sel = data[i++];
        size_t len = 0;
        if (i < size) len = data[i++];
        if (i < size) len |= (size_t)data[i++] << 8;
        if (len > size - i) len = size - i;
        _Static_assert(PS_M_COUNT + 1 <= 16, "the selector's low 4 bits must reach every method and the "
                       "tokens parser: widen it (and the comment above) when the table grows");
        int which = (sel & 15) % (nm + 1);
        int nslices = 1 + ((sel >> 4) & 3);
        if (which < nm) call_handler(svc, &methods[which], data + i, len, nslices);
        else parse_tokens(data + i, len);
        i += len;
    }
    ps_service_free(svc);
    return 0;
}
