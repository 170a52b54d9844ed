/* psd - the parameter-server daemon.
 *
 * Hosts the model the config names and serves the ParameterServer gRPC
 * service (plus grpc.health.v1.Health) to many trainers at once.
 * Lifecycle:
 *  - start: validate the config, build the model, restore the newest valid
 *    checkpoint (or --init-from weights), listen, then tell systemd READY=1;
 *  - run: once a second expire idle contexts and write a checkpoint when
 *    one is due; SIGHUP reopens server.log_file;
 *  - SIGINT/SIGTERM: drain (new Forwards refused with UNAVAILABLE, health
 *    NOT_SERVING; open contexts may finish) for up to server.grace_s, stop
 *    the server, write a final checkpoint, exit 0.
 * Signals are blocked in every thread and taken synchronously by the main
 * loop (sigtimedwait).
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "wire.h"
#include "cli.h"
#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "dashboard.h"
#include "isa_check.h"
#include "malloc_tune.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "onnx_weights.h"
#include "placement.h"
#include "placement_model.h"
#include "round_metrics.h"
#include "rpc_server.h"
#include "security.h"
#include "service.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: psd [options]\n"
            "  -c, --config FILE      cluster config (YAML); default: built-in defaults\n"
            "  -l, --listen ADDR      address to serve on (server.listen)\n"
            "      --name NAME        be servers.NAME of a cluster config: host the stages placed on NAME,\n"
            "                         bind its listen address, use its cert, key and checkpoint_dir\n"
            "                         (required when the config defines servers)\n"
            "  -b, --backend NAME     CPU compute backend: dnnl or ref (model.backend)\n"
            "      --checkpoint-dir DIR  write and resume checkpoints there (server.checkpoint_dir)\n"
            "      --metrics-listen ADDR serve Prometheus metrics on HOST:PORT (server.metrics_listen)\n"
            "      --log-file FILE    log to FILE instead of stderr; SIGHUP reopens it (server.log_file)\n"
            "      --init-from FILE   start from these weights (safetensors, state_dict names, e.g.\n"
            "                         exported from PyTorch) unless a checkpoint exists to resume\n"
            "      --check-config FILE  validate FILE (and the flags given) and exit: 0 when valid; a cluster\n"
            "                         config is checked whole, and what each server hosts is printed\n"
            "      --set KEY=VALUE    override any config key, e.g. --set optimizer.lr=0.05\n"
            "      --log-level LEVEL  debug, info, warn or error (server.log_level)\n"
            "      --print-config     print the effective config and exit\n"
            "  -V, --version          print the version and exit\n"
            "  -h, --help             this help\n"
            "Keys, types and defaults: docs/config.md.\n");
}

/* Write a checkpoint now; logs the outcome. */
static int write_checkpoint(const ps_config *cfg, ps_model *model, ps_service *svc, ps_metrics *metrics,
                            ps_ckpt_sched *sched) {
    ps_err err = {0};
    ps_ckpt_info info;
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(svc, &st, &samples);
    double t0 = ps_mono_s();
    const ps_ckpt_ident id = {cfg->cluster.name, cfg->self >= 0 ? cfg->servers[cfg->self].name : ""};
    ps_ckpt_save_opts so = {.id = &id, .samples = samples, .keep = cfg->server.checkpoint.keep,
                            .contexts = ps_service_contexts(svc)};
    if (ps_ckpt_save_with(model, cfg->server.checkpoint.dir, &so, &info, &err)) {
        ps_log(PS_LOG_ERROR, "checkpoint failed: %s", err.msg);
        ps_metrics_note_checkpoint(metrics, 0);
        return -1;
    }
    ps_service_note_checkpoint(svc, &info);
    ps_metrics_note_checkpoint(metrics, 1);
    ps_ckpt_sched_done(sched, info.version, ps_mono_s());
    ps_log(PS_LOG_INFO, "checkpoint written: %s (model version %llu, %.0f ms)", info.path,
           (unsigned long long)info.version, (ps_mono_s() - t0) * 1000);
    return 0;
}

/* What start-up would refuse beyond the config's own checks: transport
 * security (certificate, key and CA files as gRPC and the metrics port's
 * HTTPS take them, tokens file, plaintext beyond loopback), the addresses it
 * binds, the checkpoint directory, the log file. A port in use, or a
 * checkpoint directory a running psd holds, is only a warning: psd itself
 * may be running. */
