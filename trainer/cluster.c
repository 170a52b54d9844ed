/* cluster.c - the servers of a cluster, seen from a trainer (cluster.h). */
#include "cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "hash.h"
#include "security.h"

struct ps_cluster {
    const ps_config *cfg;
    ps_placement p;
    long rank;
    FILE *log;
    ps_client *cl[PS_CONFIG_MAX_SERVERS];      /* NULL: no stage lives there */
    ps_security sec[PS_CONFIG_MAX_SERVERS];
    char name[PS_CONFIG_MAX_SERVERS][PS_CONFIG_ADDR_MAX];
    const char *names[PS_CONFIG_MAX_SERVERS];  /* name[i], for retry.h's messages */
    int single;                                /* ps_cluster_single */
    long partial, reruns;
    int report_unimplemented_logged;
    char who[64];                              /* "ps-train: rank 1", for the clients' admission retries */
};

/* servers.<name>.server_name, or security.server_name. */
static const char *server_name_of(const ps_config *cfg, const char *name) {
    for (int i = 0; i < cfg->n_servers; i++)
        if (!strcmp(cfg->servers[i].name, name) && cfg->servers[i].server_name[0]) return cfg->servers[i].server_name;
    return cfg->security.server_name;
}

/* A client of one server: the cluster's CA and token, its server name. */
static ps_client *dial(const ps_config *cfg, const char *name, const char *address, int timeout_ms,
                       ps_security *sec, ps_err *err) {
    if (ps_security_client(cfg, sec, err)) return NULL;
    sec->rpc.server_name = server_name_of(cfg, name);
    ps_client *cl = ps_client_create_secure(address, timeout_ms, cfg->server.rpc.max_message_bytes, &sec->rpc, err);
    if (!cl) ps_err_prefix(err, "server %s at %s", name[0] ? name : "psd", address);
    return cl;
}

static int used(const ps_placement *p, int server) {
    for (int s = 0; s < p->n_stages; s++)
        if (ps_placement_hosts(p, s, server)) return 1;
    return 0;
}

ps_status ps_cluster_open(const ps_config *cfg, long rank, FILE *log, ps_cluster **out, ps_err *err) {
    *out = NULL;
    ps_cluster *c = calloc(1, sizeof *c);
    if (!c) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    c->cfg = cfg;
    c->rank = rank;
    c->log = log ? log : stderr;
    ps_status st = ps_placement_resolve(cfg, &c->p, err);
    if (st) { free(c); return st; }
    PS_ASSERT(c->p.n_servers >= 1 && c->p.n_servers <= PS_CONFIG_MAX_SERVERS);
    int n_used = 0;
    c->single = -1;
    for (int i = 0; i < c->p.n_servers; i++) {
        snprintf(c->name[i], sizeof c->name[i], "%s", c->p.server_name[i][0] ? c->p.server_name[i] : c->p.server_addr[i]);
        c->names[i] = c->name[i];
        if (!used(&c->p, i)) continue;
        n_used++;
        c->single = i;
        if (!(c->cl[i] = dial(cfg, c->p.server_name[i], c->p.server_addr[i], (int)(cfg->trainer.rpc_timeout_s * 1000),
                              &c->sec[i], err))) {
            ps_cluster_free(c);
            return err ? err->code : PS_ERR_UNAVAILABLE;
        }
    }
    /* psd's admission refusals (a client over its fair share) did nothing:
     * every call is sent again after a backoff, on the unit budget's terms */
    snprintf(c->who, sizeof c->who, "ps-train: rank %ld", rank);
    for (int i = 0; i < c->p.n_servers; i++) {
        if (!c->cl[i]) continue;
        ps_retry_policy bp = {.max_s = cfg->trainer.retry_max_s, .backoff_s = cfg->trainer.retry_backoff_s,
                              .backoff_max_s = cfg->trainer.retry_backoff_max_s,
                              .seed = ps_hash_str(c->p.server_addr[i]) ^ (uint64_t)rank ^ (uint64_t)getpid() << 20,
                              .who = c->who, .log = c->log};
        if (ps_client_set_busy_retry(c->cl[i], &bp, err)) {
            ps_cluster_free(c);
            return err ? err->code : PS_ERR_RESOURCE_EXHAUSTED;
        }
    }
    if (n_used != 1) c->single = -1;
    if (n_used == 0) {
        ps_cluster_free(c);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.placement: no stage is placed on any server");
    }
    *out = c;
    return PS_OK;
}

