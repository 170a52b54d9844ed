#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>
#include <arpa/inet.h>

#include "modeldef.h"
#include "placement.h"

/* ---- the table ---------------------------------------------------------- */

typedef enum {
    CT_STRING,    /* char[size]; F_NONEMPTY: "" is an error */
    CT_INT,       /* int in [lo, hi] */
    CT_U64,       /* uint64_t, any value */
    CT_DOUBLE,    /* double in lo..hi, each bound open or closed */
    CT_BOOL,      /* bool */
    CT_ENUM,      /* an enum stored as int; names[i] is value i */
    CT_PLACEMENT, /* model.placement.<stage>: device */
    CT_SIZE,      /* model.sizes.<key>: a number (the model's range for key: ps_config_check_model) */
    CT_SERVERS,   /* servers.<name>.<field>: one psd of a cluster (ps_server_def) */
} cfg_type;

enum { F_NONEMPTY = 1, F_ALIAS = 2 /* another name of the entry before it: not printed */ };

typedef struct cfg_entry cfg_entry;
struct cfg_entry {
    const char *key;
    cfg_type type;
    size_t off, size;          /* field in ps_config */
    double lo, hi;             /* CT_INT, CT_DOUBLE */
    bool lo_open, hi_open;     /* CT_DOUBLE: bound excluded */
    const char *const *names;  /* CT_ENUM, NULL-terminated */
    const char *def;           /* default, in the text form ps_config_set takes */
    unsigned flags;
    const char *why;           /* CT_INT: appended to an out-of-range error */
    /* Extra check on the parsed value (after type and range checks). */
    ps_status (*check)(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
};

_Static_assert(sizeof(ps_log_level) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_consistency) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_sync_reduce) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_backend_kind) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_optimizer_kind) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(ps_nonfinite_policy) == sizeof(int), "enum fields are written as int");

static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const consistency_names[] = {"hogwild", "sync", "ssp", NULL};
static const char *const sync_reduce_names[] = {"sum", "mean", NULL};
static const char *const backend_names[] = {"ref", "dnnl", NULL};
static const char *const optimizer_names[] = {"sgd", "adam", NULL};

static ps_status check_hostport(const cfg_entry *e, const void *val, const char *origin,
                                ps_err *err);
static ps_status check_cluster_name(const cfg_entry *e, const void *val, const char *origin,
                                    ps_err *err);
static ps_status check_arch(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
static const char *const nonfinite_names[] = {"reject", "skip", NULL};
static const char *const ema_of_names[] = {"min", "mean", "max", NULL};

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

/* Keep docs/config.md in step with this table. Entries of one section are
 * adjacent (ps_config_print relies on it). */
static const cfg_entry g_table[] = {
    { .key = "cluster.name", .type = CT_STRING, FIELD(cluster.name), .def = "psd", .flags = F_NONEMPTY,
      .check = check_cluster_name },
    { .key = "servers", .type = CT_SERVERS, FIELD(servers) },

    STR ("server.listen",          server.listen,          "127.0.0.1:50051"),
    STR ("server.address",         server.address,         "127.0.0.1:50051"),
    INT ("server.threads",         server.threads,         1, 64, "4"),
    INT ("server.compute_threads", server.compute_threads, 0, 256, "0"),
    BOOL("server.profile",         server.profile,         "true"),
    DBL ("server.context_ttl_s",   server.context_ttl_s,   1, 0, 86400, 0, "120"),
    INT ("server.max_message_mb",  server.max_message_mb,  4, 2047, "64"),
    ENUM("server.log_level",       server.log_level,       log_level_names, "info"),
    ENUM("server.consistency",     server.consistency,     consistency_names, "hogwild"),
    INT ("server.sync_workers",    server.sync_workers,    1, 4096, "2"),
    DBL ("server.sync_timeout_s",  server.sync_timeout_s,  1, 0, 86400, 0, "30"),
    ENUM("server.sync_reduce",     server.sync_reduce,     sync_reduce_names, "mean"),
    INT ("server.max_staleness",   server.max_staleness,   0, 1000000, "3"),
    INT ("server.ssp_world_size",  server.ssp_world_size,  0, 1000000, "0"),
    DBL ("server.settle_window_s", server.settle_window_s, 1, 0, 604800, 0, "900"),
    INT ("server.max_finished",    server.max_finished,    1024, 16777216, "1048576"),
    STR0("server.checkpoint_dir",  server.checkpoint_dir,  ""),
    INT ("server.checkpoint_every_steps", server.checkpoint_every_steps, 0, 1000000000, "1000"),
    DBL ("server.checkpoint_every_s", server.checkpoint_every_s, 0, 0, 31536000, 0, "300"),
    INT ("server.checkpoint_keep", server.checkpoint_keep, 1, 1000, "3"),
    DBL ("server.grace_s",         server.grace_s,         0, 0, 3600, 0, "10"),
    { .key = "server.metrics_listen", .type = CT_STRING, FIELD(server.metrics_listen), .def = "",
      .check = check_hostport },
    BOOL("server.metrics_tls",     server.metrics_tls,     "false"),
    STR0("server.log_file",        server.log_file,        ""),
    ENUM("server.nonfinite_policy", server.nonfinite_policy, nonfinite_names, "reject"),
    INT ("server.max_calls",       server.max_calls,       1, 65536, "256"),
    INT ("server.max_calls_per_client", server.max_calls_per_client, 0, 65536, "0"),
    INT ("server.max_streams_per_connection", server.max_streams_per_connection, 1, 4096, "64"),
    DBL ("server.max_connection_age_s", server.max_connection_age_s, 0, 0, 31536000, 0, "1800"),
    INT ("server.transport_memory_mb", server.transport_memory_mb, 0, 1048576, "512"),
    DBL ("server.recv_timeout_s",  server.recv_timeout_s,  1, 0, 3600, 0, "30"),
    DBL ("server.send_timeout_s",  server.send_timeout_s,  1, 0, 3600, 0, "60"),
    U64 ("server.max_context_bytes", server.max_context_bytes, "4294967296"),
    DBL ("server.health_saturated_s", server.health_saturated_s, 0, 0, 86400, 0, "30"),
    INT ("server.metrics_round_steps", server.metrics_round_steps, 1, 1000000000, "1"),
    DBL ("server.metrics_ema_alpha", server.metrics_ema_alpha, 1, 0, 1, 0, "0.05"),
    ENUM("server.metrics_ema_of",  server.metrics_ema_of,  ema_of_names, "mean"),
    STR0("server.stop_metric",     server.stop_metric,     ""),
    DBL ("server.stop_threshold",  server.stop_threshold,  0, -1e300, 1e300, 0, "0"),

    /* model.arch: a shipped model file (common/nn/modeldef.h, configs/models/); model.name is its
     * older name. model.file: a model file of one's own (a relative path from a config file is
     * relative to that file's directory). */
    { .key = "model.arch", .type = CT_STRING, FIELD(model.arch), .def = "mnist_cnn", .flags = F_NONEMPTY,
      .check = check_arch },
    { .key = "model.name", .type = CT_STRING, FIELD(model.arch), .def = NULL, .flags = F_NONEMPTY | F_ALIAS,
      .check = check_arch },
    OPT ("model.file",             model.file),
    U64 ("model.seed",             model.seed,             "1"),
    BOOL("model.snapshot_steps",   model.snapshot_steps,   "true"),
    ENUM("model.backend",          model.backend,          backend_names, "dnnl"),
    { .key = "model.placement", .type = CT_PLACEMENT, FIELD(model.placement) },
    { .key = "model.sizes", .type = CT_SIZE, FIELD(model.sizes) },

    ENUM("optimizer.type",         optimizer.type,         optimizer_names, "sgd"),
    DBL ("optimizer.lr",           optimizer.lr,           1, 0, 100, 0, "0.03"),
    DBL ("optimizer.momentum",     optimizer.momentum,     0, 0, 1, 1, "0"),
    DBL ("optimizer.weight_decay", optimizer.weight_decay, 0, 0, 1, 0, "0"),
    DBL ("optimizer.beta1",        optimizer.beta1,        0, 0, 1, 1, "0.9"),
    DBL ("optimizer.beta2",        optimizer.beta2,        0, 0, 1, 1, "0.999"),
    DBL ("optimizer.eps",          optimizer.eps,          1, 0, 1, 0, "1e-8"),

    INT ("trainer.world_size",     trainer.world_size,     2, 1024, "3"),
    /* psd refuses a Forward larger than its model's max_batch (mnist_cnn:
     * 512, common/nn/model.c); test_config holds the two together. */
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

static const char *const *entry_names(const cfg_entry *e) { return e->names; }

/* ---- errors ------------------------------------------------------------- */

/* "origin: key: message" */
static ps_status fail(ps_err *err, ps_status code, const char *origin, const char *key,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static ps_status fail(ps_err *err, ps_status code, const char *origin, const char *key,
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
static const char *shown(const char *v, char *buf, size_t cap) {
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
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or localhost; "
                    "PORT 1..65535; \"\" turns it off)", shown(v, sv, sizeof sv));
    return PS_OK;
}

/* ---- lookup ------------------------------------------------------------- */

static const char PLACEMENT_PREFIX[] = "model.placement.";
static const char SIZES_PREFIX[] = "model.sizes.";

/* Entries whose keys are a section of free names ("model.placement.<stage>"). */
static bool is_map_type(cfg_type t) { return t == CT_PLACEMENT || t == CT_SIZE || t == CT_SERVERS; }

static const cfg_entry *find_entry(const char *key) {
    for (size_t i = 0; i < N_ENTRIES; i++)
        if (!strcmp(g_table[i].key, key)) return &g_table[i];
    for (size_t i = 0; i < N_ENTRIES; i++) {
        size_t n = strlen(g_table[i].key);
        if (is_map_type(g_table[i].type) && !strncmp(key, g_table[i].key, n) && key[n] == '.')
            return &g_table[i];
    }
    return NULL;
}

/* A section is a key that has keys below it: "server", "model.placement". */
static bool is_section(const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (is_map_type(g_table[i].type) && !strcmp(g_table[i].key, key)) return true;
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

static ps_status unknown_key(const char *key, const char *origin, ps_err *err) {
    char hint[128];
    suggest(key, hint, sizeof hint);
    return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: unknown key '%s'%s", origin, key, hint);
}

/* ---- parsing values ----------------------------------------------------- */

static bool only_chars(const char *s, const char *allowed) {
    return s[strspn(s, allowed)] == '\0';
}

/* The first n characters of s are all in allowed. */
static bool only_chars_n(const char *s, size_t n, const char *allowed) {
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(allowed, s[i])) return false;
    return true;
}

static ps_status parse_int(const cfg_entry *e, const char *v, const char *origin, int *out,
                           ps_err *err) {
    char sv[128];
    if (!*v || !only_chars(v, "+-0123456789"))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not an integer",
                    shown(v, sv, sizeof sv));
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not an integer",
                    shown(v, sv, sizeof sv));
    if (errno == ERANGE || x < (long long)e->lo || x > (long long)e->hi)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is out of range [%lld, %lld]%s%s", shown(v, sv, sizeof sv),
                    (long long)e->lo, (long long)e->hi, e->why ? ": " : "", e->why ? e->why : "");
    *out = (int)x;
    return PS_OK;
}