static ps_status check_startup(const ps_config *cfg, ps_err *err) {
    grpc_init();
    ps_security sec;
    ps_status st = ps_security_server(cfg, &sec, err);
    if (!st) {
        st = ps_rpc_server_check(cfg->server.listen, &sec.rpc, err);
        ps_security_free(&sec);
    }
    grpc_shutdown();
    if (st) return st;
    ps_metrics_http_opts ho = {cfg->server.metrics_tls ? cfg->security.cert : NULL, cfg->security.key, 0, 0, 0, 0};
    if (cfg->server.metrics_listen[0] && ps_metrics_check_tls(&ho, err)) return err->code;
    const char *ls = cfg->server.rpc.local_socket;
    struct stat sb;
    if (ls[0]) {  /* its directory must take a socket; a socket there already may be this psd's */
        char dir[sizeof cfg->server.rpc.local_socket];
        snprintf(dir, sizeof dir, "%s", ls);
        char *slash = strrchr(dir, '/');
        if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
        else snprintf(dir, sizeof dir, ".");
        if (lstat(ls, &sb) == 0 && !S_ISSOCK(sb.st_mode))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.local_socket %s: exists and is not a socket", ls);
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK | X_OK) != 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.local_socket %s: its directory %s is not a "
                              "directory this user may create a socket in", ls, dir);
    }
    const char *ck = cfg->server.checkpoint.dir;
    if (ck[0] && stat(ck, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.checkpoint_dir %s: not a directory", ck);
        if (access(ck, W_OK | X_OK) != 0)
            return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "server.checkpoint_dir %s: not writable by this "
                              "user: %s", ck, strerror(errno));
        if (ps_ckpt_check_writable(ck, err)) return ps_err_prefix(err, "server.checkpoint_dir");
        const ps_ckpt_ident id = {cfg->cluster.name, cfg->self >= 0 ? cfg->servers[cfg->self].name : ""};
        ps_err le = {0};
        if (ps_ckpt_check_lock(ck, &id, &le) == PS_ERR_UNAVAILABLE)  /* itself, running: as a taken port */
            fprintf(stderr, "psd: warning: server.checkpoint_dir: %s (fine if this psd is the one running)\n", le.msg);
        else if (le.code)
            return ps_err_set(err, le.code, "server.checkpoint_dir: %s", le.msg);
    } else if (ck[0] && errno != ENOENT) {
        return ps_err_set(err, PS_ERR_IO, "server.checkpoint_dir %s: %s", ck, strerror(errno));
    } else if (ck[0] && ps_ckpt_check_create(ck, err)) {
        return ps_err_prefix(err, "server.checkpoint_dir");
    }
    if (cfg->server.log_file[0] && ps_daemon_check_log(cfg->server.log_file, err))
        return ps_err_prefix(err, "server.log_file");
    const char *key[2] = {"server.listen", "server.metrics_listen"};
    const char *addr[2] = {cfg->server.listen, cfg->server.metrics_listen};
    for (int i = 0; i < 2; i++) {
        char why[300];
        if (!addr[i][0]) continue;
        int e = ps_daemon_explain_bind(addr[i], why, sizeof why);
        if (e == EADDRINUSE)
            fprintf(stderr, "psd: warning: %s %s: %s (fine if this psd is the one running)\n", key[i], addr[i], why);
        else if (e)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: cannot listen there: %s", key[i], addr[i], why);
    }
    return PS_OK;
}

/* A server.stop_metric no shipped trainer reports (round_metrics.h): a
 * warning into buf, 0 when there is none to give. Not refused: a user's
 * own trainer may report it. */
static int stop_metric_warning(const ps_config *cfg, char *buf, size_t cap) {
    const char *m = cfg->server.service.round_metrics.stop_metric;
    if (!m[0] || ps_rmetrics_is_shipped_name(m)) return 0;
    size_t o = (size_t)snprintf(buf, cap, "server.stop_metric: no shipped trainer reports a scalar '%s' (they "
                                "report:", m);
    for (const char *const *n = ps_rmetrics_shipped_names(); *n && o < cap; n++)
        o += (size_t)snprintf(buf + o, cap - o, "%s %s", n == ps_rmetrics_shipped_names() ? "" : ",", *n);
    if (o < cap) snprintf(buf + o, cap - o, "); psd is never solved unless your trainer sends it in its Steps");
    return 1;
}

/* The checkpoint start-up would resume from: one that loads into this
 * config's model (its architecture, sizes, optimizer and identity), or
 * none. A directory whose checkpoints all fail to load stops start-up. */
static ps_status check_resume(const ps_config *cfg, ps_model *model, int *found, ps_err *err) {
    const char *ck = cfg->server.checkpoint.dir;
    struct stat sb;
    *found = 0;
    if (!ck[0] || stat(ck, &sb) != 0) return PS_OK;
    const ps_ckpt_ident id = {cfg->cluster.name, cfg->self >= 0 ? cfg->servers[cfg->self].name : ""};
    ps_ckpt_info info;
    int refused = 0;
    if (ps_ckpt_check_restore(model, ck, &id, found, &refused, &info, err))
        return ps_err_prefix(err, "server.checkpoint_dir");
    if (*found && refused)
        fprintf(stderr, "psd: warning: server.checkpoint_dir: the %d newest checkpoint%s of %s cannot be used: "
                "psd would resume from %s and rename %s *.refused\n", refused, refused == 1 ? "" : "s", ck, info.path,
                refused == 1 ? "it" : "them");
    return PS_OK;
}

