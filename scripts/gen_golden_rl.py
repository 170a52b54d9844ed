#!/usr/bin/python3
"""Write tests/golden/cartpole_round.safetensors: one full REINFORCE round of
the cartpole task computed by PyTorch, for tests/test_golden_rl.c.

    /usr/bin/python3 scripts/gen_golden_rl.py [output directory]

Two observers run episodes of T = 9 and 6 steps through pytorch/examples'
REINFORCE Policy (affine1 Linear(4,128), dropout(p=0.6) as an explicit
stored mask, relu, affine2 Linear(128,2), softmax) - one forward of a
(1, 4) observation per step, as the observers send them to psd. Each
observer's own returns (gamma 0.99, never across observers) are normalised
over its episode ((R - mean) / (std + eps), torch's unbiased std, eps the
float32 epsilon, as reinforce.py); its loss is
    -sum_t log pi(a_t|s_t) * R_t - beta * sum_t H(pi(.|s_t)),  beta = 0.01,
and the round's loss is the sum over observers (psd's sync round with
server.sync_reduce sum), followed by one torch.optim.SGD(lr=0.01) step
(final.<P>) and, from the same weights and gradients, one
torch.optim.Adam(lr=0.01) step (final_adam.<P>, configs/cartpole.yaml's).
Actions and rewards are injected (stored), so the C side needs no RNG.

Tensors: init.<P>; o<k>.input (T,4), o<k>.mask (T,128), o<k>.action (T,)
I64, o<k>.reward (T,) F32 (1 each step, 0 nowhere: CartPole pays 1 per
step; the last observer's last step included), o<k>.return (T,) F32
normalised returns, o<k>.output (T,2) probs, o<k>.grad_output (T,2)
= d(round loss)/d probs; grad.<P> (the sum over both observers);
final.<P> after the step.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

SEED = 11
GAMMA = 0.99
BETA = 0.01
LR = 0.01
ADAM_LR = 0.01
EPS = torch.finfo(torch.float32).eps
OUT_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x, mask):
        return F.softmax(self.affine2(F.relu(self.affine1(x) * mask)), dim=1)


def observer_loss(net, obs, masks, actions, rewards):
    """One observer's episode, a forward per step (1, 4)."""
    probs = []
    for t in range(obs.shape[0]):
        p = net(obs[t:t + 1], masks[t:t + 1])
        p.retain_grad()
        probs.append(p)
    R, returns = 0.0, []
    for r in reversed(rewards.tolist()):
        R = r + GAMMA * R
        returns.insert(0, R)
    returns = torch.tensor(returns, dtype=torch.float64)
    returns = (returns - returns.mean()) / (returns.std() + EPS)
    loss = 0
    for t, p in enumerate(probs):
        m = torch.distributions.Categorical(p)
        lp = m.log_prob(actions[t:t + 1])
        loss = loss - (lp * returns[t].float()).sum() - BETA * m.entropy().sum()
    return loss, probs, returns


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else OUT_DIR
    torch.manual_seed(SEED)
    net = Policy()
    t = {"init." + k: v.detach().clone() for k, v in net.state_dict().items()}
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    opt.zero_grad()
    total = 0
    obs_probs = []
    for k, T in enumerate((9, 6)):
        obs = torch.randn(T, 4) * 0.05
        masks = torch.bernoulli(torch.full((T, 128), 0.4)) / 0.4
        actions = torch.randint(0, 2, (T,), dtype=torch.int64)
        rewards = torch.ones(T, dtype=torch.float64)
        loss, probs, returns = observer_loss(net, obs, masks, actions, rewards)
        total = total + loss
        obs_probs.append(probs)
        t.update({f"o{k}.input": obs, f"o{k}.mask": masks, f"o{k}.action": actions, f"o{k}.reward": rewards.float(),
                  f"o{k}.return": returns.float(),
                  f"o{k}.output": torch.cat([p.detach() for p in probs])})
    total.backward()
    for k, probs in enumerate(obs_probs):
        t[f"o{k}.grad_output"] = torch.cat([p.grad.detach() for p in probs])
    for name, p in net.named_parameters():
        t["grad." + name] = p.grad.detach().clone()
    # the same round's gradients under the tutorial's optimizer, from the same weights
    adam_net = Policy()
    adam_net.load_state_dict({k[len("init."):]: v for k, v in t.items() if k.startswith("init.")})
    for (_, pa), (_, p) in zip(adam_net.named_parameters(), net.named_parameters()):
        pa.grad = p.grad.detach().clone()
    torch.optim.Adam(adam_net.parameters(), lr=ADAM_LR).step()
    t.update({"final_adam." + k: v.detach().clone() for k, v in adam_net.state_dict().items()})
    opt.step()
    t.update({"final." + k: v.detach().clone() for k, v in net.state_dict().items()})
    t["round_loss"] = total.detach().reshape(1).float()
    meta = {"format": "psd golden cartpole REINFORCE round v1", "generator": "scripts/gen_golden_rl.py",
            "gamma": str(GAMMA), "beta": str(BETA), "optimizer": f"SGD(lr={LR}); Adam(lr={ADAM_LR})", "observers": "2 (T=9, 6)",
            "reduce": "sum", "seed": str(SEED), "torch_version": torch.__version__}
    path = os.path.join(out_dir, "cartpole_round.safetensors")
    write_safetensors(path, t, meta)
    back, _ = read_safetensors(path)
    assert all(torch.equal(back[k], v) for k, v in t.items())
    print("wrote %s: %d tensors, round loss %.6f" % (path, len(t), total.item()))


if __name__ == "__main__":
    main()
