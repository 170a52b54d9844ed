#!/usr/bin/python3
"""Write tests/golden/cartpole_trajectory.txt: CartPole-v1 trajectories from
an independent Python port of gym's classic-control cartpole.py (gym is not
in Debian), for tests/test_cartpole.c.

    /usr/bin/python3 scripts/gen_golden_cartpole.py [output file]

The port below follows gym's CartPoleEnv.step line by line (constants,
expressions and their order, "euler" integrator, strict termination tests
on the float64 state, float32 observation) plus gym's TimeLimit wrapper for
CartPole-v1 (truncated once 500 steps were taken). Initial states and
actions come from numpy's generator here and are stored, so the C test
replays them with ps_cartpole_set_state.

Format: '#' comment lines; per episode a line
    episode K x x_dot theta theta_dot          (the initial float64 state)
then one line per step
    step T action x x_dot theta theta_dot obs0 obs1 obs2 obs3 terminated truncated
with float64 values printed with 17 significant digits (exact round trip)
and the float32 observation as float64 values of the float32s.
"""
import math
import os
import sys

import numpy as np


class CartPolePort:
    """gym/envs/classic_control/cartpole.py CartPoleEnv, CartPole-v1."""

    def __init__(self, max_episode_steps=500):
        self.gravity = 9.8
        self.masscart = 1.0
        self.masspole = 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5  # actually half the pole's length
        self.polemass_length = self.masspole * self.length
        self.force_mag = 10.0
        self.tau = 0.02  # seconds between state updates
        self.kinematics_integrator = "euler"
        self.theta_threshold_radians = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        self.max_episode_steps = max_episode_steps
        self.state = None
        self.elapsed = 0

    def reset_to(self, state):
        self.state = tuple(float(v) for v in state)
        self.elapsed = 0
        return np.array(self.state, dtype=np.float32)

    def step(self, action):
        assert action in (0, 1)
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        costheta = math.cos(theta)
        sintheta = math.sin(theta)
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        assert self.kinematics_integrator == "euler"
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = (x, x_dot, theta, theta_dot)
        terminated = bool(x < -self.x_threshold or x > self.x_threshold
                          or theta < -self.theta_threshold_radians or theta > self.theta_threshold_radians)
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps  # gym.wrappers.TimeLimit
        return np.array(self.state, dtype=np.float32), 1.0, terminated, truncated


def g17(v):
    return repr(float(v))  # shortest exact round trip


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "cartpole_trajectory.txt")
    rng = np.random.default_rng(20261130)
    env = CartPolePort()
    lines = ["# CartPole-v1 trajectories from scripts/gen_golden_cartpole.py (independent port of gym's",
             "# cartpole.py); see that script for the format. Regenerate rather than edit."]
    # policies: random actions (short episodes, terminate on theta or x),
    # a balancing controller (reaches truncation at 500), always-right
    # (x or theta edge), and a cart drifting out by x.
    policies = ["random"] * 4 + ["balance", "right", "left", "drift"]
    for k, pol in enumerate(policies):
        s0 = rng.uniform(-0.05, 0.05, size=4)
        if pol == "drift":
            s0 = np.array([2.3, 1.5, 0.0, 0.0]) + s0 * 0.01
        env.reset_to(s0)
        lines.append("episode %d %s" % (k, " ".join(g17(v) for v in env.state)))
        t = 0
        while True:
            x, x_dot, theta, theta_dot = env.state
            if pol == "random":
                a = int(rng.integers(0, 2))
            elif pol == "balance":
                a = 1 if theta + 0.3 * theta_dot + 0.02 * x + 0.05 * x_dot > 0 else 0
            elif pol == "right":
                a = 1
            elif pol == "left":
                a = 0
            else:  # drift: keep the pole up while the cart runs out
                a = 1 if theta + 0.3 * theta_dot > 0 else 0
            obs, r, term, trunc = env.step(a)
            t += 1
            lines.append("step %d %d %s %s %d %d" % (t, a, " ".join(g17(v) for v in env.state),
                                                     " ".join(g17(v) for v in obs), int(term), int(trunc)))
            if term or trunc:
                break
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s: %d episodes, %d lines" % (out, len(policies), len(lines)))


if __name__ == "__main__":
    main()
