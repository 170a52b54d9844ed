/* config_cluster.c - the keys that name things of a cluster (servers.<name>,
 * model.placement.<stage>, model.sizes.<key>) and the checks across keys:
 * every stage placed once, servers distinct, a server's own settings
 * (ps_config_select_server). (config.h, docs/config.md) */
#include "config_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "modeldef.h"
#include "placement.h"

/* "cpu" or "cuda:N" with N in 0..63, no sign, no spaces, at most 2 digits. */
static bool valid_device(const char *v) {
    if (!strcmp(v, "cpu")) return true;
    if (strncmp(v, "cuda:", 5)) return false;
    const char *d = v + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 2 || !cfg_only_chars(d, "0123456789")) return false;
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
    return *v && strlen(v) < PS_CONFIG_NAME_MAX && cfg_only_chars(v, NAME_CHARS) && strcasecmp(v, "cpu") &&
           strncasecmp(v, "cuda", 4);
}

ps_status cfg_check_cluster_name(const cfg_entry *e, const void *val, const char *origin,
                                    ps_err *err) {
    const char *v = val;
    char sv[128];
    if (!cfg_only_chars(v, NAME_CHARS "."))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s: a cluster name is 1..%d letters, digits, '_', '-' or '.'", cfg_shown(v, sv, sizeof sv),
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
    if (!cfg_only_chars(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ||
        host[0] == '-' || host[0] == '.' || strstr(host, ".."))
        return false;
    const char *p = colon + 1;
    if (!*p || strlen(p) > 5 || !cfg_only_chars(p, "0123456789")) return false;
    long x = strtol(p, NULL, 10);
    return x >= 1 && x <= 65535;
}

/* A unix socket path gRPC can dial: "unix:PATH" (relative or absolute) or
 * "unix:///ABSOLUTE" (gRPC takes no authority after "unix://"); the path
 * must fit in sockaddr_un.sun_path, NUL included. */
#define UNIX_PATH_MAX 107
static bool valid_unix_address(const char *v) {
    if (strncmp(v, "unix:", 5)) return false;
    const char *path = v + 5;
    if (!strncmp(path, "//", 2)) {
        path += 2;
        if (path[0] != '/') return false;
    }
    return *path && strlen(path) <= UNIX_PATH_MAX;
}

ps_status cfg_check_dial_address(const cfg_entry *e, const void *val, const char *origin, ps_err *err) {
    const char *v = val;
    char sv[128];
    /* local:PATH: psd's local transport (server.local_socket) */
    bool local = !strncmp(v, "local:", 6) && v[6] && strlen(v + 6) <= UNIX_PATH_MAX;
    if (!valid_dial_address(v) && !valid_unix_address(v) && !local)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or a host name; PORT 1..65535), "
                    "unix:PATH nor local:PATH (a socket path of 1..%d bytes)", cfg_shown(v, sv, sizeof sv),
                    UNIX_PATH_MAX);
    return PS_OK;
}

/* server.local_socket: "" (none) or the path of a unix socket (not
 * "unix:PATH": that is a gRPC address; trainers dial "local:PATH"). */
ps_status cfg_check_local_socket(const cfg_entry *e, const void *val, const char *origin, ps_err *err) {
    const char *v = val;
    char sv[128];
    if (!strncmp(v, "unix:", 5) || !strncmp(v, "local:", 6))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                        "%s: give the socket's path alone (trainers dial local:PATH)", cfg_shown(v, sv, sizeof sv));
    if (strlen(v) > UNIX_PATH_MAX)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "%s is longer than %d bytes (a unix socket's "
                        "path)", cfg_shown(v, sv, sizeof sv), UNIX_PATH_MAX);
    return PS_OK;
}

/* A scalar name as trainers send it in StepRequest.scalars and psd's round
 * metrics take it (server/round_metrics.c): 1..31 characters of
 * [A-Za-z0-9_.-]; "" = no stop metric. (Whether a trainer reports it is for
 * psd to warn about: user trainers may report their own.) */
