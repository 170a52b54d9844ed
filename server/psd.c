/* psd - the parameter-server daemon.
 *
 * Hosts the model the config names and serves the ParameterServer gRPC
 * service to many trainers at once. SIGINT/SIGTERM stop it: no new calls,
 * in-flight calls finish (bounded grace), exit 0. Signals are blocked in
 * every thread and taken synchronously by the main loop (sigtimedwait),
 * which also expires idle contexts once a second.
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "model.h"
#include "rpc.h"
#include "security.h"
#include "service.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: psd [options]\n"
            "  -c, --config FILE      cluster config (YAML); default: built-in defaults\n"
            "  -l, --listen ADDR      address to serve on (server.listen)\n"
            "  -b, --backend NAME     CPU compute backend: dnnl or ref (model.backend)\n"
            "      --set KEY=VALUE    override any config key, e.g. --set optimizer.lr=0.05\n"
            "      --log-level LEVEL  debug, info, warn or error (server.log_level)\n"
            "      --print-config     print the effective config and exit\n"
            "  -V, --version          print the version and exit\n"
            "  -h, --help             this help\n"
            "Keys, types and defaults: docs/config.md.\n");
}

/* --name VALUE or --name=VALUE; advances *i. Returns NULL if argv[*i] is not name. */
static const char *flag_value(int argc, char **argv, int *i, const char *lng, const char *shrt, int *missing) {
    const char *a = argv[*i];
    size_t n = strlen(lng);
    if (!strncmp(a, lng, n) && a[n] == '=') return a + n + 1;
    if (!strcmp(a, lng) || (shrt && !strcmp(a, shrt))) {
        if (*i + 1 >= argc) { *missing = 1; return NULL; }
        return argv[++*i];
    }
    return NULL;
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

    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    const char *config_path = NULL;
    int print_config = 0;
    /* The config file first, then flags override it through the same setter. */
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v = flag_value(argc, argv, &i, "--config", "-c", &missing);
        if (v) config_path = v;
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
            printf("; CUDA: not built)\n");
            return 0;
        }
        if (!strcmp(a, "--print-config")) { print_config = 1; continue; }
        if ((v = flag_value(argc, argv, &i, "--config", "-c", &missing))) continue;
        const char *key = NULL;
        char kv[512];
        if ((v = flag_value(argc, argv, &i, "--listen", "-l", &missing))) key = "server.listen";
        else if ((v = flag_value(argc, argv, &i, "--backend", "-b", &missing))) key = "model.backend";
        else if ((v = flag_value(argc, argv, &i, "--log-level", NULL, &missing))) key = "server.log_level";
        else if ((v = flag_value(argc, argv, &i, "--set", NULL, &missing))) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) { fprintf(stderr, "psd: --set needs KEY=VALUE, got '%s'\n", v); return 2; }
            snprintf(kv, sizeof kv, "%.*s", (int)(eq - v), v);
            key = kv;
            v = eq + 1;
        }
        if (missing) { fprintf(stderr, "psd: %s needs a value\n", a); return 2; }
        if (!key) { fprintf(stderr, "psd: unknown option '%s' (see psd --help)\n", a); return 2; }
        if (ps_config_set(&cfg, key, v, "command line", &err)) { fprintf(stderr, "psd: %s\n", err.msg); return 2; }
    }
    if (print_config) { ps_config_print(&cfg, stdout); return 0; }
    ps_log_set_level(cfg.server.log_level);

    /* Build the model before anything listens: placement errors stop start-up. */
    ps_model_opts mo = {0};
    mo.arch = ps_config_enum_name("model.name", (int)cfg.model.name);
    mo.cpu_backend = ps_config_enum_name("model.backend", (int)cfg.model.backend);
    mo.n_placement = cfg.model.n_placement;
    for (int i = 0; i < cfg.model.n_placement; i++) {
        mo.placement_stage[i] = cfg.model.placement[i].stage;
        mo.placement_device[i] = cfg.model.placement[i].device;
    }
    mo.seed = cfg.model.seed;
    mo.compute_threads = cfg.server.compute_threads > 0 ? cfg.server.compute_threads
                                                         : (int)sysconf(_SC_NPROCESSORS_ONLN);
    mo.lr = (float)cfg.optimizer.lr;
    mo.momentum = (float)cfg.optimizer.momentum;
    mo.weight_decay = (float)cfg.optimizer.weight_decay;
    ps_model *model = ps_model_create(&mo, &err);
    if (!model) { fprintf(stderr, "psd: %s\n", err.msg); return 1; }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);  /* before grpc_init: its threads inherit it */
    grpc_init();

    ps_service_opts so = {
        .context_ttl_s = cfg.server.context_ttl_s,
        .max_contexts = 4096,
        .max_message_bytes = (size_t)cfg.server.max_message_mb << 20,
        .consistency = "hogwild: asynchronous steps; each Forward/Backward reads one consistent "
                       "weight snapshot (readers/writer lock), each Step is atomic",
        .nonfinite_skip = cfg.server.nonfinite_policy == PS_NONFINITE_SKIP,
    };
    ps_service *svc = ps_service_create(model, &so, &err);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_security sec;
    ps_rpc_server *srv = NULL;
    if (svc && ps_security_server(&cfg, &sec, &err) == PS_OK) {
        srv = ps_rpc_server_create_secure(cfg.server.listen, cfg.server.threads, (int)so.max_message_bytes,
                                          methods, nm, svc, &sec.rpc, &err);
        ps_log(PS_LOG_INFO, "transport: %s%s; %d token%s", cfg.security.tls ? "TLS" : "plaintext",
               cfg.security.mutual_tls ? " with client certificates" : "", sec.ntokens,
               sec.ntokens == 1 ? "" : "s");
        ps_security_free(&sec);
    }
    if (!srv || ps_rpc_server_start(srv, &err)) {
        fprintf(stderr, "psd: %s\n", err.msg);
        ps_rpc_server_free(srv);
        ps_service_free(svc);
        ps_model_free(model);
        grpc_shutdown();
        return 1;
    }
    char placement[256] = "";
    for (int i = 0; i < ps_model_num_params(model); i += 2) {
        const ps_param_info *p = ps_model_param(model, i);
        if (strstr(placement, p->stage)) continue;
        size_t o = strlen(placement);
        snprintf(placement + o, sizeof placement - o, "%s%s on %s", o ? ", " : "", p->stage, p->device);
    }
    ps_log(PS_LOG_INFO, "psd %s serving model %s (%lld parameters; %s; backend %s, %d compute threads) on %s "
           "with %d threads", PS_VERSION, ps_model_arch(model), (long long)ps_model_num_weights(model),
           placement, mo.cpu_backend, mo.compute_threads, cfg.server.listen, cfg.server.threads);

    int sig = 0;
    while (!sig) {
        struct timespec tick = {1, 0};
        int r = sigtimedwait(&sigs, NULL, &tick);
        if (r > 0) sig = r;
        else if (r < 0 && errno != EAGAIN && errno != EINTR) break;
        size_t expired = ps_service_expire(svc);
        if (expired) ps_log(PS_LOG_WARN, "expired %zu idle contexts (trainers gone?)", expired);
    }
    ps_log(PS_LOG_INFO, "%s received: draining in-flight calls", sig ? strsignal(sig) : "stop");
    ps_rpc_server_shutdown(srv, 5000);
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(svc, &st, &samples);
    ps_log(PS_LOG_INFO, "stopped: model version %llu, %llu training samples, %llu contexts opened, %llu expired",
           (unsigned long long)ps_model_version(model), (unsigned long long)samples,
           (unsigned long long)st.opened, (unsigned long long)st.expired);
    ps_rpc_server_free(srv);
    ps_service_free(svc);
    ps_model_free(model);
    grpc_shutdown();
    return 0;
}