/* Start-up: the CPU's effective ISA, and every training primitive that
 * oneDNN could only give a reference (plain C) kernel - the difference
 * between ~1000 and ~80 samples/s. A probe step on a throwaway copy of the
 * model creates the primitives (ps_isa_check); the served model is not
 * touched. */
static void log_cpu_kernels(const ps_model_opts *mo) {
    const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
    char capped[96] = "";
    if (cap && cap[0]) snprintf(capped, sizeof capped, " (capped by ONEDNN_MAX_CPU_ISA=%.40s)", cap);
    if (strcmp(mo->cpu_backend, "dnnl")) {
        ps_log(PS_LOG_INFO, "cpu ISA %s%s; cpu backend %s: no kernel check", ps_backend_cpu_isa(), capped,
               mo->cpu_backend);
        return;
    }
    ps_isa_report rep;
    ps_err err = {0};
    if (ps_isa_check(mo, 32, &rep, &err) != PS_OK) {
        ps_log(PS_LOG_WARN, "cpu ISA %s%s; kernel check failed: %s", rep.isa, capped, err.msg);
        return;
    }
    if (rep.nfallback == 0) {
        ps_log(PS_LOG_INFO, "cpu ISA %s%s; training kernels: no reference fallbacks", rep.isa, capped);
        return;
    }
    ps_log(PS_LOG_WARN, "cpu ISA %s%s; %d training primitive%s run oneDNN's slow reference kernels:", rep.isa,
           capped, rep.nfallback, rep.nfallback == 1 ? "" : "s");
    for (char *line = rep.fallbacks, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) { ps_log(PS_LOG_WARN, "  reference kernel: %s", line); break; }
        *nl = 0;
        ps_log(PS_LOG_WARN, "  reference kernel: %s", line);
    }
}

/* --check-config on a cluster: what each server (or only servers[self])
 * hosts, one line per server. */
static void print_hosted(const ps_config *cfg, FILE *f) {
    ps_placement p;
    ps_err err = {0};
    if (ps_placement_resolve(cfg, &p, &err) != PS_OK) return;  /* checked before */
    for (int sv = 0; sv < p.n_servers; sv++) {
        if (cfg->self >= 0 && sv != cfg->self) continue;
        char line[1024];
        size_t o = 0;
        line[0] = '\0';
        for (int s = 0; s < p.n_stages && o < sizeof line; s++) {
            const ps_place_stage *ps = &p.stages[s];
            if (ps->server == sv)
                o += (size_t)snprintf(line + o, sizeof line - o, "%s%s on %s", o ? ", " : "", ps->name, ps->device);
            for (int k = 0; k < ps->n_shards && o < sizeof line; k++)
                if (ps->shards[k].server == sv)
                    o += (size_t)snprintf(line + o, sizeof line - o, "%s%s rows [%lld, %lld) of %lld (%s, shard %d "
                                          "of %d) on %s", o ? ", " : "", ps->name, (long long)ps->shards[k].lo,
                                          (long long)ps->shards[k].hi, (long long)ps->rows, ps->table, k + 1,
                                          ps->n_shards, ps->shards[k].device);
        }
        fprintf(f, "  %s (%s) hosts: %s\n", p.server_name[sv], p.server_addr[sv], line);
    }
}

/* Free what main made, in the order the server needs (no call in flight
 * once the rpc server is gone), and shut gRPC down; returns rc. */
static int teardown(ps_rpc_server *srv, ps_metrics *metrics, ps_dashboard *dash, ps_service *svc,
                    ps_trainers *trainers, ps_model *model, int cklock, int rc) {
    ps_rpc_server_free(srv);
    ps_metrics_free(metrics);
    ps_dashboard_free(dash);
    ps_service_free(svc);
    ps_trainers_free(trainers);
    ps_model_free(model);
    grpc_shutdown();
    ps_ckpt_unlock_dir(cklock);
    return rc;
}

/* --check-config: the model's stage table (every stage of its definition),
 * each with where the config places it. Errors begin with the config
 * (cfg_where; a model-file error with mo->origin, which holds it). */
