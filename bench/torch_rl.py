#!/usr/bin/python3
"""The PyTorch anchor of the RL bench: a faithful re-implementation of the
REINFORCE agent and observers of PyTorch's "Getting started with distributed
RPC" tutorial (torch.distributed.rpc, TensorPipe, one process per rank on
this machine), with the same CartPole-v1 dynamics as psd's observers (the
numpy/float64 port of gym's cartpole.py in scripts/gen_golden_cartpole.py;
gym is not in Debian).

    bench/torch_rl.py OBSERVERS ROUNDS

As in the tutorial: the agent (rank 0) holds the Policy and Adam(lr=1e-2),
calls every observer's run_episode with rpc_async; at each step an observer
calls the agent's select_action (rpc_sync: policy forward, Categorical
sample, log_prob kept) and report_reward (rpc_sync); when all observers are
done the agent computes the returns over all observers' rewards
concatenated, normalises them over the round, and takes one Adam step.
Prints one line:
    torch_rl observers=N rounds=R env_steps=S secs=T steps_per_s=X select_action_median_us=M
where the select-action latency is the observer's rpc_sync round trip.
"""
import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.optim as optim
from torch.distributions import Categorical

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from gen_golden_cartpole import CartPolePort  # noqa: E402
# the tutorial's policy network, as reinforce.py writes it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "models"))
from rpc_tutorials import Policy  # noqa: E402

AGENT_NAME = "agent"
OBSERVER_NAME = "observer{}"
GAMMA = 0.99


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), _call_method, args=args, kwargs=kwargs)


class Observer:
    def __init__(self):
        self.id = rpc.get_worker_info().id
        self.env = CartPolePort()
        self.rng = np.random.default_rng(543 + self.id)

    def run_episode(self, agent_rref, n_steps):
        state = self.env.reset_to(self.rng.uniform(-0.05, 0.05, size=4))
        lat = []
        steps = 0
        for _ in range(n_steps):
            t0 = time.perf_counter()
            action = _remote_method(Agent.select_action, agent_rref, self.id, state)
            lat.append((time.perf_counter() - t0) * 1e6)
            state, reward, terminated, truncated = self.env.step(action)
            _remote_method(Agent.report_reward, agent_rref, self.id, reward)
            steps += 1
            if terminated or truncated:
                break
        return steps, lat


class Agent:
    def __init__(self, world_size):
        self.ob_rrefs = []
        self.agent_rref = rpc.RRef(self)
        self.rewards = {}
        self.saved_log_probs = {}
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.eps = np.finfo(np.float32).eps.item()
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(OBSERVER_NAME.format(ob_rank))
            self.ob_rrefs.append(rpc.remote(ob_info, Observer))
            self.rewards[ob_info.id] = []
            self.saved_log_probs[ob_info.id] = []

    def select_action(self, ob_id, state):
        state = torch.from_numpy(state).float().unsqueeze(0)
        probs = self.policy(state)
        m = Categorical(probs)
        action = m.sample()
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps=500):
        futs = [rpc.rpc_async(r.owner(), _call_method, args=(Observer.run_episode, r, self.agent_rref, n_steps))
                for r in self.ob_rrefs]
        return [f.wait() for f in futs]

    def finish_episode(self):
        R, probs, rewards = 0, [], []
        for ob_id in self.rewards:
            probs.extend(self.saved_log_probs[ob_id])
            rewards.extend(self.rewards[ob_id])
        for ob_id in self.rewards:
            self.rewards[ob_id] = []
            self.saved_log_probs[ob_id] = []
        policy_loss, returns = [], []
        for r in rewards[::-1]:
            R = r + GAMMA * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        for log_prob, R in zip(probs, returns):
            policy_loss.append(-log_prob * R)
        self.optimizer.zero_grad()
        loss = torch.cat(policy_loss).sum()
        loss.backward()
        self.optimizer.step()


def run_worker(rank, world_size, rounds, port, q):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=300)
    if rank == 0:
        rpc.init_rpc(AGENT_NAME, rank=rank, world_size=world_size, rpc_backend_options=opts)
        torch.manual_seed(543)
        agent = Agent(world_size)
        agent.run_episode(10)   # warm-up
        agent.finish_episode()
        steps, lat = 0, []
        t0 = time.perf_counter()
        for _ in range(rounds):
            res = agent.run_episode()
            agent.finish_episode()
            for s, l in res:
                steps += s
                lat.extend(l)
        secs = time.perf_counter() - t0
        q.put((steps, secs, statistics.median(lat)))
    else:
        rpc.init_rpc(OBSERVER_NAME.format(rank), rank=rank, world_size=world_size, rpc_backend_options=opts)
    rpc.shutdown()


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run_worker, args=(r, n + 1, rounds, port, q)) for r in range(n + 1)]
    for p in procs:
        p.start()
    steps, secs, med = q.get()
    for p in procs:
        p.join()
    print("torch_rl observers=%d rounds=%d env_steps=%d secs=%.2f steps_per_s=%.0f select_action_median_us=%.0f"
          % (n, rounds, steps, secs, steps / secs, med))


if __name__ == "__main__":
    main()
