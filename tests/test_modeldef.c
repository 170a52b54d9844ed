/* test_modeldef.c - model files (common/nn/modeldef.h) and their build:
 *
 *  - the shipped models resolve by name (model.arch) and list themselves;
 *  - every error names file:line and the node: YAML syntax, unknown keys,
 *    kinds and attributes, required attributes, duplicate and missing
 *    names, inputs that name nothing, cycles (the nodes on it), nodes
 *    nothing reads, a stage cut with several live tensors (naming them),
 *    anchors/aliases, bad sizes and init specs; and, when the model is
 *    built, shape mismatches (Add of two shapes, a Linear whose in_features
 *    disagree with its input, a kernel larger than its input), Permute dims
 *    that are not a permutation of the batched input's keeping the batch
 *    at 0, Scale shapes that do not broadcast and parameter names that are
 *    not words, MatMul operands whose batch dimensions do not broadcast,
 *    whose inner dimensions differ or that are not matrices, a MatMul
 *    parameter without its shape or beside two inputs;
 *  - a valid DAG builds: shapes, parameter names (module paths, '-' in a
 *    segment as torchvision's regnet 'block1-0'), the stage
 *    input read by two nodes, file order kept where it is topological;
 *  - a DAG with fan-out and a residual Add: the input gradient equals
 *    central finite differences of sum(out * r) (an independent check of
 *    the executor's gradient sums at fan-out; the kinds themselves are
 *    checked against PyTorch in test_kinds);
 *  - the memory plan keeps what backward needs and nothing else: for a
 *    chain Linear, Tanh, Linear, Add (residual), LogSoftmax the training
 *    tape holds what PyTorch's autograd saves - each Linear's input, Tanh's
 *    and LogSoftmax's outputs (the stage input counts as the first
 *    Linear's) - and not the first Linear's output, the second's or the
 *    Add's; the stage table prints the same bytes per sample.
 */
#include "config.h"
#include "model.h"
#include "modeldef.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "support/random.h"
#include "support/tmpdir.h"

static char g_dir[256];

static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
    return path;
}

#define CONTAINS(hay, needle) CHECK_MSG(strstr((hay), (needle)) != NULL, "'%s' not in: %s", (needle), (hay))

/* text fails to load (or, build = 1, to build) with "path:line: " and the phrases. */
static void expect_err(const char *name, const char *text, int build, int line, const char *p1, const char *p2) {
    const char *path = write_file(name, text);
    char head[600];
    snprintf(head, sizeof head, "%s:%d:", path, line);   /* ":3:1:" for YAML syntax */
    ps_err e = {0};
    ps_model_def *d = ps_model_def_load_file(path, &e);
    if (build && d) {
        ps_model_def_free(d);
        d = NULL;
        ps_model_opts o = {.file = path, .cpu_backend = "ref", .seed = 1, .compute_threads = 1, .lr = 0.1f};
        ps_model *m = ps_model_create(&o, &e);
        CHECK_MSG(!m, "%s: built", name);
        ps_model_free(m);
    } else {
        CHECK_MSG(!d, "%s: loaded", name);
        ps_model_def_free(d);
    }
    CHECK_MSG(e.code != PS_OK, "%s: no error", name);
    CHECK_MSG(!strncmp(e.msg, head, strlen(head)), "%s: message does not start with '%s': %s", name, head, e.msg);
    if (p1) CONTAINS(e.msg, p1);
    if (p2) CONTAINS(e.msg, p2);
    /* psd's form, parse and build errors alike: what led to the file
     * (ps_config_model_origin), then file:line */
    ps_config c;
    ps_config_defaults(&c);
    snprintf(c.model.file, sizeof c.model.file, "%s", path);
    char origin[128], want[800];
    ps_model_opts o = {.file = path, .cpu_backend = "ref", .seed = 1, .compute_threads = 1, .lr = 0.1f,
                       .origin = ps_config_model_origin(&c, "e.yaml", origin, sizeof origin)};
    CHECK(!strcmp(origin, "e.yaml: model.file"));
    snprintf(want, sizeof want, "e.yaml: model.file: %s", head);
    ps_err e2 = {0};
    ps_model *m = ps_model_create(&o, &e2);
    CHECK_MSG(!m, "%s: built", name);
    ps_model_free(m);
    CHECK_MSG(!strncmp(e2.msg, want, strlen(want)), "%s: message does not start with '%s': %s", name, want, e2.msg);
    if (p1) CONTAINS(e2.msg, p1);
}

#define HEAD "name: t\nstages:\n  - name: s\n    input: {shape: [8], dtype: float32}\n    nodes:\n"

/* share: / tie: (docs/models.md "Shared parameters"): refusals at the
 * key's line (parse) or the node's line naming the key's (build), with
 * both nodes named. */