void ps_cluster_free(ps_cluster *c) {
    if (!c) return;
    for (int i = 0; i < PS_CONFIG_MAX_SERVERS; i++) {
        ps_client_free(c->cl[i]);
        ps_security_free(&c->sec[i]);
    }
    free(c);
}

const ps_placement *ps_cluster_placement(const ps_cluster *c) { return &c->p; }
int ps_cluster_single(const ps_cluster *c) { return c->single; }
ps_client *ps_cluster_client(const ps_cluster *c, int server) {
    return server >= 0 && server < c->p.n_servers ? c->cl[server] : NULL;
}
const char *ps_cluster_name(const ps_cluster *c, int server) {
    return server >= 0 && server < c->p.n_servers ? c->name[server] : "?";
}
int ps_cluster_stage_server(const ps_cluster *c, const char *stage) {
    int s = ps_placement_stage(&c->p, stage);
    return s < 0 ? -1 : c->p.stages[s].server;
}
long ps_cluster_partial_steps(const ps_cluster *c) { return c->partial; }
long ps_cluster_reruns(const ps_cluster *c) { return c->reruns; }

long ps_cluster_busy_retries(const ps_cluster *c) {
    long n = 0;
    for (int i = 0; i < c->p.n_servers; i++) n += ps_client_busy_retries(c->cl[i]);
    return n;
}

/* Append src's parameters to dst (not its buffers: BatchNorm's running
 * statistics are psd's state, never a trainer's gradient). */
static ps_status params_append(ps_wire_param_list *dst, const ps_wire_param_list *src, ps_err *err) {
    if (dst->n + src->n > dst->cap) {
        size_t cap = dst->n + src->n;
        ps_ParameterInfo *n = realloc(dst->items, cap * sizeof *n);
        if (!n) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the parameter list");
        dst->items = n;
        dst->cap = cap;
    }
    for (size_t i = 0; i < src->n; i++)
        if (!src->items[i].buffer) dst->items[dst->n++] = src->items[i];
    return PS_OK;
}

ps_status ps_cluster_connect(ps_cluster *c, double wait_s, ps_wire_param_list *params, char *model,
                             size_t model_len, ps_err *err) {
    ps_wire_param_list_init(params, 4096);
    model[0] = 0;
    double t0 = ps_mono_s();
    for (int i = 0; i < c->p.n_servers; i++) {
        if (!c->cl[i]) continue;
        ps_wire_param_list one = {0};
        char m[64] = "";
        ps_status st;
        for (;;) {
            ps_wire_param_list_free(&one);
            if ((st = ps_client_list_parameters(c->cl[i], &one, m, sizeof m, err)) == PS_OK) break;
            if (st != PS_ERR_UNAVAILABLE || ps_mono_s() - t0 > wait_s) {
                ps_wire_param_list_free(&one);
                return ps_err_prefix(err, "cannot reach psd %s", c->name[i]);
            }
            usleep(200 * 1000);
        }
        if (model[0] && strcmp(model, m))
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "psd %s serves model '%s', but another server of the "
                            "cluster serves '%s'", c->name[i], m, model);
        if (!st) st = params_append(params, &one, err);
        ps_wire_param_list_free(&one);
        if (st) return st;
        snprintf(model, model_len, "%s", m);
    }
    return PS_OK;
}

