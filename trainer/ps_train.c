/* ps-train - the trainer CLI (one process per trainer rank).
 *
 * `ps-train [TASK] [options]`: the driver that every task shares (task.h).
 * It reads the config and the flags (common ones here, the task's from its
 * flag table), connects to psd (TLS and tokens from security.*), waits for
 * it, learns its parameters, then runs the task's rounds epoch by epoch -
 * each round's step applied once, with retries (retry.h) - prints the
 * tutorial's progress lines and a summary, and has the task evaluate.
 * `ps-train status` is a separate subcommand (status_cmd.c).
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "cluster.h"
#include "config.h"
#include "log.h"
#include "ps_client.h"
#include "retry.h"
#include "security.h"
#include "status_cmd.h"
#include "task.h"

/* This process's CPU time (every thread), in seconds. */
static double process_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_flag(FILE *f, const char *shrt, const char *lng, const char *arg, const char *help) {
    char left[64];
    snprintf(left, sizeof left, "%s%s%s%s%s", shrt ? shrt : "", shrt ? ", " : "    ", lng, arg ? " " : "",
             arg ? arg : "");
    fprintf(f, "  %-23s  %s\n", left, help);
}

static void usage(FILE *f, const ps_task *task) {
    fprintf(f,
            "usage: ps-train [TASK] [options]\n"
            "       ps-train status [--server ADDR]   print a running psd's status (every server's, with a\n"
            "                                         cluster config)\n"
            "TASK is what to train (default %s; `ps-train TASK --help` lists its options):\n",
            ps_task_default()->name);
    for (int i = 0; i < ps_task_count(); i++)
        fprintf(f, "  %-10s %s\n", ps_task_at(i)->name, ps_task_at(i)->description);
    fprintf(f,
            "options of every task:\n"
            "  -c, --config FILE        cluster config (YAML); flags override it\n"
            "  -s, --server ADDR        psd address host:port, or local:PATH for psd's local transport on\n"
            "                           this host (server.address)\n"
            "  -r, --rank N             this trainer's rank, 1..world_size-1 (default 1)\n"
            "  -w, --world-size N       the PS plus all trainers (trainer.world_size)\n"
            "  -e, --epochs N           passes over the training set (trainer.epochs)\n"
            "      --log-every N        rounds between 'training %s' lines (trainer.log_every)\n"
            "      --seed N             shuffling seed; each rank adds its rank (trainer.seed)\n"
            "      --one-call           a whole training step in one RPC: Forward with the batch's class\n"
            "                           targets, psd's cross-entropy, backward and step; the default for\n"
            "                           mnist and for fit with --loss cross_entropy where it applies (one\n"
            "                           server, no gradient check); given, it says when it cannot apply\n"
            "      --split-calls        send Forward, Backward and Step as three RPCs (the tutorial's\n"
            "                           protocol) instead of one call a batch\n"
            "      --fuse-step          with the split calls, send Backward and Step as one RPC\n"
            "      --max-batches N      stop each epoch after N rounds (quick runs)\n"
            "      --no-eval            skip the task's final evaluation (test set, perplexities, greedy\n"
            "                           policy): benchmarks\n"
            "      --wait-s S           wait up to S seconds for psd to come up (default 30)\n"
            "      --status             print psd's status (model version, contexts, counters) and exit\n"
            "      --set KEY=VALUE      override any config key\n"
            "  -V, --version            print the version and exit\n"
            "  -h, --help               this help\n",
            task->unit);
    fprintf(f, "options of the %s task:\n", task->name);
    for (const ps_task_flag *fl = task->flags; fl && fl->lng; fl++) print_flag(f, fl->shrt, fl->lng, fl->arg, fl->help);
}