static void test_shared_errors(void) {
    expect_err("sh_unknown.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8}\n"
               "      - name: b\n        kind: Linear\n        out_features: 8\n        share: zz\n", 0, 10,
               "node 'b': share: 'zz' is not a node of the model", NULL);
    expect_err("sh_chain.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8}\n"
               "      - {name: b, kind: Linear, out_features: 8, share: a}\n"
               "      - {name: c, kind: Linear, out_features: 8, share: b}\n", 0, 8,
               "share: 'b' (line 7) uses the parameters of 'a' itself", "name the owner 'a'");
    expect_err("sh_kind.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8}\n"
               "      - {name: b, kind: LayerNorm, normalized_shape: 8, share: a}\n", 0, 7,
               "share: 'a' (line 6) is a Linear", "tie: {PARAMETER: NODE.PARAMETER}");
    expect_err("tie_none.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8, tie: {weight: nowhere.weight}}\n",
               0, 6, "tie.weight: 'nowhere.weight' names no node's parameter", NULL);
    expect_err("tie_map.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8, tie: a.weight}\n", 0, 6,
               "tie: expected a mapping {PARAMETER: NODE.PARAMETER}", NULL);
    expect_err("tie_shape.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8}\n"
               "      - name: b\n        kind: Linear\n        out_features: 4\n        tie: {weight: a.weight}\n",
               1, 7, "line 10: b.weight (4, 8) uses a.weight (8, 8) of node 'a' (Linear, line 6)", "one shape");
    expect_err("tie_init.yaml", HEAD "      - {name: a, kind: Linear, out_features: 8}\n"
               "      - {name: b, kind: Linear, out_features: 8, tie: {weight: a.weight}, init: {weight: zeros}}\n",
               1, 7, "init.weight of a parameter it uses from 'a' (line 6): give the owner's init", NULL);
    expect_err("sh_buffers.yaml", HEAD "      - {name: a, kind: BatchNorm1d, num_features: 8}\n"
               "      - {name: b, kind: BatchNorm1d, num_features: 8, eps: 0.001, share: a}\n", 1, 7,
               "share: 'a' (line 6) updates the buffers it lends with eps 1e-05, momentum 0.1;",
               "this node with eps 0.001");
}

/* weight_norm: a dim psd does not normalise over, and an init: of the weight it no longer has */
static void test_weight_norm_errors(void) {
    expect_err("wn_dim.yaml", HEAD "      - {name: a, kind: Linear, out_features: 4, weight_norm: true, "
               "weight_norm_dim: 1}\n", 1, 6, "node 'a' (Linear)",
               "weight_norm_dim 1: psd normalises the weight over every dim but 0 (weight_norm's default dim=0) or as "
               "a whole (null: dim=None)");
    expect_err("wn_init.yaml", HEAD "      - {name: a, kind: Linear, out_features: 4, weight_norm: true, "
               "init: {weight: zeros}}\n", 1, 6, "node 'a' (Linear)",
               "init.weight: no parameter 'weight' (parameters: weight_g, weight_v, bias)");
}

