/* cartpole.c - the CartPole-v1 environment of the REINFORCE observers,
 * step for step as gym's classic-control version (cartpole.h). */
#include "cartpole.h"

#include <math.h>
#include <string.h>

/* gym's constants (CartPoleEnv.__init__). */
#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define TOTAL_MASS (MASSPOLE + MASSCART)
#define LENGTH 0.5                        /* actually half the pole's length */
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG 10.0
#define TAU 0.02                          /* seconds between state updates */

void ps_cartpole_init(ps_cartpole *e, uint64_t seed, int max_steps) {
    memset(e, 0, sizeof *e);
    ps_rng_seed(&e->rng, seed);
    e->max_steps = max_steps > 0 ? max_steps : PS_CARTPOLE_MAX_STEPS;
    e->done = 1;
}

static void observe(const ps_cartpole *e, float obs[PS_CARTPOLE_OBS]) {
    if (obs)
        for (int i = 0; i < PS_CARTPOLE_OBS; i++) obs[i] = (float)e->s[i];
}

void ps_cartpole_set_state(ps_cartpole *e, const double s[PS_CARTPOLE_OBS]) {
    memcpy(e->s, s, sizeof e->s);
    e->steps = 0;
    e->done = 0;
}

void ps_cartpole_reset(ps_cartpole *e, float obs[PS_CARTPOLE_OBS]) {
    double s[PS_CARTPOLE_OBS];
    for (int i = 0; i < PS_CARTPOLE_OBS; i++) {
        double u = (double)(ps_rng_next(&e->rng) >> 11) * 0x1.0p-53;  /* [0, 1), 53 bits */
        s[i] = -0.05 + 0.1 * u;
    }
    ps_cartpole_set_state(e, s);
    observe(e, obs);
}

int ps_cartpole_step(ps_cartpole *e, int action, float obs[PS_CARTPOLE_OBS], double *reward, int *terminated,
                     int *truncated) {
    if ((action != 0 && action != 1) || e->done) return -1;
    double x = e->s[0], x_dot = e->s[1], theta = e->s[2], theta_dot = e->s[3];
    double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
    double costheta = cos(theta), sintheta = sin(theta);
    /* gym's expressions in gym's evaluation order (theta_dot**2 and costheta**2
     * are squares taken first), so the float64 results round the same way */
    double temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
    double thetaacc = (GRAVITY * sintheta - costheta * temp) /
                      (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
    double xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
    /* euler */
    x = x + TAU * x_dot;
    x_dot = x_dot + TAU * xacc;
    theta = theta + TAU * theta_dot;
    theta_dot = theta_dot + TAU * thetaacc;
    e->s[0] = x, e->s[1] = x_dot, e->s[2] = theta, e->s[3] = theta_dot;
    e->steps++;
    int term = x < -PS_CARTPOLE_X_THRESHOLD || x > PS_CARTPOLE_X_THRESHOLD || theta < -PS_CARTPOLE_THETA_THRESHOLD ||
               theta > PS_CARTPOLE_THETA_THRESHOLD;
    int trunc = e->steps >= e->max_steps;
    e->done = term || trunc;
    observe(e, obs);
    if (reward) *reward = 1.0;
    if (terminated) *terminated = term;
    if (truncated) *truncated = trunc;
    return 0;
}