static int print_status(ps_client *cl, ps_err *err) {
    ps_StatusResponse st;
    if (ps_client_status(cl, &st, err)) return -1;
    printf("address: %s\nversion: %s\nmodel: %s\nuptime_s: %.1f\nmodel_version: %llu\n"
           "live_contexts: %llu\nexpired_contexts: %llu\ntrainers_seen: %llu\nsamples: %llu\n"
           "nonfinite_policy: %s\nnonfinite_rejected: %llu\nnonfinite_skipped: %llu\ncpu_isa: %s\nconsistency: %s\n"
           "contexts_applied: %llu\nsync_dropped: %llu\nsync_queued: %llu\ncontexts_released: %llu\n",
           ps_client_target(cl), st.version, st.model, st.uptime_s, (unsigned long long)st.model_version,
           (unsigned long long)st.live_contexts, (unsigned long long)st.expired_contexts,
           (unsigned long long)st.trainers_seen, (unsigned long long)st.samples, st.nonfinite_policy,
           (unsigned long long)st.nonfinite_rejected, (unsigned long long)st.nonfinite_skipped, st.cpu_isa,
           st.consistency, (unsigned long long)st.contexts_applied, (unsigned long long)st.sync_dropped,
           (unsigned long long)st.sync_queued, (unsigned long long)st.contexts_released);
    return 0;
}

/* The common options, after the task's name. */
typedef struct train_opts {
    long rank, max_rounds, wait_s;
    int no_eval;            /* --no-eval: skip task->evaluate */
    int fuse, one_call, status_only;
} train_opts;

/* One of the task's flags at argv[*i]: 1 = applied, 0 = not one of its
 * flags, -1 = error (printed). */
static int task_flag(const ps_task *task, void *t, int argc, char **argv, int *i, ps_config *cfg) {
    ps_err err = {0};
    for (const ps_task_flag *fl = task->flags; fl && fl->lng; fl++) {
        const char *v;
        int missing = 0;
        if (!fl->arg) {
            if (strcmp(argv[*i], fl->lng) && !(fl->shrt && !strcmp(argv[*i], fl->shrt))) continue;
            v = "true";
        } else if (!(v = ps_cli_value(argc, argv, i, fl->lng, fl->shrt, &missing))) {
            if (!missing) continue;
            fprintf(stderr, "ps-train: %s needs a value\n", fl->lng);
            return -1;
        }
        ps_status st = fl->key ? ps_config_set(cfg, fl->key, v, "command line", &err)
                     : task->set_flag ? task->set_flag(t, fl->lng, v, &err)
                                      : ps_err_set(&err, PS_ERR_INTERNAL, "%s: no handler", fl->lng);
        if (st) {
            fprintf(stderr, "ps-train: %s\n", err.msg);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Parse argv[first..]: the config file first, then every flag over it.
 * Returns -1 to go on, else the exit code. */
static int parse_args(const ps_task *task, void *t, int argc, char **argv, int first, ps_config *cfg,
                      train_opts *o) {
    ps_err err = {0};
    const char *config_path = NULL;
    for (int i = first; i < argc; i++) {
        int missing = 0;
        const char *v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing);
        if (v) config_path = v;
        if (missing) { fprintf(stderr, "ps-train: %s needs a value\n", argv[i]); return 2; }
    }
    if (config_path && ps_config_load(cfg, config_path, &err)) {
        fprintf(stderr, "ps-train: %s\n", err.msg);
        return 2;
    }
    for (int i = first; i < argc; i++) {
        int missing = 0;
        const char *v, *a = argv[i], *key = NULL;
        char kv[512];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout, task); return 0; }
        if (!strcmp(a, "-V") || !strcmp(a, "--version")) { printf("ps-train %s\n", PS_VERSION); return 0; }
        int tf = task_flag(task, t, argc, argv, &i, cfg);
        if (tf < 0) return 2;
        if (tf > 0) continue;
        if (!strcmp(a, "--status")) { o->status_only = 1; continue; }
        else if (!strcmp(a, "--fuse-step")) { o->fuse = 1; continue; }
        else if (!strcmp(a, "--one-call")) { o->one_call = 1; continue; }
        else if (!strcmp(a, "--split-calls")) { o->one_call = 0; continue; }
        else if (!strcmp(a, "--no-eval")) { o->no_eval = 1; continue; }
        else if ((v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing))) continue;
        else if ((v = ps_cli_value(argc, argv, &i, "--rank", "-r", &missing))) {
            if (ps_cli_long("ps-train", "--rank", v, 1, 1023, &o->rank)) return 2;
            continue;
        } else if ((v = ps_cli_value(argc, argv, &i, "--max-batches", NULL, &missing))) {
            if (ps_cli_long("ps-train", "--max-batches", v, 1, 1L << 30, &o->max_rounds)) return 2;
            continue;
        } else if ((v = ps_cli_value(argc, argv, &i, "--wait-s", NULL, &missing))) {
            if (ps_cli_long("ps-train", "--wait-s", v, 0, 3600, &o->wait_s)) return 2;
            continue;
        }
        else if ((v = ps_cli_value(argc, argv, &i, "--server", "-s", &missing))) key = "server.address";
        else if ((v = ps_cli_value(argc, argv, &i, "--world-size", "-w", &missing))) key = "trainer.world_size";
        else if ((v = ps_cli_value(argc, argv, &i, "--epochs", "-e", &missing))) key = "trainer.epochs";
        else if ((v = ps_cli_value(argc, argv, &i, "--log-every", NULL, &missing))) key = "trainer.log_every";
        else if ((v = ps_cli_value(argc, argv, &i, "--seed", NULL, &missing))) key = "trainer.seed";
        else if ((v = ps_cli_value(argc, argv, &i, "--set", NULL, &missing))) {
            const char *val = ps_cli_split_kv(v, kv, sizeof kv);
            if (!val) { fprintf(stderr, "ps-train: --set needs KEY=VALUE, got '%s'\n", v); return 2; }
            key = kv;
            v = val;
        }
        if (missing) { fprintf(stderr, "ps-train: %s needs a value\n", a); return 2; }
        if (!key) {
            fprintf(stderr, "ps-train: unknown option '%s' for task %s (see ps-train %s --help)\n", a, task->name,
                    task->name);
            return 2;
        }
        if (ps_config_set(cfg, key, v, "command line", &err)) { fprintf(stderr, "ps-train: %s\n", err.msg); return 2; }
    }
    /* The cluster and its model file, as psd checks them (a model-file
     * error reads as psd prints it: "CONFIG: model.file: FILE:LINE: ...");
     * a single server's --status needs neither. */
    if (!(o->status_only && !cfg->n_servers) && ps_config_check_cluster(cfg, &err)) {
        fprintf(stderr, "ps-train: %s: %s\n", config_path ? config_path : "command line", err.msg);
        return 2;
    }
    return -1;
}

