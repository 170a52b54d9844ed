"""CartPole-v1 as gym's classic-control cartpole.py computes it, without gym
(Debian has no gym): gravity 9.8, cart 1.0, pole 0.1, half-length 0.5,
force 10, tau 0.02, explicit Euler in float64, float32 observations,
termination past 12 degrees or 2.4, truncation at 500 steps, reward 1 per
step, initial state uniform in +-0.05. The same environment ps-train
cartpole runs in C (common/cartpole.c); the random initial states differ
(numpy's generator here)."""
import math

import numpy as np


class CartPole:
    def __init__(self, seed=None, max_steps=500):
        self.rng = np.random.default_rng(seed)
        self.max_steps = max_steps
        self.state = None
        self.steps = 0

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        self.steps = 0
        return self.state.astype(np.float32)

    def step(self, action):
        """(observation, reward, terminated, truncated) after pushing left (0) or right (1)."""
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot * theta_dot * sin) / 1.1
        thetaacc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos * cos / 1.1))
        xacc = temp - 0.05 * thetaacc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * xacc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc
        self.state = np.array([x, x_dot, theta, theta_dot])
        self.steps += 1
        limit = 12 * 2 * math.pi / 360
        terminated = bool(x < -2.4 or x > 2.4 or theta < -limit or theta > limit)
        return self.state.astype(np.float32), 1.0, terminated, self.steps >= self.max_steps
