/* test_config.c - the config table, YAML loading, printing and
 * command-line overrides. Broken files are written into a fresh mkdtemp
 * directory; every error must name the file and line, the key and the
 * value. Run from the repository root (it reads configs/local.yaml and
 * docs/config.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "model.h"
#include "placement.h"
#include "support/tmpdir.h"

static char g_dir[] = "/tmp/ps_test_config_XXXXXX";

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fputs(text, f);
    fclose(f);
}

/* Write text to <dir>/name, return its path in a static buffer. */
static const char *tmpfile_with(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    write_text(path, text);
    return path;
}

#define CONTAINS(msg, s) CHECK_MSG(strstr((msg), (s)) != NULL, "'%s' not in: %s", (s), (msg))

static void test_defaults(void) {
    ps_config c;
    ps_config_defaults(&c);
    CHECK(!strcmp(c.server.listen, "127.0.0.1:50051"));
    CHECK(!strcmp(c.server.address, "127.0.0.1:50051"));
    CHECK(c.server.rpc.threads == 4);
    CHECK(c.server.compute_threads == 0);
    CHECK(c.server.service.context_ttl_s == 120.0);
    CHECK(c.server.rpc.max_message_bytes == 64 << 20 && c.server.service.max_message_bytes == 64 << 20);
    CHECK(c.server.log_level == PS_LOG_INFO);
    CHECK(c.server.service.cons.mode == PS_CONS_HOGWILD);
    CHECK(!strcmp(c.model.arch, "mnist_cnn") && !c.model.file[0]);
    CHECK(c.model.seed == 1);
    CHECK(!strcmp(ps_config_enum_name("model.backend", c.model.backend), "dnnl"));
    CHECK(c.model.n_placement == 0);   /* stages not named run on cpu */
    CHECK(c.model.n_sizes == 0);       /* the registry's defaults */
    CHECK(c.optimizer.kind == PS_OPTIM_SGD);
    CHECK(c.optimizer.lr == 0.03);
    CHECK(c.optimizer.momentum == 0.0);
    CHECK(c.optimizer.weight_decay == 0.0);
    CHECK(c.optimizer.beta1 == 0.9);      /* torch.optim.Adam's defaults */
    CHECK(c.optimizer.beta2 == 0.999);
    CHECK(c.optimizer.eps == 1e-8);
    CHECK(c.trainer.world_size == 3);
    CHECK(c.trainer.batch_size == 32);
    CHECK(c.trainer.epochs == 1);
    CHECK(!strcmp(c.trainer.data, "data/mnist"));
    CHECK(c.trainer.log_every == 20);
    CHECK(c.trainer.seed == 0);
    CHECK(c.trainer.rpc_timeout_s == 60.0);
    CHECK(c.trainer.check_gradients == false);
    CHECK(c.security.tls == false);
    CHECK(c.security.allow_insecure == false && c.security.mutual_tls == false);
    CHECK(c.security.cert[0] == 0 && c.security.tokens_file[0] == 0 && c.security.token_file[0] == 0);
    CHECK(c.server.service.nonfinite_policy == PS_NONFINITE_REJECT);
    CHECK(c.trainer.retry_max_s == 300.0 && c.trainer.retry_backoff_s == 0.2 &&
          c.trainer.retry_backoff_max_s == 10.0);
    CHECK(!strcmp(ps_config_enum_name("model.backend", c.model.backend), "dnnl"));
    CHECK(!strcmp(ps_config_enum_name("server.log_level", PS_LOG_WARN), "warn"));
    CHECK(!strcmp(ps_config_enum_name("server.consistency", PS_CONS_HOGWILD), "hogwild"));
    CHECK(!strcmp(ps_config_enum_name("server.consistency", PS_CONS_SSP), "ssp"));
    CHECK(ps_config_enum_name("server.consistency", 3) == NULL);
    CHECK(ps_config_enum_name("model.backend", 2) == NULL);
    CHECK(ps_config_enum_name("server.threads", 0) == NULL);
}

static const char *GOOD =
    "# every key, none at its default\n"
    "server:\n"
    "  listen: \"0.0.0.0:6000\"\n"
    "  address: ps.example:6000\n"
    "  threads: 8\n"
    "  compute_threads: 12\n"
    "  context_ttl_s: 30.5\n"
    "  max_message_mb: 128\n"
    "  log_level: debug\n"
    "  consistency: hogwild\n"
    "model:\n"
    "  name: mnist_cnn\n"
    "  seed: 18446744073709551615\n"
    "  backend: ref\n"
    "  placement:\n"
    "    fc: cuda:1\n"
    "    head: cuda:63\n"
    "optimizer:\n"
    "  type: sgd\n"
    "  lr: 0.1\n"
    "  momentum: 0.9\n"
    "  weight_decay: 5e-4\n"
    "trainer:\n"
    "  world_size: 5\n"
    "  batch_size: 64\n"
    "  epochs: 3\n"
    "  data: '/srv/mnist data'\n"
    "  log_every: 1000000\n"
    "  seed: 42\n"
    "  rpc_timeout_s: 3600\n"
    "  check_gradients: yes\n"
    "security:\n"
    "  tls: on\n"
    "  cert: /etc/psd/server.pem\n"
    "  key: /etc/psd/server.key\n"
    "  ca: /etc/psd/ca.pem\n"
    "  mutual_tls: true\n"
    "  tokens_file: /etc/psd/tokens\n";

static void check_good_values(const ps_config *c) {
    CHECK(!strcmp(c->server.listen, "0.0.0.0:6000"));
    CHECK(!strcmp(c->server.address, "ps.example:6000"));
    CHECK(c->server.rpc.threads == 8);
    CHECK(c->server.compute_threads == 12);
    CHECK(c->server.service.context_ttl_s == 30.5);
    CHECK(c->server.rpc.max_message_bytes == 128 << 20 && c->server.service.max_message_bytes == 128 << 20);
    CHECK(c->server.log_level == PS_LOG_DEBUG);
    CHECK(c->server.service.cons.mode == PS_CONS_HOGWILD);
    CHECK(c->model.seed == UINT64_MAX);
    CHECK(!strcmp(ps_config_enum_name("model.backend", c->model.backend), "ref"));
    /* Placement keeps the file's stages in order; stage names are checked
     * against the model by ps_config_check_model, not while loading. */
    CHECK(c->model.n_placement == 2);
    CHECK(!strcmp(c->model.placement[0].stage, "fc") && !strcmp(c->model.placement[0].device, "cuda:1"));
    CHECK(!strcmp(c->model.placement[1].stage, "head") && !strcmp(c->model.placement[1].device, "cuda:63"));
    ps_err e;
    CHECK(ps_config_check_model(c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.placement.head: model 'mnist_cnn' has no stage 'head' (stages: conv, fc)");
    CHECK(c->optimizer.lr == 0.1);
    CHECK(c->optimizer.momentum == 0.9);
    CHECK(c->optimizer.weight_decay == 5e-4);
    CHECK(c->trainer.world_size == 5);
    CHECK(c->trainer.batch_size == 64);
    CHECK(c->trainer.epochs == 3);
    CHECK(!strcmp(c->trainer.data, "/srv/mnist data"));
    CHECK(c->trainer.log_every == 1000000);
    CHECK(c->trainer.seed == 42);
    CHECK(c->trainer.rpc_timeout_s == 3600.0);
    CHECK(c->trainer.check_gradients == true);
    CHECK(c->security.tls == true && c->security.mutual_tls == true);
    CHECK(!strcmp(c->security.cert, "/etc/psd/server.pem") && !strcmp(c->security.key, "/etc/psd/server.key"));
    CHECK(!strcmp(c->security.ca, "/etc/psd/ca.pem") && !strcmp(c->security.tokens_file, "/etc/psd/tokens"));
}

static void test_good_file(void) {
    ps_config c, back;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    CHECK_MSG(ps_config_load(&c, tmpfile_with("good.yaml", GOOD), &e) == PS_OK, "%s", e.msg);
    check_good_values(&c);

    /* Print, load the print on top of fresh defaults: same config. */
    char printed[512];
    snprintf(printed, sizeof printed, "%s/printed.yaml", g_dir);
    FILE *f = fopen(printed, "w");
    ps_config_print(&c, f);
    fclose(f);
    ps_config_defaults(&back);
    CHECK_MSG(ps_config_load(&back, printed, &e) == PS_OK, "%s", e.msg);
    check_good_values(&back);
    CHECK(memcmp(&c, &back, sizeof c) == 0);

    /* The printed defaults read back as the defaults. */
    ps_config d;
    ps_config_defaults(&d);
    f = fopen(printed, "w");
    ps_config_print(&d, f);
    fclose(f);
    ps_config_defaults(&back);
    ps_config_set(&back, "trainer.epochs", "7", "test", &e); /* must be overwritten */
    CHECK_MSG(ps_config_load(&back, printed, &e) == PS_OK, "%s", e.msg);
    CHECK(memcmp(&d, &back, sizeof d) == 0);

    /* Empty file, comment-only file and empty sections change nothing. */
    ps_config_defaults(&back);
    CHECK(ps_config_load(&back, tmpfile_with("empty.yaml", ""), &e) == PS_OK);
    CHECK(ps_config_load(&back, tmpfile_with("comment.yaml", "# nothing\n"), &e) == PS_OK);
    CHECK(ps_config_load(&back, tmpfile_with("sect.yaml", "server:\ntrainer: {}\n"), &e) == PS_OK);
    CHECK(memcmp(&d, &back, sizeof d) == 0);
}

/* configs/local.yaml spells out exactly the defaults. */
static void test_local_yaml(void) {
    const char *path = "configs/local.yaml";
    CHECK_MSG(access(path, R_OK) == 0, "%s not found: run from the repository root", path);
    ps_config c, d;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    ps_config_defaults(&d);
    /* The file spells out the placement the defaults leave implicit. */
    CHECK(ps_config_set(&d, "model.placement.conv", "cpu", "test", &e) == PS_OK);
    CHECK(ps_config_set(&d, "model.placement.fc", "cpu", "test", &e) == PS_OK);
    CHECK_MSG(ps_config_load(&c, path, &e) == PS_OK, "%s", e.msg);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    CHECK(ps_config_check_model(&c, &e) == PS_OK);
    CHECK(c.trainer.world_size == 3);
}

/* Every key that ps_config_print writes is documented in docs/config.md. */
static void test_docs(void) {
    FILE *f = fopen("docs/config.md", "r");
    CHECK_MSG(f != NULL, "docs/config.md not found: run from the repository root");
    if (!f) return;
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);

    ps_config c;
    ps_config_defaults(&c);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    ps_config_print(&c, m);
    fclose(m);
    char section[64] = "";
    int keys = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char name[64];
        if (line[0] != ' ') {
            if (sscanf(line, "%63[^:]:", section) != 1) section[0] = '\0';
            continue;
        }
        if (line[2] == ' ') continue; /* placement stages */
        if (sscanf(line + 2, "%63[^:]:", name) != 1) continue;
        char key[160];
        snprintf(key, sizeof key, "`%s.%s`", section, name);
        if (!strcmp(key, "`model.placement`")) snprintf(key, sizeof key, "`model.placement.");
        if (!strcmp(key, "`model.sizes`")) snprintf(key, sizeof key, "`model.sizes.");
        CHECK_MSG(strstr(doc, key) != NULL, "docs/config.md lacks %s", key);
        keys++;
    }
    CHECK_MSG(keys == 87, "%d keys", keys);
    free(text);

    /* servers.<name>.<field>: every field a printed server has */
    ps_err e;
    ps_err_clear(&e);
    CHECK(ps_config_set(&c, "servers.ps0.address", "127.0.0.1:1", "test", &e) == PS_OK);
    m = open_memstream(&text, &len);
    ps_config_print(&c, m);
    fclose(m);
    int fields = 0;
    for (char *p = strstr(text, "\n  ps0:\n"); p && (p = strstr(p, "\n    ")) && p[5] != ' ';) {
        char name[64], key[160];
        p += 5;
        if (sscanf(p, "%63[^:]:", name) != 1) break;
        snprintf(key, sizeof key, "`servers.<name>.%s`", name);
        CHECK_MSG(strstr(doc, key) != NULL, "docs/config.md lacks %s", key);
        fields++;
    }
    CHECK_MSG(fields == 7, "%d server fields", fields);
    free(text);
    CHECK(strstr(doc, "`model.placement.<stage>.shards`") != NULL);
    CHECK(strstr(doc, "`model.placement.<stage>.rows`") != NULL);
}