static ps_status parse_u64(const cfg_entry *e, const char *v, const char *origin,
                           uint64_t *out, ps_err *err) {
    char sv[128];
    /* Digits only: strtoull would accept "-1" and wrap it. */
    if (!*v || !only_chars(v, "0123456789"))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not an unsigned integer", shown(v, sv, sizeof sv));
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not an unsigned integer", shown(v, sv, sizeof sv));
    if (errno == ERANGE)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is out of range [0, %" PRIu64 "]", shown(v, sv, sizeof sv), UINT64_MAX);
    *out = (uint64_t)x;
    return PS_OK;
}

static ps_status parse_double(const cfg_entry *e, const char *v, const char *origin,
                              double *out, ps_err *err) {
    char sv[128];
    /* Decimal notation only: no hex floats, "inf", "nan" or spaces. */
    if (!*v || !only_chars(v, "+-.0123456789eE"))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not a number",
                    shown(v, sv, sizeof sv));
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not a number",
                    shown(v, sv, sizeof sv));
    if (errno == ERANGE || !isfinite(x) || (e->lo_open ? x <= e->lo : x < e->lo) ||
        (e->hi_open ? x >= e->hi : x > e->hi))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is out of range %c%g, %g%c",
                    shown(v, sv, sizeof sv), e->lo_open ? '(' : '[', e->lo, e->hi,
                    e->hi_open ? ')' : ']');
    *out = x;
    return PS_OK;
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
    return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                "%s is not a boolean (use true/false, yes/no or on/off)", shown(v, sv, sizeof sv));
}

static ps_status parse_enum(const cfg_entry *e, const char *v, const char *origin, int *out,
                            ps_err *err) {
    char list[256] = "";
    size_t len = 0;
    const char *const *names = entry_names(e);
    for (int i = 0; names[i]; i++) {
        if (!strcmp(v, names[i])) { *out = i; return PS_OK; }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                    names[i]);
    }
    char sv[128];
    return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is not one of: %s",
                shown(v, sv, sizeof sv), list);
}

/* "cpu" or "cuda:N" with N in 0..63, no sign, no spaces, at most 2 digits. */
static bool valid_device(const char *v) {
    if (!strcmp(v, "cpu")) return true;
    if (strncmp(v, "cuda:", 5)) return false;
    const char *d = v + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 2 || !only_chars(d, "0123456789")) return false;
    if (n == 2 && d[0] == '0') return false; /* "cuda:07" */
    int x = 0;
    for (size_t i = 0; i < n; i++) x = x * 10 + (d[i] - '0');
    return x <= 63;
}

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"

