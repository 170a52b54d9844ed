#!/usr/bin/python3
"""Write tests/golden/lm_step.safetensors: one training step of the
model-parallel language model as PyTorch computes it - the tutorial's
RNNModel (EmbeddingTable: encoder + dropout; the LSTM; Decoder: dropout +
decoder) trained as word_language_model does: cross-entropy, backward,
clip_grad_norm_(0.25) over every parameter, SGD(lr=20) - with injected
dropout masks, nonzero carried hidden state and a clip that bites.

    /usr/bin/python3 scripts/gen_golden_lm_step.py [output directory]

Sizes: ntoken 20, ninp 6, nhid 5, 2 LSTM layers, T=4, N=3, dropout 0.5.
The LSTM is two single-layer nn.LSTMs so that the dropout between layers
takes an injected mask (nn.LSTM(dropout=p) draws its own); their
parameters are stored under nn.LSTM(ninp, nhid, 2)'s names.
Tensors: init.<P>, ids (T,N) I64, target (T,N) I64, h0, c0 (2,N,H),
mask.emb (T,N,ninp), mask.mid (T,N,H), mask.dec (T,N,H), loss (), norm ()
(clip_grad_norm_'s total norm, before clipping), hn, cn (2,N,H),
grad.<P> (before clipping), final.<P> after the step.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

SEED = 21
V, E, H, L, T, N, P, LR, CLIP = 20, 6, 5, 2, 4, 3, 0.5, 20.0, 0.25


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', 'tests', 'golden')
    torch.manual_seed(SEED)
    encoder = nn.Embedding(V, E)
    nn.init.uniform_(encoder.weight, -0.1, 0.1)
    l0, l1 = nn.LSTM(E, H), nn.LSTM(H, H)
    decoder = nn.Linear(H, V)
    nn.init.uniform_(decoder.weight, -0.1, 0.1)
    nn.init.zeros_(decoder.bias)
    # weights large enough that the step moves things visibly
    with torch.no_grad():
        for p in list(l0.parameters()) + list(l1.parameters()):
            p.uniform_(-1.5, 1.5)
    named = {'encoder.weight': encoder.weight, 'decoder.weight': decoder.weight, 'decoder.bias': decoder.bias}
    for k, layer in enumerate((l0, l1)):
        for nm in ('weight_ih', 'weight_hh', 'bias_ih', 'bias_hh'):
            named[f'rnn.{nm}_l{k}'] = getattr(layer, nm + '_l0')
    t = {'init.' + k: v.detach().clone() for k, v in named.items()}
    ids = torch.tensor([[1, 5, 7], [5, 19, 0], [3, 3, 12], [7, 1, 9]], dtype=torch.int64)  # repeated rows
    target = torch.randint(0, V, (T, N))
    h0, c0 = torch.randn(L, N, H), torch.randn(L, N, H)
    me = torch.bernoulli(torch.full((T, N, E), 1 - P)) / (1 - P)
    mm = torch.bernoulli(torch.full((T, N, H), 1 - P)) / (1 - P)
    md = torch.bernoulli(torch.full((T, N, H), 1 - P)) / (1 - P)
    x = encoder(ids) * me
    y0, (h_0, c_0) = l0(x, (h0[0:1], c0[0:1]))
    y1, (h_1, c_1) = l1(y0 * mm, (h0[1:2], c0[1:2]))
    logits = decoder(y1 * md)
    loss = F.cross_entropy(logits.view(-1, V), target.view(-1))
    loss.backward()
    for k, v in named.items():
        t['grad.' + k] = v.grad.detach().clone()
    norm = torch.nn.utils.clip_grad_norm_(list(named.values()), CLIP)
    with torch.no_grad():
        for v in named.values():
            v.add_(v.grad, alpha=-LR)
    for k, v in named.items():
        t['final.' + k] = v.detach().clone()
    t.update({'ids': ids, 'target': target, 'h0': h0, 'c0': c0, 'mask.emb': me, 'mask.mid': mm, 'mask.dec': md,
              'loss': loss.detach().reshape(()), 'norm': norm.detach().reshape(()),
              'hn': torch.cat([h_0, h_1]).detach(), 'cn': torch.cat([c_0, c_1]).detach()})
    assert norm > CLIP, "the clip must bite"
    t = {k: (v.float() if v.dtype != torch.int64 else v).contiguous() for k, v in t.items()}
    path = os.path.join(out, 'lm_step.safetensors')
    write_safetensors(path, t, {'generator': 'scripts/gen_golden_lm_step.py', 'torch': torch.__version__,
                                'sizes': f'ntoken={V} ninp={E} nhid={H} layers={L} T={T} N={N} dropout={P} '
                                         f'lr={LR} clip={CLIP}'})
    back, _ = read_safetensors(path)
    for k, v in t.items():
        assert torch.equal(back[k], v), k
    print(f"wrote {path}: {len(t)} tensors, loss {loss.item():.4f}, norm {norm.item():.4f}")


if __name__ == '__main__':
    main()