static void test_errors(void) {
    expect_err("syntax.yaml", "name: t\nstages: [\n", 0, 3, "YAML syntax error", NULL);
    expect_err("nodename.yaml", HEAD "      - {name: a/b, kind: Linear, out_features: 2}\n", 0, 6,
               "node name 'a/b': a module path of letters, digits, '_' and '-'", NULL);
    expect_err("topkey.yaml", "name: t\nlayers: 3\nstages: []\n", 0, 2, "unknown key 'layers'", "keys: name, about");
    expect_err("noname.yaml", "stages:\n  - name: s\n", 0, 1, "no name:", NULL);
    expect_err("kind.yaml", HEAD "      - {name: a, kind: Conv3d, out_channels: 2}\n", 0, 6,
               "node 'a': unknown kind 'Conv3d'", "Conv2d");
    expect_err("attr.yaml", HEAD "      - {name: a, kind: Linear, out_features: 2, out_channels: 3}\n", 0, 6,
               "node 'a' (Linear): unknown attribute 'out_channels'", "Linear takes: in_features, out_features");
    expect_err("required.yaml", HEAD "      - {name: a, kind: Linear}\n", 0, 6,
               "node 'a' (Linear): out_features is required", NULL);
    expect_err("dup.yaml", HEAD "      - {name: a, kind: ReLU}\n      - {name: a, kind: ReLU}\n", 0, 7,
               "node 'a' is defined twice (first on line 6)", NULL);
    expect_err("noname_node.yaml", HEAD "      - {name: a, kind: ReLU}\n      - {kind: ReLU}\n", 0, 7,
               "stage 's': a node without a name", NULL);
    expect_err("missing.yaml", HEAD "      - {name: a, kind: ReLU}\n      - {name: b, kind: ReLU, input: zz}\n", 0, 7,
               "node 'b': input 'zz' is not a node of the model", NULL);
    expect_err("cycle.yaml",
               HEAD "      - {name: a, kind: ReLU, input: input}\n      - {name: b, kind: Add, inputs: [a, d]}\n"
                    "      - {name: c, kind: ReLU, input: b}\n      - {name: d, kind: ReLU, input: c}\n"
                    "      - {name: out, kind: ReLU, input: d}\n",
               0, 7, "node 'b' is on a cycle (b <- d <- c <- b)", NULL);
    expect_err("self.yaml", HEAD "      - {name: a, kind: ReLU, input: a}\n", 0, 6, "node 'a' reads itself", NULL);
    expect_err("dangling.yaml", HEAD "      - {name: a, kind: ReLU}\n      - {name: b, kind: ReLU, input: input}\n",
               0, 6, "nothing reads node 'a'", "output ('b')");
    expect_err("cut.yaml",
               "name: t\nstages:\n  - name: s1\n    input: {shape: [8]}\n    nodes:\n"
               "      - {name: a, kind: ReLU}\n      - {name: b, kind: ReLU}\n"
               "  - name: s2\n    nodes:\n      - {name: c, kind: Add, inputs: [input, a]}\n",
               0, 10, "node 'c' of stage 's2' reads 'a' of stage 's1'",
               "live across the cut s1|s2: b (the output of stage 's1'), a");
    expect_err("alias.yaml", "name: t\nx: &k 3\n", 0, 2, "anchors", NULL);
    expect_err("inputs.yaml", HEAD "      - {name: a, kind: ReLU, inputs: [input, input]}\n", 0, 6,
               "node 'a' (ReLU): 2 inputs; ReLU takes 1", NULL);
    {   /* a node reads at most PS_NODE_MAX_INPUTS values (test_kinds runs a Concat of that many) */
        char text[2048] = HEAD "      - {name: a, kind: ReLU, input: input}\n      - {name: j, kind: Concat, inputs: [";
        for (int i = 0; i <= PS_NODE_MAX_INPUTS; i++) strcat(text, i ? ", a" : "a");
        strcat(text, "]}\n");
        char want[96];
        snprintf(want, sizeof want, "node 'j': inputs: 1..%d names, got %d", PS_NODE_MAX_INPUTS,
                 PS_NODE_MAX_INPUTS + 1);
        expect_err("inputs_max.yaml", text, 0, 7, want, NULL);
    }
    expect_err("concat_one.yaml", HEAD "      - {name: j, kind: Concat, inputs: [input]}\n", 0, 6,
               "node 'j' (Concat): 1 input; Concat takes 2..64", NULL);
    expect_err("size_ref.yaml", HEAD "      - {name: a, kind: Linear, out_features: width}\n", 0, 6,
               "out_features: 'width' is neither a number nor a size", NULL);
    expect_err("size_range.yaml",
               "name: t\nsizes:\n  w: {default: 0, min: 1, max: 4}\nstages: []\n", 0, 3,
               "sizes.w: default 0 is outside its range 1..4", NULL);
    expect_err("init.yaml", HEAD "      - {name: a, kind: Linear, out_features: 2, init: {weight: gaussian}}\n", 0, 6,
               "init.weight: 'gaussian' is not an initialisation", NULL);
    expect_err("enum.yaml", HEAD "      - {name: a, kind: Conv2d, out_channels: 2, kernel_size: 1, padding_mode: reflect}\n",
               0, 6, "padding_mode: 'reflect' is not one of 'zeros'", NULL);
    expect_err("noinput.yaml", "name: t\nstages:\n  - name: s\n    nodes:\n      - {name: a, kind: ReLU}\n", 0, 3,
               "stage 's': input: {shape: [...], dtype: ...} is required for the first stage", NULL);
    expect_err("mixed.yaml", HEAD "      - {name: a, kind: LSTM, hidden_size: 4}\n      - {name: b, kind: ReLU}\n", 0, 3,
               "stage 's' mixes parameter-only nodes", NULL);
    /* recurrent layers: an LSTM over one step is the trainer's, alone in its stage; psd runs them over sequences */
#define SEQ "name: t\nstages:\n  - name: s\n    input: {shape: [5, 3], dtype: float32}\n    nodes:\n"
    expect_err("lstm_step_fed.yaml", HEAD "      - {name: a, kind: Linear, out_features: 4}\n"
               "      - {name: b, kind: LSTM, hidden_size: 4}\n", 1, 7,
               "node 'b' (LSTM): per-sample input of one dimension: psd runs an LSTM over (L, input_size) sequences",
               NULL);
    expect_err("lstm_bidir_step.yaml", HEAD "      - {name: r, kind: LSTM, hidden_size: 4, bidirectional: true}\n",
               1, 6, "node 'r' (LSTM): input (8)",
               "bidirectional: the trainer's LSTM (a per-step input of one dimension) has biases and one direction");
    expect_err("gru_seq_first.yaml", SEQ "      - {name: r, kind: GRU, hidden_size: 4}\n", 1, 6,
               "node 'r' (GRU): input (5, 3)",
               "batch_first is false: psd's batch is the first dimension");
    expect_err("gru_step.yaml", HEAD "      - {name: r, kind: GRU, hidden_size: 4, batch_first: true}\n", 1, 6,
               "node 'r' (GRU): input (8)",
               "per-sample input (8) float32; it takes 2 dimensions");
    expect_err("lstm_in.yaml", SEQ "      - {name: r, kind: LSTM, input_size: 4, hidden_size: 4, batch_first: true}\n",
               1, 6, "input_size is 4 but the input has 3", NULL);
#undef SEQ
    /* built: shapes */
    expect_err("add_shape.yaml",
               HEAD "      - {name: a, kind: Linear, out_features: 4, input: input}\n"
                    "      - {name: b, kind: Add, inputs: [a, input]}\n",
               1, 7, "node 'b' (Add): input (4), (8): input 'a' is (4) and input 'input' is (8)",
               "Add broadcasts inputs of one rank whose dimensions are equal or 1");
    /* numpy broadcasting of two inputs (Add, Sub, Mul, Div): (4) by (8), (3, 4) by (4, 3) and two ranks are
     * refused (test_kinds' bcast_* cases take the broadcasts) */
    expect_err("mul_shape.yaml",
               HEAD "      - {name: a, kind: Linear, out_features: 4, input: input}\n"
                    "      - {name: b, kind: Mul, inputs: [a, input]}\n",
               1, 7, "node 'b' (Mul)", "Mul broadcasts inputs of one rank");
    expect_err("mul_lead.yaml",
               "name: t\nstages:\n  - name: s\n    input: {shape: [4, 3]}\n    nodes:\n"
               "      - {name: r, kind: Reshape, shape: [3, 4]}\n"
               "      - {name: b, kind: Mul, inputs: [r, input]}\n",
               1, 7, "node 'b' (Mul): input (3, 4), (4, 3)", "dimensions are equal or 1");
    expect_err("div_rank.yaml",
               "name: t\nstages:\n  - name: s\n    input: {shape: [8]}\n    nodes:\n"
               "      - {name: r, kind: Reshape, shape: [1, 8]}\n"
               "      - {name: b, kind: Div, inputs: [input, r]}\n",
               1, 7, "node 'b' (Div): input (8), (1, 8)", "Div broadcasts inputs of one rank");
    expect_err("in_features.yaml", HEAD "      - {name: a, kind: Linear, in_features: 9, out_features: 4}\n", 1, 6,
               "node 'a' (Linear)", "in_features is 9 but the input has 8");
    expect_err("kernel.yaml",
               "name: t\nstages:\n  - name: s\n    input: {shape: [1, 4, 4]}\n    nodes:\n"
               "      - {name: c, kind: Conv2d, out_channels: 2, kernel_size: 5}\n",
               1, 6, "node 'c' (Conv2d)", "does not fit the input");
    expect_err("dims.yaml", HEAD "      - {name: a, kind: Conv2d, out_channels: 2, kernel_size: 3}\n", 1, 6,
               "node 'a' (Conv2d)", "it takes 3 dimensions of float32");
    expect_err("range.yaml", HEAD "      - {name: a, kind: Dropout, p: 1}\n", 1, 6, "node 'a' (Dropout)",
               "p: 1 is outside [0, 1)");
    /* shrinks, thresholds, PReLU, RReLU, alpha dropout */
    expect_err("prelu_c.yaml", HEAD "      - {name: a, kind: PReLU, num_parameters: 3}\n", 1, 6, "node 'a' (PReLU)",
               "num_parameters: 3, where the input has 8 channels (dim 1): PReLU takes 1 or the channels");
    expect_err("rrelu.yaml", HEAD "      - {name: a, kind: RReLU, lower: 0.5, upper: 0.2}\n", 1, 6, "node 'a' (RReLU)",
               "lower 0.5 is above upper 0.2");
    expect_err("celu.yaml", HEAD "      - {name: a, kind: CELU, alpha: 0}\n", 1, 6, "node 'a' (CELU)",
               "alpha: 0 (CELU divides by alpha)");
    expect_err("softshrink.yaml", HEAD "      - {name: a, kind: Softshrink, lambd: -0.5}\n", 1, 6,
               "node 'a' (Softshrink)", "lambd: -0.5 is outside");
    expect_err("threshold.yaml", HEAD "      - {name: a, kind: Threshold, threshold: 0.5}\n", 1, 6,
               "node 'a' (Threshold)", "value");
    expect_err("alpha_p.yaml", HEAD "      - {name: a, kind: AlphaDropout, p: 1}\n", 1, 6, "node 'a' (AlphaDropout)",
               "p: 1 is outside [0, 1)");
    expect_err("sd_p.yaml", HEAD "      - {name: a, kind: StochasticDepth, p: 1.5, mode: row}\n", 1, 6,
               "node 'a' (StochasticDepth)", "p: 1.5 is outside [0, 1]");
    expect_err("sd_mode.yaml", HEAD "      - {name: a, kind: StochasticDepth, p: 0.2, mode: rows}\n", 0, 6,
               "node 'a' (StochasticDepth): mode: 'rows' is not one of 'row', 'batch'", NULL);
    expect_err("adaptive_list.yaml",
               "name: t\nstages:\n  - name: s\n    input: {shape: [2, 4, 4]}\n    nodes:\n"
               "      - {name: p, kind: AdaptiveAvgPool2d, output_size: [null]}\n",
               0, 6, "node 'p' (AdaptiveAvgPool2d): output_size: a list of 2 values, got 1", NULL);
    expect_err("adaptive_zero.yaml",
               "name: t\nstages:\n  - name: s\n    input: {shape: [2, 4, 4]}\n    nodes:\n"
               "      - {name: p, kind: AdaptiveAvgPool2d, output_size: [0, 3]}\n",
               1, 6, "node 'p' (AdaptiveAvgPool2d)", "output_size: 0 is outside [1, 65536]");
    /* Embedding's padding_idx: a row of the table, negatives from the end (test_kinds runs valid ones) */
#define HEADI "name: t\nstages:\n  - name: s\n    input: {shape: [5], dtype: int64}\n    nodes:\n"
    expect_err("pad_idx.yaml", HEADI "      - {name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 2, "
               "padding_idx: 7}\n", 1, 6, "node 'e' (Embedding)",
               "padding_idx 7 is not a row of the 7-row table (-7..6, as nn.Embedding's)");
    expect_err("pad_idx_neg.yaml", HEADI "      - {name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 2, "
               "padding_idx: -8}\n", 1, 6, "node 'e' (Embedding)", "padding_idx -8 is not a row");
    expect_err("pad_idx_frac.yaml", HEADI "      - {name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 2, "
               "padding_idx: 1.5}\n", 1, 6, "node 'e' (Embedding)", "padding_idx: 1.5 is not a whole number");
#undef HEADI
    /* Permute: PyTorch's dims of the batched input, a permutation keeping the batch at 0 (test_kinds runs
     * the valid ones against PyTorch) */
#define HEAD3 "name: t\nstages:\n  - name: s\n    input: {shape: [2, 3, 4]}\n    nodes:\n"
    expect_err("perm_count.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [0, 2, 1]}\n", 1, 6,
               "node 'p' (Permute)", "dims [0, 2, 1] has 3 entries but the batched input (N, 2, 3, 4) has 4 dimensions");
    expect_err("perm_twice.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [0, 2, -2, 1]}\n", 1, 6,
               "node 'p' (Permute)", "dims [0, 2, -2, 1] is not a permutation: dimension 2 appears twice");
    expect_err("perm_range.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [0, 1, 4, 2]}\n", 1, 6,
               "node 'p' (Permute)", "4 is not a dimension of the batched input (-4..3)");
    expect_err("perm_batch.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [1, 0, 2, 3]}\n", 1, 6,
               "node 'p' (Permute)", "dims [1, 0, 2, 3] moves the batch: dims[0] must be 0");
    expect_err("perm_long.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [0, 1, 2, 3, 4, 5]}\n", 0, 6,
               "node 'p' (Permute): dims: a list of 5 values at most, got 6", NULL);
    expect_err("perm_attr.yaml", HEAD3 "      - {name: p, kind: Permute, dims: [0, 1, 5, 2]}\n", 1, 6,
               "node 'p' (Permute)", "dims: 5 is outside [-5, 4]");
    /* swin's kinds: Roll's shifts and dims pair up over per-sample dims; Pad's pairs fit the input; Narrow's
     * step stays inside; RelativePositionBias's shift below its window (test_kinds runs valid ones) */
    expect_err("roll_count.yaml", HEAD3 "      - {name: r, kind: Roll, shifts: [1, 2], dims: [1]}\n", 1, 6,
               "node 'r' (Roll)", "2 shifts for 1 dims: one shift per dim");
    expect_err("roll_batch.yaml", HEAD3 "      - {name: r, kind: Roll, shifts: 1, dims: 0}\n", 1, 6,
               "node 'r' (Roll)", "dims entry 0 is not a dimension 1..3 of the batched input (0 is the batch)");
    expect_err("roll_twice.yaml", HEAD3 "      - {name: r, kind: Roll, shifts: [1, 1], dims: [3, -1]}\n", 1, 6,
               "node 'r' (Roll)", "dims 3 and -1 are one dimension");
    expect_err("pad_odd.yaml", HEAD3 "      - {name: p, kind: Pad, pad: [1, 2, 3]}\n", 1, 6, "node 'p' (Pad)",
               "pad has 3 values: pairs (before, after) for at most the input's 3 per-sample dimensions");
    expect_err("pad_batch.yaml", HEAD3 "      - {name: p, kind: Pad, pad: [0, 0, 0, 0, 0, 0, 1, 1]}\n", 1, 6,
               "node 'p' (Pad)", "pad has 8 values");
    expect_err("pad_neg.yaml", HEAD3 "      - {name: p, kind: Pad, pad: [0, -1]}\n", 1, 6, "node 'p' (Pad)",
               "pad: -1 is outside [0, ");
    expect_err("pad_long.yaml", HEAD3 "      - {name: p, kind: Pad, pad: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}\n", 0, 6,
               "node 'p' (Pad): pad: a list of 8 values at most, got 10", NULL);
    /* an empty list is Reshape's shape (one value per sample) only; CumSum's dim after the batch */
    expect_err("ln_empty.yaml", HEAD3 "      - {name: l, kind: LayerNorm, normalized_shape: []}\n", 0, 6,
               "node 'l' (LayerNorm): normalized_shape: an empty list (give at least one value)", NULL);
    expect_err("reshape_scalar.yaml", HEAD3 "      - {name: r, kind: Reshape, shape: []}\n", 1, 6, "node 'r' (Reshape)",
               "shape: 24 elements per sample cannot be viewed as the given shape");
    expect_err("cumsum_batch.yaml", HEAD3 "      - {name: c, kind: CumSum, dim: 0}\n", 1, 6, "node 'c' (CumSum)",
               "dim 0 is not a dimension 1..3 of the batched input (0 is the batch)");
    expect_err("narrow_step.yaml", HEAD3 "      - {name: n, kind: Narrow, dim: -1, start: 1, length: 3, step: 2}\n",
               1, 6, "node 'n' (Narrow)", "start 1 + (length 3 - 1) * step 2 is past dim -1 of size 4");
    expect_err("rpb_shift.yaml", HEAD3 "      - {name: b, kind: RelativePositionBias, window_size: 2, num_heads: 1, "
               "shift_size: [0, 2]}\n", 1, 6, "node 'b' (RelativePositionBias)", "shift_size 2 is not below "
               "window_size 2");
    /* Scale: a learned tensor broadcast as (C, 1, 1) over (C, H, W); its state_dict suffix a word */
    expect_err("scale_shape.yaml", HEAD3 "      - {name: s, kind: Scale, shape: [2, 1, 4]}\n", 1, 6,
               "node 's' (Scale)", "shape [2, 1, 4] does not broadcast over the input (2, 3, 4) as Scale takes it");
    expect_err("scale_size.yaml", HEAD3 "      - {name: s, kind: Scale, shape: [4, 1]}\n", 1, 6,
               "node 's' (Scale)", "shape [4, 1] does not broadcast");
    expect_err("scale_batch.yaml", HEAD3 "      - {name: s, kind: Scale, shape: [2, 2, 1, 1]}\n", 1, 6,
               "node 's' (Scale)", "does not broadcast");
    expect_err("scale_name.yaml", HEAD3 "      - {name: s, kind: Scale, shape: [2, 1, 1], parameter: a.b}\n", 0, 6,
               "node 's' (Scale): parameter: 'a.b' is not a name of 1 to 64 letters, digits and _", NULL);
    /* MatMul: batch dims broadcast (equal, or 1), one rank for two computed operands, inner dims matching,
     * stacks of matrices only; a parameter operand with its shape, never with two inputs */
    expect_err("matmul_lead.yaml", HEAD3 "      - {name: a, kind: Permute, dims: [0, 2, 1, 3], input: input}\n"
               "      - {name: m, kind: MatMul, inputs: [input, a], transpose_b: true}\n", 1, 7, "node 'm' (MatMul)",
               "input 'input' is (2, 3, 4) and input 'a' is (3, 2, 4) (transpose_b): batch dimension 1 (2 and 3) "
               "does not broadcast (equal, or 1 in one of them)");
    expect_err("matmul_rank.yaml", HEAD3 "      - {name: a, kind: Reshape, shape: [6, 4], input: input}\n"
               "      - {name: m, kind: MatMul, inputs: [input, a], transpose_b: true}\n", 1, 7, "node 'm' (MatMul)",
               "MatMul takes two computed inputs of one rank");
    expect_err("matmul_pshape.yaml", HEAD3 "      - {name: m, kind: MatMul, parameter: W}\n", 1, 6, "node 'm' (MatMul)",
               "MatMul's parameter takes a shape of 2 to 4 dimensions (a stack of matrices); it has 0");
    expect_err("matmul_shape.yaml", HEAD3 "      - {name: m, kind: MatMul, shape: [4, 4], inputs: [input, input]}\n",
               1, 6, "node 'm' (MatMul)", "MatMul's shape is its parameter's");
    expect_err("matmul_pin2.yaml", HEAD3 "      - {name: m, kind: MatMul, parameter: W, shape: [4, 4], "
               "inputs: [input, input]}\n", 1, 6, "node 'm' (MatMul)", "MatMul takes two inputs, or one and a "
               "`parameter` (with its `shape`); it has 2 inputs and a parameter");
    expect_err("matmul_plead.yaml", HEAD3 "      - {name: m, kind: MatMul, parameter: W, shape: [2, 1, 4, 4]}\n", 1, 6,
               "node 'm' (MatMul)", "parameter 'm.W' is [2, 1, 4, 4]: the parameter has more dimensions than the "
               "input's sample and the extra leading ones face the batch, so they must be 1");
    expect_err("matmul_pinner.yaml", HEAD3 "      - {name: m, kind: MatMul, parameter: null, shape: [3, 5], "
               "parameter_side: left}\n", 1, 6, "node 'm' (MatMul)", "parameter 'm' is [3, 5] and input 'input' is "
               "(2, 3, 4): the inner dimensions differ (5 and 3)");
    expect_err("matmul_inner.yaml", HEAD3 "      - {name: m, kind: MatMul, inputs: [input, input]}\n", 1, 6,
               "node 'm' (MatMul)", "input 'input' is (2, 3, 4) and input 'input' is (2, 3, 4): the inner "
               "dimensions differ (4 and 3): (..., m, k) @ (..., k, n)");
    expect_err("matmul_vec.yaml", HEAD3 "      - {name: f, kind: Flatten, input: input}\n"
               "      - {name: m, kind: MatMul, inputs: [f, f]}\n", 1, 7, "node 'm' (MatMul)",
               "input 'f' is (24) and input 'f' is (24): MatMul takes float32 stacks of matrices (2 to 4 "
               "dimensions per sample; the batch is never a matrix dimension)");
    expect_err("mulconst.yaml", HEAD3 "      - {name: s, kind: MulConstant}\n", 0, 6, "node 's' (MulConstant)",
               "value");
    /* MaskedFill: a triangle of the last two dims of a stack of matrices; -inf a value, nan not */
    expect_err("mfill_vec.yaml", HEAD3 "      - {name: f, kind: Flatten, input: input}\n"
               "      - {name: m, kind: MaskedFill, mask: triu, value: -inf}\n", 1, 7, "node 'm' (MaskedFill)",
               "(24)");
    expect_err("mfill_mask.yaml", HEAD3 "      - {name: m, kind: MaskedFill, mask: diag, value: 0}\n", 0, 6,
               "node 'm' (MaskedFill): mask: 'diag' is not one of 'triu', 'tril'", NULL);
    expect_err("mfill_nan.yaml", HEAD3 "      - {name: m, kind: MaskedFill, mask: tril, value: nan}\n", 0, 6,
               "node 'm' (MaskedFill): value: 'nan' is neither a number nor a size of the model", NULL);
    expect_err("mfill_value.yaml", HEAD3 "      - {name: m, kind: MaskedFill, mask: tril}\n", 0, 6,
               "node 'm' (MaskedFill)", "value");
    expect_err("mha_causal.yaml", HEAD3 "      - {name: f, kind: Flatten, start_dim: 2, input: input}\n"
               "      - {name: m, kind: MultiheadAttention, embed_dim: 12, num_heads: 2, batch_first: true, "
               "causal: 1}\n", 0, 7, "node 'm' (MultiheadAttention): causal: '1' is not true or false", NULL);
#undef HEAD3
}