/* A server name (servers.<name>): 1..31 letters, digits, '_' or '-', and
 * no device's name in any case ("cpu", "cuda..."): a bare word in a
 * placement is a device when it can be one, so "CPU" is a typo, not a
 * server. */
static bool valid_server_name(const char *v) {
    return *v && strlen(v) < PS_CONFIG_NAME_MAX && only_chars(v, NAME_CHARS) && strcasecmp(v, "cpu") &&
           strncasecmp(v, "cuda", 4);
}

static ps_status check_cluster_name(const cfg_entry *e, const void *val, const char *origin,
                                    ps_err *err) {
    const char *v = val;
    char sv[128];
    if (!only_chars(v, NAME_CHARS "."))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s: a cluster name is 1..%d letters, digits, '_', '-' or '.'", shown(v, sv, sizeof sv),
                    PS_CONFIG_NAME_MAX - 1);
    return PS_OK;
}

/* "HOST:PORT" where trainers dial a server or where it binds: HOST an IPv4
 * address, [IPv6 address] or a host name (letters, digits, '-', '.');
 * PORT 1..65535. */
static bool valid_dial_address(const char *v) {
    if (ps_config_parse_hostport(v, NULL, 0, NULL)) return true;
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v || (size_t)(colon - v) > 253) return false;
    char host[256];
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = '\0';
    if (!only_chars(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ||
        host[0] == '-' || host[0] == '.' || strstr(host, ".."))
        return false;
    const char *p = colon + 1;
    if (!*p || strlen(p) > 5 || !only_chars(p, "0123456789")) return false;
    long x = strtol(p, NULL, 10);
    return x >= 1 && x <= 65535;
}

/* "DEVICE", "SERVER/DEVICE" or "SERVER" (device cpu) into server (maybe
 * "") and device. need_server: a bare device is refused (shard entries).
 * NULL when valid, else what is wrong. */
static const char *parse_place(const char *v, bool need_server, char server[PS_CONFIG_NAME_MAX],
                               char device[PS_CONFIG_DEVICE_MAX]) {
    memset(server, 0, PS_CONFIG_NAME_MAX);
    memset(device, 0, PS_CONFIG_DEVICE_MAX);
    const char *slash = strchr(v, '/');
    if (!slash && valid_device(v)) {
        if (need_server) return "names no server (expected SERVER or SERVER/DEVICE)";
        snprintf(device, PS_CONFIG_DEVICE_MAX, "%s", v);
        return NULL;
    }
    size_t sl = slash ? (size_t)(slash - v) : strlen(v);
    char name[PS_CONFIG_NAME_MAX + 1] = "";
    if (sl < sizeof name) { memcpy(name, v, sl); name[sl] = '\0'; }
    if (sl == 0 || sl >= PS_CONFIG_NAME_MAX || !valid_server_name(name))
        return slash ? "is not SERVER/DEVICE (SERVER: 1..31 letters, digits, '_' or '-'; DEVICE: \"cpu\" or "
                       "\"cuda:N\" with N in 0..63)"
                     : "is not a device (expected \"cpu\" or \"cuda:N\" with N in 0..63), nor a server name "
                       "(1..31 letters, digits, '_' or '-'; or SERVER/DEVICE)";
    if (slash && !valid_device(slash + 1))
        return "has no valid device after the '/' (expected \"cpu\" or \"cuda:N\" with N in 0..63)";
    snprintf(server, PS_CONFIG_NAME_MAX, "%s", name);
    snprintf(device, PS_CONFIG_DEVICE_MAX, "%s", slash ? slash + 1 : "cpu");
    return NULL;
}

/* model.placement.<stage> = "DEVICE" | "SERVER/DEVICE" | "SERVER", or
 * model.placement.<stage>.shards = "SERVER[/DEVICE],..." (from YAML the
 * sequence, joined by the loader). Either replaces the stage's previous
 * placement whole, so printing and loading give the same bytes. */
static ps_status set_placement(ps_config *c, const cfg_entry *e, const char *key, const char *v,
                               const char *origin, ps_err *err) {
    char sv[128];
    if (strncmp(key, PLACEMENT_PREFIX, sizeof PLACEMENT_PREFIX - 1))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "name a stage, e.g. %sconv: cuda:0", PLACEMENT_PREFIX);
    char stage[PS_CONFIG_STAGE_MAX + 1] = "";
    const char *rest = key + sizeof PLACEMENT_PREFIX - 1;
    const char *dot = strchr(rest, '.');
    size_t sl = dot ? (size_t)(dot - rest) : strlen(rest);
    if (sl < sizeof stage) { memcpy(stage, rest, sl); stage[sl] = '\0'; }
    if (sl == 0 || sl >= PS_CONFIG_STAGE_MAX || !only_chars(stage, NAME_CHARS))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "stage name must be 1..%d letters, digits, '_' or '-'",
                    PS_CONFIG_STAGE_MAX - 1);
    if (dot && strcmp(dot + 1, "shards") && strcmp(dot + 1, "rows"))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "a placement has no key '%s' (a stage takes a device or SERVER/DEVICE, or "
                    "%s%s.shards: a list of servers and optionally %s%s.rows: the row boundaries "
                    "between them)", dot + 1, PLACEMENT_PREFIX, stage, PLACEMENT_PREFIX, stage);
    ps_stage_placement *old = NULL;
    for (int i = 0; i < c->model.n_placement && !old; i++)
        if (!strcmp(c->model.placement[i].stage, stage)) old = &c->model.placement[i];
    ps_stage_placement np;
    memset(&np, 0, sizeof np);
    snprintf(np.stage, sizeof np.stage, "%s", stage);
    if (dot && !strcmp(dot + 1, "rows")) {
        /* only the boundaries change; the servers stay as they are */
        if (old) np = *old;
        np.n_rows = 0;
        memset(np.rows, 0, sizeof np.rows);
        const char *p = v;
        while (*p == ' ') p++;
        while (*p) {
            while (*p == ' ') p++;
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            while (len && p[len - 1] == ' ') len--;
            char item[32];
            if (len == 0 || len >= sizeof item || !only_chars_n(p, len, "0123456789"))
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                            "%s: boundary %d is not a row number (expected a list of integers, the first "
                            "row of shards 2..n)", shown(v, sv, sizeof sv), np.n_rows + 1);
            memcpy(item, p, len);
            item[len] = '\0';
            if (np.n_rows >= PS_CONFIG_MAX_SHARDS - 1)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "more than %d boundaries (at most %d "
                            "shards)", PS_CONFIG_MAX_SHARDS - 1, PS_CONFIG_MAX_SHARDS);
            errno = 0;
            long long x = strtoll(item, NULL, 10);
            if (errno || x < 1)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundary %d (%s) must be at least 1 "
                            "(shard 1 starts at row 0)", shown(v, sv, sizeof sv), np.n_rows + 1, item);
            if (np.n_rows && x <= np.rows[np.n_rows - 1])
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundaries must be strictly "
                            "increasing (boundary %d, %lld, follows %lld)", shown(v, sv, sizeof sv),
                            np.n_rows + 1, x, (long long)np.rows[np.n_rows - 1]);
            np.rows[np.n_rows++] = x;
            if (!comma) break;
            p = comma + 1;
            if (!*p)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundary %d is empty",
                            shown(v, sv, sizeof sv), np.n_rows + 1);
        }
    } else if (!dot) {
        const char *why = parse_place(v, false, np.server, np.device);
        if (why) return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s %s", shown(v, sv, sizeof sv), why);
    } else {
        /* comma-separated entries, blanks around each ignored */
        const char *p = v;
        for (;;) {
            while (*p == ' ') p++;
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            while (len && p[len - 1] == ' ') len--;
            char item[PS_CONFIG_NAME_MAX + PS_CONFIG_DEVICE_MAX + 2];
            if (len == 0)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                            "%s: shard %d is empty (expected a list of SERVER or SERVER/DEVICE)",
                            shown(v, sv, sizeof sv), np.n_shards + 1);
            if (np.n_shards >= PS_CONFIG_MAX_SHARDS)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "more than %d shards",
                            PS_CONFIG_MAX_SHARDS);
            if (len >= sizeof item)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "shard %d '%.40s...' is too long",
                            np.n_shards + 1, p);
            memcpy(item, p, len);
            item[len] = '\0';
            const char *why = parse_place(item, true, np.shard_server[np.n_shards], np.shard_device[np.n_shards]);
            if (why)
                return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "shard %d %s %s", np.n_shards + 1,
                            shown(item, sv, sizeof sv), why);
            np.n_shards++;
            if (!comma) break;
            p = comma + 1;
        }
        /* the boundaries stay: shards and rows may come in either order */
        if (old) {
            np.n_rows = old->n_rows;
            memcpy(np.rows, old->rows, sizeof np.rows);
        }
    }
    for (int i = 0; i < c->model.n_placement; i++) {
        if (!strcmp(c->model.placement[i].stage, stage)) {
            c->model.placement[i] = np;
            return PS_OK;
        }
    }
    if (c->model.n_placement >= PS_CONFIG_MAX_STAGES)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "too many stages in %s (at most %d)", e->key, PS_CONFIG_MAX_STAGES);
    c->model.placement[c->model.n_placement++] = np;
    return PS_OK;
}

