/* config.c - the configuration's one table of keys (type, range, default,
 * field in the owning module's options) and the setter that both the YAML
 * loader (config_yaml.c) and the command-line flags go through: lookup with
 * suggestions, the checked parsers of every value type (also the flags'
 * numbers), defaults and enum names. Servers, placements, sizes and the
 * checks across keys: config_cluster.c. (config.h, docs/config.md) */
#include "config_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>


/* ---- the table ---------------------------------------------------------- */


_Static_assert(sizeof(ps_log_level) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_cons_mode) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_sync_reduce) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_rm_ema_of) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_optim_kind) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_nonfinite_policy) == sizeof(int), "enum fields are written as int");

/* Enum names: each list is its module's (X(value, name) in its header). */
#define NAME_OF(value, name) name,
static const char *const consistency_names[] = {PS_CONS_MODES(NAME_OF) NULL};
static const char *const sync_reduce_names[] = {PS_SYNC_REDUCES(NAME_OF) NULL};
static const char *const nonfinite_names[] = {PS_NONFINITE_POLICIES(NAME_OF) NULL};
static const char *const ema_of_names[] = {PS_RM_EMA_OFS(NAME_OF) NULL};
#undef NAME_OF

static ps_status check_hostport(const cfg_entry *e, const void *val, const char *origin,
                                ps_err *err);

#define FIELD(f) .off = offsetof(ps_config, f), .size = sizeof(((ps_config *)0)->f)
#define STR(k, f, d) { .key = k, .type = CT_STRING, FIELD(f), .def = d, .flags = F_NONEMPTY }
#define INT(k, f, l, h, d) { .key = k, .type = CT_INT, FIELD(f), .lo = l, .hi = h, .def = d }
#define U64(k, f, d) { .key = k, .type = CT_U64, FIELD(f), .def = d }
/* lo_open/hi_open: 1 excludes the bound, 0 includes it. */
#define DBL(k, f, lopen, l, h, hopen, d) \
    { .key = k, .type = CT_DOUBLE, FIELD(f), .lo = l, .hi = h, .lo_open = lopen, \
      .hi_open = hopen, .def = d }
/* A string that may be empty (optional paths). */
#define OPT(k, f) { .key = k, .type = CT_STRING, FIELD(f), .def = "" }
#define BOOL(k, f, d) { .key = k, .type = CT_BOOL, FIELD(f), .def = d }
/* A string that may be empty ("" = feature off). */
#define STR0(k, f, d) { .key = k, .type = CT_STRING, FIELD(f), .def = d }
#define ENUM(k, f, n, d) { .key = k, .type = CT_ENUM, FIELD(f), .names = n, .def = d }
/* An enum whose names a module function gives. */
#define ENUMF(k, f, fn, d) { .key = k, .type = CT_ENUM, FIELD(f), .names_fn = fn, .def = d }
#define SVC(f) server.service.f
#define RPC(f) server.rpc.f

/* Keep docs/config.md in step with this table. Entries of one section are
 * adjacent (ps_config_print relies on it). */
