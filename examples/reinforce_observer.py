#!/usr/bin/python3
"""An observer of PyTorch's distributed RPC tutorial's REINFORCE agent
(https://pytorch.org/tutorials/intermediate/rpc_tutorial.html), with psd
hosting the policy and its optimizer instead of the tutorial's Agent.

The tutorial's observers play CartPole and call the Agent's select_action
over RPC at every step; the Agent keeps the log-probabilities, computes the
returns and steps its optimizer once per episode of all observers. Here
each observer is a process: every step is a training Forward of the
policy on psd (stage "policy" of model cartpole_policy, pytorch/examples'
Policy) inside the episode's psd context, the action is sampled here from
the returned probabilities, and at the episode's end loss.backward() and
ctx.step() send the gradient of the observer's REINFORCE loss into psd's
sync round (configs/cartpole.yaml: rounds of 2 observers, gradients summed,
one Adam step per round). psd aggregates each round's episode rewards
(round metrics) and says when the running reward passed the threshold:

    psd --config configs/cartpole.yaml &
    PYTHONPATH=python examples/reinforce_observer.py --config configs/cartpole.yaml --rank 1 &
    PYTHONPATH=python examples/reinforce_observer.py --config configs/cartpole.yaml --rank 2

Deviations from the tutorial, as ps-train cartpole's (docs/rl.md): each
observer discounts and normalises its own episode's returns; each observer
has its own seed (--seed plus its rank).
"""
import argparse
import sys
from itertools import count

import numpy as np
import torch
from torch.distributions import Categorical

import psd
from cartpole import CartPole

EPS = np.finfo(np.float32).eps.item()


def run_episode(policy, env, gamma):
    """One episode in the current psd context: (episode reward, REINFORCE loss)."""
    state, saved_log_probs, rewards = env.reset(), [], []
    for t in count():
        probs = policy(torch.from_numpy(state).unsqueeze(0))   # select_action, on psd
        m = Categorical(probs)
        action = m.sample()
        saved_log_probs.append(m.log_prob(action))
        state, reward, terminated, truncated = env.step(action.item())
        rewards.append(reward)
        if terminated or truncated:
            break
    R, returns = 0.0, []
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    if len(returns) > 1:
        returns = (returns - returns.mean()) / (returns.std() + EPS)
    policy_loss = torch.cat([-log_prob * R for log_prob, R in zip(saved_log_probs, returns)]).sum()
    policy_loss.backward()
    return sum(rewards), policy_loss.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/cartpole.yaml")
    p.add_argument("--server", help="psd's address (overrides server.address)")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--seed", type=int, default=543, help="environment and sampling; each rank adds its rank")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--max-episodes", type=int, default=10000)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed * 1000003 + args.rank)
    client = psd.connect(args.config, rank=args.rank, server=args.server,
                         overrides=dict(kv.split("=", 1) for kv in args.set))
    policy = psd.RemoteStage("policy", client)
    env = CartPole(seed=args.seed * 1000003 + args.rank)
    for i_episode in range(1, args.max_episodes + 1):
        try:
            for ctx in psd.attempts(client):
                with ctx:
                    ep_reward, loss = run_episode(policy, env, args.gamma)
                    res = ctx.step(scalars={"reward": ep_reward, "loss": loss})
        except psd.RoundClosed as e:    # late for its sync round 5 times in a row (attempts played it again 4)
            print(f"Rank {args.rank} Episode {i_episode} dropped by psd: {e}", flush=True)
            continue
        reward = res.round_scalars.get("reward", {})
        last, running = reward.get("min", ep_reward), reward.get("ema", ep_reward)   # over the round's observers
        if i_episode % args.log_interval == 0 or res.solved:
            print(f"Rank {args.rank} Episode {i_episode}\tLast reward: {last:.2f}\tAverage reward: {running:.2f}\t"
                  f"(own {ep_reward:.0f} steps, round {res.round} of {res.round_contexts} observers)", flush=True)
        if res.solved:
            print(f"Rank {args.rank} Solved! Running reward is now {running:.2f} (round {res.round}, "
                  f"{i_episode} episodes)", flush=True)
            return 0
    print(f"Rank {args.rank}: not solved in {args.max_episodes} episodes", flush=True)
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except psd.Error as e:
        sys.exit(f"reinforce_observer: {e}")