/* servers.<name>.<field>: the fields of ps_server_def, in print order. */
typedef enum { SF_DIAL, SF_LISTEN, SF_PATH, SF_TEXT } server_field_kind;
static const struct server_field {
    const char *name;
    size_t off, size;
    server_field_kind kind;
} g_server_fields[] = {
#define SFIELD(n, k) { #n, offsetof(ps_server_def, n), sizeof(((ps_server_def *)0)->n), k }
    SFIELD(address, SF_DIAL),
    SFIELD(listen, SF_DIAL),
    SFIELD(cert, SF_PATH),
    SFIELD(key, SF_PATH),
    SFIELD(server_name, SF_TEXT),
    SFIELD(metrics_listen, SF_LISTEN),
    SFIELD(checkpoint_dir, SF_PATH),
#undef SFIELD
};
#define N_SERVER_FIELDS (sizeof g_server_fields / sizeof g_server_fields[0])
static const char SERVERS_PREFIX[] = "servers.";

static const char *server_field_list(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_SERVER_FIELDS && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", g_server_fields[i].name);
    return buf;
}

/* Index of servers.<name>, -1 if absent. */
static int find_server(const ps_config *c, const char *name) {
    for (int i = 0; i < c->n_servers; i++)
        if (!strcmp(c->servers[i].name, name)) return i;
    return -1;
}

/* "ps0, ps1" */
static const char *server_names(const ps_config *c, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->n_servers && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", c->servers[i].name);
    return buf;
}

/* servers.<name>.<field>; a name not seen yet adds a server. */
static ps_status set_server(ps_config *c, const char *key, const char *v, const char *origin, ps_err *err) {
    char sv[128], list[160];
    if (strncmp(key, SERVERS_PREFIX, sizeof SERVERS_PREFIX - 1))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "name a server and a field, e.g. %sps0.address",
                    SERVERS_PREFIX);
    const char *rest = key + sizeof SERVERS_PREFIX - 1;
    const char *dot = strchr(rest, '.');
    size_t nl = dot ? (size_t)(dot - rest) : strlen(rest);
    char name[PS_CONFIG_NAME_MAX + 1] = "";
    if (nl < sizeof name) { memcpy(name, rest, nl); name[nl] = '\0'; }
    if (nl == 0 || nl >= PS_CONFIG_NAME_MAX || !valid_server_name(name))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "a server name is 1..%d letters, digits, '_' or '-' (and not a device: cpu, cuda...)",
                    PS_CONFIG_NAME_MAX - 1);
    if (!dot)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "name a field of the server: %s%s.<%s>",
                    SERVERS_PREFIX, name, server_field_list(list, sizeof list));
    const struct server_field *sf = NULL;
    for (size_t i = 0; i < N_SERVER_FIELDS; i++)
        if (!strcmp(g_server_fields[i].name, dot + 1)) sf = &g_server_fields[i];
    if (!sf)
        return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: unknown key '%s' (a server has: %s)", origin, key,
                          server_field_list(list, sizeof list));
    size_t len = strlen(v);
    if (len >= sf->size)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s is %zu bytes long; at most %zu allowed",
                    shown(v, sv, sizeof sv), len, sf->size - 1);
    if (*v && sf->kind == SF_DIAL && !valid_dial_address(v))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or a host name; PORT 1..65535)",
                    shown(v, sv, sizeof sv));
    if (*v && sf->kind == SF_LISTEN && !ps_config_parse_hostport(v, NULL, 0, NULL))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or localhost; "
                    "PORT 1..65535; \"\" takes server.metrics_listen)", shown(v, sv, sizeof sv));
    int i = find_server(c, name);
    if (i < 0) {
        if (c->n_servers >= PS_CONFIG_MAX_SERVERS)
            return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "too many servers (at most %d: %s)",
                        PS_CONFIG_MAX_SERVERS, server_names(c, list, sizeof list));
        i = c->n_servers++;
        memset(&c->servers[i], 0, sizeof c->servers[i]);
        snprintf(c->servers[i].name, sizeof c->servers[i].name, "%s", name);
    }
    char *field = (char *)&c->servers[i] + sf->off;
    memset(field, 0, sf->size);
    memcpy(field, v, len + 1);
    return PS_OK;
}