static const cfg_entry g_table[] = {
    { .key = "cluster.name", .type = CT_STRING, FIELD(cluster.name), .def = "psd", .flags = F_NONEMPTY | F_ALSO,
      .also = offsetof(ps_config, SVC(cluster)), .check = cfg_check_cluster_name },
    { .key = "servers", .type = CT_SERVERS, FIELD(servers) },

    STR ("server.listen",          server.listen,          "127.0.0.1:50051"),
    { .key = "server.address", .type = CT_STRING, FIELD(server.address), .def = "127.0.0.1:50051",
      .flags = F_NONEMPTY, .check = cfg_check_dial_address },
    INT ("server.threads",         RPC(threads),           1, 64, "4"),
    INT ("server.compute_threads", server.compute_threads, 0, 256, "0"),
    BOOL("server.pin_compute",     server.pin_compute,     "true"),
    BOOL("server.profile",         RPC(profile),           "true"),
    DBL ("server.context_ttl_s",   SVC(context_ttl_s),     1, 0, 86400, 0, "120"),
    { .key = "server.max_message_mb", .type = CT_INT, FIELD(RPC(max_message_bytes)), .lo = 4, .hi = 2047,
      .def = "64", .scale = 1 << 20, .flags = F_ALSO, .also = offsetof(ps_config, SVC(max_message_bytes)) },
    ENUMF("server.log_level",      server.log_level,       ps_log_level_names, "info"),
    ENUM("server.consistency",     SVC(cons.mode),         consistency_names, "hogwild"),
    INT ("server.sync_workers",    SVC(cons.sync_workers), 1, 4096, "2"),
    DBL ("server.sync_timeout_s",  SVC(cons.sync_timeout_s), 1, 0, 86400, 0, "30"),
    ENUM("server.sync_reduce",     SVC(cons.sync_reduce),  sync_reduce_names, "mean"),
    INT ("server.max_staleness",   SVC(cons.max_staleness), 0, 1000000, "3"),
    INT ("server.ssp_world_size",  SVC(cons.ssp_world_size), 0, 1000000, "0"),
    DBL ("server.ssp_idle_s",      SVC(cons.idle_s),       1, 0, 86400, 0, "30"),
    DBL ("server.settle_window_s", SVC(settle_window_s),   1, 0, 604800, 0, "900"),
    INT ("server.max_finished",    SVC(max_finished),      1024, 16777216, "1048576"),
    STR0("server.checkpoint_dir",  server.checkpoint.dir,  ""),
    INT ("server.checkpoint_every_steps", server.checkpoint.every_steps, 0, 1000000000, "1000"),
    DBL ("server.checkpoint_every_s", server.checkpoint.every_s, 0, 0, 31536000, 0, "300"),
    INT ("server.checkpoint_keep", server.checkpoint.keep, 1, 1000, "3"),
    DBL ("server.grace_s",         server.grace_s,         0, 0, 3600, 0, "10"),
    { .key = "server.metrics_listen", .type = CT_STRING, FIELD(server.metrics_listen), .def = "",
      .check = check_hostport },
    BOOL("server.metrics_tls",     server.metrics_tls,     "false"),
    STR0("server.log_file",        server.log_file,        ""),
    ENUM("server.nonfinite_policy", SVC(nonfinite_policy), nonfinite_names, "reject"),
    INT ("server.max_calls",       RPC(max_calls),         1, 65536, "256"),
    INT ("server.max_calls_per_client", RPC(max_calls_per_client), 0, 65536, "0"),
    INT ("server.max_stalled_per_client", RPC(max_stalled_per_client), 1, 65536, "16"),
    INT ("server.max_connections_per_client", RPC(max_connections_per_client), 1, 65536, "64"),
    INT ("server.max_streams_per_connection", RPC(max_streams_per_connection), 1, 4096, "64"),
    DBL ("server.max_connection_age_s", RPC(max_connection_age_s), 0, 0, 31536000, 0, "1800"),
    INT ("server.transport_memory_mb", RPC(transport_memory_mb), 0, 1048576, "512"),
    /* the rpc server times calls in whole milliseconds: at least 1 ms */
    DBL ("server.recv_timeout_s",  RPC(recv_timeout_s),    0, 0.001, 3600, 0, "30"),
    DBL ("server.send_timeout_s",  RPC(send_timeout_s),    0, 0.001, 3600, 0, "60"),
    INT ("server.idle_poll_us",    RPC(idle_poll_us),      0, 100000, "2000"),
    { .key = "server.local_socket", .type = CT_STRING, FIELD(RPC(local_socket)), .def = "",
      .check = cfg_check_local_socket },
    U64 ("server.max_context_bytes", SVC(max_context_bytes), "4294967296"),
    DBL ("server.batch_wait_ms",   SVC(batch_wait_ms),     0, 0, 1000, 0, "0"),
    INT ("server.batch_max_samples", SVC(batch_max_samples), 1, 65536, "256"),
    INT ("server.batch_executors", SVC(batch_executors), 1, 64, "1"),
    BOOL("server.batch_backward",  SVC(batch_backward),    "true"),
    DBL ("server.health_saturated_s", SVC(health_saturated_s), 0, 0, 86400, 0, "30"),
    INT ("server.metrics_round_steps", SVC(round_metrics.round_steps), 1, 1000000000, "1"),
    DBL ("server.metrics_ema_alpha", SVC(round_metrics.alpha), 1, 0, 1, 0, "0.05"),
    ENUM("server.metrics_ema_of",  SVC(round_metrics.ema_of), ema_of_names, "mean"),
    { .key = "server.stop_metric", .type = CT_STRING, FIELD(SVC(round_metrics.stop_metric)), .def = "",
      .check = cfg_check_scalar_name },
    DBL ("server.stop_threshold",  SVC(round_metrics.stop_threshold), 0, -1e300, 1e300, 0, "0"),

    /* model.arch: a shipped model file (common/nn/modeldef.h, configs/models/); model.name is its
     * older name. model.file: a model file of one's own (a relative path from a config file is
     * relative to that file's directory). */
    { .key = "model.arch", .type = CT_STRING, FIELD(model.arch), .def = "mnist_cnn", .flags = F_NONEMPTY,
      .check = cfg_check_arch },
    { .key = "model.name", .type = CT_STRING, FIELD(model.arch), .def = NULL, .flags = F_NONEMPTY | F_ALIAS,
      .check = cfg_check_arch },
    OPT ("model.file",             model.file),
    /* model.onnx: an ONNX model (common/nn/onnx_model.h): another name of model.file, which takes
     * .onnx files too (its initializers are the initial weights) */
    { .key = "model.onnx", .type = CT_STRING, FIELD(model.file), .def = NULL, .flags = F_ALIAS },
    U64 ("model.seed",             model.seed,             "1"),
    BOOL("model.snapshot_steps",   model.snapshot_steps,   "true"),
    ENUMF("model.backend",         model.backend,          ps_backend_cpu_names, "dnnl"),
    { .key = "model.placement", .type = CT_PLACEMENT, FIELD(model.placement) },
    { .key = "model.sizes", .type = CT_SIZE, FIELD(model.sizes) },

    ENUMF("optimizer.type",        optimizer.kind,         ps_optim_kind_names, "sgd"),
    DBL ("optimizer.lr",           optimizer.lr,           1, 0, 100, 0, "0.03"),
    DBL ("optimizer.momentum",     optimizer.momentum,     0, 0, 1, 1, "0"),
    DBL ("optimizer.weight_decay", optimizer.weight_decay, 0, 0, 1, 0, "0"),
    DBL ("optimizer.beta1",        optimizer.beta1,        0, 0, 1, 1, "0.9"),
    DBL ("optimizer.beta2",        optimizer.beta2,        0, 0, 1, 1, "0.999"),
    DBL ("optimizer.eps",          optimizer.eps,          1, 0, 1, 0, "1e-8"),

    INT ("trainer.world_size",     trainer.world_size,     2, 1024, "3"),
    /* psd refuses a Forward larger than its model's max_batch (mnist_cnn:
     * 512, max_batch in configs/models/mnist_cnn.yaml); test_config holds
     * the two together. */
    { .key = "trainer.batch_size", .type = CT_INT, FIELD(trainer.batch_size), .lo = 1, .hi = 512,
      .def = "32", .why = "psd's model (mnist_cnn) takes at most 512 samples per call" },
    INT ("trainer.epochs",         trainer.epochs,         1, 10000, "1"),
    STR ("trainer.data",           trainer.data,           "data/mnist"),
    INT ("trainer.log_every",      trainer.log_every,      1, 1000000, "20"),
    DBL ("trainer.progress_every_s", trainer.progress_every_s, 0, 0, 86400, 0, "10"),
    U64 ("trainer.seed",           trainer.seed,           "0"),
    DBL ("trainer.rpc_timeout_s",  trainer.rpc_timeout_s,  1, 0, 3600, 0, "60"),
    BOOL("trainer.check_gradients", trainer.check_gradients, "false"),
    DBL ("trainer.retry_max_s",    trainer.retry_max_s,    0, 0, 86400, 0, "300"),
    DBL ("trainer.retry_backoff_s", trainer.retry_backoff_s, 1, 0, 60, 0, "0.2"),
    DBL ("trainer.retry_backoff_max_s", trainer.retry_backoff_max_s, 1, 0, 600, 0, "10"),

    BOOL("security.tls",           security.tls,           "false"),
    OPT ("security.cert",          security.cert),
    OPT ("security.key",           security.key),
    OPT ("security.ca",            security.ca),
    BOOL("security.mutual_tls",    security.mutual_tls,    "false"),
    OPT ("security.client_cert",   security.client_cert),
    OPT ("security.client_key",    security.client_key),
    OPT ("security.server_name",   security.server_name),
    OPT ("security.tokens_file",   security.tokens_file),
    OPT ("security.token_file",    security.token_file),
    BOOL("security.allow_insecure", security.allow_insecure, "false"),
};
#define N_ENTRIES (sizeof g_table / sizeof g_table[0])

