/* placement.c - resolve a config's placement against the model file it
 * names (see placement.h). */
#include "placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeldef.h"

void ps_shard_range(int64_t rows, int n, int k, int64_t *lo, int64_t *hi) {
    PS_ASSERT(n >= 1 && k >= 0 && k < n && rows >= 0);
    *lo = rows * k / n;
    *hi = rows * (k + 1) / n;
}

/* The model's value of size key: model.sizes.<key>, else the file's. */
static double size_value(const ps_config *c, const ps_model_def *d, const char *key) {
    for (int i = 0; i < c->model.n_sizes; i++)
        if (!strcmp(c->model.sizes[i].key, key)) return c->model.sizes[i].value;
    const ps_size_key *k = ps_model_def_size(d, key);
    PS_ASSERT(k);
    return k->def;
}

/* Rows of an Embedding node's table (num_embeddings: a number or a size,
 * *key then naming it). */
static int64_t embedding_rows(const ps_config *c, const ps_model_def *d, const ps_node_def *nd, const char **key) {
    *key = NULL;
    for (int i = 0; i < nd->nattr; i++) {
        if (strcmp(nd->attrs[i].key, "num_embeddings") || !nd->attrs[i].vals[0]) continue;
        const char *v = nd->attrs[i].vals[0];
        if (ps_model_def_size(d, v)) {
            *key = v;
            return (int64_t)size_value(c, d, v);
        }
        return strtoll(v, NULL, 10);
    }
    return 0;
}

static const ps_stage_placement *find_placement(const ps_config *c, const char *stage) {
    for (int i = 0; i < c->model.n_placement; i++)
        if (!strcmp(c->model.placement[i].stage, stage)) return &c->model.placement[i];
    return NULL;
}

static int find_server(const ps_placement *p, const char *name) {
    for (int i = 0; i < p->n_servers; i++)
        if (!strcmp(p->server_name[i], name)) return i;
    return -1;
}

static const char *name_list(const ps_placement *p, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n_servers && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", p->server_name[i]);
    return buf;
}

#define PL "model.placement."

/* A sharded stage: its first layer must be an embedding; rows and table name. */
static ps_status place_shards(const ps_config *c, const ps_model_def *d, const ps_stage_def *sd,
                              const ps_stage_placement *pl, ps_placement *p, ps_place_stage *ps, ps_err *err) {
    char list[PS_CONFIG_MAX_SERVERS * PS_CONFIG_NAME_MAX];
    const ps_node_def *first = &d->nodes[sd->first];
    if (strcmp(first->kind_name, "Embedding") || first->in[0] != -1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.shards: only a stage whose first node is an "
                          "Embedding of the stage input can be sharded; stage '%s' of model '%s' starts with %s",
                          sd->name, sd->name, d->name, first->kind_name);
    const char *num_key;
    int64_t rows = embedding_rows(c, d, first, &num_key);
    ps->rows = rows;
    snprintf(ps->table, sizeof ps->table, "%.56s.weight", first->name);
    if (pl->n_shards > rows)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.shards: %d shards but %s has only %lld rows%s%s%s "
                          "(at least one row per shard)", sd->name, pl->n_shards, ps->table, (long long)rows,
                          num_key ? " (model.sizes." : "", num_key ? num_key : "",
                          num_key ? ")" : "");
    ps->server = -1;
    ps->n_shards = pl->n_shards;
    ps->equal = 1;
    for (int k = 0; k < pl->n_shards; k++) {
        int sv = find_server(p, pl->shard_server[k]);
        if (sv < 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.shards: server '%s' is not in servers (%s)",
                              sd->name, pl->shard_server[k], name_list(p, list, sizeof list));
        for (int j = 0; j < k; j++)
            if (ps->shards[j].server == sv)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.shards: server '%s' is named twice "
                                  "(shards %d and %d); each shard goes on its own server", sd->name,
                                  pl->shard_server[k], j + 1, k + 1);
        ps->shards[k].server = sv;
        snprintf(ps->shards[k].device, sizeof ps->shards[k].device, "%s", pl->shard_device[k]);
        ps_shard_range(rows, pl->n_shards, k, &ps->shards[k].lo, &ps->shards[k].hi);
    }
    if (pl->n_rows == 0) return PS_OK;
    /* chosen ranges: shard k holds [B_k, B_{k+1}), B_0 = 0, B_n = R */
    if (pl->n_rows != pl->n_shards - 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.rows: %d boundar%s for %d shards; give n-1 = %d "
                          "(the first row of shards 2..%d)", sd->name, pl->n_rows, pl->n_rows == 1 ? "y" : "ies",
                          pl->n_shards, pl->n_shards - 1, pl->n_shards);
    for (int k = 0; k < pl->n_rows; k++) {
        /* strictly increasing and >= 1 already checked when set */
        if (pl->rows[k] < 1 || pl->rows[k] > rows - 1 || (k && pl->rows[k] <= pl->rows[k - 1]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.rows: boundary %d (%lld) is outside 1..%lld "
                              "or not above the one before (%s has %lld rows%s%s%s; boundaries strictly "
                              "increasing)", sd->name, k + 1, (long long)pl->rows[k], (long long)(rows - 1),
                              ps->table, (long long)rows, num_key ? " (model.sizes." : "",
                              num_key ? num_key : "", num_key ? ")" : "");
    }
    for (int k = 0; k < pl->n_shards; k++) {
        ps->shards[k].lo = k ? pl->rows[k - 1] : 0;
        ps->shards[k].hi = k < pl->n_rows ? pl->rows[k] : rows;
    }
    ps->equal = 0;
    return PS_OK;
}