/* model.sizes.<key>: a number, checked against the range of the size of
 * the model set so far when it has one (the error then names the line);
 * ps_config_check_model checks every size against the final model (the
 * model may be set after its sizes). */
static ps_status set_size(ps_config *c, const cfg_entry *e, const char *key, const char *v,
                          const char *origin, ps_err *err) {
    const char *name = strncmp(key, SIZES_PREFIX, sizeof SIZES_PREFIX - 1) ? "" : key + sizeof SIZES_PREFIX - 1;
    if (!*name || strchr(name, '.'))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "expected model.sizes.NAME");
    ps_model_def *d = ps_model_def_load(c->model.arch, c->model.file, NULL);
    const ps_size_key *sk = d ? ps_model_def_size(d, name) : NULL;
    cfg_entry ek = { .key = key, .type = CT_DOUBLE, .lo = sk ? sk->lo : -1e300, .hi = sk ? sk->hi : 1e300,
                     .hi_open = sk && sk->hi_open };
    int integer = sk && sk->integer;
    ps_model_def_free(d);
    double x;
    ps_status st = parse_double(&ek, v, origin, &x, err);
    if (st != PS_OK) return st;
    char sv[128];
    if (integer && x != floor(x))
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s is not a whole number", shown(v, sv, sizeof sv));
    for (int i = 0; i < c->model.n_sizes; i++)
        if (!strcmp(c->model.sizes[i].key, name)) { c->model.sizes[i].value = x; return PS_OK; }
    if (c->model.n_sizes >= PS_CONFIG_MAX_SIZES || strlen(name) >= PS_CONFIG_SIZE_KEY_MAX)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "too many sizes in %s (at most %d)", e->key,
                    PS_CONFIG_MAX_SIZES);
    ps_model_size *ms = &c->model.sizes[c->model.n_sizes++];
    memset(ms, 0, sizeof *ms);
    snprintf(ms->key, sizeof ms->key, "%s", name);
    ms->value = x;
    return PS_OK;
}

static ps_status check_arch(const cfg_entry *e, const void *val, const char *origin, ps_err *err) {
    const char *v = val;
    for (const char *p = v; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-'))
            return fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "'%.64s' is not a model name (letters, "
                        "digits, '_' and '-'; a model file of your own goes in model.file)", v);
    return PS_OK;
}

ps_model_def *ps_config_load_model(const ps_config *c, ps_err *err) {
    ps_model_def *d = ps_model_def_load(c->model.arch, c->model.file, err);
    if (!d) ps_err_prefix(err, "%s", c->model.file[0] ? "model.file" : "model.arch");
    return d;
}

ps_status ps_config_check_model(const ps_config *c, ps_err *err) {
    ps_model_def *d = ps_config_load_model(c, err);
    if (!d) return err ? err->code : PS_ERR_INVALID_ARGUMENT;
    char list[256];
    ps_status st = PS_OK;
    for (int i = 0; i < c->model.n_placement && st == PS_OK; i++)
        if (ps_model_def_stage(d, c->model.placement[i].stage) < 0)
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: model '%s' has no stage '%s' (stages: %s)",
                            PLACEMENT_PREFIX, c->model.placement[i].stage, d->name, c->model.placement[i].stage,
                            ps_model_def_stage_list(d, list, sizeof list));
    for (int i = 0; i < c->model.n_sizes && st == PS_OK; i++) {
        const ps_model_size *ms = &c->model.sizes[i];
        const ps_size_key *sk = ps_model_def_size(d, ms->key);
        if (!sk) {
            size_t len = 0;
            list[0] = 0;
            for (int k = 0; k < d->nsizes; k++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", k ? ", " : "", d->sizes[k].key);
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: model '%s' has no size '%s' (sizes: %s)",
                            SIZES_PREFIX, ms->key, d->name, ms->key, d->nsizes ? list : "none");
        } else if (!(ms->value >= sk->lo && (sk->hi_open ? ms->value < sk->hi : ms->value <= sk->hi))) {
            char v[32];
            snprintf(v, sizeof v, "%g", ms->value);
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: '%s' is out of range %g..%g%s (model '%s')",
                            SIZES_PREFIX, ms->key, v, sk->lo, sk->hi, sk->hi_open ? " (excluded)" : "", d->name);
        } else if (sk->integer && ms->value != floor(ms->value)) {
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: %g is not a whole number (model '%s')",
                            SIZES_PREFIX, ms->key, ms->value, d->name);
        }
    }
    ps_model_def_free(d);
    return st;
}

/* ---- a cluster of several psd ------------------------------------------- */

/* Split "HOST:PORT" (HOST maybe [v6]; "localhost" -> 127.0.0.1). */
static void split_hostport(const char *v, char *host, size_t cap, int *port) {
    const char *colon = strrchr(v, ':');
    size_t hl = colon ? (size_t)(colon - v) : strlen(v);
    if (hl >= cap) hl = cap - 1;
    memcpy(host, v, hl);
    host[hl] = '\0';
    if (!strcmp(host, "localhost")) snprintf(host, cap, "127.0.0.1");
    *port = colon ? (int)strtol(colon + 1, NULL, 10) : 0;
}

static bool wildcard_host(const char *h) { return !strcmp(h, "0.0.0.0") || !strcmp(h, "[::]"); }

/* Two servers on one host (same address host) binding the same port. */
static bool same_bind(const char *addr_a, const char *a, const char *addr_b, const char *b) {
    char ha[256], hb[256], la[256], lb[256];
    int pa, pb, qa, qb;
    split_hostport(addr_a, ha, sizeof ha, &pa);
    split_hostport(addr_b, hb, sizeof hb, &pb);
    if (strcmp(ha, hb)) return false;   /* different machines may bind the same port */
    split_hostport(a, la, sizeof la, &qa);
    split_hostport(b, lb, sizeof lb, &qb);
    return qa == qb && (!strcmp(la, lb) || wildcard_host(la) || wildcard_host(lb));
}

static const char *effective_listen(const ps_server_def *s) { return s->listen[0] ? s->listen : s->address; }

static const char *effective_metrics(const ps_config *c, const ps_server_def *s) {
    return s->metrics_listen[0] ? s->metrics_listen : c->server.metrics_listen;
}

static ps_status check_servers(const ps_config *c, ps_err *err) {
    for (int i = 0; i < c->n_servers; i++) {
        const ps_server_def *s = &c->servers[i];
        if (!s->address[0])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s.address: required (HOST:PORT where "
                              "trainers dial %s)", s->name, s->name);
        for (int j = 0; j < i; j++) {
            const ps_server_def *o = &c->servers[j];
            char h1[256], h2[256];
            int p1, p2;
            split_hostport(s->address, h1, sizeof h1, &p1);
            split_hostport(o->address, h2, sizeof h2, &p2);
            if (!strcmp(h1, h2) && p1 == p2)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s.address: '%s' is also servers.%s's "
                                  "address '%s'; each server needs its own", s->name, s->address, o->name,
                                  o->address);
            if (same_bind(s->address, effective_listen(s), o->address, effective_listen(o)))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s.listen: '%s' is where servers.%s "
                                  "binds too ('%s', same host); servers on one host need distinct ports",
                                  s->name, effective_listen(s), o->name, effective_listen(o));
            const char *ms = effective_metrics(c, s), *mo = effective_metrics(c, o);
            if (ms[0] && mo[0] && same_bind(s->address, ms, o->address, mo))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s.metrics_listen: '%s' is servers.%s's "
                                  "metrics address too (same host); set servers.<name>.metrics_listen per "
                                  "server", s->name, ms, o->name);
        }
    }
    return PS_OK;
}

