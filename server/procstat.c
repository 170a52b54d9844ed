/* procstat.c - this process's accounts from /proc/self (procstat.h). */
#include "procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Seconds since the epoch at which the machine booted (/proc/stat btime), or -1. */
static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    char line[256];
    double t = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) {
            t = strtod(line + 6, NULL);
            break;
        }
    if (f) fclose(f);
    return t;
}

void ps_proc_self(ps_proc_stats *s) {
    *s = (ps_proc_stats){-1, -1, -1, -1, -1, -1};
    const long page = sysconf(_SC_PAGESIZE), tck = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/self/stat", "r");
    char line[1024];
    if (f && fgets(line, sizeof line, f) && tck > 0 && page > 0) {
        /* proc(5): after the command's ')', field 3 (the state letter) ... 14 utime, 15 stime, 22 starttime
         * (clock ticks after boot), 23 vsize (bytes), 24 rss (pages) */
        const char *q = strrchr(line, ')');   /* the command may hold spaces and parentheses */
        unsigned long long v[25] = {0};
        int k = 3;
        for (q = q ? q + 2 : NULL; q && *q && k <= 24; k++) {
            if (k > 3) v[k] = strtoull(q, NULL, 10);
            q = strchr(q, ' ');
            if (q) q++;
        }
        if (k > 24) {
            s->cpu_s = (double)(v[14] + v[15]) / (double)tck;
            s->vm_bytes = (double)v[23];
            s->rss_bytes = (double)v[24] * (double)page;
            const double boot = boot_time();
            if (boot >= 0) s->start_time_s = boot + (double)v[22] / (double)tck;
        }
    }
    if (f) fclose(f);
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long n = 0;
        for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
        closedir(d);
        s->open_fds = (double)(n - 1);   /* less the one reading the directory */
    }
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) s->max_fds = (double)rl.rlim_cur;
}