ps_status cfg_check_scalar_name(const cfg_entry *e, const void *val, const char *origin, ps_err *err) {
    const char *v = val;
    char sv[128];
    if (!cfg_only_chars(v, NAME_CHARS "."))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key,
                    "%s is not a scalar name (1..%d letters, digits, '_', '.' or '-', as trainers report them; "
                    "\"\" = no stop metric)", cfg_shown(v, sv, sizeof sv), PS_RM_NAME_MAX - 1);
    return PS_OK;
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
ps_status cfg_set_placement(ps_config *c, const cfg_entry *e, const char *key, const char *v,
                               const char *origin, ps_err *err) {
    char sv[128];
    if (strncmp(key, CFG_PLACEMENT_PREFIX, sizeof CFG_PLACEMENT_PREFIX - 1))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "name a stage, e.g. %sconv: cuda:0", CFG_PLACEMENT_PREFIX);
    char stage[PS_CONFIG_STAGE_MAX + 1] = "";
    const char *rest = key + sizeof CFG_PLACEMENT_PREFIX - 1;
    const char *dot = strchr(rest, '.');
    size_t sl = dot ? (size_t)(dot - rest) : strlen(rest);
    if (sl < sizeof stage) { memcpy(stage, rest, sl); stage[sl] = '\0'; }
    if (sl == 0 || sl >= PS_CONFIG_STAGE_MAX || !cfg_only_chars(stage, NAME_CHARS))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "stage name must be 1..%d letters, digits, '_' or '-'",
                    PS_CONFIG_STAGE_MAX - 1);
    if (dot && strcmp(dot + 1, "shards") && strcmp(dot + 1, "rows"))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "a placement has no key '%s' (a stage takes a device or SERVER/DEVICE, or "
                    "%s%s.shards: a list of servers and optionally %s%s.rows: the row boundaries "
                    "between them)", dot + 1, CFG_PLACEMENT_PREFIX, stage, CFG_PLACEMENT_PREFIX, stage);
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
            if (len == 0 || len >= sizeof item || !cfg_only_chars_n(p, len, "0123456789"))
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                            "%s: boundary %d is not a row number (expected a list of integers, the first "
                            "row of shards 2..n)", cfg_shown(v, sv, sizeof sv), np.n_rows + 1);
            memcpy(item, p, len);
            item[len] = '\0';
            if (np.n_rows >= PS_CONFIG_MAX_SHARDS - 1)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "more than %d boundaries (at most %d "
                            "shards)", PS_CONFIG_MAX_SHARDS - 1, PS_CONFIG_MAX_SHARDS);
            errno = 0;
            long long x = strtoll(item, NULL, 10);
            if (errno || x < 1)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundary %d (%s) must be at least 1 "
                            "(shard 1 starts at row 0)", cfg_shown(v, sv, sizeof sv), np.n_rows + 1, item);
            if (np.n_rows && x <= np.rows[np.n_rows - 1])
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundaries must be strictly "
                            "increasing (boundary %d, %lld, follows %lld)", cfg_shown(v, sv, sizeof sv),
                            np.n_rows + 1, x, (long long)np.rows[np.n_rows - 1]);
            np.rows[np.n_rows++] = x;
            if (!comma) break;
            p = comma + 1;
            if (!*p)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s: boundary %d is empty",
                            cfg_shown(v, sv, sizeof sv), np.n_rows + 1);
        }
    } else if (!dot) {
        const char *why = parse_place(v, false, np.server, np.device);
        if (why) return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s %s", cfg_shown(v, sv, sizeof sv), why);
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
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                            "%s: shard %d is empty (expected a list of SERVER or SERVER/DEVICE)",
                            cfg_shown(v, sv, sizeof sv), np.n_shards + 1);
            if (np.n_shards >= PS_CONFIG_MAX_SHARDS)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "more than %d shards",
                            PS_CONFIG_MAX_SHARDS);
            if (len >= sizeof item)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "shard %d '%.40s...' is too long",
                            np.n_shards + 1, p);
            memcpy(item, p, len);
            item[len] = '\0';
            const char *why = parse_place(item, true, np.shard_server[np.n_shards], np.shard_device[np.n_shards]);
            if (why)
                return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "shard %d %s %s", np.n_shards + 1,
                            cfg_shown(item, sv, sizeof sv), why);
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
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
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
#define SERVERS_PREFIX "servers."

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
ps_status cfg_set_server(ps_config *c, const char *key, const char *v, const char *origin, ps_err *err) {
    char sv[128], list[160];
    if (strncmp(key, SERVERS_PREFIX, sizeof SERVERS_PREFIX - 1))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "name a server and a field, e.g. %sps0.address",
                    SERVERS_PREFIX);
    const char *rest = key + sizeof SERVERS_PREFIX - 1;
    const char *dot = strchr(rest, '.');
    size_t nl = dot ? (size_t)(dot - rest) : strlen(rest);
    char name[PS_CONFIG_NAME_MAX + 1] = "";
    if (nl < sizeof name) { memcpy(name, rest, nl); name[nl] = '\0'; }
    if (nl == 0 || nl >= PS_CONFIG_NAME_MAX || !valid_server_name(name))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "a server name is 1..%d letters, digits, '_' or '-' (and not a device: cpu, cuda...)",
                    PS_CONFIG_NAME_MAX - 1);
    if (!dot)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "name a field of the server: %s%s.<%s>",
                    SERVERS_PREFIX, name, server_field_list(list, sizeof list));
    const struct server_field *sf = NULL;
    for (size_t i = 0; i < N_SERVER_FIELDS; i++)
        if (!strcmp(g_server_fields[i].name, dot + 1)) sf = &g_server_fields[i];
    if (!sf)
        return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: unknown key '%s' (a server has: %s)", origin, key,
                          server_field_list(list, sizeof list));
    size_t len = strlen(v);
    if (len >= sf->size)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s is %zu bytes long; at most %zu allowed",
                    cfg_shown(v, sv, sizeof sv), len, sf->size - 1);
    if (*v && sf->kind == SF_DIAL && !valid_dial_address(v) && !valid_unix_address(v))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or a host name; PORT 1..65535) "
                    "nor unix:PATH (a socket path of 1..%d bytes)", cfg_shown(v, sv, sizeof sv), UNIX_PATH_MAX);
    if (*v && sf->kind == SF_LISTEN && !ps_config_parse_hostport(v, NULL, 0, NULL))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key,
                    "%s is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or localhost; "
                    "PORT 1..65535; \"\" takes server.metrics_listen)", cfg_shown(v, sv, sizeof sv));
    int i = find_server(c, name);
    if (i < 0) {
        if (c->n_servers >= PS_CONFIG_MAX_SERVERS)
            return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "too many servers (at most %d: %s)",
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
ps_status cfg_set_size(ps_config *c, const cfg_entry *e, const char *key, const char *v,
                       const char *origin, ps_err *err) {
    const char *name = strncmp(key, CFG_SIZES_PREFIX, sizeof CFG_SIZES_PREFIX - 1) ? "" : key + sizeof CFG_SIZES_PREFIX - 1;
    if (!*name || strchr(name, '.'))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "expected model.sizes.NAME");
    ps_model_def *d = ps_model_def_load(c->model.arch, c->model.file, NULL);
    const ps_size_key *sk = d ? ps_model_def_size(d, name) : NULL;
    cfg_entry ek = { .key = key, .type = CT_DOUBLE, .lo = sk ? sk->lo : -1e300, .hi = sk ? sk->hi : 1e300,
                     .hi_open = sk && sk->hi_open };
    int integer = sk && sk->integer;
    ps_model_def_free(d);
    double x;
    ps_status st = cfg_parse_double(&ek, v, origin, &x, err);
    if (st != PS_OK) return st;
    char sv[128];
    if (integer && x != floor(x))
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "%s is not a whole number", cfg_shown(v, sv, sizeof sv));
    for (int i = 0; i < c->model.n_sizes; i++)
        if (!strcmp(c->model.sizes[i].key, name)) { c->model.sizes[i].value = x; return PS_OK; }
    if (c->model.n_sizes >= PS_CONFIG_MAX_SIZES || strlen(name) >= PS_CONFIG_SIZE_KEY_MAX)
        return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, key, "too many sizes in %s (at most %d)", e->key,
                        PS_CONFIG_MAX_SIZES);
    ps_model_size *ms = &c->model.sizes[c->model.n_sizes++];
    memset(ms, 0, sizeof *ms);
    snprintf(ms->key, sizeof ms->key, "%s", name);
    ms->value = x;
    return PS_OK;
}