static void test_shipped(void) {
    char list[512], path[1024];
    ps_err e = {0};
    ps_model_def_list_shipped(list, sizeof list);
    CONTAINS(list, "cartpole_policy, mnist_cnn, rnn_lm");
    CHECK_MSG(ps_model_def_find_arch("mnist_cnn", path, sizeof path, &e) == PS_OK, "%s", e.msg);
    CONTAINS(path, "mnist_cnn.yaml");
    CHECK(ps_model_def_find_arch("nope", path, sizeof path, &e) == PS_ERR_NOT_FOUND);
    CONTAINS(e.msg, "no model 'nope'");
    CHECK(ps_model_def_find_arch("../x", path, sizeof path, &e) == PS_ERR_INVALID_ARGUMENT);
    ps_model_def *d = ps_model_def_load("rnn_lm", NULL, &e);
    CHECK_MSG(d, "%s", e.msg);
    if (d) {
        CHECK(d->nstages == 3 && d->nsizes == 4 && !strcmp(d->stages[2].name, "rnn"));
        CHECK(ps_model_def_size(d, "ntoken") && ps_model_def_size(d, "ntoken")->def == 10000);
        CHECK(ps_model_def_size(d, "dropout")->hi_open);
        ps_model_def_free(d);
    }
}

/* A DAG: stage input fans out to two branches, summed, then a residual Add
 * with a Linear of the sum; two stages. */