/* Server s's checkpoint directory: its own, or server.checkpoint_dir/<name>
 * ("" = none). */
static ps_status server_ckpt_dir(const ps_config *c, const ps_server_def *s, char *ck, size_t n, ps_err *err) {
    int w = s->checkpoint_dir[0] ? snprintf(ck, n, "%s", s->checkpoint_dir)
            : c->server.checkpoint_dir[0] ? snprintf(ck, n, "%s/%s", c->server.checkpoint_dir, s->name)
                                           : snprintf(ck, n, "%s", "");
    if (w < 0 || (size_t)w >= n)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.checkpoint_dir: '%.64s...' + '/%s' is longer than "
                          "%d bytes", c->server.checkpoint_dir, s->name, PS_CONFIG_PATH_MAX - 1);
    return PS_OK;
}

/* A path as written, without "./" parts, repeated or trailing slashes:
 * "ck/./ps0/" and "ck//ps0" are "ck/ps0". */
static void path_norm(const char *in, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = in; *p && o + 1 < n;) {
        if (p[0] == '/' && (p[1] == '/' || (p[1] == '.' && (p[2] == '/' || !p[2])))) { p += p[1] == '/' ? 1 : 2; continue; }
        if (p == in && p[0] == '.' && p[1] == '/') { p += 2; continue; }
        out[o++] = *p++;
    }
    while (o > 1 && out[o - 1] == '/') o--;
    out[o] = 0;
}

/* Two servers writing checkpoints into one directory overwrite each other's
 * ckpt-N files: refused (each also holds its directory's lock file at run
 * time, checkpoint.h). */
static ps_status check_ckpt_dirs(const ps_config *c, ps_err *err) {
    char d[PS_CONFIG_MAX_SERVERS][PS_CONFIG_PATH_MAX], raw[PS_CONFIG_PATH_MAX];
    for (int i = 0; i < c->n_servers; i++) {
        if (server_ckpt_dir(c, &c->servers[i], raw, sizeof raw, err)) return err->code;
        path_norm(raw, d[i], sizeof d[i]);
        for (int j = 0; j < i && d[i][0]; j++)
            if (!strcmp(d[i], d[j]))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s.checkpoint_dir: '%s' is servers.%s's "
                                  "checkpoint directory too; two servers in one directory overwrite each other's "
                                  "checkpoints - give each its own (or leave it empty: server.checkpoint_dir/<name>)",
                                  c->servers[i].name, d[i], c->servers[j].name);
    }
    return PS_OK;
}

ps_status ps_config_check_cluster(const ps_config *c, ps_err *err) {
    /* (once a server is selected, server.checkpoint_dir is its own: the
     * directories were checked by ps_config_select_server) */
    ps_status st = c->n_servers ? check_servers(c, err) : PS_OK;
    if (st == PS_OK && c->n_servers && c->self < 0) st = check_ckpt_dirs(c, err);
    ps_placement p;
    if (st == PS_OK) st = ps_placement_build(c, &p, err);  /* also ps_config_check_model */
    if (st != PS_OK || c->n_servers == 0) return st;
    char used[PS_CONFIG_MAX_SERVERS * PS_CONFIG_NAME_MAX] = "";
    size_t o = 0;
    for (int sv = 0; sv < p.n_servers; sv++) {
        int hosts = 0;
        for (int s = 0; s < p.n_stages && !hosts; s++) hosts = ps_placement_hosts(&p, s, sv);
        if (!hosts)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s: no stage is placed on it (%s"
                              "<stage>: %s/DEVICE, or a shard) - remove it or give it a stage", p.server_name[sv],
                              PLACEMENT_PREFIX, p.server_name[sv]);
        o += (size_t)snprintf(used + o, sizeof used - o, "%s%s", o ? ", " : "", p.server_name[sv]);
    }
    if (c->server.consistency != PS_CONSISTENCY_HOGWILD && ps_placement_servers_used(&p) > 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.consistency: %s needs one server: stages span "
                          "%s; use hogwild until a cross-server round exists",
                          ps_config_enum_name("server.consistency", (int)c->server.consistency), used);
    return PS_OK;
}

ps_status ps_config_select_server(ps_config *c, const char *name, ps_err *err) {
    char list[PS_CONFIG_MAX_SERVERS * PS_CONFIG_NAME_MAX];
    if (c->n_servers == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--name %s: this config defines no servers "
                          "(servers.<name>); without them psd is the only server: drop --name", name);
    int i = find_server(c, name);
    if (i < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--name %s: not a server of this config (servers: %s)",
                          name, server_names(c, list, sizeof list));
    const ps_server_def *s = &c->servers[i];
    char ck[PS_CONFIG_PATH_MAX];
    if (check_ckpt_dirs(c, err) || server_ckpt_dir(c, s, ck, sizeof ck, err)) return err->code;
    /* Whole buffers copied, so the config stays memcmp-comparable. */
#define TAKE(dst, src) do { memset((dst), 0, sizeof(dst)); snprintf((dst), sizeof(dst), "%s", (src)); } while (0)
    TAKE(c->server.address, s->address);
    TAKE(c->server.listen, effective_listen(s));
    if (s->cert[0]) TAKE(c->security.cert, s->cert);
    if (s->key[0]) TAKE(c->security.key, s->key);
    if (s->metrics_listen[0]) TAKE(c->server.metrics_listen, s->metrics_listen);
    TAKE(c->server.checkpoint_dir, ck);
#undef TAKE
    c->self = i;
    return PS_OK;
}

