/* status_cmd.c - `ps-train status`: a running psd's Status, printed for
 * people (status_cmd.h). */
#include "status_cmd.h"

#include <grpc/grpc.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "config.h"
#include "ps_client.h"
#include "security.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ps-train status [--server ADDR] [--config FILE] [--timeout-s S] [--set KEY=VALUE]\n"
            "  prints what psd's Status RPC returns: uptime, model version (steps),\n"
            "  samples, live contexts, trainers seen, last checkpoint\n"
            "  -s, --server ADDR   psd address host:port (default: server.address of the config)\n"
            "  -c, --config FILE   cluster config (YAML)\n"
            "      --timeout-s S   give up after S seconds (default 5)\n"
            "      --set KEY=VALUE override a config key (e.g. security.token_file=...)\n"
            "  TLS and tokens come from the config's security.* keys, as for training.\n"
            "  With a cluster config (servers.*) and no --server: one line per server (name,\n"
            "  address, hosted stages, model version, partial steps applied / lost there).\n"
            "  (ps-train --status prints the same as key: value lines for scripts.)\n");
}

static void print_duration(double s) {
    long t = (long)s;
    if (t >= 86400) printf("%ldd %02ldh %02ldm %02lds", t / 86400, t % 86400 / 3600, t % 3600 / 60, t % 60);
    else if (t >= 3600) printf("%ldh %02ldm %02lds", t / 3600, t % 3600 / 60, t % 60);
    else if (t >= 60) printf("%ldm %02lds", t / 60, t % 60);
    else printf("%.1fs", s);
}

int ps_status_cmd_main(int argc, char **argv) {
    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    const char *server = NULL, *config = NULL;
    const char *sets[64];
    int nsets = 0;
    double timeout_s = 5;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        if ((v = ps_cli_value(argc, argv, &i, "--server", "-s", &missing))) server = v;
        else if ((v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing))) config = v;
        else if ((v = ps_cli_value(argc, argv, &i, "--set", NULL, &missing))) {
            if (nsets == 64) { fprintf(stderr, "ps-train status: too many --set\n"); return 2; }
            sets[nsets++] = v;
        }
        else if ((v = ps_cli_value(argc, argv, &i, "--timeout-s", NULL, &missing))) {
            ps_config tmp = cfg; /* the same checks as trainer.rpc_timeout_s */
            if (ps_config_set(&tmp, "trainer.rpc_timeout_s", v, "--timeout-s", &err)) {
                fprintf(stderr, "ps-train status: %s\n", err.msg);
                return 2;
            }
            timeout_s = tmp.trainer.rpc_timeout_s;
        } else if (!missing) {
            fprintf(stderr, "ps-train status: unknown option '%s' (see ps-train status --help)\n", argv[i]);
            return 2;
        }
        if (missing) { fprintf(stderr, "ps-train status: %s needs a value\n", argv[i]); return 2; }
    }
    if (config && ps_config_load(&cfg, config, &err)) { fprintf(stderr, "ps-train status: %s\n", err.msg); return 2; }
    for (int i = 0; i < nsets; i++) {
        char key[256];
        const char *val = ps_cli_split_kv(sets[i], key, sizeof key);
        if (!val) {
            fprintf(stderr, "ps-train status: --set needs KEY=VALUE, got '%s'\n", sets[i]);
            return 2;
        }
        if (ps_config_set(&cfg, key, val, "command line", &err)) {
            fprintf(stderr, "ps-train status: %s\n", err.msg);
            return 2;
        }
    }
    if (server && ps_config_set(&cfg, "server.address", server, "--server", &err)) {
        fprintf(stderr, "ps-train status: %s\n", err.msg);
        return 2;
    }

    if (cfg.n_servers > 0 && !server) {
        /* the cluster (and its model file) as psd and ps-train name its errors */
        if (ps_config_check_cluster(&cfg, &err)) {
            fprintf(stderr, "ps-train status: %s: %s\n", config ? config : "command line", err.msg);
            return 2;
        }
        grpc_init();
        int crc = ps_cluster_print_status(&cfg, timeout_s, stdout);
        grpc_shutdown();
        return crc;
    }
    ps_security sec;
    if (ps_security_client(&cfg, &sec, &err)) { fprintf(stderr, "ps-train status: %s\n", err.msg); return 2; }
    grpc_init();
    int rc = 1;
    ps_client *cl = ps_client_create_secure(cfg.server.address, (int)(timeout_s * 1000), 4 << 20, &sec.rpc, &err);
    ps_StatusResponse st = ps_StatusResponse_init_zero;
    if (!cl || ps_client_status(cl, &st, &err)) {
        fprintf(stderr, "ps-train status: %s\n", err.msg);
        goto out;
    }
    printf("psd %s at %s: %s\n", st.version, cfg.server.address, st.draining ? "DRAINING (shutting down)" : "serving");
    printf("  uptime            ");
    print_duration(st.uptime_s);
    printf("\n  model             %s, version %llu (optimizer steps applied)\n", st.model,
           (unsigned long long)st.model_version);
    printf("  samples           %llu trained\n", (unsigned long long)st.samples);
    printf("  cpu ISA           %s\n", st.cpu_isa[0] ? st.cpu_isa : "(not reported)");
    printf("  contexts          %llu live, %llu expired\n", (unsigned long long)st.live_contexts,
           (unsigned long long)st.expired_contexts);
    printf("  trainers seen     %llu\n", (unsigned long long)st.trainers_seen);
    if (st.checkpoint_age_s >= 0) {
        printf("  last checkpoint   step %llu, ", (unsigned long long)st.last_checkpoint_step);
        print_duration(st.checkpoint_age_s);
        printf(" ago (%s)\n", st.last_checkpoint);
    } else {
        printf("  last checkpoint   none\n");
    }
    printf("  non-finite        policy %s: %llu calls rejected, %llu steps skipped\n", st.nonfinite_policy,
           (unsigned long long)st.nonfinite_rejected, (unsigned long long)st.nonfinite_skipped);
    printf("  consistency       %s\n", st.consistency);
    if (st.server_name[0] || st.hosted[0])
        printf("  cluster           %s, server %s, hosts %s\n", st.cluster, st.server_name[0] ? st.server_name : "-",
               st.hosted[0] ? st.hosted : "(not reported)");
    if (st.partial_steps || st.partial_steps_lost)
        printf("  partial steps     %llu applied here (lost elsewhere), %llu lost here\n",
               (unsigned long long)st.partial_steps, (unsigned long long)st.partial_steps_lost);
    if (st.sync_round) printf("  sync round        %llu open, waits for %u; %llu late steps dropped, %llu queued "
                              "into a later round\n", (unsigned long long)st.sync_round, st.sync_members,
                              (unsigned long long)st.sync_dropped, (unsigned long long)st.sync_queued);
    printf("  steps applied     %llu contexts\n", (unsigned long long)st.contexts_applied);
    if (st.metrics_round) {
        printf("  metrics round     %llu", (unsigned long long)st.metrics_round);
        if (st.stop_metric[0])
            printf(" (%s: running %s > %g)", st.solved ? "SOLVED" : "not solved", st.stop_metric, st.stop_threshold);
        printf("\n");
        for (pb_size_t i = 0; i < st.round_scalars_count; i++) {
            const ps_RoundScalar *r = &st.round_scalars[i];
            printf("    %-15s count %u  min %.6g  mean %.6g  max %.6g  ema %.6g\n", r->name, r->count, r->min, r->mean,
                   r->max, r->ema);
        }
    }
    rc = 0;
out:
    ps_client_free(cl);
    ps_security_free(&sec);
    grpc_shutdown();
    return rc;
}
