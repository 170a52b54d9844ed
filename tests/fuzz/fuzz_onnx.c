/* fuzz_onnx - libFuzzer target over psd's ONNX reader and importer
 * (common/nn/onnx.h, onnx_import.h) and the model built from what they
 * produce. Build and run: `make fuzz` (seeds: tests/fuzz/corpus/onnx, small
 * exports of PyTorch modules and ONNX backend test models, written by
 * tests/fuzz/make_onnx_corpus.py).
 *
 * Each input is a serialised ModelProto. Properties checked (a violation
 * aborts = a finding):
 *  - the reader accepts it or refuses it with a message naming the input;
 *    an accepted model's counts and pointers are consistent (raw tensor
 *    data inside the input, every dimension bounded);
 *  - the import accepts it or refuses it with a message; an accepted
 *    import's model file text parses (the import never writes a file the
 *    model-file loader rejects as malformed YAML), and its every initial
 *    value converts (ps_onnx_import_value);
 *  - the stage table of that model file (every shape inferred) is produced
 *    or refused with a message;
 *  - a serialised TensorProto read the same bytes is accepted or refused;
 *  - ASan/UBSan: no memory error, leak, overflow or undefined behaviour.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "modeldef.h"
#include "onnx.h"
#include "onnx_import.h"
#include "onnx_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_model(const ps_onnx_model *m, const uint8_t *data, size_t size) {
    for (int i = 0; i < m->ninits; i++) {
        const ps_onnx_tensor *t = &m->inits[i];
        if (!t->name || t->ndim < 0 || t->ndim > PS_ONNX_MAX_DIMS || t->numel < 0) abort();
        if (t->raw && (t->raw < data || t->raw + (size_t)t->numel * ps_onnx_dtype_size(t->dtype) > data + size))
            abort();
    }
    for (int i = 0; i < m->nnodes; i++) {
        const ps_onnx_node *n = &m->nodes[i];
        if (!n->op_type || !n->op_type[0] || !n->name || !n->domain) abort();
        for (int k = 0; k < n->nin; k++)
            if (!n->in[k]) abort();
        for (int k = 0; k < n->nattr; k++)
            if (!n->attrs[k].name) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_err err = {0};
    ps_onnx_tensor *t = ps_onnx_parse_tensor(data, size, "fuzz.pb", &err);
    if (!t && (!err.msg[0] || strncmp(err.msg, "fuzz.pb", 7))) abort();
    ps_onnx_free_tensor(t);

    memset(&err, 0, sizeof err);
    ps_onnx_model *m = ps_onnx_parse(data, size, "fuzz.onnx", &err);
    if (!m) {
        if (!err.msg[0] || strncmp(err.msg, "fuzz.onnx", 9)) abort();
        return 0;
    }
    check_model(m, data, size);
    memset(&err, 0, sizeof err);
    ps_onnx_import *im = ps_onnx_import_model(m, "fuzz.onnx", NULL, &err);
    if (!im) {
        if (!err.msg[0] || strncmp(err.msg, "fuzz.onnx", 9)) abort();
        ps_onnx_free(m);
        return 0;
    }
    for (int i = 0; i < ps_onnx_import_num_values(im); i++) {
        int64_t n = ps_onnx_import_value_numel(im, i);
        if (n < 0) abort();
        if (n > ((int64_t)1 << 24)) continue;   /* a large tensor: converting it proves little */
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        if (!buf) abort();
        ps_err e = {0};
        if (ps_onnx_import_value(im, i, buf, &e) && !e.msg[0]) abort();
        free(buf);
    }
    size_t len;
    const char *text = ps_onnx_import_yaml(im, &len);
    ps_err e1 = {0};
    ps_model_def *d = ps_onnx_import_def(im, "fuzz.onnx", &e1);
    /* the importer writes well-formed model files: refusals are about names, kinds and attributes */
    if (!d && (!e1.msg[0] || strstr(e1.msg, "YAML syntax"))) abort();
    ps_model_def_free(d);
    if (d) fuzz_describe(text, len);   /* the stage table: every shape inferred through the kinds */
    ps_onnx_import_free(im);
    ps_onnx_free(m);
    return 0;
}