static ps_status build_with(const ps_config *c, const ps_model_def *d, ps_placement *p, ps_err *err) {
    PS_ASSERT(d->nstages <= PS_CONFIG_MAX_STAGES);
    char list[PS_CONFIG_MAX_SERVERS * PS_CONFIG_NAME_MAX];
    if (c->n_servers == 0) {
        p->n_servers = 1;
        snprintf(p->server_addr[0], sizeof p->server_addr[0], "%s", c->server.address);
    } else {
        p->n_servers = c->n_servers;
        for (int i = 0; i < c->n_servers; i++) {
            snprintf(p->server_name[i], sizeof p->server_name[i], "%s", c->servers[i].name);
            snprintf(p->server_addr[i], sizeof p->server_addr[i], "%s", c->servers[i].address);
        }
    }
    p->n_stages = d->nstages;
    for (int s = 0; s < d->nstages; s++) {
        const ps_stage_def *sd = &d->stages[s];
        ps_place_stage *ps = &p->stages[s];
        snprintf(ps->name, sizeof ps->name, "%s", sd->name);
        const ps_stage_placement *pl = find_placement(c, sd->name);
        if (pl && pl->n_rows && !pl->n_shards)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.rows: boundaries between shards, but stage "
                              "'%s' is not sharded (add " PL "%s.shards: [SERVER, ...], or drop rows)", sd->name,
                              sd->name, sd->name);
        if (c->n_servers == 0) {
            if (pl && pl->n_shards)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s.shards: names server '%s' but the config "
                                  "defines no servers (add servers.%s.address)", sd->name, pl->shard_server[0],
                                  pl->shard_server[0]);
            /* a bare word that is no device reads as a server: most often a mistyped device */
            if (pl && pl->server[0])
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s: '%s' is not a device (\"cpu\" or "
                                  "\"cuda:N\" with N in 0..63) but a server name, and the config defines no "
                                  "servers (add servers.%s.address, or give a device)", sd->name, pl->server,
                                  pl->server);
            ps->server = 0;
            snprintf(ps->device, sizeof ps->device, "%s", pl ? pl->device : "cpu");
            continue;
        }
        if (!pl)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s: stage '%s' of model '%s' is not placed; "
                              "with servers defined every stage names its server (servers: %s)", sd->name,
                              sd->name, d->name, name_list(p, list, sizeof list));
        if (pl->n_shards) {
            ps_status st = place_shards(c, d, sd, pl, p, ps, err);
            if (st != PS_OK) return st;
            continue;
        }
        if (!pl->server[0])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s: '%s' names no server; with servers "
                              "defined write SERVER or SERVER/DEVICE (servers: %s)", sd->name, pl->device,
                              name_list(p, list, sizeof list));
        int sv = find_server(p, pl->server);
        if (sv < 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, PL "%s: server '%s' is not in servers (%s)",
                              sd->name, pl->server, name_list(p, list, sizeof list));
        ps->server = sv;
        snprintf(ps->device, sizeof ps->device, "%s", pl->device);
    }
    return PS_OK;
}

ps_status ps_placement_build(const ps_config *c, ps_placement *p, ps_err *err) {
    memset(p, 0, sizeof *p);
    ps_status st = ps_config_check_model(c, err);
    if (st != PS_OK) return st;
    ps_model_def *d = ps_config_load_model(c, err);
    if (!d) return err ? err->code : PS_ERR_INVALID_ARGUMENT;
    st = build_with(c, d, p, err);
    ps_model_def_free(d);
    return st;
}

ps_status ps_placement_resolve(const ps_config *c, ps_placement *p, ps_err *err) {
    ps_status st = ps_config_check_cluster(c, err);
    if (st != PS_OK) {
        memset(p, 0, sizeof *p);
        return st;
    }
    return ps_placement_build(c, p, err);
}

int ps_placement_shard_of(const ps_placement *p, int s, int64_t id) {
    if (s < 0 || s >= p->n_stages) return -1;
    const ps_place_stage *ps = &p->stages[s];
    if (ps->n_shards == 0 || id < 0 || id >= ps->rows) return -1;
    int k;
    if (ps->equal) {
        /* the largest k with R*k/n <= id: floor(R*k/n) <= id <=> R*k < n*(id+1) */
        int64_t n = ps->n_shards;
        k = (int)((n * (id + 1) - 1) / ps->rows);
    } else {
        /* chosen ranges: the largest k with lo_k <= id (binary search; n <= PS_CONFIG_MAX_SHARDS) */
        int a = 0, b = ps->n_shards - 1;
        while (a < b) {
            int m = (a + b + 1) / 2;
            if (ps->shards[m].lo <= id) a = m;
            else b = m - 1;
        }
        k = a;
    }
    PS_ASSERT(k >= 0 && k < ps->n_shards && ps->shards[k].lo <= id && id < ps->shards[k].hi);
    return k;
}

int ps_placement_stage(const ps_placement *p, const char *name) {
    for (int s = 0; s < p->n_stages; s++)
        if (!strcmp(p->stages[s].name, name)) return s;
    return -1;
}

int ps_placement_hosts(const ps_placement *p, int s, int server) {
    if (s < 0 || s >= p->n_stages) return 0;
    const ps_place_stage *ps = &p->stages[s];
    if (ps->server == server) return 1;
    for (int k = 0; k < ps->n_shards; k++)
        if (ps->shards[k].server == server) return 1;
    return 0;
}

int ps_placement_servers_used(const ps_placement *p) {
    int used = 0;
    for (int sv = 0; sv < p->n_servers; sv++) {
        int any = 0;
        for (int s = 0; s < p->n_stages && !any; s++) any = ps_placement_hosts(p, s, sv);
        used += any;
    }
    return used;
}
