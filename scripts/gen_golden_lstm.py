#!/usr/bin/python3
"""Write tests/golden/lstm.safetensors: PyTorch's nn.LSTM (2 layers, no
dropout) forward and backward, the reference for trainer/lstm.c (the
trainer's LSTM of the language model, both the plain C reference and
oneDNN).

    /usr/bin/python3 scripts/gen_golden_lstm.py [output directory]

Sizes: T=5 steps, N=3 batch, I=6 inputs, H=4 hidden, 2 layers. The loss is
sum(y * gy) + sum(hn * ghn) + sum(cn * gcn) with random gy, ghn, gcn, so
d loss / d y = gy etc. are the gradients the C test feeds backward.
Tensors (float32):
  x (T,N,I), h0, c0 (2,N,H)           inputs (nonzero initial state)
  rnn.weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}
                                      PyTorch's parameters (gate order i,f,g,o)
  y (T,N,H), hn, cn (2,N,H)           outputs
  gy, ghn, gcn                        output gradients
  grad.x, grad.h0, grad.c0            input gradients
  grad.rnn.<parameter>                parameter gradients (both biases)
The file is read back and compared with what was computed.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

SEED = 12
T, N, I, H, L = 5, 3, 6, 4, 2


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', 'tests', 'golden')
    torch.manual_seed(SEED)
    rnn = nn.LSTM(I, H, L)
    # biases large enough that a swapped gate or a dropped bias shows
    with torch.no_grad():
        for name, p in rnn.named_parameters():
            p.uniform_(-0.6, 0.6)
    x = torch.randn(T, N, I, requires_grad=True)
    h0 = torch.randn(L, N, H, requires_grad=True)
    c0 = torch.randn(L, N, H, requires_grad=True)
    y, (hn, cn) = rnn(x, (h0, c0))
    gy, ghn, gcn = torch.randn(T, N, H), torch.randn(L, N, H), torch.randn(L, N, H)
    loss = (y * gy).sum() + (hn * ghn).sum() + (cn * gcn).sum()
    loss.backward()
    t = {'x': x, 'h0': h0, 'c0': c0, 'y': y, 'hn': hn, 'cn': cn, 'gy': gy, 'ghn': ghn, 'gcn': gcn,
         'grad.x': x.grad, 'grad.h0': h0.grad, 'grad.c0': c0.grad}
    for name, p in rnn.named_parameters():
        t['rnn.' + name] = p
        t['grad.rnn.' + name] = p.grad
    t = {k: v.detach().float().contiguous() for k, v in t.items()}
    path = os.path.join(out, 'lstm.safetensors')
    write_safetensors(path, t, {'generator': 'scripts/gen_golden_lstm.py', 'torch': torch.__version__,
                                'sizes': f'T={T} N={N} I={I} H={H} layers={L}'})
    back, _ = read_safetensors(path)
    for k, v in t.items():
        assert torch.equal(back[k], v), k
    print(f"wrote {path}: {len(t)} tensors")


if __name__ == '__main__':
    main()