ps_status cfg_check_arch(const cfg_entry *e, const void *val, const char *origin, ps_err *err) {
    const char *v = val;
    for (const char *p = v; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-'))
            return cfg_fail(err, PS_ERR_INVALID_ARGUMENT, origin, e->key, "'%.64s' is not a model name (letters, "
                            "digits, '_' and '-'; a model file of your own goes in model.file)", v);
    return PS_OK;
}

const char *ps_config_model_origin(const ps_config *c, const char *where, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s", where ? where : "", where ? ": " : "", c->model.file[0] ? "model.file" : "model.arch");
    return buf;
}

ps_model_def *ps_config_load_model(const ps_config *c, ps_err *err) {
    ps_model_def *d = ps_model_def_load(c->model.arch, c->model.file, err);
    char origin[64];
    if (!d) ps_err_prefix(err, "%s", ps_config_model_origin(c, NULL, origin, sizeof origin));
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
                            CFG_PLACEMENT_PREFIX, c->model.placement[i].stage, d->name, c->model.placement[i].stage,
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
                            CFG_SIZES_PREFIX, ms->key, d->name, ms->key, d->nsizes ? list : "none");
        } else if (!(ms->value >= sk->lo && (sk->hi_open ? ms->value < sk->hi : ms->value <= sk->hi))) {
            char v[32];
            snprintf(v, sizeof v, "%g", ms->value);
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: '%s' is out of range %g..%g%s (model '%s')",
                            CFG_SIZES_PREFIX, ms->key, v, sk->lo, sk->hi, sk->hi_open ? " (excluded)" : "", d->name);
        } else if (sk->integer && ms->value != floor(ms->value)) {
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s: %g is not a whole number (model '%s')",
                            CFG_SIZES_PREFIX, ms->key, ms->value, d->name);
        }
    }
    ps_model_def_free(d);
    return st;
}