static ps_status print_stage_table(const ps_config *cfg, const char *cfg_where, const ps_model_opts *mo, FILE *f,
                                   ps_err *err) {
    ps_placement p;
    static char where[PS_CONFIG_MAX_STAGES][512];
    const char *wp[PS_CONFIG_MAX_STAGES] = {0};
    if (ps_placement_resolve(cfg, &p, err) != PS_OK) return ps_err_prefix(err, "%s", cfg_where);
    for (int s = 0; s < p.n_stages; s++) {
        const ps_place_stage *ps = &p.stages[s];
        size_t o = 0;
        where[s][0] = '\0';
        if (ps->n_shards) {
            for (int k = 0; k < ps->n_shards && o < sizeof where[s]; k++)
                o += (size_t)snprintf(where[s] + o, sizeof where[s] - o, "%s%s/%s rows [%lld, %lld)", k ? ", " : "",
                                      p.server_name[ps->shards[k].server], ps->shards[k].device,
                                      (long long)ps->shards[k].lo, (long long)ps->shards[k].hi);
        } else if (cfg->n_servers) {
            snprintf(where[s], sizeof where[s], "%s/%s", p.server_name[ps->server], ps->device);
        } else {
            snprintf(where[s], sizeof where[s], "%s", ps->device);
        }
        wp[s] = where[s];
    }
    ps_model_opts all = *mo;
    all.n_hosted = 0;
    all.shard_stage = NULL;
    return ps_model_describe(&all, wp, f, err);
}

/* Every hosted stage's input and output fit a request's or reply's tensor
 * (PS_WIRE_MAX_DIMS with the batch): a model psd could build but never be
 * called with is refused at start and by --check-config. */
static ps_status wire_shapes(ps_model *m, ps_err *err) {
    for (int s = 0; s < ps_model_num_stages(m); s++) {
        const ps_stage_info *si = ps_model_stage(m, s);
        const int worst = si->in_ndim > si->out_ndim ? si->in_ndim : si->out_ndim;
        if (worst > PS_WIRE_MAX_DIMS - 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s': its %s has %d dimensions per sample; a "
                              "request's or reply's tensor carries at most %d with the batch (join or flatten dims, "
                              "or cut the stage elsewhere)", si->name, si->in_ndim > PS_WIRE_MAX_DIMS - 1 ? "input"
                              : "output", worst, PS_WIRE_MAX_DIMS);
    }
    return PS_OK;
}

/* A Constant's buffer has no values of its own: psd starts only where
 * --init-from, a checkpoint or the ONNX file gives them. */
static ps_status unset_constant(ps_model *m, ps_err *err) {
    const char *name = ps_model_unset_constant(m);
    if (!name) return PS_OK;
    char where[PS_ERR_MSG_MAX / 2];
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "buffer '%s' (%s) is a Constant, whose values come from the "
                      "weights: start psd with --init-from a safetensors file holding it (psd-export writes one "
                      "beside the model file), or resume from a checkpoint", name,
                      ps_model_where(m, name, where, sizeof where));
}