const char *const *cfg_entry_names(const cfg_entry *e) { return e->names ? e->names : e->names_fn(); }

const cfg_entry *cfg_table(size_t *n) {
    *n = N_ENTRIES;
    return g_table;
}


/* ---- errors ------------------------------------------------------------- */

ps_status cfg_fail(ps_err *err, ps_status code, const char *origin, const char *key,
                      const char *fmt, ...) {
    char msg[PS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!err) return code;
    /* Truncation is fine: the message is for a person. */
    int n = snprintf(err->msg, sizeof err->msg, "%s: %s: ", origin, key);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%s", msg);
    err->code = code;
    return code;
}

/* A value for an error message: quoted, cut to 64 characters. */
const char *cfg_shown(const char *v, char *buf, size_t cap) {
    size_t len = strlen(v);
    if (len <= 64) snprintf(buf, cap, "'%s'", v);
    else snprintf(buf, cap, "'%.48s...' (%zu characters)", v, len);
    return buf;
}

bool ps_config_parse_hostport(const char *v, char *host, size_t host_cap, int *port) {
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v || !colon[1] || strlen(colon + 1) > 5) return false;
    const char *p = colon + 1;
    if (p[strspn(p, "0123456789")] != '\0') return false;
    long x = strtol(p, NULL, 10);
    if (x < 1 || x > 65535) return false;
    char h[64];
    size_t hl = (size_t)(colon - v);
    if (hl >= sizeof h) return false;
    memcpy(h, v, hl);
    h[hl] = '\0';
    unsigned char buf[16];
    const char *numeric = h;
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']') return false;
        h[hl - 1] = '\0';
        numeric = h + 1;
        if (inet_pton(AF_INET6, numeric, buf) != 1) return false;
    } else if (!strcmp(h, "localhost")) {
        numeric = "127.0.0.1";
    } else if (inet_pton(AF_INET, h, buf) != 1) {
        return false;
    }
    if (host && (size_t)snprintf(host, host_cap, "%s", numeric) >= host_cap) return false;
    if (port) *port = (int)x;
    return true;
}