/* ---- a cluster of several psd ------------------------------------------- */

/* Split "HOST:PORT" (HOST maybe [v6]; "localhost" -> 127.0.0.1; a unix
 * socket is on the dialling host: 127.0.0.1, port 0). */
static void split_hostport(const char *v, char *host, size_t cap, int *port) {
    if (!strncmp(v, "unix:", 5)) {
        snprintf(host, cap, "127.0.0.1");
        *port = 0;
        return;
    }
    const char *colon = strrchr(v, ':');
    size_t hl = colon ? (size_t)(colon - v) : strlen(v);
    if (hl >= cap) hl = cap - 1;
    memcpy(host, v, hl);
    host[hl] = '\0';
    if (!strcmp(host, "localhost")) snprintf(host, cap, "127.0.0.1");
    *port = colon ? (int)strtol(colon + 1, NULL, 10) : 0;
}

static void path_norm(const char *in, char *out, size_t n);

/* The socket path of a "unix:" address, normalised ("unix:///s/a.sock",
 * "unix:/s//a.sock" and "unix:/s/./a.sock" are one socket) into out; false
 * for HOST:PORT. */
static bool unix_path(const char *v, char *out, size_t n) {
    if (strncmp(v, "unix:", 5)) return false;
    v += 5;
    path_norm(!strncmp(v, "//", 2) ? v + 2 : v, out, n);
    return true;
}

/* One address twice: the same unix socket, or the same host and port
 * ("localhost" is 127.0.0.1). A unix socket is never a HOST:PORT. */
static bool same_address(const char *a, const char *b) {
    char ha[256], hb[256];
    int pa, pb;
    bool ua = unix_path(a, ha, sizeof ha), ub = unix_path(b, hb, sizeof hb);
    if (ua || ub) return ua && ub && !strcmp(ha, hb);
    split_hostport(a, ha, sizeof ha, &pa);
    split_hostport(b, hb, sizeof hb, &pb);
    return !strcmp(ha, hb) && pa == pb;
}

static bool wildcard_host(const char *h) { return !strcmp(h, "0.0.0.0") || !strcmp(h, "[::]"); }

