/* clock.h - the one clock of the house: seconds as a double, for
 * timeouts, rates, uptimes and ages. Monotonic unless said otherwise
 * (CLOCK_MONOTONIC: one clock for every process of the machine, so two
 * processes' readings compare). */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

/* CLOCK_MONOTONIC, seconds. */
double ps_mono_s(void);
/* CLOCK_MONOTONIC, whole milliseconds. */
long long ps_mono_ms(void);
/* CLOCK_REALTIME, seconds since the epoch (ages of files and checkpoints). */
double ps_wall_s(void);

#endif