static ps_status check_hostport(const cfg_entry *e, const void *val, const char *origin,
                                ps_err *err) {
    const char *v = val;
    char sv[128];
    if (*v && !ps_config_parse_hostport(v, NULL, 0, NULL))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or localhost; "
                    "PORT 1..65535; \"\" turns it off)", cfg_shown(v, sv, sizeof sv));
    return PS_OK;
}


/* ---- lookup ------------------------------------------------------------- */


/* Entries whose keys are a section of free names ("model.placement.<stage>"). */
bool cfg_is_map_type(cfg_type t) { return t == CT_PLACEMENT || t == CT_SIZE || t == CT_SERVERS; }

const cfg_entry *cfg_find_entry(const char *key) {
    for (size_t i = 0; i < N_ENTRIES; i++)
        if (!strcmp(g_table[i].key, key)) return &g_table[i];
    for (size_t i = 0; i < N_ENTRIES; i++) {
        size_t n = strlen(g_table[i].key);
        if (cfg_is_map_type(g_table[i].type) && !strncmp(key, g_table[i].key, n) && key[n] == '.')
            return &g_table[i];
    }
    return NULL;
}

/* A section is a key that has keys below it: "server", "model.placement". */
bool cfg_is_section(const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (cfg_is_map_type(g_table[i].type) && !strcmp(g_table[i].key, key)) return true;
        if (!strncmp(g_table[i].key, key, n) && g_table[i].key[n] == '.') return true;
    }
    return false;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return (size_t)-1;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* " (did you mean 'x'?)" for a key or section close to key, else "". */