void ps_cluster_print(ps_cluster *c, FILE *f) {
    const ps_placement *p = &c->p;
    for (int s = 0; s < p->n_stages; s++) {
        const ps_place_stage *st = &p->stages[s];
        fprintf(f, "stage %s: ", st->name);
        if (st->n_shards) {
            fprintf(f, "%s sharded over", st->table);
            for (int k = 0; k < st->n_shards; k++) {
                const ps_place_shard *sh = &st->shards[k];
                fprintf(f, "%s %s rows [%lld,%lld) at %s", k ? "," : "", c->name[sh->server], (long long)sh->lo,
                        (long long)sh->hi, p->server_addr[sh->server]);
            }
            fprintf(f, "\n");
        } else {
            fprintf(f, "%s (%s) at %s\n", c->name[st->server], st->device, p->server_addr[st->server]);
        }
    }
    if (c->single >= 0) return;
    /* The model versions of the servers every batch steps (those hosting a
     * whole stage; a shard is stepped only by the batches with ids in its
     * rows, so its version legitimately lags): they differ after a restart
     * from an older checkpoint part, or after partial steps. */
    uint64_t v[PS_CONFIG_MAX_SERVERS];
    int have[PS_CONFIG_MAX_SERVERS] = {0}, differ = 0, first = -1;
    for (int i = 0; i < p->n_servers; i++) {
        if (!c->cl[i]) continue;
        int whole = 0;
        for (int s = 0; s < p->n_stages; s++) whole |= p->stages[s].n_shards == 0 && p->stages[s].server == i;
        if (!whole) continue;
        ps_StatusResponse rs;
        ps_err e = {0};
        if (ps_client_status(c->cl[i], &rs, &e)) {
            fprintf(f, "server %s: no Status (%s)\n", c->name[i], e.msg);
            continue;
        }
        v[i] = rs.model_version;
        have[i] = 1;
        if (first < 0) first = i;
        else if (v[i] != v[first]) differ = 1;
    }
    if (!differ) {
        if (first >= 0) fprintf(f, "servers at model version %llu\n", (unsigned long long)v[first]);
        return;
    }
    fprintf(f, "warning: parts at different versions:");
    for (int i = 0, n = 0; i < p->n_servers; i++)
        if (have[i]) fprintf(f, "%s %s %llu", n++ ? "," : "", c->name[i], (unsigned long long)v[i]);
    fprintf(f, " (every batch steps each of them: a server resumed from an older checkpoint part, or partial "
            "steps; each goes on from its own version)\n");
}

/* ---- batches ------------------------------------------------------------ */

static void touch(ps_cluster_batch *b, int server) {
    PS_ASSERT(server >= 0 && server < b->cluster->p.n_servers && b->cluster->cl[server]);
    b->touched |= 1u << server;
}

ps_status ps_cluster_forward(ps_cluster_batch *b, int server, ps_client_fwd *f, ps_client_fwd_out *o, ps_err *err) {
    touch(b, server);
    f->ctx = b->ctx;
    f->train = 1;
    f->want_sq_norm = f->targets.data != NULL;  /* fused loss: the backward runs here, its norm is needed */
    ps_status st = ps_client_forward_ex(b->cluster->cl[server], f, o, err);
    if (st) return ps_err_prefix(err, "%s", b->cluster->name[server]);
    if (f->targets.data) b->sq_norm[server] = o->sq_norm;  /* fused loss: the backward ran here */
    return PS_OK;
}

ps_status ps_cluster_backward(ps_cluster_batch *b, int server, ps_client_bwd *bw, ps_err *err) {
    touch(b, server);
    bw->ctx = b->ctx;
    bw->step = 0;
    ps_client_step_out so = {0};
    ps_status st = ps_client_backward_ex(b->cluster->cl[server], bw, &so, err);
    if (st) return ps_err_prefix(err, "%s", b->cluster->name[server]);
    b->sq_norm[server] = so.sq_norm;
    return PS_OK;
}

ps_status ps_cluster_push_gradients(ps_cluster_batch *b, int server, const ps_wire_named *items, size_t n,
                                    ps_err *err) {
    /* a Forward of the batch went there first: the context must still be there (a restarted psd would
     * otherwise open a fresh one and step these gradients alone) */
    int known = (b->touched & (1u << server)) != 0;
    touch(b, server);
    double sq = 0;
    ps_status st = ps_client_push_gradients(b->cluster->cl[server], b->ctx, (uint32_t)b->cluster->rank, known, items,
                                            n, &sq, err);
    if (st) return ps_err_prefix(err, "%s", b->cluster->name[server]);
    b->sq_norm[server] = sq;
    return PS_OK;
}

double ps_cluster_batch_sq_norm(const ps_cluster_batch *b) {
    double s = 0;
    for (int i = 0; i < PS_CONFIG_MAX_SERVERS; i++)
        if (b->touched & (1u << i)) s += b->sq_norm[i];
    return s;
}

typedef struct run_arg {
    ps_cluster_batch *b;
    ps_cluster_run_fn fn;
    void *arg;
} run_arg;

static ps_status op_run(void *arg, uint64_t ctx, unsigned *touched, ps_err *err) {
    run_arg *a = arg;
    ps_cluster_batch *b = a->b;
    *b = (ps_cluster_batch){.cluster = b->cluster, .ctx = ctx, .grad_scale = 1.0f, .result = b->result};
    ps_status st = a->fn(a->arg, b, err);
    *touched = b->touched;
    return st;
}