ps_status ps_config_set(ps_config *c, const char *key, const char *value, const char *origin,
                        ps_err *err) {
    PS_ASSERT(c && key);
    if (!origin) origin = "(unknown origin)";
    const cfg_entry *e = find_entry(key);
    if (!e && is_section(key))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: '%s' is a section, not a key; set one of its keys", origin, key);
    if (!e) return unknown_key(key, origin, err);
    if (!value)
        return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "no value given");

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
            return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "must not be empty");
        if (len >= e->size)
            return fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                        "%s is %zu bytes long; at most %zu allowed", shown(value, sv, sizeof sv),
                        len, e->size - 1);
        src = value;
        n = len + 1;
        break;
    }
    case CT_INT: st = parse_int(e, value, origin, &v.i, err); n = sizeof v.i; break;
    case CT_U64: st = parse_u64(e, value, origin, &v.u, err); n = sizeof v.u; break;
    case CT_DOUBLE: st = parse_double(e, value, origin, &v.d, err); n = sizeof v.d; break;
    case CT_BOOL: st = parse_bool(e, value, origin, &v.b, err); n = sizeof v.b; break;
    case CT_ENUM: st = parse_enum(e, value, origin, &v.i, err); n = sizeof v.i; break;
    case CT_PLACEMENT: return set_placement(c, e, key, value, origin, err);
    case CT_SIZE: return set_size(c, e, key, value, origin, err);
    case CT_SERVERS: return set_server(c, key, value, origin, err);
    }
    if (st != PS_OK) return st;
    if (e->check && (st = e->check(e, src, origin, err)) != PS_OK) return st;
    PS_ASSERT(n <= e->size);
    if (e->type == CT_STRING) memset(field, 0, e->size); /* no stale tail bytes */
    memcpy(field, src, n);
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
    const cfg_entry *e = find_entry(key);
    if (!e || e->type != CT_ENUM || value < 0) return NULL;
    const char *const *names = entry_names(e);
    for (int i = 0; names[i]; i++)
        if (i == value) return names[i];
    return NULL;
}

/* ---- YAML --------------------------------------------------------------- */

#define KEY_MAX 128

typedef struct loader {
    yaml_document_t *doc;
    const char *path;
    ps_config *c;
    ps_err *err;
} loader;

static const char *node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a single value";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

/* A plain (unquoted) YAML null: "", "~", "null". */
static bool is_null_scalar(const yaml_node_t *n) {
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

/* Depth below a map-type entry's key: "servers.ps0" 1, "servers.ps0.listen" 2. */
static int depth_below(const cfg_entry *e, const char *key) {
    int d = 0;
    for (const char *p = key + strlen(e->key); *p; p++) d += *p == '.';
    return d;
}

/* A key whose YAML value may be a mapping of further keys:
 * servers.<name> and model.placement.<stage> ({shards: [...]}). */
static bool nests(const cfg_entry *e, const char *key) {
    return e && (e->type == CT_SERVERS || e->type == CT_PLACEMENT) && depth_below(e, key) == 1;
}

/* A key whose YAML value may be a sequence: model.placement.<stage>.shards
 * and model.placement.<stage>.rows. */
static bool is_list_key(const cfg_entry *e, const char *key) {
    size_t n = strlen(key);
    return e->type == CT_PLACEMENT && depth_below(e, key) == 2 &&
           ((n > 7 && !strcmp(key + n - 7, ".shards")) || (n > 5 && !strcmp(key + n - 5, ".rows")));
}

/* A sequence of single values as the comma-separated text the setter takes. */
static ps_status join_sequence(loader *L, yaml_node_t *seq, const char *key, const char *origin, char *out,
                               size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++) {
        yaml_node_t *n = yaml_document_get_node(L->doc, *it);
        PS_ASSERT(n);
        if (n->type != YAML_SCALAR_NODE || is_null_scalar(n))
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: entry %d: expected a single value, got %s",
                              origin, key, (int)(it - seq->data.sequence.items.start) + 1,
                              n->type == YAML_SCALAR_NODE ? "nothing" : node_kind(n));
        const char *v = (const char *)n->data.scalar.value;
        if (strchr(v, ','))
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: entry %d '%.64s' holds a ','; "
                              "write one value per entry", origin, key,
                              (int)(it - seq->data.sequence.items.start) + 1, v);
        int w = snprintf(out + o, cap - o, "%s%s", o ? "," : "", v);
        if (w < 0 || (size_t)w >= cap - o)
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: too many or too long entries", origin,
                              key);
        o += (size_t)w;
    }
    return PS_OK;
}

static ps_status walk_mapping(loader *L, yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(L->doc, p->value);
        PS_ASSERT(kn && vn);
        size_t line = kn->start_mark.line + 1;
        char origin[PS_CONFIG_PATH_MAX + 32];
        snprintf(origin, sizeof origin, "%s:%zu", L->path, line);
        if (kn->type != YAML_SCALAR_NODE)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: a key must be a name, not %s",
                              origin, node_kind(kn));
        const char *name = (const char *)kn->data.scalar.value;
        char key[KEY_MAX];
        int kl = snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", name);
        if (kl < 0 || (size_t)kl >= sizeof key)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: key '%.64s...' is too long",
                              origin, name);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(L->doc, q->key);
            if (qk->type == YAML_SCALAR_NODE && !strcmp((const char *)qk->data.scalar.value, name))
                return ps_err_set(L->err, PS_ERR_FORMAT,
                                  "%s: duplicate key '%s' (first given on line %zu)", origin,
                                  key, qk->start_mark.line + 1);
        }

        bool section = is_section(key);
        const cfg_entry *e = find_entry(key);
        if (vn->type == YAML_MAPPING_NODE && (section || nests(e, key))) {
            ps_status st = walk_mapping(L, vn, key);
            if (st != PS_OK) return st;
            continue;
        }
        if (vn->type == YAML_SEQUENCE_NODE && e && is_list_key(e, key)) {
            char joined[PS_CONFIG_MAX_SHARDS * (PS_CONFIG_NAME_MAX + PS_CONFIG_DEVICE_MAX + 2) + 64];
            ps_status st = join_sequence(L, vn, key, origin, joined, sizeof joined);
            if (st == PS_OK) st = ps_config_set(L->c, key, joined, origin, L->err);
            if (st != PS_OK) return st;
            continue;
        }
        if (!section && !e) return unknown_key(key, origin, L->err);
        if (section && !(vn->type == YAML_SCALAR_NODE && is_null_scalar(vn)))
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: expected a mapping of keys, got %s",
                              origin, key, node_kind(vn));
        if (section) continue; /* "server:" with nothing under it */
        if (vn->type != YAML_SCALAR_NODE)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: expected a single value, got %s",
                              origin, key, node_kind(vn));
        if (is_null_scalar(vn))
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: no value given",
                              origin, key);
        ps_status st = ps_config_set(L->c, key, (const char *)vn->data.scalar.value, origin,
                                     L->err);
        if (st != PS_OK) return st;
    }
    return PS_OK;
}

static ps_status yaml_error(const yaml_parser_t *p, const char *path, ps_err *err) {
    if (p->error == YAML_MEMORY_ERROR)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory parsing YAML", path);
    if (p->error == YAML_READER_ERROR)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: byte %zu: %s", path, p->problem_offset,
                          p->problem ? p->problem : "cannot read");
    return ps_err_set(err, PS_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path,
                      p->problem_mark.line + 1, p->problem_mark.column + 1,
                      p->problem ? p->problem : "unknown problem", p->context ? " " : "",
                      p->context ? p->context : "");
}