static void suggest(const char *key, char *buf, size_t cap) {
    const char *best = NULL;
    size_t best_d = 3; /* at most 2 edits */
    char sect[64], best_sect[64] = "";
    for (size_t i = 0; i < N_ENTRIES; i++) {
        const char *k = g_table[i].key;
        size_t d = edit_distance(key, k);
        if (d < best_d) { best_d = d; best = k; best_sect[0] = '\0'; }
        const char *dot = strchr(k, '.');
        size_t sl = dot ? (size_t)(dot - k) : 0;
        if (dot && sl < sizeof sect) {
            memcpy(sect, k, sl);
            sect[sl] = '\0';
            d = edit_distance(key, sect);
            if (d < best_d) { best_d = d; best = NULL; snprintf(best_sect, sizeof best_sect, "%s", sect); }
        }
    }
    if (best) snprintf(buf, cap, " (did you mean '%s'?)", best);
    else if (best_sect[0]) snprintf(buf, cap, " (did you mean '%s'?)", best_sect);
    else buf[0] = '\0';
}

ps_status cfg_unknown_key(const char *key, const char *origin, ps_err *err) {
    char hint[128];
    suggest(key, hint, sizeof hint);
    return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: unknown key '%s'%s", origin, key, hint);
}


/* ---- parsing values ----------------------------------------------------- */

bool cfg_only_chars(const char *s, const char *allowed) {
    return s[strspn(s, allowed)] == '\0';
}

/* The first n characters of s are all in allowed. */
bool cfg_only_chars_n(const char *s, size_t n, const char *allowed) {
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(allowed, s[i])) return false;
    return true;
}


/* ---- checked numbers (config.h: also the flags' parser) ------------------ */

static ps_status num_long(const char *what, const char *v, long lo, long hi, const char *why, long *out,
                          ps_err *err) {
    char sv[128];
    if (!*v || !cfg_only_chars(v, "+-0123456789"))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is not an integer", what, cfg_shown(v, sv, sizeof sv));
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is not an integer", what, cfg_shown(v, sv, sizeof sv));
    if (errno == ERANGE || x < lo || x > hi)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is out of range [%ld, %ld]%s%s", what,
                          cfg_shown(v, sv, sizeof sv), lo, hi, why ? ": " : "", why ? why : "");
    *out = (long)x;
    return PS_OK;
}

ps_status ps_parse_long(const char *what, const char *text, long lo, long hi, long *out, ps_err *err) {
    return num_long(what, text, lo, hi, NULL, out, err);
}

ps_status ps_parse_double(const char *what, const char *text, double lo, double hi, unsigned open, double *out,
                          ps_err *err) {
    char sv[128];
    /* Decimal notation only: no hex floats, "inf", "nan" or spaces. */
    if (!*text || !cfg_only_chars(text, "+-.0123456789eE"))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is not a number", what, cfg_shown(text, sv, sizeof sv));
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *end)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is not a number", what, cfg_shown(text, sv, sizeof sv));
    bool lo_open = open & PS_PARSE_OPEN_LO, hi_open = open & PS_PARSE_OPEN_HI;
    if (errno == ERANGE || !isfinite(x) || (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %s is out of range %c%g, %g%c", what,
                          cfg_shown(text, sv, sizeof sv), lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    *out = x;
    return PS_OK;
}

/* The table's entries: "origin: key: ..." */
static ps_status parse_int(const cfg_entry *e, const char *v, const char *origin, int *out,
                           ps_err *err) {
    char what[PS_CONFIG_PATH_MAX + 192];
    snprintf(what, sizeof what, "%s: %s", origin, e->key);
    long x;
    ps_status st = num_long(what, v, (long)e->lo, (long)e->hi, e->why, &x, err);
    if (st == PS_OK) *out = (int)x;
    return st;
}

static ps_status parse_u64(const cfg_entry *e, const char *v, const char *origin,
                           uint64_t *out, ps_err *err) {
    char sv[128];
    /* Digits only: strtoull would accept "-1" and wrap it. */
    if (!*v || !cfg_only_chars(v, "0123456789"))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not an unsigned integer", cfg_shown(v, sv, sizeof sv));
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not an unsigned integer", cfg_shown(v, sv, sizeof sv));
    if (errno == ERANGE)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is out of range [0, %" PRIu64 "]", cfg_shown(v, sv, sizeof sv), UINT64_MAX);
    *out = (uint64_t)x;
    return PS_OK;
}

ps_status cfg_parse_double(const cfg_entry *e, const char *v, const char *origin,
                              double *out, ps_err *err) {
    char what[PS_CONFIG_PATH_MAX + 192];
    snprintf(what, sizeof what, "%s: %s", origin, e->key);
    return ps_parse_double(what, v, e->lo, e->hi, (e->lo_open ? PS_PARSE_OPEN_LO : 0) |
                           (e->hi_open ? PS_PARSE_OPEN_HI : 0), out, err);
}

static ps_status parse_bool(const cfg_entry *e, const char *v, const char *origin, bool *out,
                            ps_err *err) {
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcmp(v, yes[i])) { *out = true; return PS_OK; }
        if (!strcmp(v, no[i])) { *out = false; return PS_OK; }
    }
    char sv[128];
    return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                "%s is not a boolean (use true/false, yes/no or on/off)", cfg_shown(v, sv, sizeof sv));
}