static const char *DAG =
    "name: dag\n"
    "about: a small DAG\n"
    "stages:\n"
    "  - name: s1\n"
    "    input: {shape: [6], dtype: float32}\n"
    "    nodes:\n"
    "      - {name: block.left, kind: Linear, out_features: 5, input: input}\n"
    "      - {name: block.right, kind: Linear, out_features: 5, input: input}\n"
    "      - {name: block.act, kind: ReLU, input: block.right}\n"
    "      - {name: block.sum, kind: Add, inputs: [block.left, block.act]}\n"
    "      - {name: block-1.proj, kind: Linear, out_features: 5}\n"
    "      - {name: block.res, kind: Add, inputs: [block-1.proj, block.sum, block.left]}\n"
    "  - name: s2\n"
    "    nodes:\n"
    "      - {name: head, kind: Linear, out_features: 3}\n"
    "      - {name: out, kind: LogSoftmax, dim: -1}\n";

static void test_dag(const char *backend) {
    const char *path = write_file("dag.yaml", DAG);
    ps_err e = {0};
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 5, .compute_threads = 1, .lr = 0.1f};
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m, "%s", e.msg);
    if (!m) return;
    CHECK(ps_model_num_stages(m) == 2 && ps_model_num_params(m) == 8);
    CHECK(ps_model_find_param(m, "block.left.weight") == 0 && ps_model_find_param(m, "block-1.proj.bias") == 5);
    CHECK(ps_model_stage(m, 0)->out_dims[0] == 5 && ps_model_stage(m, 1)->in_dims[0] == 5);
    const int n = 3, K = 6, OUT = 3;
    rng r = {11};
    float x[18], rw[9], out[9], gin[18];
    for (int i = 0; i < n * K; i++) x[i] = rng_uniform(&r);
    for (int i = 0; i < n * OUT; i++) rw[i] = rng_uniform(&r);
    ps_tape *t = NULL;
    CHECK(ps_model_forward_range(m, 0, 1, x, n, 1, NULL, 0, out, &t, NULL, &e) == PS_OK);
    ps_grads *g = ps_grads_create(m, &e);
    CHECK_MSG(t && g && ps_model_backward_acc(m, t, rw, gin, g, &e) == PS_OK, "%s", e.msg);
    /* central differences of L = sum(out * rw) in double */
    double h = 1e-2;
    float fd[18];
    for (int i = 0; i < n * K; i++) {
        float xp[18], op[9], om[9];
        double lp = 0, lm = 0;
        memcpy(xp, x, sizeof xp);
        xp[i] = x[i] + (float)h;
        ps_model_forward_range(m, 0, 1, xp, n, 0, NULL, 0, op, NULL, NULL, &e);
        xp[i] = x[i] - (float)h;
        ps_model_forward_range(m, 0, 1, xp, n, 0, NULL, 0, om, NULL, NULL, &e);
        for (int k = 0; k < n * OUT; k++) { lp += op[k] * rw[k]; lm += om[k] * rw[k]; }
        fd[i] = (float)((lp - lm) / (2 * h));
    }
    char what[64];
    snprintf(what, sizeof what, "%s dag grad_in vs finite differences", backend);
    check_array(what, gin, fd, (size_t)(n * K), 2e-3, 2e-2);
    /* eval equals the training forward (no dropout) */
    float ev[9];
    CHECK(ps_model_forward_range(m, 0, 1, x, n, 0, NULL, 0, ev, NULL, NULL, &e) == PS_OK);
    snprintf(what, sizeof what, "%s dag eval == train", backend);
    check_array(what, ev, out, (size_t)(n * OUT), 0, 0);
    ps_grads_free(g);
    ps_tape_free(t);
    ps_model_free(m);
}