int main(int argc, char **argv) {
    ps_log_set_prog("psd");
    /* GNU OpenMP reads OMP_WAIT_POLICY when it loads: spinning workers
     * starve the other threads on small machines, so default to passive
     * by re-executing once with it set (an explicit value is respected). */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);  /* falls through only on failure */
    }
    /* the re-exec named the process "exe" (top, ps -C); its threads inherit this */
    pthread_setname_np(pthread_self(), "psd");
    int malloc_tuned = ps_malloc_tune();  /* before any thread; logged once the level is set */

    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    const char *config_path = NULL, *init_from = NULL, *name = NULL;
    int print_config = 0, check_config = 0, listen_flag = 0;
    /* The config file first, then flags override it through the same setter. */
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing);
        if (v) config_path = v;
        else if ((v = ps_cli_value(argc, argv, &i, "--check-config", NULL, &missing))) {
            config_path = v;
            check_config = 1;
        }
        if (missing) { fprintf(stderr, "psd: %s needs a value\n", argv[i]); return 2; }
    }
    if (config_path && ps_config_load(&cfg, config_path, &err)) {
        fprintf(stderr, "psd: %s\n", err.msg);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            printf("psd %s (backends:", PS_VERSION);
            for (const char *const *b = ps_backend_names(); *b; b++) printf(" %s", *b);
            char cuda[192];
            ps_backend_build_info(cuda, sizeof cuda);
            printf("; %s)\n", cuda);
            return 0;
        }
        if (!strcmp(a, "--print-config")) { print_config = 1; continue; }
        if ((v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing))) continue;
        if ((v = ps_cli_value(argc, argv, &i, "--check-config", NULL, &missing))) continue;
        if ((v = ps_cli_value(argc, argv, &i, "--init-from", NULL, &missing))) { init_from = v; continue; }
        if ((v = ps_cli_value(argc, argv, &i, "--name", NULL, &missing))) { name = v; continue; }
        const char *key = NULL;
        char kv[512];
        if ((v = ps_cli_value(argc, argv, &i, "--listen", "-l", &missing))) { key = "server.listen"; listen_flag = 1; }
        else if ((v = ps_cli_value(argc, argv, &i, "--backend", "-b", &missing))) key = "model.backend";
        else if ((v = ps_cli_value(argc, argv, &i, "--log-level", NULL, &missing))) key = "server.log_level";
        else if ((v = ps_cli_value(argc, argv, &i, "--checkpoint-dir", NULL, &missing))) key = "server.checkpoint_dir";
        else if ((v = ps_cli_value(argc, argv, &i, "--metrics-listen", NULL, &missing))) key = "server.metrics_listen";
        else if ((v = ps_cli_value(argc, argv, &i, "--log-file", NULL, &missing))) key = "server.log_file";
        else if ((v = ps_cli_value(argc, argv, &i, "--set", NULL, &missing))) {
            const char *val = ps_cli_split_kv(v, kv, sizeof kv);
            if (!val) { fprintf(stderr, "psd: --set needs KEY=VALUE, got '%s'\n", v); return 2; }
            key = kv;
            v = val;
        }
        if (missing) { fprintf(stderr, "psd: %s needs a value\n", a); return 2; }
        if (!key) { fprintf(stderr, "psd: unknown option '%s' (see psd --help)\n", a); return 2; }
        if (ps_config_set(&cfg, key, v, "command line", &err)) { fprintf(stderr, "psd: %s\n", err.msg); return 2; }
    }
    /* A cluster config (servers.*): this psd is servers.<name>; its entry
     * replaces server.listen/address/metrics_listen/checkpoint_dir and
     * security.cert/key before anything below reads them. */
    const char *where = config_path ? config_path : "command line";
    if (name && listen_flag) {
        fprintf(stderr, "psd: --listen does not apply with --name: servers.%s binds servers.%s.listen (set that, "
                "e.g. --set servers.%s.listen=HOST:PORT)\n", name, name, name);
        return 2;
    }
    if (name && ps_config_select_server(&cfg, name, &err)) { fprintf(stderr, "psd: %s: %s\n", where, err.msg); return 2; }
    if (print_config) { ps_config_print(&cfg, stdout); return 0; }
    /* The whole cluster (or the single-server form: stages, sizes, no server names). */
    if (ps_config_check_cluster(&cfg, &err)) { fprintf(stderr, "psd: %s: %s\n", where, err.msg); return 2; }
    if (cfg.n_servers) {
        if (!name && !check_config) {
            char names[PS_CONFIG_MAX_SERVERS * PS_CONFIG_NAME_MAX] = "";
            for (int i = 0, o = 0; i < cfg.n_servers; i++)
                o += snprintf(names + o, sizeof names - (size_t)o, "%s%s", i ? ", " : "", cfg.servers[i].name);
            fprintf(stderr, "psd: %s: this config describes servers %s: start one with --name NAME\n", where, names);
            return 2;
        }
    }
    ps_log_set_level(cfg.server.log_level);
    ps_log(PS_LOG_DEBUG, "malloc: %s", malloc_tuned ? "mmap threshold 32 MiB, trim threshold 64 MiB (malloc_tune.h)"
                                                    : "left as is (GLIBC_TUNABLES or not glibc)");
    if (!check_config && cfg.server.log_file[0] && ps_daemon_open_log(cfg.server.log_file, &err)) {
        fprintf(stderr, "psd: %s (server.log_file)\n", err.msg);
        return 2;
    }
    if (!cfg.server.log_file[0]) ps_daemon_use_journal_if_attached();

    /* Build the model before anything listens: placement errors stop start-up. */
    if (ps_config_check_model(&cfg, &err)) {
        fprintf(stderr, "psd: %s: %s\n", where, err.msg);
        return 2;
    }
    /* A cluster's server (psd --name): only the stages, and the shard rows,
     * placed on it, each on its placement's device. */
    ps_model_opts mo;
    ps_placement place;
    if (ps_placement_model_opts(&cfg, &place, &mo, &err)) {
        fprintf(stderr, "psd: %s: %s\n", where, err.msg);
        return 2;
    }
    char origin[PS_CONFIG_PATH_MAX + 16];   /* model-file errors: "psd.yaml: model.file: FILE:LINE: ..." */
    mo.origin = ps_config_model_origin(&cfg, where, origin, sizeof origin);
    ps_model *model = ps_model_create(&mo, &err);
    if (!model) { fprintf(stderr, "psd: %s\n", err.msg); return check_config ? 2 : 1; }
    if (check_config) {
        /* every check start-up makes, without binding or writing anything */
        int rc = 0;
        if (print_stage_table(&cfg, where, &mo, stdout, &err)) {
            fprintf(stderr, "psd: %s\n", err.msg);
            rc = 2;
        }
        /* A server's start-up checks (its files, its port, the checkpoint it
         * would resume from) need --name: they are about one host. */
        int resumes = 0;
        if (!rc && (!cfg.n_servers || name) && (check_startup(&cfg, &err) || check_resume(&cfg, model, &resumes, &err))) {
            fprintf(stderr, "psd: %s%s%s\n", config_path ? config_path : "", config_path ? ": " : "", err.msg);
            rc = 2;
        }
        /* The initial weights, which start-up does not read when it resumes
         * from a checkpoint: then only a warning. */
        int onnx = !init_from && mo.file && ps_onnx_is_onnx_file(mo.file);
        if (!rc && (init_from || onnx) &&
            (init_from ? ps_ckpt_init_from_part(model, init_from, NULL, &err)
                       : ps_onnx_init_weights(model, mo.file, &err) && ps_err_prefix(&err, "%s", origin))) {
            fprintf(stderr, "psd: %s%s%s%s\n", resumes ? "warning: " : "", init_from ? "--init-from: " : "", err.msg,
                    resumes ? " (unused: psd resumes from the checkpoint in server.checkpoint_dir)" : "");
            if (!resumes) rc = 2;
        }
        if (!rc && wire_shapes(model, &err)) {
            fprintf(stderr, "psd: %s: %s\n", where, err.msg);
            rc = 2;
        }
        if (!rc && !resumes && !init_from && !onnx && unset_constant(model, &err)) {
            fprintf(stderr, "psd: %s: %s\n", where, err.msg);
            rc = 2;
        }
        char warn[256];
        if (!rc && stop_metric_warning(&cfg, warn, sizeof warn)) fprintf(stderr, "psd: warning: %s\n", warn);
        ps_model_free(model);
        if (!rc && !cfg.n_servers) printf("psd: %s: configuration OK\n", config_path ? config_path : "(defaults)");
        if (!rc && cfg.n_servers && name)
            printf("psd: %s: configuration OK for %s of cluster %s\n", where, name, cfg.cluster.name);
        if (!rc && cfg.n_servers && !name)
            printf("psd: %s: cluster %s: configuration OK (each server's start-up checks - files, port: "
                   "--check-config with --name)\n", where, cfg.cluster.name);
        if (!rc && cfg.n_servers) print_hosted(&cfg, stdout);
        return rc;
    }

    /* Resume: the newest valid checkpoint wins over --init-from, so a
     * restarted service continues where it stopped. */
    ps_ckpt_info restored = {0};
    int have_ckpt = 0;
    const char *ckdir = cfg.server.checkpoint.dir;
    const ps_ckpt_ident ckid = {cfg.cluster.name, cfg.self >= 0 ? cfg.servers[cfg.self].name : ""};
    ps_ckpt_settle settle = {0};   /* the restored steps' records: a retried Step of them is answered */
    int cklock = -1;               /* this server's hold on its checkpoint dir, for the process's life */
    if (ckdir[0] && (ps_ckpt_prepare_dir(ckdir, &err) || ps_ckpt_lock_dir(ckdir, &ckid, &cklock, &err) ||
                     ps_ckpt_restore_latest_with(model, ckdir, &ckid, &have_ckpt, &restored, &settle, &err))) {
        ps_log(PS_LOG_ERROR, "%s", err.msg);
        ps_model_free(model);
        return 1;
    }
    if (have_ckpt) {
        ps_log(PS_LOG_INFO, "resumed from checkpoint %s: model version %llu (step %llu), %llu samples",
               restored.path, (unsigned long long)restored.version, (unsigned long long)restored.version,
               (unsigned long long)restored.samples);
        if (init_from) ps_log(PS_LOG_WARN, "--init-from %s ignored: resuming from the checkpoint", init_from);
    } else if (init_from) {
        if (ps_ckpt_init_from_part(model, init_from, NULL, &err)) {
            ps_log(PS_LOG_ERROR, "--init-from: %s", err.msg);
            ps_model_free(model);
            return 1;
        }
        ps_log(PS_LOG_INFO, "initial weights from %s", init_from);
    } else if (mo.file && ps_onnx_is_onnx_file(mo.file)) {   /* model.onnx: the file's initializers */
        if (ps_onnx_init_weights(model, mo.file, &err) && ps_err_prefix(&err, "%s", origin)) {
            ps_log(PS_LOG_ERROR, "%s", err.msg);
            ps_model_free(model);
            return 1;
        }
        ps_log(PS_LOG_INFO, "initial weights from the initializers of %s", mo.file);
    } else if (ckdir[0]) {
        ps_log(PS_LOG_INFO, "no checkpoint in %s: starting from freshly initialised weights", ckdir);
    }
    if (wire_shapes(model, &err) ||
        (!have_ckpt && !init_from && !(mo.file && ps_onnx_is_onnx_file(mo.file)) && unset_constant(model, &err))) {
        ps_log(PS_LOG_ERROR, "%s", err.msg);
        ps_model_free(model);
        return 1;
    }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);  /* before grpc_init: its threads inherit it */
    /* After the mask: the probe step starts the OpenMP workers, which must
     * inherit it too, or a SIGTERM lands on one of them and kills psd. */
    log_cpu_kernels(&mo);
    char warn[256];
    if (stop_metric_warning(&cfg, warn, sizeof warn)) ps_log(PS_LOG_WARN, "%s", warn);
    grpc_init();

    ps_service_opts *so = &cfg.server.service;  /* the server.* keys are in it; what is not a key: */
    so->optimizer = ps_optim_kind_name(cfg.optimizer.kind);
    so->cpu_isa = ps_backend_cpu_isa;
    ps_service *svc = ps_service_create(model, so, &err);
    if (svc && have_ckpt) {
        ps_service_set_samples(svc, restored.samples);
        ps_service_note_checkpoint(svc, &restored);
        ps_ctx_table_import(ps_service_contexts(svc), settle.rec, settle.n, settle.applied);
        if (settle.present)
            ps_log(PS_LOG_INFO, "%zu finished-context records restored (%llu contexts applied): a retried Step of "
                   "them is answered, not re-run", settle.n, (unsigned long long)settle.applied);
    }
    ps_ckpt_settle_free(&settle);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_metrics *metrics = svc ? ps_metrics_create(svc, model, methods, nm, &err) : NULL;
    if (metrics) methods = ps_metrics_methods(metrics, &nm);
    /* The web dashboard on the metrics port (dashboard.h): each trainer as psd sees it, a bounded history. */
    ps_trainers *trainers = metrics && cfg.server.metrics_listen[0] ? ps_trainers_create() : NULL;
    ps_dashboard_opts dopts = {svc, model, trainers, &cfg, 0};
    ps_dashboard *dash = trainers ? ps_dashboard_create(&dopts, &err) : NULL;
    if (dash) ps_service_set_trainers(svc, trainers), ps_metrics_set_dashboard(metrics, dash);
    else if (trainers) ps_log(PS_LOG_WARN, "no dashboard (metrics only): %s", err.msg);
    const ps_rpc_server_opts *ro = &cfg.server.rpc;
    ps_metrics_http_opts ho = {cfg.server.metrics_tls ? cfg.security.cert : NULL, cfg.security.key,
                               (unsigned)ro->max_calls, (unsigned)ps_rpc_calls_per_client(ro),
                               (unsigned)(ro->recv_timeout_s < 10 ? ro->recv_timeout_s + 0.999 : 10),
                               (unsigned)(ro->send_timeout_s < 10 ? ro->send_timeout_s + 0.999 : 10)};
    /* A taken port is the common failure (a second psd): say so plainly. */
    char why[300];
    ps_daemon_explain_bind(cfg.server.listen, why, sizeof why);
    ps_rpc_server *srv = NULL;
    ps_security sec;
    if (why[0]) {
        ps_err_set(&err, PS_ERR_UNAVAILABLE, "cannot listen on %s (server.listen): %s", cfg.server.listen, why);
    } else if (metrics && ps_security_server(&cfg, &sec, &err) == PS_OK) {
        srv = ps_rpc_server_create_opts(cfg.server.listen, &cfg.server.rpc, methods, nm, metrics, &sec.rpc, &err);
        if (srv) ps_service_set_admission(svc, srv);
        ps_log(PS_LOG_INFO, "transport: %s%s; %d token%s", cfg.security.tls ? "TLS" : "plaintext",
               cfg.security.mutual_tls ? " with client certificates" : "", sec.ntokens,
               sec.ntokens == 1 ? "" : "s");
        ps_security_free(&sec);
    }
    if (!srv || (cfg.server.metrics_listen[0] && ps_metrics_listen_opts(metrics, cfg.server.metrics_listen, &ho, &err)) ||
        ps_rpc_server_start(srv, &err)) {
        ps_log(PS_LOG_ERROR, "%s", err.msg);
        return teardown(srv, metrics, dash, svc, trainers, model, cklock, 1);
    }
    char placement[512];
    ps_service_hosted(svc, placement, sizeof placement);
    if (cfg.self >= 0)
        ps_log(PS_LOG_INFO, "server %s of cluster %s: hosts %s", cfg.servers[cfg.self].name, cfg.cluster.name,
               placement);
    if (cfg.server.rpc.local_socket[0])
        ps_log(PS_LOG_INFO, "local transport on %s (trainers on this host dial local:%s)",
               cfg.server.rpc.local_socket, cfg.server.rpc.local_socket);
    ps_log(PS_LOG_INFO, "psd %s serving model %s (%lld parameters; %s; cpu stages use %s, %d compute threads) on %s "
           "with %d threads", PS_VERSION, ps_model_arch(model), (long long)ps_model_num_weights(model),
           placement, mo.cpu_backend, mo.compute_threads, cfg.server.listen, cfg.server.rpc.threads);
    {
        int fused = 0;
        for (int s = 0; s < ps_model_num_stages(model); s++) fused += ps_model_stage(model, s)->fused_bn_relu;
        if (fused)
            ps_log(PS_LOG_INFO, "%d BatchNorm + ReLU (ReLU6, LeakyReLU) pair%s computed as one (PS_FUSE=0: apart)",
                   fused, fused == 1 ? "" : "s");
    }
    if (cfg.server.metrics_listen[0])
        ps_log(PS_LOG_INFO, "dashboard on %s://%s/ (metrics at /metrics)", cfg.server.metrics_tls ? "https" : "http",
               cfg.server.metrics_listen);
    if (ckdir[0])
        ps_log(PS_LOG_INFO, "checkpoints in %s every %d steps / %g s, keeping %d", ckdir,
               cfg.server.checkpoint.every_steps, cfg.server.checkpoint.every_s, cfg.server.checkpoint.keep);
    char note[512];
    snprintf(note, sizeof note, "READY=1\nSTATUS=serving %s on %s, model version %llu", ps_model_arch(model),
             cfg.server.listen, (unsigned long long)ps_model_version(model));
    ps_daemon_notify(note);

    ps_ckpt_sched sched = {&cfg.server.checkpoint, ps_model_version(model), ps_mono_s()};
    int sig = 0, rc = 0;
    double retry_at = 0;  /* after a failed checkpoint, wait before trying again */
    while (!sig) {
        struct timespec tick = {1, 0};
        int r = sigtimedwait(&sigs, NULL, &tick);
        if (r == SIGHUP) {
            if (cfg.server.log_file[0]) {
                if (ps_daemon_open_log(cfg.server.log_file, &err)) ps_log(PS_LOG_ERROR, "SIGHUP: %s", err.msg);
                else ps_log(PS_LOG_INFO, "SIGHUP: reopened log file %s", cfg.server.log_file);
            } else {
                ps_log(PS_LOG_INFO, "SIGHUP: no server.log_file to reopen (logging to stderr)");
            }
        } else if (r > 0) {
            sig = r;
        } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
            break;
        }
        size_t expired = ps_service_expire(svc);
        if (expired) ps_log(PS_LOG_WARN, "expired %zu idle contexts (trainers gone?)", expired);
        if (!sig && ckdir[0] && ps_mono_s() >= retry_at && ps_ckpt_sched_due(&sched, ps_model_version(model), ps_mono_s()) &&
            write_checkpoint(&cfg, model, svc, metrics, &sched))
            retry_at = ps_mono_s() + 30;
    }
    ps_daemon_notify("STOPPING=1\nSTATUS=draining");
    ps_service_set_draining(svc);
    double t_stop = ps_mono_s();
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(svc, &st, &samples);
    ps_log(PS_LOG_INFO, "%s received: draining (up to %g s; new work refused, %llu open contexts may finish)",
           sig ? strsignal(sig) : "stop", cfg.server.grace_s, (unsigned long long)st.live);
    /* Let running calls return and open contexts reach their Step, within
     * the grace period (quiet twice in a row: a call that was already being
     * handled may still open a context). */
    for (int quiet = 0; quiet < 2;) {
        ps_service_stats(svc, &st, &samples);
        int running = ps_metrics_in_flight(metrics);
        quiet = st.live == 0 && running == 0 ? quiet + 1 : 0;
        if (quiet == 2) break;
        if (ps_mono_s() - t_stop >= cfg.server.grace_s) {
            ps_log(PS_LOG_WARN, "grace period (%g s) over with %llu contexts open and %d calls in handlers",
                   cfg.server.grace_s, (unsigned long long)st.live, running);
            break;
        }
        struct timespec nap = {0, 50 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    double left = cfg.server.grace_s - (ps_mono_s() - t_stop);
    ps_service_close(svc);  /* sync rounds and held Forwards that cannot complete now: UNAVAILABLE */
    ps_rpc_server_shutdown(srv, left > 0.1 ? (int)(left * 1000) : 100);
    ps_service_stats(svc, &st, &samples);
    if (st.live) ps_log(PS_LOG_WARN, "%llu contexts still open after the grace period: dropped",
                        (unsigned long long)st.live);
    if (ckdir[0] && ps_model_version(model) == sched.last_version)
        ps_log(PS_LOG_INFO, "checkpoint up to date (model version %llu)", (unsigned long long)sched.last_version);
    else if (ckdir[0] && write_checkpoint(&cfg, model, svc, metrics, &sched))
        rc = 1;  /* the service manager should see that state was not saved */
    ps_log(PS_LOG_INFO, "stopped: model version %llu, %llu training samples, %llu contexts opened, %llu expired",
           (unsigned long long)ps_model_version(model), (unsigned long long)samples,
           (unsigned long long)st.opened, (unsigned long long)st.expired);
    return teardown(srv, metrics, dash, svc, trainers, model, cklock, rc);
}