/* Connected: run the epochs, the summary and the evaluation. */
static int train(const ps_task *task, void *t, ps_task_env *env, const train_opts *o) {
    ps_err err = {0};
    const ps_config *cfg = env->cfg;
    long rank = env->rank;
    ps_ctx_ids ids;
    ps_ctx_ids_init(&ids);
    char who[64];
    snprintf(who, sizeof who, "ps-train: rank %ld", rank);
    ps_retry_policy rp = {.max_s = cfg->trainer.retry_max_s, .backoff_s = cfg->trainer.retry_backoff_s,
                          .backoff_max_s = cfg->trainer.retry_backoff_max_s, .seed = ids.base ^ (uint64_t)rank,
                          .who = who, .log = stderr};
    ps_retry rt;
    ps_retry_init(&rt, &rp);
    env->retry = &rt;
    env->ids = &ids;

    /* Progress: a live line on a terminal; otherwise (a log file, make run's
     * scripts) a line every trainer.progress_every_s - unless the task
     * printed lines of its own meanwhile (CartPole's episodes). */
    int tty = isatty(STDERR_FILENO);
    double t0 = ps_mono_s(), every = cfg->trainer.progress_every_s, next_line = t0 + every, cpu0 = process_cpu_s();
    long samples = 0, all_rounds = 0;
    uint64_t version = 0;
    int stop = 0;
    for (int ep = 0; ep < cfg->trainer.epochs && !stop; ep++) {
        int rounds = 0;
        if (task->begin_epoch(t, env, ep, &rounds, &err)) goto fail;
        if (o->max_rounds && o->max_rounds < rounds) rounds = (int)o->max_rounds;
        all_rounds += rounds;
        double ep_t0 = ps_mono_s();
        for (int b = 0; b < rounds && !stop; b++) {
            ps_task_round r = {0};
            if (task->run_round(t, env, ep, b, &r, &err)) goto fail;
            version = r.version;
            samples += r.samples;
            stop = r.stop;
            if (!r.printed && b % cfg->trainer.log_every == 0) {
                if (tty) fprintf(stderr, "\r\033[K");
                printf("Rank %ld training %s %d loss %.6f\n", rank, task->unit, b, r.loss);
                fflush(stdout);
            }
            double now = ps_mono_s(), el = now - t0;
            if (r.printed) next_line = now + every;
            if (tty) {
                fprintf(stderr, "\r\033[K[rank %ld] epoch %d/%d %s %d/%d loss %.4f  %.0f samples/s  model v%llu",
                        rank, ep + 1, cfg->trainer.epochs, task->unit, b + 1, rounds, r.loss,
                        el > 0 ? samples / el : 0.0, (unsigned long long)version);
            } else if (every > 0 && now >= next_line && b + 1 < rounds && !stop) {
                double ep_el = now - ep_t0, eta = (b + 1) ? ep_el / (b + 1) * (rounds - b - 1) : 0;
                fprintf(stderr, "[rank %ld] progress: epoch %d/%d %s %d/%d (%.0f%%) loss %.4f, %.0f samples/s, "
                        "model v%llu, epoch ends in ~%.0f s\n", rank, ep + 1, cfg->trainer.epochs, task->unit, b + 1,
                        rounds, 100.0 * (b + 1) / rounds, r.loss, el > 0 ? samples / el : 0.0,
                        (unsigned long long)version, eta);
                next_line = now + every;
            }
        }
        if (tty) fprintf(stderr, "\r\033[K");
        if (task->end_epoch && task->end_epoch(t, env, ep, &err)) goto fail;
    }
    double secs = ps_mono_s() - t0;
    if (tty) fprintf(stderr, "\r\033[K");
    if (all_rounds == 0) {   /* --eval-only: nothing was trained, so no rate to report */
        printf("Rank %ld: no training rounds (evaluation only)\n", rank);
    } else {
        printf("Training complete!\n");
        printf("Rank %ld: %ld samples in %.3f s (%.0f samples/s)\n", rank, samples, secs,
               secs > 0 ? samples / secs : 0.0);
        double cpu = process_cpu_s() - cpu0;   /* what load changes less than the wall time (bench/lm.sh) */
        printf("Rank %ld: CPU %.3f s in the training loop (%.2f us per sample)\n", rank, cpu,
               samples > 0 ? cpu * 1e6 / (double)samples : 0.0);
    }
    if (rt.total) printf("Rank %ld: %ld RPC retries\n", rank, rt.total);
    long busy = env->cluster ? ps_cluster_busy_retries(env->cluster) : 0;
    if (busy) printf("Rank %ld: %ld calls sent again after psd's admission refusals\n", rank, busy);
    fflush(stdout);
    if (!o->no_eval && task->evaluate(t, env, &err)) goto fail;
    return 0;
fail:
    if (tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "ps-train: rank %ld: %s\n", rank, err.msg);
    return 1;
}