/* A relative model.file this config file set is relative to its directory. */
static ps_status file_relative_to(ps_config *c, const char *before, const char *path, ps_err *err) {
    const char *slash = strrchr(path, '/');
    if (!c->model.file[0] || c->model.file[0] == '/' || !strcmp(before, c->model.file) || !slash) return PS_OK;
    char joined[PS_CONFIG_PATH_MAX];
    int n = snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - path), path, c->model.file);
    if (n < 0 || (size_t)n >= sizeof joined)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: model.file: '%s' relative to the config's directory "
                          "is too long", path, c->model.file);
    memset(c->model.file, 0, sizeof c->model.file);
    memcpy(c->model.file, joined, (size_t)n + 1);
    return PS_OK;
}

ps_status ps_config_load(ps_config *c, const char *path, ps_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO,
                          "%s: cannot open config: %s", path, strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: cannot initialise libyaml", path);
    }
    yaml_parser_set_input_file(&parser, f);

    ps_status st = PS_OK;
    yaml_document_t doc;
    char file_before[PS_CONFIG_PATH_MAX];
    memcpy(file_before, c->model.file, sizeof file_before);
    if (!yaml_parser_load(&parser, &doc)) {
        st = yaml_error(&parser, path, err);
        goto out;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type == YAML_MAPPING_NODE) {
            loader L = {.doc = &doc, .path = path, .c = c, .err = err};
            st = walk_mapping(&L, root, "");
            if (st == PS_OK) st = file_relative_to(c, file_before, path, err);
        } else if (!(root->type == YAML_SCALAR_NODE && is_null_scalar(root))) {
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s:%zu: expected a mapping of sections (server:, model:, ...) at "
                            "the top level, got %s", path, root->start_mark.line + 1,
                            node_kind(root));
        }
        yaml_document_delete(&doc);
        if (st != PS_OK) goto out;
        /* Exactly one document per file. */
        if (!yaml_parser_load(&parser, &doc)) {
            st = yaml_error(&parser, path, err);
            goto out;
        }
        root = yaml_document_get_root_node(&doc);
        if (root && !(root->type == YAML_SCALAR_NODE && is_null_scalar(root)))
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s:%zu: a second YAML document; a config file holds one",
                            path, root->start_mark.line + 1);
    }
    yaml_document_delete(&doc);
out:
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}

/* ---- printing ----------------------------------------------------------- */

static void print_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) fprintf(f, "\\x%02x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* Shortest %g form (6 digits at least, so 120 is not 1.2e+02) that reads
 * back as the same double. */
static void print_double(FILE *f, double x) {
    char buf[64];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    fputs(buf, f);
}

static void print_servers(const ps_config *c, FILE *f) {
    fputs("servers:", f);
    if (c->n_servers == 0) fputs(" {}", f);
    for (int i = 0; i < c->n_servers; i++) {
        fprintf(f, "\n  %s:", c->servers[i].name);
        for (size_t k = 0; k < N_SERVER_FIELDS; k++) {
            fprintf(f, "\n    %s: ", g_server_fields[k].name);
            print_string(f, (const char *)&c->servers[i] + g_server_fields[k].off);
        }
    }
    fputc('\n', f);
}

static void print_placement(const ps_config *c, FILE *f) {
    if (c->model.n_placement == 0) fputs(" {}", f);
    for (int k = 0; k < c->model.n_placement; k++) {
        const ps_stage_placement *p = &c->model.placement[k];
        fprintf(f, "\n    %s:", p->stage);
        if (p->n_shards) {
            fputs(" {shards: [", f);
            for (int j = 0; j < p->n_shards; j++) {
                char item[PS_CONFIG_NAME_MAX + PS_CONFIG_DEVICE_MAX + 1];
                snprintf(item, sizeof item, "%s/%s", p->shard_server[j], p->shard_device[j]);
                if (j) fputs(", ", f);
                print_string(f, item);
            }
            fputc(']', f);
            if (p->n_rows) {
                fputs(", rows: [", f);
                for (int j = 0; j < p->n_rows; j++) fprintf(f, "%s%lld", j ? ", " : "", (long long)p->rows[j]);
                fputc(']', f);
            }
            fputc('}', f);
        } else if (p->n_rows) {
            /* rows without shards: refused by the checks, printed so the mistake survives a round trip */
            fputs(" {rows: [", f);
            for (int j = 0; j < p->n_rows; j++) fprintf(f, "%s%lld", j ? ", " : "", (long long)p->rows[j]);
            fputs("]}", f);
        } else if (p->server[0]) {
            char item[PS_CONFIG_NAME_MAX + PS_CONFIG_DEVICE_MAX + 1];
            snprintf(item, sizeof item, "%s/%s", p->server, p->device);
            fputc(' ', f);
            print_string(f, item);
        } else {
            fputc(' ', f);
            print_string(f, p->device);
        }
    }
}

void ps_config_print(const ps_config *c, FILE *f) {
    fputs("# effective configuration (see docs/config.md)\n", f);
    const char *sect = NULL;
    size_t sect_len = 0;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        const cfg_entry *e = &g_table[i];
        if (e->flags & F_ALIAS) continue;
        if (e->type == CT_SERVERS) { /* a top-level map: servers.<name>.<field> */
            fputs(sect ? "\n" : "", f);
            print_servers(c, f);
            sect = e->key;
            sect_len = strlen(e->key);
            continue;
        }
        const char *dot = strchr(e->key, '.');
        PS_ASSERT(dot);
        size_t sl = (size_t)(dot - e->key);
        if (!sect || sl != sect_len || strncmp(sect, e->key, sl)) {
            fprintf(f, "%s%.*s:\n", sect ? "\n" : "", (int)sl, e->key);
            sect = e->key;
            sect_len = sl;
        }
        const char *field = (const char *)c + e->off;
        fprintf(f, "  %s:", dot + 1);
        switch (e->type) {
        case CT_STRING: fputc(' ', f); print_string(f, field); break;
        case CT_INT: fprintf(f, " %d", *(const int *)field); break;
        case CT_U64: fprintf(f, " %" PRIu64, *(const uint64_t *)field); break;
        case CT_DOUBLE: fputc(' ', f); print_double(f, *(const double *)field); break;
        case CT_BOOL: fputs(*(const bool *)field ? " true" : " false", f); break;
        case CT_ENUM: {
            const char *name = ps_config_enum_name(e->key, *(const int *)field);
            fprintf(f, " %s", name ? name : "?");
            break;
        }
        case CT_PLACEMENT: print_placement(c, f); break;
        case CT_SIZE:
            if (c->model.n_sizes == 0) fputs(" {}", f);
            for (int k = 0; k < c->model.n_sizes; k++) {
                fprintf(f, "\n    %s: ", c->model.sizes[k].key);
                print_double(f, c->model.sizes[k].value);
            }
            break;
        case CT_SERVERS: PS_ASSERT(!"handled above"); break;
        }
        fputc('\n', f);
    }
}
