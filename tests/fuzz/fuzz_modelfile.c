/* fuzz_modelfile - libFuzzer target over the model-file loader
 * (common/nn/modeldef.h) and the shape inference of a model built from it.
 * Build and run: `make fuzz` (seeds: tests/fuzz/corpus/modelfile, the
 * shipped models and a few broken ones).
 *
 * Each input is a model file's text. Properties checked (a violation
 * aborts = a finding):
 *  - the loader accepts it, or refuses it with a non-empty message that
 *    starts with the file's name;
 *  - an accepted file's definition is consistent: every node's inputs are
 *    nodes of its own stage (or the stage input), each stage's order is a
 *    permutation of its nodes in which inputs come first;
 *  - the stage table (every shape inferred, memory plans made, no weights)
 *    is produced or refused with a message;
 *  - ASan/UBSan: no memory error, leak, overflow or undefined behaviour.
 * The file reaches the builder through a memfd (no disk). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "modeldef.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_def(const ps_model_def *d) {
    for (int s = 0; s < d->nstages; s++) {
        const ps_stage_def *sd = &d->stages[s];
        if (sd->first < 0 || sd->count < 1 || sd->first + sd->count > d->nnodes) abort();
        char *seen = calloc((size_t)sd->count, 1);
        if (!seen) abort();
        for (int k = 0; k < sd->count; k++) {
            int i = sd->order[k];
            if (i < sd->first || i >= sd->first + sd->count || seen[i - sd->first]) abort();
            seen[i - sd->first] = 1;
            const ps_node_def *nd = &d->nodes[i];
            if (nd->stage != s || !nd->kind || nd->nin < 1) abort();
            for (int j = 0; j < nd->nin; j++) {
                int in = nd->in[j];
                if (in == -1) continue;
                if (in < sd->first || in >= sd->first + sd->count || !seen[in - sd->first]) abort();
            }
        }
        if (sd->output < sd->first || sd->output >= sd->first + sd->count) abort();
        free(seen);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_err err = {0};
    ps_model_def *d = ps_model_def_parse((const char *)data, size, "fuzz.yaml", &err);
    if (!d) {
        if (!err.msg[0] || strncmp(err.msg, "fuzz.yaml", 9)) abort();
        return 0;
    }
    check_def(d);
    ps_model_def_free(d);
    fuzz_describe(data, size);
    return 0;
}