static ps_status op_step(void *arg, int server, uint64_t ctx, ps_err *err) {
    run_arg *a = arg;
    ps_cluster *c = a->b->cluster;
    ps_client_step_out so = {0};
    ps_client_scalar loss = {"loss", a->b->loss};
    int n = a->b->has_loss && isfinite(a->b->loss);
    ps_status st = ps_client_step_full(c->cl[server], ctx, 0, a->b->grad_scale, n ? &loss : NULL, n, &so, NULL, err);
    if (st == PS_OK && so.version > a->b->version) a->b->version = so.version;
    return st;
}

static void op_release(void *arg, int server, uint64_t ctx) {
    run_arg *a = arg;
    ps_cluster *c = a->b->cluster;
    if (c->cl[server]) ps_client_release_context(c->cl[server], ctx, (uint32_t)c->rank, NULL, NULL);  /* best effort */
}

static void op_report(void *arg, int server, uint64_t ctx, unsigned applied, unsigned lost) {
    run_arg *a = arg;
    ps_cluster *c = a->b->cluster;
    if (!c->cl[server]) return;
    const char *an[PS_CONFIG_MAX_SERVERS], *ln[PS_CONFIG_MAX_SERVERS];
    int na = 0, nl = 0;
    for (int i = 0; i < c->p.n_servers; i++) {
        if (applied & (1u << i)) an[na++] = c->name[i];
        if (lost & (1u << i)) ln[nl++] = c->name[i];
    }
    ps_err e = {0};
    ps_status st = ps_client_report_partial(c->cl[server], ctx, (uint32_t)c->rank, an, na, ln, nl, NULL, &e);
    if (st == PS_ERR_UNIMPLEMENTED) {
        if (!c->report_unimplemented_logged)
            fprintf(c->log, "ps-train: rank %ld: psd %s does not know ReportPartial (an older psd): partial steps "
                    "are counted by this trainer only\n", c->rank, c->name[server]);
        c->report_unimplemented_logged = 1;
    } else if (st) {
        fprintf(c->log, "ps-train: rank %ld: could not report the partial step of context %llx to %s: %s\n", c->rank,
                (unsigned long long)ctx, c->name[server], e.msg);
    }
}

ps_status ps_cluster_run(ps_cluster *c, ps_retry *r, ps_ctx_ids *ids, const char *unit, ps_cluster_run_fn fn,
                         void *arg, ps_cluster_batch *b, ps_err *err) {
    *b = (ps_cluster_batch){.cluster = c, .grad_scale = 1.0f};
    run_arg a = {b, fn, arg};
    ps_multi_ops ops = {.unit = unit, .n_servers = c->p.n_servers, .names = c->names, .run = op_run, .step = op_step,
                        .report = op_report, .release = op_release, .arg = &a};
    ps_multi_result res;
    ps_status st = ps_retry_once_multi(r, ids, &ops, &res, err);
    b->result = res;
    c->reruns += res.reruns;
    if (st == PS_OK && res.partial) c->partial++;
    return st;
}

/* ---- ps-train status ---------------------------------------------------- */

int ps_cluster_print_status(const ps_config *cfg, double timeout_s, FILE *f) {
    ps_placement p;
    ps_err err = {0};
    if (ps_placement_resolve(cfg, &p, &err)) {
        fprintf(stderr, "ps-train status: %s\n", err.msg);
        return 1;
    }
    int bad = 0;
    fprintf(f, "cluster %s: %d servers\n", cfg->cluster.name, p.n_servers);
    for (int i = 0; i < p.n_servers; i++) {
        ps_security sec = {0};
        ps_client *cl = dial(cfg, p.server_name[i], p.server_addr[i], (int)(timeout_s * 1000), &sec, &err);
        ps_StatusResponse st;
        if (!cl || ps_client_status(cl, &st, &err)) {
            fprintf(f, "  %-8s %-22s UNREACHABLE: %s\n", p.server_name[i], p.server_addr[i], err.msg);
            bad = 1;
        } else {
            fprintf(f, "  %-8s %-22s %s, model %s version %llu, hosts %s; %llu samples; partial steps %llu applied "
                    "here, %llu lost here\n", p.server_name[i], p.server_addr[i],
                    st.draining ? "DRAINING" : "serving", st.model, (unsigned long long)st.model_version,
                    st.hosted[0] ? st.hosted : "(not reported)", (unsigned long long)st.samples,
                    (unsigned long long)st.partial_steps, (unsigned long long)st.partial_steps_lost);
        }
        ps_client_free(cl);
        ps_security_free(&sec);
    }
    return bad;
}
