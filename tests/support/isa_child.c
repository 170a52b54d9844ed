/* isa_child.c - a test program run again under ONEDNN_MAX_CPU_ISA, in a
 * child process, its exit status checked; the ISAs and whether this CPU has
 * each (isa_child.h). */
#include "isa_child.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"
#include "backend.h"

void check_isa_child(const char *what, const char *isa, char *const argv[]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (isa) setenv("ONEDNN_MAX_CPU_ISA", isa, 1);
        else unsetenv("ONEDNN_MAX_CPU_ISA");
        execv("/proc/self/exe", argv);
        perror("exec /proc/self/exe");
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s under ONEDNN_MAX_CPU_ISA=%s: child failed (status 0x%x)",
              what, isa ? isa : "(unset)", status);
}

const isa_row isa_rows[ISA_ROWS] = {
    { "AVX512_CORE", "avx512_core", { "avx512f", "avx512bw", "avx512vl", "avx512dq" } },
    { "AVX2", "avx2", { "avx2", "fma", NULL, NULL } },
    { "SSE41", "sse41", { "sse4_1", NULL, NULL, NULL } },
};

int isa_host_has(const isa_row *row) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[8192];
    int ok = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            ok = 1;
            for (int i = 0; i < 4 && row->flags[i]; i++) {
                char want[64];
                snprintf(want, sizeof want, " %s", row->flags[i]);
                size_t n = strlen(want);
                const char *p = line;
                int found = 0;
                while ((p = strstr(p, want)) != NULL) {
                    if (p[n] == ' ' || p[n] == '\n' || p[n] == 0) { found = 1; break; }
                    p += n;
                }
                ok &= found;
            }
            break;
        }
    fclose(f);
    return ok;
}

int isa_children_main(const char *name, int argc, char **argv, int (*child)(const char *isa)) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    const char *host = ps_backend_cpu_isa();
    if (!strstr(host, "avx") && strcmp(host, "sse41")) {
        printf("%s: skipped: oneDNN's ISA here is %s, not x86-64 with SSE4.1\n", name, host);
        return 77;
    }
    const char *isas[] = { "SSE41", "AVX2", "DEFAULT" };   /* DEFAULT: the host's own */
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!strcmp(isas[i], "AVX2") && !strstr(host, "avx2") && !strstr(host, "avx512")) continue;
        char *const args[] = {argv[0], "--child", (char *)isas[i], NULL};
        check_isa_child(name, strcmp(isas[i], "DEFAULT") ? isas[i] : NULL, args);
    }
    return check_summary(name);
}
