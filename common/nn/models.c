/* models.c - the model registry (see models.h). */
#include "models.h"

#include <stdio.h>
#include <string.h>

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- mnist_cnn: PyTorch's RPC parameter-server tutorial network ----
 * conv1, relu, conv2, max_pool2d(2), Dropout2d(0.25), flatten | fc1, relu,
 * Dropout(0.5), fc2, log_softmax. The "|" is the tutorial's device split.
 * (The tutorial's first dropout is nn.Dropout2d acting on the 4-D conv
 * output: it drops whole channels; its second acts on (N, 128), where
 * Dropout2d drops elements, as nn.Dropout.) */
static const ps_layer_def mnist_conv[] = {
    {.kind = "conv2d", .name = "conv1", .out = 32, .k = 3, .stride = 1},
    {.kind = "relu"},
    {.kind = "conv2d", .name = "conv2", .out = 64, .k = 3, .stride = 1},
    {.kind = "maxpool2d", .k = 2, .stride = 2},
    {.kind = "dropout2d", .p = 0.25f},
    {.kind = "flatten"},
};
static const ps_layer_def mnist_fc[] = {
    {.kind = "linear", .name = "fc1", .out = 128},
    {.kind = "relu"},
    {.kind = "dropout", .p = 0.5f},
    {.kind = "linear", .name = "fc2", .out = 10},
    {.kind = "log_softmax"},
};
static const ps_stage_def mnist_stages[] = {
    {.name = "conv", .in_ndim = 3, .in_dims = {1, 28, 28}, .in_dtype = PS_DTYPE_F32, .layers = mnist_conv,
     .nlayers = LEN(mnist_conv)},
    {.name = "fc", .inherit = 1, .layers = mnist_fc, .nlayers = LEN(mnist_fc)},
};

/* ---- cartpole_policy: pytorch/examples reinforcement_learning/reinforce.py
 * Policy: affine1 Linear(4, 128), Dropout(0.6), relu, affine2
 * Linear(128, 2), softmax(dim=1). */
static const ps_layer_def cartpole_policy[] = {
    {.kind = "linear", .name = "affine1", .out = 128},
    {.kind = "dropout", .p = 0.6f},
    {.kind = "relu"},
    {.kind = "linear", .name = "affine2", .out = 2},
    {.kind = "softmax"},
};
static const ps_stage_def cartpole_stages[] = {
    {.name = "policy", .in_ndim = 1, .in_dims = {4}, .in_dtype = PS_DTYPE_F32, .layers = cartpole_policy,
     .nlayers = LEN(cartpole_policy)},
};

/* ---- rnn_lm: pytorch/examples distributed/rpc/rnn (EmbeddingTable and
 * Decoder; the LSTM between them runs on the trainer), initialised as
 * word_language_model's init_weights: encoder and decoder weights
 * U(-0.1, 0.1), decoder bias 0. */
static const ps_layer_def rnn_emb[] = {
    {.kind = "embedding", .name = "encoder", .num_key = "ntoken", .out_key = "ninp",
     .w_init = PS_INIT_UNIFORM, .init_a = 0.1f},
    {.kind = "dropout", .p_key = "dropout"},
};
static const ps_layer_def rnn_dec[] = {
    {.kind = "dropout", .p_key = "dropout"},
    {.kind = "linear", .name = "decoder", .out_key = "ntoken", .w_init = PS_INIT_UNIFORM, .init_a = 0.1f,
     .b_init = PS_INIT_ZERO},
};
/* The trainer's 2-layer nn.LSTM(ninp, nhid): parameters only (PushGradients). */
static const ps_layer_def rnn_lstm[] = {
    {.kind = "lstm", .name = "rnn", .out_key = "nhid", .k = 0},
    {.kind = "lstm", .name = "rnn", .out_key = "nhid", .k = 1},
};
static const ps_stage_def rnn_stages[] = {
    {.name = "emb", .in_ndim = 0, .in_dtype = PS_DTYPE_I64, .layers = rnn_emb, .nlayers = LEN(rnn_emb)},
    {.name = "decoder", .in_ndim = 1, .in_keys = {"nhid"}, .in_dtype = PS_DTYPE_F32, .layers = rnn_dec,
     .nlayers = LEN(rnn_dec)},
    {.name = "rnn", .in_ndim = 1, .in_keys = {"ninp"}, .in_dtype = PS_DTYPE_F32, .layers = rnn_lstm,
     .nlayers = LEN(rnn_lstm)},
};
static const ps_size_key rnn_sizes[] = {
    {"ntoken", 10000, 1, 100000000, 0, 1, "vocabulary size (rows of encoder.weight, outputs of decoder)"},
    {"ninp", 200, 1, 65536, 0, 1, "embedding width (encoder output)"},
    {"nhid", 200, 1, 65536, 0, 1, "hidden width of the trainer's RNN (decoder input)"},
    {"dropout", 0.2, 0, 1, 1, 0, "dropout probability after the encoder and before the decoder"},
};

static const ps_model_def registry[] = {
    {"mnist_cnn", "PyTorch's RPC parameter-server tutorial CNN (MNIST)", 512, mnist_stages, LEN(mnist_stages),
     NULL, 0},
    {"cartpole_policy", "pytorch/examples reinforcement_learning REINFORCE policy (CartPole)", 4096,
     cartpole_stages, LEN(cartpole_stages), NULL, 0},
    {"rnn_lm", "pytorch/examples distributed/rpc/rnn embedding table and decoder (word language model)",
     4096, rnn_stages, LEN(rnn_stages), rnn_sizes, LEN(rnn_sizes)},
};

static const char *const names[] = {"mnist_cnn", "cartpole_policy", "rnn_lm", NULL};
_Static_assert(sizeof names / sizeof names[0] == sizeof registry / sizeof registry[0] + 1,
               "one name per registry row");

int ps_model_def_count(void) { return LEN(registry); }

const ps_model_def *ps_model_def_at(int i) { return i >= 0 && i < LEN(registry) ? &registry[i] : NULL; }

const ps_model_def *ps_model_def_find(const char *name) {
    for (int i = 0; name && i < LEN(registry); i++)
        if (!strcmp(registry[i].name, name)) return &registry[i];
    return NULL;
}

const char *const *ps_model_def_names(void) { return names; }

const ps_size_key *ps_model_def_size(const ps_model_def *def, const char *key) {
    for (int i = 0; i < def->nsizes; i++)
        if (!strcmp(def->sizes[i].key, key)) return &def->sizes[i];
    return NULL;
}

const ps_size_key *ps_model_any_size(const char *key) {
    for (int i = 0; i < LEN(registry); i++) {
        const ps_size_key *k = ps_model_def_size(&registry[i], key);
        if (k) return k;
    }
    return NULL;
}

int ps_model_def_stage(const ps_model_def *def, const char *name) {
    for (int s = 0; s < def->nstages; s++)
        if (!strcmp(def->stages[s].name, name)) return s;
    return -1;
}

const char *ps_model_def_stage_list(const ps_model_def *def, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = 0;
    for (int s = 0; s < def->nstages && o < size; s++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", s ? ", " : "", def->stages[s].name);
    return buf;
}