/* Two servers on one host (same address host) binding the same port. */
static bool same_bind(const char *addr_a, const char *a, const char *addr_b, const char *b) {
    char ha[256], hb[256], la[256], lb[256];
    int pa, pb, qa, qb;
    split_hostport(addr_a, ha, sizeof ha, &pa);
    split_hostport(addr_b, hb, sizeof hb, &pb);
    if (strcmp(ha, hb)) return false;   /* different machines may bind the same port */
    if (unix_path(a, la, sizeof la) || unix_path(b, lb, sizeof lb)) return same_address(a, b);
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
            if (same_address(s->address, o->address))
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
            : c->server.checkpoint.dir[0] ? snprintf(ck, n, "%s/%s", c->server.checkpoint.dir, s->name)
                                           : snprintf(ck, n, "%s", "");
    if (w < 0 || (size_t)w >= n)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.checkpoint_dir: '%.64s...' + '/%s' is longer than "
                          "%d bytes", c->server.checkpoint.dir, s->name, PS_CONFIG_PATH_MAX - 1);
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

/* One server's gRPC and metrics ports: the second bind would fail. */
static ps_status check_own_ports(const char *listen_key, const char *listen, const char *metrics_key,
                                 const char *metrics, ps_err *err) {
    if (!metrics[0] || !same_bind(listen, listen, listen, metrics)) return PS_OK;
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is where %s binds too ('%s'); the metrics port "
                      "needs a port of its own", metrics_key, metrics, listen_key, listen);
}

/* Keys of trainer.* that bound each other. */
static ps_status check_trainer(const ps_config *c, ps_err *err) {
    if (c->trainer.retry_backoff_s > c->trainer.retry_backoff_max_s)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "trainer.retry_backoff_s: %g is larger than "
                          "trainer.retry_backoff_max_s (%g): the first wait before a retry cannot be longer than "
                          "the longest; raise trainer.retry_backoff_max_s or lower trainer.retry_backoff_s",
                          c->trainer.retry_backoff_s, c->trainer.retry_backoff_max_s);
    return PS_OK;
}

ps_status ps_config_check_cluster(const ps_config *c, ps_err *err) {
    /* (once a server is selected, server.checkpoint_dir is its own: the
     * directories were checked by ps_config_select_server) */
    ps_status st = check_trainer(c, err);
    if (st == PS_OK && c->n_servers) st = check_servers(c, err);
    if (st == PS_OK && c->n_servers && c->self < 0) st = check_ckpt_dirs(c, err);
    if (st == PS_OK && !c->n_servers)
        st = check_own_ports("server.listen", c->server.listen, "server.metrics_listen", c->server.metrics_listen, err);
    for (int i = 0; st == PS_OK && i < c->n_servers; i++) {
        const ps_server_def *s = &c->servers[i];
        if (c->self >= 0 && i != c->self) continue;
        char lk[64], mk[64];
        snprintf(lk, sizeof lk, "servers.%s.listen", s->name);
        snprintf(mk, sizeof mk, "servers.%s.metrics_listen", s->name);
        st = check_own_ports(lk, effective_listen(s), s->metrics_listen[0] ? mk : "server.metrics_listen",
                             effective_metrics(c, s), err);
    }
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
                              CFG_PLACEMENT_PREFIX, p.server_name[sv]);
        o += (size_t)snprintf(used + o, sizeof used - o, "%s%s", o ? ", " : "", p.server_name[sv]);
    }
    if (c->server.service.cons.mode != PS_CONS_HOGWILD && ps_placement_servers_used(&p) > 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.consistency: %s needs one server: stages span "
                          "%s; use hogwild until a cross-server round exists",
                          ps_config_enum_name("server.consistency", (int)c->server.service.cons.mode), used);
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
    TAKE(c->server.checkpoint.dir, ck);
    TAKE(c->server.service.server_name, s->name);
#undef TAKE
    c->self = i;
    return PS_OK;
}


/* ---- printing (ps_config_print) ---------------------------------------- */

void cfg_print_servers(const ps_config *c, FILE *f) {
    fputs("servers:", f);
    if (c->n_servers == 0) fputs(" {}", f);
    for (int i = 0; i < c->n_servers; i++) {
        fprintf(f, "\n  %s:", c->servers[i].name);
        for (size_t k = 0; k < N_SERVER_FIELDS; k++) {
            fprintf(f, "\n    %s: ", g_server_fields[k].name);
            cfg_print_string(f, (const char *)&c->servers[i] + g_server_fields[k].off);
        }
    }
    fputc('\n', f);
}

void cfg_print_placement(const ps_config *c, FILE *f) {
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
                cfg_print_string(f, item);
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
            cfg_print_string(f, item);
        } else {
            fputc(' ', f);
            cfg_print_string(f, p->device);
        }
    }
}