int main(int argc, char **argv) {
    ps_log_set_prog("ps-train");
    if (argc > 1 && !strcmp(argv[1], "status")) return ps_status_cmd_main(argc - 1, argv + 1);
    const ps_task *task = ps_task_default();
    int first = 1;
    if (argc > 1 && argv[1][0] != '-') {
        if (!(task = ps_task_find(argv[1]))) {
            fprintf(stderr, "ps-train: unknown task '%s'; tasks:", argv[1]);
            for (int i = 0; i < ps_task_count(); i++) fprintf(stderr, " %s", ps_task_at(i)->name);
            fprintf(stderr, ", and the subcommand status (see ps-train --help)\n");
            return 2;
        }
        first = 2;
    }
    void *t = task->create();
    if (!t) { fprintf(stderr, "ps-train: out of memory\n"); return 1; }
    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    train_opts o = {.rank = 1, .wait_s = 30, .one_call = -1};
    int rc = parse_args(task, t, argc, argv, first, &cfg, &o);
    if (rc >= 0) { task->destroy(t); return rc; }
    int world = cfg.trainer.world_size;
    if (o.rank >= world) {
        fprintf(stderr, "ps-train: --rank %ld is not a trainer rank of world size %d (trainers are 1..%d; "
                "rank 0 is the parameter server)\n", o.rank, world, world - 1);
        task->destroy(t);
        return 2;
    }
    ps_security sec;
    if (ps_security_client(&cfg, &sec, &err)) {
        fprintf(stderr, "ps-train: %s\n", err.msg);
        task->destroy(t);
        return 2;
    }
    if (o.status_only) {
        task->destroy(t);
        grpc_init();
        int src;
        if (cfg.n_servers > 0) {
            src = ps_cluster_print_status(&cfg, cfg.trainer.rpc_timeout_s, stdout);
        } else {
            ps_client *sc = ps_client_create_secure(cfg.server.address, (int)(cfg.trainer.rpc_timeout_s * 1000),
                                                    cfg.server.rpc.max_message_bytes, &sec.rpc, &err);
            src = sc && print_status(sc, &err) == 0 ? 0 : 1;
            if (src) fprintf(stderr, "ps-train: %s\n", err.msg);
            ps_client_free(sc);
        }
        ps_security_free(&sec);
        grpc_shutdown();
        return src;
    }

    /* one call a batch unless told otherwise (--split-calls, or --fuse-step: a protocol of its own) */
    int one = o.one_call >= 0 ? o.one_call : o.fuse ? 0 : PS_ONE_CALL_DEFAULT;
    ps_task_env env = {.cfg = &cfg, .rank = o.rank, .world_size = world, .fuse_step = o.fuse, .one_call = one,
                       .no_eval = o.no_eval};
    if (task->init(t, &env, &err)) {
        fprintf(stderr, "ps-train: %s\n", err.msg);
        task->destroy(t);
        ps_security_free(&sec);
        return 1;
    }

    grpc_init();
    rc = 1;
    ps_wire_param_list params = {0};
    ps_cluster *cluster = NULL;
    char model[64] = "";
    if (ps_cluster_open(&cfg, o.rank, stderr, &cluster, &err) ||
        ps_cluster_connect(cluster, (double)o.wait_s, &params, model, sizeof model, &err)) {
        fprintf(stderr, "ps-train: rank %ld: %s\n", o.rank, err.msg);
        goto out;
    }
    int64_t nweights = 0;
    size_t ntensors = 0;    /* a table sharded over servers is one tensor (its first shard counts) */
    for (size_t i = 0; i < params.n; i++) {
        if (params.items[i].rows_total == 0 || params.items[i].row_offset == 0) ntensors++;
        int64_t c = 1;
        for (pb_size_t d = 0; d < params.items[i].shape_count; d++) c *= params.items[i].shape[d];
        nweights += c;
    }
    int single = ps_cluster_single(cluster);
    ps_client *cl = single >= 0 ? ps_cluster_client(cluster, single) : NULL;
    if (cfg.n_servers == 0) {
        printf("Rank %ld: connected to psd at %s: model %s, %zu parameter tensors (%lld weights)\n", o.rank,
               cfg.server.address, model, ntensors, (long long)nweights);
    } else {
        printf("Rank %ld: connected to cluster %s: model %s, %zu parameter tensors (%lld weights)\n", o.rank,
               cfg.cluster.name, model, ntensors, (long long)nweights);
        ps_cluster_print(cluster, stdout);
    }
    fflush(stdout);
    env.cluster = cluster;
    env.cl = cl;
    env.model = model;
    env.params = &params;
    rc = train(task, t, &env, &o);
    if (ps_cluster_partial_steps(cluster) || ps_cluster_reruns(cluster))
        printf("Rank %ld: %ld partial steps (applied on some servers, lost on others), %ld batches run again\n",
               o.rank, ps_cluster_partial_steps(cluster), ps_cluster_reruns(cluster));
out:
    task->destroy(t);
    ps_wire_param_list_free(&params);
    ps_cluster_free(cluster);
    ps_security_free(&sec);
    grpc_shutdown();
    return rc;
}
