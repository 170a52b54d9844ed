/* procstat.h - this process's own accounts from /proc (Linux): resident and
 * virtual memory, CPU time, start time, open and allowed file descriptors -
 * what /metrics (the standard process_* series) and the dashboard show.
 *
 * Contract: ps_proc_self fills every field it can read and sets the others
 * to -1; it never fails otherwise and allocates nothing. */
#ifndef PS_PROCSTAT_H
#define PS_PROCSTAT_H

typedef struct ps_proc_stats {
    double cpu_s;           /* user + system CPU seconds */
    double start_time_s;    /* start, seconds since the Unix epoch */
    double rss_bytes;       /* resident memory */
    double vm_bytes;        /* virtual memory */
    double open_fds;        /* open file descriptors */
    double max_fds;         /* the soft limit on them (-1: none or unknown) */
} ps_proc_stats;

void ps_proc_self(ps_proc_stats *s);

#endif