/* Load text on top of defaults; expect failure with code, a message that
 * starts with "<path>:<line>:" and contains each needle.
 */
static void expect_bad(const char *name, const char *text, ps_status code, int line,
                       const char *n1, const char *n2) {
    char path[512];
    if (text) snprintf(path, sizeof path, "%s", tmpfile_with(name, text));
    else snprintf(path, sizeof path, "%s/%s", g_dir, name); /* never written */
    char head[600];
    if (line > 0) snprintf(head, sizeof head, "%s:%d:", path, line); /* ":3:2" for syntax */
    else snprintf(head, sizeof head, "%s:", path);
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    ps_status st = ps_config_load(&c, path, &e);
    CHECK_MSG(st == code, "%s: got %s, want %s (%s)", name, ps_status_name(st),
              ps_status_name(code), e.msg);
    CHECK_MSG(!strncmp(e.msg, head, strlen(head)), "%s: message does not start with '%s': %s",
              name, head, e.msg);
    if (n1) CONTAINS(e.msg, n1);
    if (n2) CONTAINS(e.msg, n2);
}

/* Config files ps_config_load must refuse: the file, its text (NULL: never
 * written), the code, the line the error names and what it must say. */
typedef struct bad_file {
    const char *name, *text;
    ps_status code;
    int line;
    const char *n1, *n2;
} bad_file;

static const bad_file k_bad_files[] = {
    {"unknown.yaml", "server:\n  threads: 2\n  lisen: 1.2.3.4:5\n", PS_ERR_NOT_FOUND, 3,
     "unknown key 'server.lisen'", "did you mean 'server.listen'"},
    {"unknown_section.yaml", "# x\nservr:\n  listen: a\n", PS_ERR_NOT_FOUND, 2,
     "unknown key 'servr'", "did you mean 'server'"},
    {"range.yaml", "optimizer:\n  momentum: 0.5\n\n  lr: -1\n", PS_ERR_INVALID_ARGUMENT, 4,
     "optimizer.lr: '-1' is out of range (0, 100]", NULL},
    {"range_int.yaml", "trainer:\n  world_size: 1\n", PS_ERR_INVALID_ARGUMENT, 2,
     "trainer.world_size: '1' is out of range [2, 1024]", NULL},
    {"range_open.yaml", "optimizer:\n  momentum: 1\n", PS_ERR_INVALID_ARGUMENT, 2,
     "optimizer.momentum: '1' is out of range [0, 1)", NULL},
    {"nonnum.yaml", "server:\n  threads: four\n", PS_ERR_INVALID_ARGUMENT, 2,
     "server.threads: 'four' is not an integer", NULL},
    {"float_int.yaml", "server:\n  threads: 4.0\n", PS_ERR_INVALID_ARGUMENT, 2,
     "server.threads: '4.0' is not an integer", NULL},
    {"trailing.yaml", "optimizer:\n  lr: 0.1x\n", PS_ERR_INVALID_ARGUMENT, 2,
     "optimizer.lr: '0.1x' is not a number", NULL},
    {"nan.yaml", "optimizer:\n  lr: .nan\n", PS_ERR_INVALID_ARGUMENT, 2, "optimizer.lr: '.nan' is not a number", NULL},
    {"neg_seed.yaml", "model:\n  seed: -1\n", PS_ERR_INVALID_ARGUMENT, 2,
     "model.seed: '-1' is not an unsigned integer", NULL},
    {"big_seed.yaml", "model:\n  seed: 18446744073709551616\n", PS_ERR_INVALID_ARGUMENT, 2,
     "model.seed: '18446744073709551616' is out of range", NULL},
    {"type_map.yaml", "server:\n  threads:\n    min: 1\n", PS_ERR_FORMAT, 2,
     "server.threads: expected a single value, got a mapping", NULL},
    {"type_list.yaml", "server:\n  listen: [a, b]\n", PS_ERR_FORMAT, 2,
     "server.listen: expected a single value, got a list", NULL},
    {"type_section.yaml", "\n\nserver: 5\n", PS_ERR_FORMAT, 3,
     "server: expected a mapping of keys, got a single value", NULL},
    {"type_placement.yaml", "model:\n  placement: cuda:0\n", PS_ERR_FORMAT, 2,
     "model.placement: expected a mapping", NULL},
    {"device.yaml", "model:\n  placement:\n    conv: gpu:0\n", PS_ERR_INVALID_ARGUMENT, 3,
     "model.placement.conv: 'gpu:0' is not a device", NULL},
    {"device64.yaml", "model:\n  placement:\n    fc: cuda:64\n", PS_ERR_INVALID_ARGUMENT, 3,
     "model.placement.fc: 'cuda:64' is not a device", NULL},
    {"stage.yaml", "model:\n  placement:\n    \"a b\": cpu\n", PS_ERR_INVALID_ARGUMENT, 3,
     "model.placement.a b: stage name", NULL},
    {"stages9.yaml",
     "model:\n  placement:\n    a: cpu\n    b: cpu\n    c: cpu\n    d: cpu\n"
     "    e: cpu\n    f: cpu\n    g: cpu\n    h: cpu\n    i: cpu\n",
     PS_ERR_INVALID_ARGUMENT, 11, "model.placement.i: too many stages", "at most 8"},
    /* sizes of the model set above them in the file: checked on their line */
    {"size_int.yaml", "model:\n  arch: rnn_lm\n  sizes:\n    ntoken: 1.5\n", PS_ERR_INVALID_ARGUMENT, 4,
     "model.sizes.ntoken: '1.5' is not a whole number", NULL},
    {"size_range.yaml", "model:\n  name: rnn_lm\n  sizes:\n    dropout: 1\n", PS_ERR_INVALID_ARGUMENT, 4,
     "model.sizes.dropout: '1' is out of range [0, 1)", NULL},
    {"model_name.yaml", "model:\n  arch: res/net\n", PS_ERR_INVALID_ARGUMENT, 2,
     "model.arch: 'res/net' is not a model name", NULL},
    {"bool.yaml", "trainer:\n  check_gradients: maybe\n", PS_ERR_INVALID_ARGUMENT, 2,
     "trainer.check_gradients: 'maybe' is not a boolean", NULL},
    {"bool1.yaml", "trainer:\n  check_gradients: 1\n", PS_ERR_INVALID_ARGUMENT, 2,
     "trainer.check_gradients: '1' is not a boolean", NULL},
    {"dup.yaml", "server:\n  threads: 2\n  listen: a:1\n  threads: 3\n", PS_ERR_FORMAT, 4,
     "duplicate key 'server.threads' (first given on line 2)", NULL},
    {"dup_section.yaml", "server:\n  threads: 2\nserver:\n  listen: a:1\n", PS_ERR_FORMAT, 3,
     "duplicate key 'server'", NULL},
    {"enum.yaml", "server:\n  consistency: strict\n", PS_ERR_INVALID_ARGUMENT, 2,
     "server.consistency: 'strict' is not one of: hogwild", NULL},
    {"enum_backend.yaml", "model:\n  backend: cuda\n", PS_ERR_INVALID_ARGUMENT, 2,
     "model.backend: 'cuda' is not one of: ref, dnnl", NULL},
    {"empty_value.yaml", "trainer:\n  data:\n", PS_ERR_INVALID_ARGUMENT, 2, "trainer.data: no value given", NULL},
    {"empty_string.yaml", "trainer:\n  data: ''\n", PS_ERR_INVALID_ARGUMENT, 2,
     "trainer.data: must not be empty", NULL},
    {"policy.yaml", "server:\n  nonfinite_policy: ignore\n", PS_ERR_INVALID_ARGUMENT, 2,
     "server.nonfinite_policy: 'ignore' is not one of: reject, skip", NULL},
    {"retry.yaml", "trainer:\n  retry_backoff_s: 0\n", PS_ERR_INVALID_ARGUMENT, 2,
     "trainer.retry_backoff_s: '0' is out of range (0, 60]", NULL},
    {"insecure.yaml", "security:\n  allow_insecure: maybe\n", PS_ERR_INVALID_ARGUMENT, 2,
     "security.allow_insecure: 'maybe' is not a boolean", NULL},
    {"toplist.yaml", "- server\n", PS_ERR_FORMAT, 1, "expected a mapping of sections", "got a list"},
    {"twodocs.yaml", "server:\n  threads: 2\n---\nserver:\n  threads: 3\n", PS_ERR_FORMAT, 4,
     "a second YAML document", NULL},
    {"syntax.yaml", "server:\n  threads: 2\n listen: x\n", PS_ERR_FORMAT, 3, "YAML syntax error", NULL},
    {"missing.yaml", NULL, PS_ERR_NOT_FOUND, 0, "cannot open config", NULL},
};

