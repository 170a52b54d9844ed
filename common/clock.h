/* clock.h - the one clock of the house: seconds as a double, for
 * timeouts, rates, uptimes and ages. Monotonic unless said otherwise
 * (CLOCK_MONOTONIC: one clock for every process of the machine, so two
 * processes' readings compare). */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

#include <pthread.h>
#include <time.h>

/* CLOCK_MONOTONIC, seconds. */
double ps_mono_s(void);
/* CLOCK_MONOTONIC, whole milliseconds. */
long long ps_mono_ms(void);
/* CLOCK_REALTIME, seconds since the epoch (ages of files and checkpoints). */
double ps_wall_s(void);

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines
 * (a change of the wall clock moves no timeout), and such a deadline ms
 * milliseconds from now. */
void ps_cond_init_mono(pthread_cond_t *cv);
struct timespec ps_mono_deadline_ms(long long ms);

#endif