/* x(8) -> a Linear(16) -> b Tanh -> c Linear(16) -> d Add(c, b) ->
 * e LogSoftmax. Backward reads x (a's input), b (Tanh's output and c's
 * input) and e (LogSoftmax's output): 8 + 16 + 16 floats per sample. a, c
 * and d are dead once read (Tanh and Add may overwrite theirs in place, but
 * LogSoftmax writes a new tensor, so d's memory must be released). */
static const char *PLAN =
    "name: plan\n"
    "stages:\n"
    "  - name: s\n"
    "    input: {shape: [8], dtype: float32}\n"
    "    nodes:\n"
    "      - {name: a, kind: Linear, out_features: 16}\n"
    "      - {name: b, kind: Tanh}\n"
    "      - {name: c, kind: Linear, out_features: 16}\n"
    "      - {name: d, kind: Add, inputs: [c, b]}\n"
    "      - {name: e, kind: LogSoftmax, dim: -1}\n";

static void test_plan(const char *backend) {
    const char *path = write_file("plan.yaml", PLAN);
    ps_err e = {0};
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 3, .compute_threads = 1, .lr = 0.1f};
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m, "%s", e.msg);
    if (!m) return;
    enum { N = 5, PER = (8 + 16 + 16) * 4 };
    float x[N * 8], out[N * 16];
    rng r = {7};
    for (int i = 0; i < N * 8; i++) x[i] = rng_uniform(&r);
    ps_tape *t = NULL;
    CHECK_MSG(ps_model_forward_range(m, 0, 0, x, N, 1, NULL, 0, out, &t, NULL, &e) == PS_OK, "%s", e.msg);
    if (t) {
        CHECK_MSG(ps_tape_bytes(t) == (size_t)N * PER, "%s: the tape keeps %zu bytes for %d samples, want %d",
                  backend, ps_tape_bytes(t), N, N * PER);
        ps_tape_free(t);
    }
    /* the stage table's activation bytes per sample */
    char buf[4096] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    CHECK(f && ps_model_describe(&o, NULL, f, &e) == PS_OK);
    if (f) fclose(f);
    char row[64];
    snprintf(row, sizeof row, "%d  cpu", PER);
    CONTAINS(buf, row);
    ps_model_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ps-test-modeldef.XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    test_errors();
    test_shared_errors();
    test_weight_norm_errors();
    test_shipped();
    test_dag("ref");
    test_dag("dnnl");
    test_plan("ref");
    test_plan("dnnl");
    test_rmtree(g_dir);
    return check_summary("test_modeldef");
}