static void test_bad_files(void) {
    char long_value[400];
    memset(long_value, 'a', 300);
    long_value[300] = '\0';
    char long_file[600];
    snprintf(long_file, sizeof long_file, "server:\n  listen: %s\n", long_value);

    for (size_t i = 0; i < sizeof k_bad_files / sizeof k_bad_files[0]; i++) {
        const bad_file *b = &k_bad_files[i];
        expect_bad(b->name, b->text, b->code, b->line, b->n1, b->n2);
    }
    expect_bad("long.yaml", long_file, PS_ERR_INVALID_ARGUMENT, 2,
               "server.listen: 'aaaa", "is 300 bytes long; at most 255 allowed");
    /* a directory opens, and reading it failed with "byte 0: input error" */
    ps_config c;
    ps_err e;
    ps_config_defaults(&c);
    CHECK(ps_config_load(&c, g_dir, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "cannot read config: it is a directory");
}

/* The lifecycle keys (checkpoints, drain, metrics, log file): defaults,
 * every bad value named with file, line, key and value, and "" = off. */
static void test_service_keys(void) {
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    CHECK(!strcmp(c.server.checkpoint.dir, ""));
    CHECK(c.server.checkpoint.every_steps == 1000);
    CHECK(c.server.checkpoint.every_s == 300.0);
    CHECK(c.server.checkpoint.keep == 3);
    CHECK(c.server.grace_s == 10.0);
    CHECK(!strcmp(c.server.metrics_listen, ""));
    CHECK(!strcmp(c.server.log_file, ""));

    const char *good = "server:\n  checkpoint_dir: /var/lib/psd\n  checkpoint_every_steps: 0\n"
                       "  checkpoint_every_s: 2.5\n  checkpoint_keep: 1\n  grace_s: 0\n"
                       "  metrics_listen: \"[::1]:9464\"\n  log_file: /var/log/psd.log\n";
    CHECK(ps_config_load(&c, tmpfile_with("svc_good.yaml", good), &e) == PS_OK);
    CHECK(!strcmp(c.server.checkpoint.dir, "/var/lib/psd"));
    CHECK(c.server.checkpoint.every_steps == 0 && c.server.checkpoint.every_s == 2.5);
    CHECK(c.server.checkpoint.keep == 1 && c.server.grace_s == 0.0);
    CHECK(!strcmp(c.server.metrics_listen, "[::1]:9464"));
    CHECK(!strcmp(c.server.log_file, "/var/log/psd.log"));
    /* "" switches a feature off again. */
    CHECK(ps_config_load(&c, tmpfile_with("svc_off.yaml", "server:\n  checkpoint_dir: \"\"\n"
                                          "  metrics_listen: ''\n"), &e) == PS_OK);
    CHECK(!strcmp(c.server.checkpoint.dir, "") && !strcmp(c.server.metrics_listen, ""));

    expect_bad("svc_steps.yaml", "server:\n  checkpoint_every_steps: -1\n", PS_ERR_INVALID_ARGUMENT,
               2, "server.checkpoint_every_steps: '-1' is out of range [0, 1000000000]", NULL);
    expect_bad("svc_steps2.yaml", "server:\n  checkpoint_every_steps: 1e3\n",
               PS_ERR_INVALID_ARGUMENT, 2, "server.checkpoint_every_steps: '1e3' is not an integer",
               NULL);
    expect_bad("svc_secs.yaml", "\nserver:\n  checkpoint_every_s: -5\n", PS_ERR_INVALID_ARGUMENT, 3,
               "server.checkpoint_every_s: '-5' is out of range [0, 3.1536e+07]", NULL);
    expect_bad("svc_secs2.yaml", "server:\n  checkpoint_every_s: 10min\n", PS_ERR_INVALID_ARGUMENT,
               2, "server.checkpoint_every_s: '10min' is not a number", NULL);
    expect_bad("svc_keep.yaml", "server:\n  checkpoint_keep: 0\n", PS_ERR_INVALID_ARGUMENT, 2,
               "server.checkpoint_keep: '0' is out of range [1, 1000]", NULL);
    expect_bad("svc_grace.yaml", "server:\n  grace_s: 3601\n", PS_ERR_INVALID_ARGUMENT, 2,
               "server.grace_s: '3601' is out of range [0, 3600]", NULL);
    expect_bad("svc_dir.yaml", "server:\n  checkpoint_dir:\n", PS_ERR_INVALID_ARGUMENT, 2,
               "server.checkpoint_dir: no value given", NULL);
    expect_bad("svc_dir2.yaml", "server:\n  checkpoint_dir: [a]\n", PS_ERR_FORMAT, 2,
               "server.checkpoint_dir: expected a single value, got a list", NULL);
    const char *bad_addrs[] = {"9464", ":9464", "0.0.0.0:0", "0.0.0.0:65536", "host.example:80",
                               "1.2.3.4:80x", "::1:9464", "[::1]", "[zz]:80", "1.2.3:80", NULL};
    for (int i = 0; bad_addrs[i]; i++) {
        char text[128], want[128];
        snprintf(text, sizeof text, "server:\n  metrics_listen: \"%s\"\n", bad_addrs[i]);
        snprintf(want, sizeof want, "server.metrics_listen: '%s' is not HOST:PORT", bad_addrs[i]);
        expect_bad("svc_metrics.yaml", text, PS_ERR_INVALID_ARGUMENT, 2, want, NULL);
    }
    /* The same checks on the command line. */
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "server.metrics_listen", "localhost:1", "command line", &e) == PS_OK);
    CHECK(ps_config_set(&c, "server.metrics_listen", "127.0.0.1", "command line", &e) ==
          PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "command line: server.metrics_listen: '127.0.0.1' is not HOST:PORT");
    CHECK(!strcmp(c.server.metrics_listen, "localhost:1"));
    CHECK(ps_config_set(&c, "server.grace_s", "abc", "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "command line: server.grace_s: 'abc' is not a number");

    char host[64];
    int port = 0;
    CHECK(ps_config_parse_hostport("localhost:9464", host, sizeof host, &port));
    CHECK(!strcmp(host, "127.0.0.1") && port == 9464);
    CHECK(ps_config_parse_hostport("[::]:65535", host, sizeof host, &port));
    CHECK(!strcmp(host, "::") && port == 65535);
    CHECK(ps_config_parse_hostport("0.0.0.0:1", host, sizeof host, &port));
    CHECK(!strcmp(host, "0.0.0.0") && port == 1);
}

static void test_cli(void) {
    ps_config c, before;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "server.listen", "0.0.0.0:7000", "command line", &e) == PS_OK);
    CHECK(!strcmp(c.server.listen, "0.0.0.0:7000"));
    CHECK(ps_config_set(&c, "optimizer.lr", "10", "command line", &e) == PS_OK);
    CHECK(c.optimizer.lr == 10.0);
    CHECK(ps_config_set(&c, "server.threads", "+64", "command line", &e) == PS_OK);
    CHECK(c.server.rpc.threads == 64);
    CHECK(ps_config_set(&c, "trainer.seed", "18446744073709551615", "command line", &e) == PS_OK);
    CHECK(c.trainer.seed == UINT64_MAX);
    CHECK(ps_config_set(&c, "server.log_level", "error", "command line", &e) == PS_OK);
    CHECK(c.server.log_level == PS_LOG_ERROR);
    CHECK(ps_config_set(&c, "trainer.rpc_timeout_s", "1e-3", "command line", &e) == PS_OK);
    CHECK(c.trainer.rpc_timeout_s == 1e-3);

    const char *yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "ON"};
    const char *no[] = {"false", "False", "no", "NO", "off", "Off"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        c.trainer.check_gradients = false;
        CHECK_MSG(ps_config_set(&c, "trainer.check_gradients", yes[i], "cli", &e) == PS_OK &&
                  c.trainer.check_gradients, "%s", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        c.trainer.check_gradients = true;
        CHECK_MSG(ps_config_set(&c, "trainer.check_gradients", no[i], "cli", &e) == PS_OK &&
                  !c.trainer.check_gradients, "%s", no[i]);
    }

    /* Failures leave the config unchanged and name origin, key and value. */
    before = c;
    CHECK(ps_config_set(&c, "optimizer.lr", "-1", "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(!strcmp(e.msg, "command line: optimizer.lr: '-1' is out of range (0, 100]"));
    CHECK(ps_config_set(&c, "optimizer.lr", "100.000001", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "optimizer.lr", "0", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "optimizer.lr", "inf", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "optimizer.lr", " 0.1", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "optimizer.lr", "", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "server.threads", "4 ", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "server.threads", "0x10", "command line", &e) != PS_OK);
    CHECK(ps_config_set(&c, "server.threads", "99999999999999999999", "cli", &e) != PS_OK);
    CHECK(!strcmp(e.msg, "cli: server.threads: '99999999999999999999' is out of range [1, 64]"));
    CHECK(ps_config_set(&c, "trainer.check_gradients", "y", "cli", &e) != PS_OK);
    CHECK(ps_config_set(&c, "server.consistency", "Hogwild", "cli", &e) != PS_OK);
    {
        ps_config c2 = c;
        CHECK(ps_config_set(&c2, "security.tls", "on", "command line", &e) == PS_OK && c2.security.tls);
        CHECK(ps_config_set(&c2, "security.ca", "", "command line", &e) == PS_OK);  /* optional path */
        CHECK(ps_config_set(&c2, "server.nonfinite_policy", "skip", "cli", &e) == PS_OK &&
              c2.server.service.nonfinite_policy == PS_NONFINITE_SKIP);
    }
    CHECK(ps_config_set(&c, "server.lisen", "x", "command line", &e) == PS_ERR_NOT_FOUND);
    CHECK(!strcmp(e.msg,
                  "command line: unknown key 'server.lisen' (did you mean 'server.listen'?)"));
    CHECK(ps_config_set(&c, "nothing.like.this", "x", "cli", &e) == PS_ERR_NOT_FOUND);
    CHECK(!strcmp(e.msg, "cli: unknown key 'nothing.like.this'"));
    CHECK(ps_config_set(&c, "server", "x", "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "'server' is a section");
    CHECK(ps_config_set(&c, "model.placement", "cpu", "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "cli: model.placement: name a stage");
    CHECK(ps_config_set(&c, "model.placement.conv", "cuda:07", "cli", &e) != PS_OK);
    CHECK(ps_config_set(&c, "model.placement.conv", "cuda:", "cli", &e) != PS_OK);
    CHECK(ps_config_set(&c, "model.placement.conv", "cuda:-1", "cli", &e) != PS_OK);
    CHECK(ps_config_set(&c, "model.placement.conv", "CPU", "cli", &e) != PS_OK);
    CHECK(ps_config_set(&c, "server.address", NULL, "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&c, &before, sizeof c) == 0);

    /* Placement: replace in place, append, then refuse a ninth stage. */
    CHECK(ps_config_set(&c, "model.placement.conv", "cpu", "cli", &e) == PS_OK);
    CHECK(ps_config_set(&c, "model.placement.fc", "cpu", "cli", &e) == PS_OK);
    CHECK(ps_config_set(&c, "model.placement.conv", "cuda:0", "cli", &e) == PS_OK);
    CHECK(c.model.n_placement == 2 && !strcmp(c.model.placement[0].device, "cuda:0"));
    CHECK(ps_config_set(&c, "model.placement.fc", "cuda:10", "cli", &e) == PS_OK);
    CHECK(c.model.n_placement == 2 && !strcmp(c.model.placement[1].device, "cuda:10"));
    const char *more[] = {"s2", "s3", "s4", "s5", "s6", "s7"};
    for (int i = 0; i < 6; i++) {
        char key[64];
        snprintf(key, sizeof key, "model.placement.%s", more[i]);
        CHECK(ps_config_set(&c, key, "cpu", "cli", &e) == PS_OK);
    }
    CHECK(c.model.n_placement == 8 && !strcmp(c.model.placement[7].stage, "s7"));
    CHECK(ps_config_set(&c, "model.placement.s8", "cpu", "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(c.model.n_placement == 8);
    CHECK(ps_config_set(&c, "model.placement.s7", "cuda:5", "cli", &e) == PS_OK);

    /* A command-line override applied after the file wins. */
    ps_config_defaults(&c);
    CHECK(ps_config_load(&c, tmpfile_with("good2.yaml", GOOD), &e) == PS_OK);
    CHECK(ps_config_set(&c, "trainer.batch_size", "16", "command line", &e) == PS_OK);
    CHECK(c.trainer.batch_size == 16 && c.trainer.epochs == 3);
}

/* trainer.batch_size accepts exactly what psd's model accepts in one call:
 * up to ps_model_max_batch; beyond it the error names the key, the value
 * and the range, from the command line and from a file. */
static void test_batch_size_limit(void) {
    ps_model_opts o = {.arch = "mnist_cnn", .cpu_backend = "ref", .seed = 1, .compute_threads = 1, .lr = 0.03f};
    ps_err e;
    ps_err_clear(&e);
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m != NULL, "mnist_cnn: %s", e.msg);
    if (!m) return;
    int max = ps_model_max_batch(m);
    ps_model_free(m);
    char v[32], range[64];
    ps_config c;
    ps_config_defaults(&c);
    snprintf(v, sizeof v, "%d", max);
    CHECK(ps_config_set(&c, "trainer.batch_size", v, "command line", &e) == PS_OK);
    CHECK(c.trainer.batch_size == max);
    CHECK(ps_config_set(&c, "trainer.batch_size", "1", "command line", &e) == PS_OK);
    snprintf(v, sizeof v, "%d", max + 1);
    snprintf(range, sizeof range, "[1, %d]", max);
    ps_err_clear(&e);
    CHECK(ps_config_set(&c, "trainer.batch_size", v, "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(c.trainer.batch_size == 1);
    CONTAINS(e.msg, "command line: trainer.batch_size: ");
    CONTAINS(e.msg, v);
    CONTAINS(e.msg, range);
    CONTAINS(e.msg, "at most");
    ps_err_clear(&e);
    CHECK(ps_config_set(&c, "trainer.batch_size", "4096", "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "'4096'");
    CHECK(ps_config_set(&c, "trainer.batch_size", "0", "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, range);
    expect_bad("batch_big.yaml", "trainer:\n  batch_size: 1000\n", PS_ERR_INVALID_ARGUMENT, 2,
               "trainer.batch_size", range);
}

/* optimizer.type adam and its keys (beta1, beta2, eps), good and bad. */
static void test_optimizer_keys(void) {
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    const char *text = "optimizer:\n  type: adam\n  lr: 0.001\n  beta1: 0.85\n  beta2: 0\n"
                       "  eps: 1\n  weight_decay: 0.01\n";
    CHECK_MSG(ps_config_load(&c, tmpfile_with("adam.yaml", text), &e) == PS_OK, "%s", e.msg);
    CHECK(c.optimizer.kind == PS_OPTIM_ADAM);
    CHECK(!strcmp(ps_config_enum_name("optimizer.type", c.optimizer.kind), "adam"));
    CHECK(c.optimizer.lr == 0.001 && c.optimizer.beta1 == 0.85 && c.optimizer.beta2 == 0.0);
    CHECK(c.optimizer.eps == 1.0 && c.optimizer.weight_decay == 0.01);
    /* Command-line flags go through the same checks. */
    CHECK(ps_config_set(&c, "optimizer.eps", "1e-6", "command line", &e) == PS_OK && c.optimizer.eps == 1e-6);
    CHECK(ps_config_set(&c, "optimizer.beta2", "0.9999", "command line", &e) == PS_OK);
    CHECK(ps_config_set(&c, "optimizer.type", "sgd", "command line", &e) == PS_OK &&
          c.optimizer.kind == PS_OPTIM_SGD);
    CHECK(ps_config_set(&c, "optimizer.eps", "0", "command line", &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(!strcmp(e.msg, "command line: optimizer.eps: '0' is out of range (0, 1]"), "%s", e.msg);
    CHECK(c.optimizer.eps == 1e-6); /* unchanged on error */

    expect_bad("opt_type.yaml", "optimizer:\n  lr: 0.1\n  type: adamw\n", PS_ERR_INVALID_ARGUMENT, 3,
               "optimizer.type: 'adamw' is not one of: sgd, adam", NULL);
    expect_bad("beta1.yaml", "optimizer:\n  type: adam\n  beta1: 1\n", PS_ERR_INVALID_ARGUMENT, 3,
               "optimizer.beta1: '1' is out of range [0, 1)", NULL);
    expect_bad("beta2.yaml", "optimizer:\n  beta2: -0.1\n", PS_ERR_INVALID_ARGUMENT, 2,
               "optimizer.beta2: '-0.1' is out of range [0, 1)", NULL);
    expect_bad("eps.yaml", "optimizer:\n  eps: 0\n", PS_ERR_INVALID_ARGUMENT, 2,
               "optimizer.eps: '0' is out of range (0, 1]", NULL);
    expect_bad("eps_nan.yaml", "optimizer:\n  eps: one\n", PS_ERR_INVALID_ARGUMENT, 2,
               "optimizer.eps: 'one' is not a number", NULL);
    expect_bad("betas.yaml", "optimizer:\n  betas: [0.9, 0.999]\n", PS_ERR_NOT_FOUND, 2,
               "unknown key 'optimizer.betas'", NULL);
}

/* model.name (model.arch) takes any shipped model; placement and sizes are
 * checked against the chosen model's stages and sizes. */
static void test_model_keys(void) {
    ps_config c;
    ps_err e;
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "model.name", "rnn_lm", "test", &e) == PS_OK);
    CHECK(ps_config_set(&c, "model.sizes.ntoken", "50", "test", &e) == PS_OK);
    CHECK(ps_config_set(&c, "model.sizes.ntoken", "60", "test", &e) == PS_OK);   /* replaces */
    CHECK(ps_config_set(&c, "model.placement.decoder", "cpu", "test", &e) == PS_OK);
    CHECK(c.model.n_sizes == 1 && !strcmp(c.model.sizes[0].key, "ntoken") && c.model.sizes[0].value == 60);
    CHECK_MSG(ps_config_check_model(&c, &e) == PS_OK, "%s", e.msg);
    CHECK(ps_config_set(&c, "model.placement.conv", "cpu", "test", &e) == PS_OK);
    CHECK(ps_config_check_model(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.placement.conv: model 'rnn_lm' has no stage 'conv' (stages: emb, decoder, rnn)");
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "model.sizes.nhid", "16", "test", &e) == PS_OK);
    CHECK(ps_config_check_model(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.sizes.nhid: model 'mnist_cnn' has no size 'nhid' (sizes: none)");
    CHECK(ps_config_set(&c, "model.name", "cartpole_policy", "test", &e) == PS_OK);
    CHECK(!strcmp(c.model.arch, "cartpole_policy"));
    CHECK(ps_config_set(&c, "model.arch", "rnn_lm", "test", &e) == PS_OK && !strcmp(c.model.arch, "rnn_lm"));
    /* a name that is no shipped model: refused when the model is checked, listing the models there are */
    CHECK(ps_config_set(&c, "model.arch", "resnet", "test", &e) == PS_OK);
    CHECK(ps_config_check_model(&c, &e) == PS_ERR_NOT_FOUND);
    CONTAINS(e.msg, "model.arch: no model 'resnet'");
    CONTAINS(e.msg, "cartpole_policy, mnist_cnn, rnn_lm");
    CHECK(ps_config_set(&c, "model.arch", "../etc/x", "test", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "is not a model name");
    /* sizes the chosen model lacks, or out of its range, are refused by the model check */
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "model.sizes.nlayers", "2", "test", &e) == PS_OK);
    CHECK(ps_config_set(&c, "model.arch", "rnn_lm", "test", &e) == PS_OK);
    CHECK(ps_config_check_model(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.sizes.nlayers: model 'rnn_lm' has no size 'nlayers' (sizes: ntoken, ninp, nhid, dropout)");
    ps_config_defaults(&c);
    CHECK(ps_config_set(&c, "model.sizes.dropout", "1", "test", &e) == PS_OK);   /* mnist_cnn: not known yet */
    CHECK(ps_config_set(&c, "model.arch", "rnn_lm", "test", &e) == PS_OK);
    CHECK(ps_config_check_model(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.sizes.dropout: '1' is out of range 0..1 (excluded)");
}

/* ---- several PS nodes: cluster.name, servers.<name>, placement forms ---- */

static const char *CLUSTER =
    "cluster:\n"
    "  name: lm-demo.1\n"
    "servers:\n"
    "  ps0:\n"
    "    address: \"127.0.0.1:50061\"\n"
    "    listen: \"0.0.0.0:50061\"\n"
    "    cert: certs/ps0.pem\n"
    "    key: certs/ps0.key\n"
    "    server_name: ps0.example\n"
    "    metrics_listen: \"127.0.0.1:9101\"\n"
    "    checkpoint_dir: /var/lib/psd/ps0\n"
    "  ps1: {address: \"node-2.cluster:50062\"}\n"
    "  ps_2: {address: \"[::1]:50063\"}\n"
    "model:\n"
    "  name: rnn_lm\n"
    "  sizes: {ntoken: 1000}\n"
    "  placement:\n"
    "    emb: {shards: [ps0, ps1/cuda:0], rows: [300]}\n"
    "    decoder: ps_2/cpu\n"
    "    rnn: ps_2\n";

static void check_cluster_values(const ps_config *c) {
    CHECK(!strcmp(c->cluster.name, "lm-demo.1"));
    CHECK(c->n_servers == 3 && c->self == -1);
    const ps_server_def *s = &c->servers[0];
    CHECK(!strcmp(s->name, "ps0") && !strcmp(s->address, "127.0.0.1:50061") && !strcmp(s->listen, "0.0.0.0:50061"));
    CHECK(!strcmp(s->cert, "certs/ps0.pem") && !strcmp(s->key, "certs/ps0.key"));
    CHECK(!strcmp(s->server_name, "ps0.example") && !strcmp(s->metrics_listen, "127.0.0.1:9101"));
    CHECK(!strcmp(s->checkpoint_dir, "/var/lib/psd/ps0"));
    CHECK(!strcmp(c->servers[1].name, "ps1") && !strcmp(c->servers[1].address, "node-2.cluster:50062"));
    CHECK(!c->servers[1].listen[0] && !c->servers[1].cert[0]);
    CHECK(!strcmp(c->servers[2].name, "ps_2") && !strcmp(c->servers[2].address, "[::1]:50063"));
    CHECK(c->model.n_placement == 3);
    const ps_stage_placement *emb = &c->model.placement[0];
    CHECK(!strcmp(emb->stage, "emb") && emb->n_shards == 2 && !emb->server[0] && !emb->device[0]);
    CHECK(!strcmp(emb->shard_server[0], "ps0") && !strcmp(emb->shard_device[0], "cpu"));
    CHECK(!strcmp(emb->shard_server[1], "ps1") && !strcmp(emb->shard_device[1], "cuda:0"));
    CHECK(emb->n_rows == 1 && emb->rows[0] == 300);
    CHECK(!strcmp(c->model.placement[1].stage, "decoder") && !strcmp(c->model.placement[1].server, "ps_2") &&
          !strcmp(c->model.placement[1].device, "cpu") && c->model.placement[1].n_shards == 0);
    CHECK(!strcmp(c->model.placement[2].server, "ps_2") && !strcmp(c->model.placement[2].device, "cpu"));
}

static void set_ok(ps_config *c, const char *k, const char *v) {
    ps_err e;
    ps_err_clear(&e);
    CHECK_MSG(ps_config_set(c, k, v, "command line", &e) == PS_OK, "%s=%s: %s", k, v, e.msg);
}

/* Keys whose accepted values once differed from what starts: server.address
 * (what trainers dial: HOST:PORT or unix:PATH, as ps-train and psd.connect
 * can dial), server.stop_metric (a scalar name as psd's round metrics take
 * it) and the rpc server's timeouts (whole milliseconds, at least 1). */
static void test_start_ranges(void) {
    static const struct { const char *key, *value, *want; } bad[] = {
        {"server.address", "bogus", "cli: server.address: 'bogus' is not HOST:PORT (HOST an IPv4 address, "
                                    "[IPv6 address] or a host name; PORT 1..65535), unix:PATH nor local:PATH"},
        {"server.address", "127.0.0.1:0", "'127.0.0.1:0' is not HOST:PORT"},
        {"server.address", "127.0.0.1:65536", "'127.0.0.1:65536' is not HOST:PORT"},
        {"server.address", "bad_host:50051", "'bad_host:50051' is not HOST:PORT"},
        {"server.address", "[::1:50051", "'[::1:50051' is not HOST:PORT"},
        {"server.address", "host:50051 ", "'host:50051 ' is not HOST:PORT"},
        {"server.address", "unix:", "'unix:' is not HOST:PORT"},
        {"server.address", "unix://relative.sock", "'unix://relative.sock' is not HOST:PORT"},
        {"servers.ps0.address", "unix:", "servers.ps0.address: 'unix:' is not HOST:PORT (HOST an IPv4 address, "
                                         "[IPv6 address] or a host name; PORT 1..65535) nor unix:PATH"},
        {"servers.ps0.address", "unix://relative.sock", "'unix://relative.sock' is not HOST:PORT"},
        {"servers.ps0.listen", "bogus", "servers.ps0.listen: 'bogus' is not HOST:PORT"},
        {"server.address", "", "server.address: must not be empty"},
        {"server.stop_metric", "running reward", "server.stop_metric: 'running reward' is not a scalar name "
                                                 "(1..31 letters, digits, '_', '.' or '-'"},
        {"server.stop_metric", "reward\"", "is not a scalar name"},
        {"server.stop_metric", "abcdefghijklmnopqrstuvwxyz0123456", "at most 31 allowed"},
        {"server.recv_timeout_s", "0.0005", "server.recv_timeout_s: '0.0005' is out of range [0.001, 3600]"},
        {"server.send_timeout_s", "0", "server.send_timeout_s: '0' is out of range [0.001, 3600]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_config c, before;
        ps_err e;
        ps_err_clear(&e);
        ps_config_defaults(&c);
        before = c;
        CHECK_MSG(ps_config_set(&c, bad[i].key, bad[i].value, "cli", &e) != PS_OK, "%s=%s accepted", bad[i].key,
                  bad[i].value);
        CONTAINS(e.msg, bad[i].want);
        CHECK_MSG(memcmp(&c, &before, sizeof c) == 0, "%s=%s changed the config", bad[i].key, bad[i].value);
    }
    char long_unix[160] = "unix:/";
    memset(long_unix + 6, 'a', 102);   /* a 103-byte path: fits sun_path; one more than 107 does not */
    static const struct { const char *key, *value; } good[] = {
        {"server.address", "127.0.0.1:50051"}, {"server.address", "[::1]:1"}, {"server.address", "localhost:65535"},
        {"server.address", "ps-1.example.org:50051"}, {"server.address", "unix:/run/psd/psd.sock"},
        {"server.address", "unix:psd.sock"}, {"server.address", "unix:///run/psd.sock"},
        {"server.stop_metric", "reward"}, {"server.stop_metric", "episode.len-2_x"}, {"server.stop_metric", ""},
        {"server.recv_timeout_s", "0.001"}, {"server.send_timeout_s", "3600"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ps_config c;
        ps_config_defaults(&c);
        set_ok(&c, good[i].key, good[i].value);
    }
    ps_config c;
    ps_config_defaults(&c);
    set_ok(&c, "server.address", long_unix);
    char too_long[160];
    snprintf(too_long, sizeof too_long, "%s%s", long_unix, "bbbbb");  /* 108 bytes */
    ps_err e;
    ps_err_clear(&e);
    CHECK(ps_config_set(&c, "server.address", too_long, "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "unix:PATH nor local:PATH (a socket path of 1..107 bytes)");
}

static void test_cluster_parse(void) {
    ps_config c, back;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    CHECK(!strcmp(c.cluster.name, "psd") && c.n_servers == 0 && c.self == -1);
    CHECK_MSG(ps_config_load(&c, tmpfile_with("cluster.yaml", CLUSTER), &e) == PS_OK, "%s", e.msg);
    check_cluster_values(&c);
    CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);

    /* print -> load: the same bytes (servers and shard lists included) */
    char printed[512];
    snprintf(printed, sizeof printed, "%s/cluster-printed.yaml", g_dir);
    FILE *f = fopen(printed, "w");
    ps_config_print(&c, f);
    fclose(f);
    ps_config_defaults(&back);
    CHECK_MSG(ps_config_load(&back, printed, &e) == PS_OK, "%s", e.msg);
    check_cluster_values(&back);
    CHECK(memcmp(&c, &back, sizeof c) == 0);

    /* the flag forms build the same config as the YAML */
    ps_config cli;
    ps_config_defaults(&cli);
    set_ok(&cli, "cluster.name", "lm-demo.1");
    set_ok(&cli, "servers.ps0.address", "127.0.0.1:50061");
    set_ok(&cli, "servers.ps0.listen", "0.0.0.0:50061");
    set_ok(&cli, "servers.ps0.cert", "certs/ps0.pem");
    set_ok(&cli, "servers.ps0.key", "certs/ps0.key");
    set_ok(&cli, "servers.ps0.server_name", "ps0.example");
    set_ok(&cli, "servers.ps0.metrics_listen", "127.0.0.1:9101");
    set_ok(&cli, "servers.ps0.checkpoint_dir", "/var/lib/psd/ps0");
    set_ok(&cli, "servers.ps1.address", "node-2.cluster:50062");
    set_ok(&cli, "servers.ps_2.address", "[::1]:50063");
    set_ok(&cli, "model.name", "rnn_lm");
    set_ok(&cli, "model.sizes.ntoken", "1000");
    set_ok(&cli, "model.placement.emb", "cpu");          /* replaced by the shards below */
    set_ok(&cli, "model.placement.emb.rows", " 300 ");   /* before the shards: kept by them */
    set_ok(&cli, "model.placement.emb.shards", " ps0 , ps1/cuda:0");
    set_ok(&cli, "model.placement.decoder", "ps_2/cpu");
    set_ok(&cli, "model.placement.rnn", "ps_2");
    CHECK(memcmp(&c, &cli, sizeof c) == 0);
    /* a stage given a plain placement after shards drops the shards */
    set_ok(&cli, "model.placement.emb", "ps0/cuda:1");
    CHECK(cli.model.placement[0].n_shards == 0 && cli.model.placement[0].n_rows == 0 &&
          !strcmp(cli.model.placement[0].server, "ps0") &&
          !strcmp(cli.model.placement[0].device, "cuda:1") && !cli.model.placement[0].shard_server[0][0]);
    /* a setting of an existing server replaces that field only */
    set_ok(&cli, "servers.ps1.address", "127.0.0.1:50099");
    CHECK(cli.n_servers == 3 && !strcmp(cli.servers[1].address, "127.0.0.1:50099"));

    /* single-server forms are unchanged: a bare device; a bare word is a server */
    ps_config_defaults(&c);
    set_ok(&c, "model.placement.conv", "cuda:3");
    CHECK(!c.model.placement[0].server[0] && !strcmp(c.model.placement[0].device, "cuda:3"));
    set_ok(&c, "model.placement.conv", "gpu_host");
    CHECK(!strcmp(c.model.placement[0].server, "gpu_host") && !strcmp(c.model.placement[0].device, "cpu"));

    /* at most PS_CONFIG_MAX_SERVERS servers, PS_CONFIG_MAX_SHARDS shards */
    ps_config_defaults(&c);
    for (int i = 0; i < PS_CONFIG_MAX_SERVERS; i++) {
        char k[64], v[64];
        snprintf(k, sizeof k, "servers.s%d.address", i);
        snprintf(v, sizeof v, "127.0.0.1:%d", 40000 + i);
        set_ok(&c, k, v);
    }
    CHECK(ps_config_set(&c, "servers.s8.address", "127.0.0.1:1", "cli", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "cli: servers.s8.address: too many servers (at most 8: s0, s1,");
    CHECK(ps_config_set(&c, "model.placement.emb.shards", "s0,s1,s2,s3,s4,s5,s6,s7,s0", "cli", &e) != PS_OK);
    CONTAINS(e.msg, "more than 8 shards");
}

/* Each bad value: from the command line, refused naming key and value,
 * the config unchanged. */
static void test_cluster_bad_values(void) {
    static const struct { const char *key, *value, *want; } bad[] = {
        {"cluster.name", "my cluster", "cli: cluster.name: 'my cluster': a cluster name is 1..31 letters"},
        {"cluster.name", "", "cluster.name: must not be empty"},
        {"cluster.name", "abcdefghijklmnopqrstuvwxyz0123456", "at most 31 allowed"},
        {"servers.p s.address", "127.0.0.1:1", "servers.p s.address: a server name is 1..31 letters"},
        {"servers.cpu.address", "127.0.0.1:1", "and not a device"},
        {"servers.CUDA1.address", "127.0.0.1:1", "and not a device"},
        {"servers.abcdefghijklmnopqrstuvwxyz0123456.address", "127.0.0.1:1", "a server name is 1..31"},
        {"servers.ps0", "127.0.0.1:1", "servers.ps0: name a field of the server: servers.ps0.<address, listen"},
        {"servers.ps0.adress", "127.0.0.1:1", "unknown key 'servers.ps0.adress' (a server has: address, listen"},
        {"servers.ps0.address", "127.0.0.1", "servers.ps0.address: '127.0.0.1' is not HOST:PORT"},
        {"servers.ps0.address", "host:0", "'host:0' is not HOST:PORT"},
        {"servers.ps0.address", "bad_host:50061", "'bad_host:50061' is not HOST:PORT"},
        {"servers.ps0.listen", "0.0.0.0:99999", "servers.ps0.listen: '0.0.0.0:99999' is not HOST:PORT"},
        {"servers.ps0.metrics_listen", "node-1:9100", "servers.ps0.metrics_listen: 'node-1:9100' is not HOST:PORT"},
        {"model.placement.fc", "ps0/gpu", "model.placement.fc: 'ps0/gpu' has no valid device after the '/'"},
        {"model.placement.fc", "p s/cpu", "'p s/cpu' is not SERVER/DEVICE"},
        {"model.placement.fc", "/cpu", "'/cpu' is not SERVER/DEVICE"},
        {"model.placement.fc", "gpu:0", "model.placement.fc: 'gpu:0' is not a device"},
        {"model.placement.fc.device", "cpu", "model.placement.fc.device: a placement has no key 'device'"},
        {"model.placement.emb.shards", "", "model.placement.emb.shards: '': shard 1 is empty"},
        {"model.placement.emb.shards", "ps0,,ps1", "shard 2 is empty"},
        {"model.placement.emb.shards", "ps0,cuda:0", "shard 2 'cuda:0' names no server"},
        {"model.placement.emb.shards", "ps0,ps1/tpu", "shard 2 'ps1/tpu' has no valid device"},
        {"model.placement.emb.rows", "300,x", "model.placement.emb.rows: '300,x': boundary 2 is not a row number"},
        {"model.placement.emb.rows", "-5", "model.placement.emb.rows: '-5': boundary 1 is not a row number"},
        {"model.placement.emb.rows", "0,10", "model.placement.emb.rows: '0,10': boundary 1 (0) must be at least 1"},
        {"model.placement.emb.rows", "300,300", "model.placement.emb.rows: '300,300': boundaries must be strictly "
                                                "increasing (boundary 2, 300, follows 300)"},
        {"model.placement.emb.rows", "300,200", "boundaries must be strictly increasing (boundary 2, 200, follows"},
        {"model.placement.emb.rows", "300,", "model.placement.emb.rows: '300,': boundary 2 is empty"},
        {"model.placement.emb.rows", "1,2,3,4,5,6,7,8", "model.placement.emb.rows: more than 7 boundaries"},
        {"model.placement.emb.rows", "99999999999999999999", "boundary 1 (99999999999999999999) must be at least 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_config c, before;
        ps_err e;
        ps_err_clear(&e);
        ps_config_defaults(&c);
        set_ok(&c, "servers.ps0.address", "127.0.0.1:50061");
        before = c;
        CHECK_MSG(ps_config_set(&c, bad[i].key, bad[i].value, "cli", &e) != PS_OK, "%s=%s accepted", bad[i].key,
                  bad[i].value);
        CONTAINS(e.msg, bad[i].want);
        CHECK_MSG(memcmp(&c, &before, sizeof c) == 0, "%s=%s changed the config", bad[i].key, bad[i].value);
    }
    /* YAML: a sequence only where a list is meant */
    expect_bad("seq_lr.yaml", "optimizer:\n  lr: [0.1]\n", PS_ERR_FORMAT, 2,
               "optimizer.lr: expected a single value, got a list", NULL);
    expect_bad("seq_stage.yaml", "model:\n  name: rnn_lm\n  placement:\n    emb: [ps0, ps1]\n", PS_ERR_FORMAT, 4,
               "model.placement.emb: expected a single value, got a list", NULL);
    expect_bad("seq_servers.yaml", "servers: [ps0, ps1]\n", PS_ERR_FORMAT, 1,
               "servers: expected a mapping of keys, got a list", NULL);
    expect_bad("seq_addr.yaml", "servers:\n  ps0:\n    address: [a, b]\n", PS_ERR_FORMAT, 3,
               "servers.ps0.address: expected a single value, got a list", NULL);
    expect_bad("seq_nested.yaml", "model:\n  placement:\n    emb: {shards: [ps0, [ps1]]}\n", PS_ERR_FORMAT, 3,
               "model.placement.emb.shards: entry 2: expected a single value, got a list", NULL);
    expect_bad("seq_null.yaml", "model:\n  placement:\n    emb: {shards: [ps0, ~]}\n", PS_ERR_FORMAT, 3,
               "entry 2: expected a single value, got nothing", NULL);
    expect_bad("seq_comma.yaml", "model:\n  placement:\n    emb: {shards: [\"ps0,ps1\"]}\n",
               PS_ERR_INVALID_ARGUMENT, 3, "entry 1 'ps0,ps1' holds a ','", NULL);
    expect_bad("seq_empty.yaml", "model:\n  placement:\n    emb: {shards: []}\n", PS_ERR_INVALID_ARGUMENT, 3,
               "model.placement.emb.shards: '': shard 1 is empty", NULL);
    expect_bad("server_null.yaml", "servers:\n  ps0:\n", PS_ERR_INVALID_ARGUMENT, 2,
               "servers.ps0: no value given", NULL);
    expect_bad("server_field.yaml", "servers:\n  ps0: {addr: \"127.0.0.1:1\"}\n", PS_ERR_NOT_FOUND, 2,
               "unknown key 'servers.ps0.addr'", NULL);
    expect_bad("server_dup.yaml", "servers:\n  ps0: {address: \"127.0.0.1:1\"}\n  ps0: {address: \"127.0.0.1:2\"}\n",
               PS_ERR_FORMAT, 3, "duplicate key 'servers.ps0'", NULL);
    expect_bad("server_deep.yaml", "servers:\n  ps0: {address: {host: a}}\n", PS_ERR_FORMAT, 2,
               "servers.ps0.address: expected a single value, got a mapping", NULL);
}

/* A cluster config built by settings; then one change, one expected error. */
static void cluster_base(ps_config *c) {
    ps_config_defaults(c);
    set_ok(c, "model.name", "rnn_lm");
    set_ok(c, "model.sizes.ntoken", "3");
    set_ok(c, "servers.ps0.address", "127.0.0.1:50061");
    set_ok(c, "servers.ps1.address", "127.0.0.1:50062");
    set_ok(c, "model.placement.emb.shards", "ps0,ps1");
    set_ok(c, "model.placement.decoder", "ps1");
    set_ok(c, "model.placement.rnn", "ps0/cpu");
}

static void expect_cluster_bad(const char *what, const char *k1, const char *v1, const char *k2, const char *v2,
                               const char *want) {
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    cluster_base(&c);
    if (k1) set_ok(&c, k1, v1);
    if (k2) set_ok(&c, k2, v2);
    CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT, "%s: accepted", what);
    CHECK_MSG(!strncmp(e.msg, want, strlen(want)), "%s:\n  got  %s\n  want %s", what, e.msg, want);
    ps_placement p;
    ps_err e2;
    ps_err_clear(&e2);
    CHECK_MSG(ps_placement_resolve(&c, &p, &e2) == PS_ERR_INVALID_ARGUMENT && !strcmp(e.msg, e2.msg),
              "%s: resolve said: %s", what, e2.msg);
}

/* Clusters ps_config_check_cluster (and ps_placement_resolve, with the
 * same message) must refuse: what is wrong, one or two keys set on
 * cluster_base's config, and how the error must begin. */
typedef struct cluster_bad {
    const char *what, *k1, *v1, *k2, *v2, *want;
} cluster_bad;

static const cluster_bad k_cluster_bad[] = {
    {"unknown server", "model.placement.decoder", "ps3", NULL, NULL,
     "model.placement.decoder: server 'ps3' is not in servers (ps0, ps1)"},
    {"unknown shard server", "model.placement.emb.shards", "ps0,ps3/cuda:0", NULL, NULL,
     "model.placement.emb.shards: server 'ps3' is not in servers (ps0, ps1)"},
    /* two servers in one checkpoint directory (they overwrote each other's ckpt-N) */
    {"one checkpoint_dir", "servers.ps0.checkpoint_dir", "/srv/ck", "servers.ps1.checkpoint_dir", "/srv//ck/",
     "servers.ps1.checkpoint_dir: '/srv/ck' is servers.ps0's checkpoint directory too"},
    {"a server in another's default directory", "server.checkpoint_dir", "/srv/ck", "servers.ps1.checkpoint_dir",
     "/srv/ck/./ps0",
     "servers.ps1.checkpoint_dir: '/srv/ck/ps0' is servers.ps0's checkpoint directory too"},
    {"single-server form with servers", "model.placement.decoder", "cuda:0", NULL, NULL,
     "model.placement.decoder: 'cuda:0' names no server; with servers defined write SERVER or SERVER/DEVICE (servers: "
     "ps0, ps1)"},
    {"a server twice in one shard list", "model.placement.emb.shards", "ps0,ps1,ps0/cuda:1", NULL, NULL,
     "model.placement.emb.shards: server 'ps0' is named twice (shards 1 and 3)"},
    {"shards on a non-embedding stage", "model.placement.decoder.shards", "ps0,ps1", NULL, NULL,
     "model.placement.decoder.shards: only a stage whose first node is an Embedding of the stage input can be "
     "sharded; stage 'decoder' of model 'rnn_lm' starts with Dropout"},
    {"more shards than rows", "model.sizes.ntoken", "1", NULL, NULL,
     "model.placement.emb.shards: 2 shards but encoder.weight has only 1 rows (model.sizes.ntoken)"},
    /* model.placement.<stage>.rows: n-1 boundaries in 1..R-1, only with shards */
    {"rows: too many", "model.placement.emb.rows", "1,2", NULL, NULL,
     "model.placement.emb.rows: 2 boundaries for 2 shards; give n-1 = 1"},
    {"rows: past the table", "model.placement.emb.rows", "3", NULL, NULL,
     "model.placement.emb.rows: boundary 1 (3) is outside 1..2 or not above the one before (encoder.weight has 3 rows "
     "(model.sizes.ntoken)"},
    {"rows without shards", "model.placement.decoder.rows", "1", NULL, NULL,
     "model.placement.decoder.rows: boundaries between shards, but stage 'decoder' is not sharded (add "
     "model.placement.decoder.shards: [SERVER, ...], or drop rows)"},
    {"duplicate addresses", "servers.ps1.address", "localhost:50061", NULL, NULL,
     "servers.ps1.address: 'localhost:50061' is also servers.ps0's address '127.0.0.1:50061'"},
    /* unix sockets: one path twice (as gRPC dials it) is one address */
    {"one unix socket twice", "servers.ps0.address", "unix:/run/psd//ps.sock", "servers.ps1.address",
     "unix:///run/psd/./ps.sock",
     "servers.ps1.address: 'unix:///run/psd/./ps.sock' is also servers.ps0's address 'unix:/run/psd//ps.sock'"},
    {"one unix listen twice", "servers.ps0.listen", "unix:/run/psd/ps.sock", "servers.ps1.listen",
     "unix:/run/psd/ps.sock", "servers.ps1.listen: 'unix:/run/psd/ps.sock' is where servers.ps0 binds too"},
    /* trainer.*: the first backoff is at most the longest */
    {"retry_backoff_s above retry_backoff_max_s", "trainer.retry_backoff_s", "20", NULL, NULL,
     "trainer.retry_backoff_s: 20 is larger than trainer.retry_backoff_max_s (10)"},
    {"duplicate listen addresses", "servers.ps0.listen", "0.0.0.0:7000", "servers.ps1.listen", "127.0.0.1:7000",
     "servers.ps1.listen: '127.0.0.1:7000' is where servers.ps0 binds too"},
    {"one metrics port on one host", "server.metrics_listen", "127.0.0.1:9100", NULL, NULL,
     "servers.ps1.metrics_listen: '127.0.0.1:9100' is servers.ps0's metrics address too"},
    {"an address missing", "servers.ps2.listen", "0.0.0.0:50063", NULL, NULL, "servers.ps2.address: required"},
    {"a server hosting nothing", "servers.ps2.address", "127.0.0.1:50063", NULL, NULL,
     "servers.ps2: no stage is placed on it"},
    {"sync across servers", "server.consistency", "sync", NULL, NULL,
     "server.consistency: sync needs one server: stages span ps0, ps1; use hogwild until a cross-server round exists"},
    {"ssp across servers", "server.consistency", "ssp", NULL, NULL, "server.consistency: ssp needs one server"},
    {"a stage the model lacks", "model.placement.conv", "ps0", NULL, NULL,
     "model.placement.conv: model 'rnn_lm' has no stage 'conv'"},
};

static void test_cluster_checks(void) {
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    cluster_base(&c);
    CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
    for (size_t i = 0; i < sizeof k_cluster_bad / sizeof k_cluster_bad[0]; i++) {
        const cluster_bad *b = &k_cluster_bad[i];
        expect_cluster_bad(b->what, b->k1, b->v1, b->k2, b->v2, b->want);
    }
    {   /* servers on one host dialled over unix sockets (as server.address may be) */
        cluster_base(&c);
        set_ok(&c, "servers.ps0.address", "unix:/run/psd/ps0.sock");
        set_ok(&c, "servers.ps1.address", "unix:///run/psd/ps1.sock");
        set_ok(&c, "server.metrics_listen", "");
        CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
        CHECK(ps_config_select_server(&c, "ps1", &e) == PS_OK && !strcmp(c.server.listen, "unix:///run/psd/ps1.sock"));
        /* the backoff check in the single-server form too; equal is fine */
        ps_config_defaults(&c);
        set_ok(&c, "trainer.retry_backoff_s", "10");
        CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
        set_ok(&c, "trainer.retry_backoff_max_s", "5");
        CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
        CONTAINS(e.msg, "trainer.retry_backoff_s: 10 is larger than trainer.retry_backoff_max_s (5)");
    }
    {
        ps_config_defaults(&c);
        set_ok(&c, "model.name", "rnn_lm");
        set_ok(&c, "servers.ps0.address", "127.0.0.1:50061");
        set_ok(&c, "model.placement.emb", "ps0");
        set_ok(&c, "model.placement.decoder", "ps0");
        CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
        CONTAINS(e.msg, "model.placement.rnn: stage 'rnn' of model 'rnn_lm' is not placed; with servers defined "
                        "every stage names its server (servers: ps0)");
    }
    {
        cluster_base(&c);
        set_ok(&c, "server.checkpoint_dir", "/srv/ck");
        CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);  /* /srv/ck/ps0, /srv/ck/ps1 */
        set_ok(&c, "servers.ps0.checkpoint_dir", "/srv/ck/ps1");
        CHECK(ps_config_select_server(&c, "ps0", &e) == PS_ERR_INVALID_ARGUMENT);
        CONTAINS(e.msg, "servers.ps1.checkpoint_dir: '/srv/ck/ps1' is servers.ps0's checkpoint directory too");
        cluster_base(&c);
        set_ok(&c, "server.checkpoint_dir", "/srv/ck");
        CHECK(ps_config_select_server(&c, "ps1", &e) == PS_OK && !strcmp(c.server.checkpoint.dir, "/srv/ck/ps1"));
        CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
    }
    {
        cluster_base(&c);
        set_ok(&c, "model.sizes.ntoken", "30");
        set_ok(&c, "servers.ps2.address", "127.0.0.1:50063");
        set_ok(&c, "model.placement.emb.rows", "10");
        set_ok(&c, "model.placement.emb.shards", "ps0,ps1,ps2");
        CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
        CONTAINS(e.msg, "model.placement.emb.rows: 1 boundary for 3 shards; give n-1 = 2 (the first row of shards "
                        "2..3)");
        set_ok(&c, "model.placement.emb.rows", "10,29");
        CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
    }
    {
        cluster_base(&c);
        set_ok(&c, "model.placement.emb.rows", "2");
        ps_placement p;
        CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
        CHECK(p.stages[0].shards[0].lo == 0 && p.stages[0].shards[0].hi == 2 && p.stages[0].shards[1].lo == 2 &&
              p.stages[0].shards[1].hi == 3);
        set_ok(&c, "model.placement.emb.rows", "");     /* empty: the equal split again */
        CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
        CHECK(p.stages[0].shards[0].hi == 1 && c.model.placement[0].n_rows == 0);
    }

    /* the same ports on different hosts are fine: they are different machines */
    cluster_base(&c);
    set_ok(&c, "servers.ps0.address", "node-1:50061");
    set_ok(&c, "servers.ps1.address", "node-2:50061");
    set_ok(&c, "servers.ps0.listen", "0.0.0.0:50061");
    set_ok(&c, "servers.ps1.listen", "0.0.0.0:50061");
    set_ok(&c, "server.metrics_listen", "0.0.0.0:9100");
    CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);

    /* a placement naming a server without servers */
    ps_config_defaults(&c);
    set_ok(&c, "model.placement.fc", "ps1/cpu");
    CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.placement.fc: 'ps1' is not a device (\"cpu\" or \"cuda:N\" with N in 0..63) but a "
                    "server name, and the config defines no servers (add servers.ps1.address");
    ps_config_defaults(&c);
    set_ok(&c, "model.name", "rnn_lm");
    set_ok(&c, "model.placement.emb.shards", "a,b");
    CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.placement.emb.shards: names server 'a' but the config defines no servers");
    ps_config_defaults(&c);
    set_ok(&c, "model.name", "rnn_lm");
    set_ok(&c, "model.placement.emb.rows", "100");
    CHECK(ps_config_check_cluster(&c, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "model.placement.emb.rows: boundaries between shards, but stage 'emb' is not sharded");
    /* the single-server form passes as before, sync included */
    ps_config_defaults(&c);
    set_ok(&c, "model.placement.fc", "cuda:0");
    set_ok(&c, "server.consistency", "sync");
    CHECK_MSG(ps_config_check_cluster(&c, &e) == PS_OK, "%s", e.msg);
}

static void test_select_server(void) {
    ps_config c;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    CHECK(ps_config_select_server(&c, "ps0", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "--name ps0: this config defines no servers");
    CHECK_MSG(ps_config_load(&c, tmpfile_with("cluster-sel.yaml", CLUSTER), &e) == PS_OK, "%s", e.msg);
    set_ok(&c, "server.checkpoint_dir", "/ck");
    set_ok(&c, "server.metrics_listen", "127.0.0.1:9200");
    set_ok(&c, "security.cert", "certs/all.pem");
    ps_config before = c;
    CHECK(ps_config_select_server(&c, "ps9", &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "--name ps9: not a server of this config (servers: ps0, ps1, ps_2)");
    CHECK(memcmp(&c, &before, sizeof c) == 0);

    ps_config c0 = c;
    CHECK_MSG(ps_config_select_server(&c0, "ps0", &e) == PS_OK, "%s", e.msg);
    CHECK(c0.self == 0);
    CHECK(!strcmp(c0.server.address, "127.0.0.1:50061") && !strcmp(c0.server.listen, "0.0.0.0:50061"));
    CHECK(!strcmp(c0.security.cert, "certs/ps0.pem") && !strcmp(c0.security.key, "certs/ps0.key"));
    CHECK(!strcmp(c0.server.metrics_listen, "127.0.0.1:9101"));
    CHECK(!strcmp(c0.server.checkpoint.dir, "/var/lib/psd/ps0"));

    ps_config c1 = c;
    CHECK_MSG(ps_config_select_server(&c1, "ps1", &e) == PS_OK, "%s", e.msg);
    CHECK(c1.self == 1);
    CHECK(!strcmp(c1.server.address, "node-2.cluster:50062") && !strcmp(c1.server.listen, "node-2.cluster:50062"));
    CHECK(!strcmp(c1.security.cert, "certs/all.pem") && !c1.security.key[0]);     /* the cluster's */
    CHECK(!strcmp(c1.server.metrics_listen, "127.0.0.1:9200"));
    CHECK(!strcmp(c1.server.checkpoint.dir, "/ck/ps1"));
    CHECK(!strcmp(c1.server.service.server_name, "ps1") && !c.server.service.server_name[0]);
    /* buffers cleared: selecting by hand equals the same settings */
    ps_config by_hand = c;
    set_ok(&by_hand, "server.address", "node-2.cluster:50062");
    set_ok(&by_hand, "server.listen", "node-2.cluster:50062");
    set_ok(&by_hand, "server.checkpoint_dir", "/ck/ps1");
    by_hand.self = 1;
    snprintf(by_hand.server.service.server_name, sizeof by_hand.server.service.server_name, "ps1");
    CHECK(memcmp(&c1, &by_hand, sizeof c1) == 0);

    ps_config c2 = c;
    set_ok(&c2, "server.checkpoint_dir", "");
    CHECK(ps_config_select_server(&c2, "ps_2", &e) == PS_OK && c2.self == 2 && !c2.server.checkpoint.dir[0]);
}

int main(void) {
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_model_keys();
    test_defaults();
    test_good_file();
    test_local_yaml();
    test_docs();
    test_bad_files();
    test_service_keys();
    test_cli();
    test_batch_size_limit();
    test_optimizer_keys();
    test_cluster_parse();
    test_cluster_bad_values();
    test_start_ranges();
    test_cluster_checks();
    test_select_server();
    test_rmtree(g_dir);
    return check_summary("test_config");
}
