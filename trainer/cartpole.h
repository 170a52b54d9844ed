/* cartpole.h - CartPole-v1, the classic-control environment of OpenAI gym
 * (gym/envs/classic_control/cartpole.py, itself Sutton's pole.c), for the
 * REINFORCE observers of `ps-train cartpole`.
 *
 * Same physics as gym, reviewed line by line: gravity 9.8, cart mass 1.0,
 * pole mass 0.1, half pole length 0.5, force magnitude 10, tau 0.02 s,
 * explicit Euler ("euler" kinematics integrator: positions advance with the
 * old velocities), the state in float64 and the observation its float32
 * rounding. An episode terminates when |x| > 2.4 or |theta| > 12 degrees
 * (12 * 2 * pi / 360 rad; strict inequalities, on the float64 state), and
 * is truncated after max_steps steps (CartPole-v1's TimeLimit: 500). Every
 * step, the last included, earns reward 1. Reset draws each state variable
 * uniformly in [-0.05, 0.05).
 *
 * Deviation from gym: the reset draws come from the env's own seeded
 * ps_rng (rng.h), not numpy's generator, so a seed gives a different (but
 * reproducible) initial state than gym's.
 *
 * A plain value the caller owns; not thread-shared.
 */
#ifndef PS_CARTPOLE_H
#define PS_CARTPOLE_H

#include <stdint.h>

#include "rng.h"

#define PS_CARTPOLE_OBS 4          /* x, x_dot, theta, theta_dot */
#define PS_CARTPOLE_ACTIONS 2      /* 0 push left, 1 push right */
#define PS_CARTPOLE_MAX_STEPS 500  /* CartPole-v1's episode limit */
#define PS_CARTPOLE_X_THRESHOLD 2.4
#define PS_CARTPOLE_THETA_THRESHOLD (12 * 2 * 3.14159265358979323846 / 360)

typedef struct ps_cartpole {
    double s[PS_CARTPOLE_OBS];   /* x, x_dot, theta, theta_dot */
    int steps;                   /* steps since the reset */
    int max_steps;               /* truncation */
    int done;                    /* terminated or truncated: reset before stepping again */
    ps_rng rng;
} ps_cartpole;

/* Seed the reset draws; max_steps 0 = 500. */
void ps_cartpole_init(ps_cartpole *e, uint64_t seed, int max_steps);
/* A new episode; obs receives the initial observation. */
void ps_cartpole_reset(ps_cartpole *e, float obs[PS_CARTPOLE_OBS]);
/* Start an episode from a given state (tests, golden trajectories). */
void ps_cartpole_set_state(ps_cartpole *e, const double s[PS_CARTPOLE_OBS]);
/* One step with action 0 or 1 (anything else: -1, nothing changes; also -1
 * when the episode is done). Sets obs, *terminated, *truncated and returns
 * the reward (1). */
int ps_cartpole_step(ps_cartpole *e, int action, float obs[PS_CARTPOLE_OBS], double *reward, int *terminated,
                     int *truncated);

#endif