static ps_status parse_enum(const cfg_entry *e, const char *v, const char *origin, int *out,
                            ps_err *err) {
    char list[256] = "";
    size_t len = 0;
    const char *const *names = cfg_entry_names(e);
    for (int i = 0; names[i]; i++) {
        if (!strcmp(v, names[i])) { *out = i; return PS_OK; }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                    names[i]);
    }
    char sv[128];
    return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not one of: %s",
                cfg_shown(v, sv, sizeof sv), list);
}


ps_status ps_config_set(ps_config *c, const char *key, const char *value, const char *origin,
                        ps_err *err) {
    PS_ASSERT(c && key);
    if (!origin) origin = "(unknown origin)";
    const cfg_entry *e = cfg_find_entry(key);
    if (!e && cfg_is_section(key))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: '%s' is a section, not a key; set one of its keys", origin, key);
    if (!e) return cfg_unknown_key(key, origin, err);
    if (!value)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "no value given");

    char *field = (char *)c + e->off;
    ps_status st = PS_OK;
    char sv[128];
    union { int i; uint64_t u; double d; bool b; } v;
    memset(&v, 0, sizeof v);
    const void *src = &v;
    size_t n = 0;
    switch (e->type) {
    case CT_STRING: {
        size_t len = strlen(value);
        if ((e->flags & F_NONEMPTY) && len == 0)
            return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "must not be empty");
        if (len >= e->size)
            return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                        "%s is %zu bytes long; at most %zu allowed", cfg_shown(value, sv, sizeof sv),
                        len, e->size - 1);
        src = value;
        n = len + 1;
        break;
    }
    case CT_INT:
        st = parse_int(e, value, origin, &v.i, err);
        if (e->scale) v.i *= e->scale;  /* the range (checked) keeps it within int */
        n = sizeof v.i;
        break;
    case CT_U64: st = parse_u64(e, value, origin, &v.u, err); n = sizeof v.u; break;
    case CT_DOUBLE: st = cfg_parse_double(e, value, origin, &v.d, err); n = sizeof v.d; break;
    case CT_BOOL: st = parse_bool(e, value, origin, &v.b, err); n = sizeof v.b; break;
    case CT_ENUM: st = parse_enum(e, value, origin, &v.i, err); n = sizeof v.i; break;
    case CT_PLACEMENT: return cfg_set_placement(c, e, key, value, origin, err);
    case CT_SIZE: return cfg_set_size(c, e, key, value, origin, err);
    case CT_SERVERS: return cfg_set_server(c, key, value, origin, err);
    }
    if (st != PS_OK) return st;
    if (e->check && (st = e->check(e, src, origin, err)) != PS_OK) return st;
    PS_ASSERT(n <= e->size);
    if (e->type == CT_STRING) memset(field, 0, e->size); /* no stale tail bytes */
    memcpy(field, src, n);
    if (e->flags & F_ALSO) {
        char *also = (char *)c + e->also;
        if (e->type == CT_STRING) memset(also, 0, e->size);
        memcpy(also, src, n);
    }
    return PS_OK;
}

void ps_config_defaults(ps_config *c) {
    memset(c, 0, sizeof *c);
    c->self = -1;
    ps_err err;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (!g_table[i].def) continue;
        ps_status st = ps_config_set(c, g_table[i].key, g_table[i].def, "default", &err);
        if (st != PS_OK) fprintf(stderr, "%s\n", err.msg);
        PS_ASSERT(st == PS_OK);
    }
}

const char *ps_config_enum_name(const char *key, int value) {
    const cfg_entry *e = cfg_find_entry(key);
    if (!e || e->type != CT_ENUM || value < 0) return NULL;
    const char *const *names = cfg_entry_names(e);
    for (int i = 0; names[i]; i++)
        if (i == value) return names[i];
    return NULL;
}

