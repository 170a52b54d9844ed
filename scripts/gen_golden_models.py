#!/usr/bin/python3
"""Write the PyTorch golden files of the models psd hosts besides the MNIST
CNN (scripts/gen_golden.py writes that one):

    tests/golden/cartpole_step.safetensors   cartpole_policy, one SGD step
    tests/golden/rnn_lm_stages.safetensors   rnn_lm's two stages, one SGD step
    tests/golden/cartpole_adam.safetensors   cartpole_policy, two Adam steps
    tests/golden/rnn_lm_adam.safetensors     rnn_lm, two steps: SparseAdam on the
                                             embedding, Adam on the decoder

Regenerate (needs PyTorch; Debian's python3-torch 1.13 made the committed
files):

    /usr/bin/python3 scripts/gen_golden_models.py [output directory]

The C test (tests/test_golden_models.c) only reads the committed files. The
files are written with gen_golden.py's struct+json safetensors writer and
read back to check they hold what was computed.

cartpole_policy (pytorch/examples reinforcement_learning/reinforce.py):
    x (N,4) -> affine1 = Linear(4,128) -> dropout (p=0.6): x * mask
            -> relu -> affine2 = Linear(128,2) -> softmax(dim=1) = probs
    loss = -sum_i log(probs[i, action_i]) * return_i   (REINFORCE)
  tensors: init.<P>, input (N,4), mask (N,128), action (N,) I64, return (N,),
  output (N,2), grad_output (N,2) = d loss/d probs, grad_input (N,4),
  grad.<P>, final.<P> after torch.optim.SGD(lr=0.01).

rnn_lm (pytorch/examples distributed/rpc/rnn: EmbeddingTable, Decoder;
word_language_model's init_weights), ntoken 50, ninp 8, nhid 8, dropout 0.2:
    stage emb:     ids (S,B) I64 -> encoder = Embedding(50,8) -> x * emb.mask
    (trainer RNN, here tanh as a stand-in: h = tanh(e))
    stage decoder: h (S,B,8) -> x * dec.mask -> decoder = Linear(8,50)
    loss = cross_entropy(logits.view(-1,50), target.view(-1)), mean
  tensors: init.<P>, emb.input (S,B) I64, emb.mask (S,B,8), emb.output,
  emb.grad_output = d loss/d e, dec.input = h, dec.mask (S,B,8), dec.output
  (S,B,50), dec.grad_output, dec.grad_input = d loss/d h, target (S,B) I64,
  grad.<P> (encoder.weight dense, zero rows where no id hit), final.<P> after
  torch.optim.SGD(lr=0.5) (plain SGD: only the hit rows of encoder.weight
  change).

cartpole_adam: the policy above, two steps k = 0, 1 of
torch.optim.Adam(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
on given output gradients: probs = net(step<k>.input, step<k>.mask),
probs.backward(step<k>.grad_output) (random, not a loss: the parameter
gradients are what the C side must reproduce, from the weights it has
after step k-1).
  tensors: init.<P>, step<k>.{input (N,4), mask (N,128), grad_output (N,2)},
  step<k>.grad.<P>, and after the step step<k>.final.<P>,
  step<k>.exp_avg.<P>, step<k>.exp_avg_sq.<P> (optimizer.state).

rnn_lm_adam: rnn_lm's stages as above (ntoken 50, ninp 8, nhid 8), the
embedding with sparse=True updated by torch.optim.SparseAdam, the decoder
by torch.optim.Adam, both lr=0.01, betas (0.9, 0.999), eps 1e-8; two steps
k = 0, 1 on given output gradients: e = emb(step<k>.emb.input,
step<k>.emb.mask), e.backward(step<k>.emb.grad_output); out =
dec(step<k>.dec.input, step<k>.dec.mask), out.backward(step<k>.dec.
grad_output). Step 0 hits rows 0, 3, ..., 33 (ids 3*randint(0,12)), step 1
rows 1, 4, ..., 34 plus a few of step 0's, so rows touched only at step 0
show SparseAdam's laziness (weights and moments kept at step 1).
  tensors: init.<P>, step<k>.emb.{input (S,B) I64, mask (S,B,8),
  grad_output (S,B,8)}, step<k>.dec.{input (S,B,8), mask (S,B,8),
  grad_output (S,B,50)}, step<k>.grad.<P> (dense; encoder.weight's sparse
  gradient coalesced and densified), step<k>.final.<P>,
  step<k>.exp_avg.<P>, step<k>.exp_avg_sq.<P>.

Masks are bernoulli(1-p)/(1-p) in float32, drawn with torch and stored.
Randomness: torch.manual_seed(SEED) before each model, in the order the
code below draws.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

SEED = 0
OUT_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)   # replaced by an explicit mask below
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x, mask):
        x = self.affine1(x)
        x = x * mask
        x = F.relu(x)
        return F.softmax(self.affine2(x), dim=1)


def cartpole():
    torch.manual_seed(SEED)
    net = Policy()
    n, lr = 6, 0.01
    t = {"init." + k: v.detach().clone() for k, v in net.state_dict().items()}
    x = torch.randn(n, 4)
    mask = torch.bernoulli(torch.full((n, 128), 0.4)) / 0.4
    action = torch.randint(0, 2, (n,), dtype=torch.int64)
    ret = torch.randn(n)
    x.requires_grad_(True)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    opt.zero_grad()
    probs = net(x, mask)
    probs.retain_grad()
    loss = -(torch.log(probs[torch.arange(n), action]) * ret).sum()
    loss.backward()
    t.update({"input": x.detach().clone(), "mask": mask, "action": action, "return": ret,
              "output": probs.detach().clone(), "grad_output": probs.grad.detach().clone(),
              "grad_input": x.grad.detach().clone()})
    for k, p in net.named_parameters():
        t["grad." + k] = p.grad.detach().clone()
    opt.step()
    t.update({"final." + k: v.detach().clone() for k, v in net.state_dict().items()})
    meta = {"format": "psd golden cartpole_policy step v1", "generator": "scripts/gen_golden_models.py",
            "layers": "affine1=Linear(4,128); dropout(p=0.6, x*mask); relu; affine2=Linear(128,2); softmax(dim=1)",
            "loss": "-sum(log(probs[i, action_i]) * return_i)", "optimizer": f"SGD(lr={lr})",
            "batch": str(n), "seed": str(SEED), "torch_version": torch.__version__}
    return "cartpole_step.safetensors", t, meta


class EmbeddingTable(nn.Module):
    def __init__(self, ntoken, ninp):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)

    def forward(self, ids, mask):
        return self.encoder(ids) * mask


class Decoder(nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, h, mask):
        return self.decoder(h * mask)


def rnn_lm():
    ntoken, ninp, nhid, p, seq, batch, lr = 50, 8, 8, 0.2, 5, 3, 0.5
    torch.manual_seed(SEED)
    emb, dec = EmbeddingTable(ntoken, ninp), Decoder(ntoken, nhid)
    t = {"init." + k: v.detach().clone() for k, v in list(emb.state_dict().items()) + list(dec.state_dict().items())}
    # ids from a small range so that rows repeat and most rows stay untouched
    ids = torch.randint(0, 12, (seq, batch), dtype=torch.int64) * 3
    target = torch.randint(0, ntoken, (seq, batch), dtype=torch.int64)
    emask = torch.bernoulli(torch.full((seq, batch, ninp), 1 - p)) / (1 - p)
    dmask = torch.bernoulli(torch.full((seq, batch, nhid), 1 - p)) / (1 - p)
    params = list(emb.parameters()) + list(dec.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    opt.zero_grad()
    e = emb(ids, emask)
    e.retain_grad()
    h = torch.tanh(e)                      # the trainer's RNN, reduced to a stand-in
    hd = h.detach().clone().requires_grad_(True)
    out = dec(hd, dmask)
    out.retain_grad()
    loss = F.cross_entropy(out.view(-1, ntoken), target.view(-1))
    loss.backward()
    h.backward(hd.grad)                    # through the stand-in into the embedding stage
    t.update({"emb.input": ids, "emb.mask": emask, "emb.output": e.detach().clone(),
              "emb.grad_output": e.grad.detach().clone(), "dec.input": hd.detach().clone(),
              "dec.mask": dmask, "dec.output": out.detach().clone(),
              "dec.grad_output": out.grad.detach().clone(), "dec.grad_input": hd.grad.detach().clone(),
              "target": target})
    for k, prm in list(emb.named_parameters()) + list(dec.named_parameters()):
        t["grad." + k] = prm.grad.detach().clone()
    opt.step()
    t.update({"final." + k: v.detach().clone() for k, v in list(emb.state_dict().items()) + list(dec.state_dict().items())})
    meta = {"format": "psd golden rnn_lm stages v1", "generator": "scripts/gen_golden_models.py",
            "sizes": f"ntoken={ntoken} ninp={ninp} nhid={nhid} dropout={p}", "shape": f"seq={seq} batch={batch}",
            "layers": "emb: encoder=Embedding(50,8), x*emb.mask | (tanh) | decoder: x*dec.mask, decoder=Linear(8,50)",
            "loss": "cross_entropy(dec.output, target), mean", "optimizer": f"SGD(lr={lr})",
            "seed": str(SEED), "torch_version": torch.__version__}
    return "rnn_lm_stages.safetensors", t, meta


def adam_state(opt, named, k, t):
    for name, prm in named:
        st = opt.state[prm]
        t[f"step{k}.exp_avg.{name}"] = st["exp_avg"].detach().clone()
        t[f"step{k}.exp_avg_sq.{name}"] = st["exp_avg_sq"].detach().clone()


def cartpole_adam():
    torch.manual_seed(SEED + 1)
    net = Policy()
    n, lr, wd = 6, 0.01, 0.01
    named = list(net.named_parameters())
    t = {"init." + k: v.detach().clone() for k, v in net.state_dict().items()}
    opt = torch.optim.Adam(net.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    for k in range(2):
        x = torch.randn(n, 4)
        mask = torch.bernoulli(torch.full((n, 128), 0.4)) / 0.4
        gout = torch.randn(n, 2)
        opt.zero_grad()
        probs = net(x, mask)
        probs.backward(gout)
        t.update({f"step{k}.input": x, f"step{k}.mask": mask, f"step{k}.grad_output": gout})
        for name, prm in named:
            t[f"step{k}.grad.{name}"] = prm.grad.detach().clone()
        opt.step()
        for name, prm in named:
            t[f"step{k}.final.{name}"] = prm.detach().clone()
        adam_state(opt, named, k, t)
    meta = {"format": "psd golden cartpole_policy adam v1", "generator": "scripts/gen_golden_models.py",
            "layers": "affine1=Linear(4,128); dropout(p=0.6, x*mask); relu; affine2=Linear(128,2); softmax(dim=1)",
            "gradients": "probs.backward(step<k>.grad_output)",
            "optimizer": f"Adam(lr={lr}, betas=(0.9, 0.999), eps=1e-08, weight_decay={wd})",
            "steps": "2", "batch": str(n), "seed": str(SEED + 1), "torch_version": torch.__version__}
    return "cartpole_adam.safetensors", t, meta


def rnn_lm_adam():
    ntoken, ninp, nhid, p, seq, batch, lr = 50, 8, 8, 0.2, 5, 3, 0.01
    torch.manual_seed(SEED + 2)
    emb, dec = EmbeddingTable(ntoken, ninp), Decoder(ntoken, nhid)
    emb.encoder.sparse = True              # sparse gradient: what SparseAdam takes
    nemb, ndec = list(emb.named_parameters()), list(dec.named_parameters())
    t = {"init." + k: v.detach().clone() for k, v in list(emb.state_dict().items()) + list(dec.state_dict().items())}
    sopt = torch.optim.SparseAdam([prm for _, prm in nemb], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    dopt = torch.optim.Adam([prm for _, prm in ndec], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    for k in range(2):
        ids = torch.randint(0, 12, (seq, batch), dtype=torch.int64) * 3 + k
        if k == 1:
            ids[0, :] = torch.tensor([0, 3, 6])   # a few rows of step 0 again
        emask = torch.bernoulli(torch.full((seq, batch, ninp), 1 - p)) / (1 - p)
        dmask = torch.bernoulli(torch.full((seq, batch, nhid), 1 - p)) / (1 - p)
        h = torch.randn(seq, batch, nhid)
        eg = torch.randn(seq, batch, ninp)
        dg = torch.randn(seq, batch, ntoken)
        sopt.zero_grad()
        dopt.zero_grad()
        emb(ids, emask).backward(eg)
        dec(h, dmask).backward(dg)
        t.update({f"step{k}.emb.input": ids, f"step{k}.emb.mask": emask, f"step{k}.emb.grad_output": eg,
                  f"step{k}.dec.input": h, f"step{k}.dec.mask": dmask, f"step{k}.dec.grad_output": dg})
        for name, prm in nemb + ndec:
            gr = prm.grad.coalesce().to_dense() if prm.grad.is_sparse else prm.grad
            t[f"step{k}.grad.{name}"] = gr.detach().clone()
        sopt.step()
        dopt.step()
        for name, prm in nemb + ndec:
            t[f"step{k}.final.{name}"] = prm.detach().clone()
        adam_state(sopt, nemb, k, t)
        adam_state(dopt, ndec, k, t)
    meta = {"format": "psd golden rnn_lm adam v1", "generator": "scripts/gen_golden_models.py",
            "sizes": f"ntoken={ntoken} ninp={ninp} nhid={nhid} dropout={p}", "shape": f"seq={seq} batch={batch}",
            "layers": "emb: encoder=Embedding(50,8,sparse=True), x*emb.mask | decoder: x*dec.mask, decoder=Linear(8,50)",
            "gradients": "emb.backward(step<k>.emb.grad_output), dec.backward(step<k>.dec.grad_output)",
            "optimizer": f"SparseAdam(encoder, lr={lr}, betas=(0.9, 0.999), eps=1e-08); "
                         f"Adam(decoder, lr={lr}, betas=(0.9, 0.999), eps=1e-08)",
            "steps": "2", "seed": str(SEED + 2), "torch_version": torch.__version__}
    return "rnn_lm_adam.safetensors", t, meta


def main():
    assert sys.byteorder == "little"
    out_dir = sys.argv[1] if len(sys.argv) > 1 else OUT_DIR
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for make in (cartpole, rnn_lm, cartpole_adam, rnn_lm_adam):
        name, tensors, meta = make()
        path = os.path.join(out_dir, name)
        write_safetensors(path, tensors, meta)
        got, _ = read_safetensors(path)
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes; self-check passed")


if __name__ == "__main__":
    main()
