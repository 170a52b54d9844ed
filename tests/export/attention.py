"""A hand-written self-attention block in a small classifier: what
tests/export/check_attention.py exports with psd-export and with PyTorch's
ONNX exporter (training mode) and trains one step on psd against PyTorch.

SelfAttention is minGPT's CausalSelfAttention (karpathy/minGPT,
mingpt/model.py) without its causal mask and dropouts: one Linear to q, k
and v split three ways, heads split with view + transpose, q @ k^T scaled
by 1/sqrt(head size), softmax over the last dim, @ v, the heads merged back
with transpose(1, 2) + view, and the output projection."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)   # key, query, value projections for all heads, in a batch
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd
        self.head_size = n_embd // n_head

    def forward(self, x):
        B, T, C = x.size()   # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_size)
        att = F.softmax(att, dim=-1)
        y = att @ v          # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)   # re-assemble all head outputs side by side
        return self.c_proj(y)


class GPTConfig:
    """minGPT's config fields CausalSelfAttention reads."""

    def __init__(self, n_embd=16, n_head=4, block_size=8, attn_pdrop=0.0, resid_pdrop=0.0):
        self.n_embd, self.n_head, self.block_size = n_embd, n_head, block_size
        self.attn_pdrop, self.resid_pdrop = attn_pdrop, resid_pdrop


class CausalSelfAttention(nn.Module):
    """
    A vanilla multi-head masked self-attention layer with a projection at the end.
    It is possible to use torch.nn.MultiheadAttention here but I am including an
    explicit implementation here to show that there is nothing too scary here.

    (karpathy/minGPT, mingpt/model.py, as written there: the causal mask a
    buffer of the block size, sliced to the sequence length T in forward.)
    """

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                     .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size() # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k ,v  = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:,:,:T,:T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C) # re-assemble all head outputs side by side

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class CausalClassifier(nn.Module):
    """AttentionClassifier's block around minGPT's CausalSelfAttention as written upstream (its mask a
    tril buffer of block_size, sliced to the sequence length T: T < block_size at seq 6, block 8)."""

    def __init__(self, features=5, seq=6, n_embd=16, n_head=4, classes=10, block_size=8, attn_pdrop=0.0):
        super().__init__()
        self.embed = nn.Linear(features, n_embd)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(GPTConfig(n_embd, n_head, block_size, attn_pdrop))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(seq * n_embd, classes)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.attn(self.ln_1(x))
        x = self.ln_f(x)
        return self.head(x.flatten(1))


class AttentionClassifier(nn.Module):
    """(N, T, features) -> (N, classes): an embedding, one pre-norm transformer block (attention and an
    MLP, both residual), a final LayerNorm, and a Linear over the flattened sequence."""

    def __init__(self, features=5, seq=6, n_embd=16, n_head=4, classes=10):
        super().__init__()
        self.embed = nn.Linear(features, n_embd)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_act = nn.GELU()
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(seq * n_embd, classes)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp_proj(self.mlp_act(self.mlp_fc(self.ln_2(x))))
        x = self.ln_f(x)
        return self.head(x.flatten(1))


class MHABlock(nn.Module):
    """(N, T, features) -> (N, classes) around nn.MultiheadAttention (batch_first, self-attention,
    need_weights=False): an embedding, a pre-norm residual attention block as torchvision's vit encoder
    layer has it, a final LayerNorm, and a Linear over the flattened sequence. PyTorch's ONNX exporter
    writes the attention as some 40 ops (the batch moved to dim 1 and merged with the heads) that psd reads
    back as one MultiheadAttention node.

    mode "mask" calls it with a causal attn_mask, a float buffer (-inf above the diagonal) as
    nn.Transformer.generate_square_subsequent_mask writes it; "mask_bool" with a bool buffer torch.triu(ones, 1)
    (psd-export writes causal: true for these; generate_square_subsequent_mask(T) called in forward does not
    trace: torch.fx cannot pass a traced size to torch.full); "mask_other" with a bool mask that is not causal (tril(ones, -1) | the diagonal's neighbours),
    "padding" with a key_padding_mask computed from the input. mode selects what psd refuses too: "cross" (the
    key and value another tensor than the query), "weights" (need_weights=True, the averaged weights used)."""

    def __init__(self, features=5, seq=6, n_embd=16, n_head=4, classes=10, mode="plain", **mha):
        super().__init__()
        self.mode = mode
        self.embed = nn.Linear(features, n_embd)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True, **mha)
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(seq * n_embd, classes)
        if mode == "mask":
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))
        if mode == "mask_bool":
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))
        if mode == "mask_other":
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 2))

    def forward(self, x):
        x = self.embed(x)
        h = self.ln_1(x)
        if self.mode in ("mask", "mask_bool", "mask_other"):
            a = self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        elif self.mode == "padding":
            a = self.attn(h, h, h, key_padding_mask=x[:, :, 0] > 0, need_weights=False)[0]
        elif self.mode == "cross":
            a = self.attn(h, x, x, need_weights=False)[0]
        elif self.mode == "weights":
            a, w = self.attn(h, h, h, need_weights=True)
            a = a + w.sum(-1, keepdim=True)
        else:
            a = self.attn(h, h, h, need_weights=False)[0]
        x = self.ln_f(x + a)
        return self.head(x.flatten(1))


class PaddedMHA(nn.Module):
    """(N, S) int64 token ids -> (N, classes) around nn.MultiheadAttention with the key padding mask
    computed from the ids (ids == pad, pad id 0): an embedding, a pre-norm residual attention block, a final
    LayerNorm and a Linear over the flattened sequence - what NLP users write. mode: "eq" (ids == self.pad_id),
    "method" (ids.eq(pad)), "causal" (== beside a causal bool attn_mask buffer). Refused by psd-export: "ne"
    (ids != pad, the kept tokens), "pad_tensor" (the pad id computed from the input: ids == ids[:, -1:]),
    "short" (a mask one key short: PyTorch's own shape check), "embedded" (a mask computed from the
    embedding, not the ids)."""

    def __init__(self, vocab=11, seq=6, n_embd=8, n_head=2, classes=10, mode="eq", pad_id=0):
        super().__init__()
        self.mode, self.pad_id = mode, pad_id
        self.emb = nn.Embedding(vocab, n_embd)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(seq * n_embd, classes)
        if mode == "causal":
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, ids):
        x = self.emb(ids)
        h = self.ln_1(x)
        if self.mode == "method":
            pad = ids.eq(self.pad_id)
        elif self.mode == "ne":
            pad = ids != self.pad_id
        elif self.mode == "pad_tensor":
            pad = ids == ids[:, -1:]
        elif self.mode == "short":
            pad = ids[:, 1:] == self.pad_id
        elif self.mode == "embedded":
            pad = x[:, :, 0] == 0
        else:
            pad = ids == self.pad_id
        am = self.mask if self.mode == "causal" else None
        a = self.attn(h, h, h, key_padding_mask=pad, attn_mask=am, need_weights=False)[0]
        x = self.ln_f(x + a)
        return self.head(x.flatten(1))


class ParamLinear(nn.Module):
    """A custom layer as users write it: x @ self.W + self.b with raw parameters (W (in, out), not
    nn.Linear's (out, in))."""

    def __init__(self, i, o):
        super().__init__()
        self.W = nn.Parameter(torch.randn(i, o) / math.sqrt(i))
        self.b = nn.Parameter(torch.randn(o) * 0.1)

    def forward(self, x):
        return x @ self.W + self.b


class ParamAttention(nn.Module):
    """(N, 6, 5) -> (N, 10): attention written by hand with raw parameters and broadcast matmuls: a custom
    ParamLinear in, per-head query weights (H, E, d) read by x (N, 1, T, E) @ W_q (broadcast both ways), one
    key and value head shared by the heads (multi-query: k and v (N, 1, T, d) broadcast over the heads in
    q @ k.transpose(-2, -1) and att @ v), torch.matmul and the output projection x @ W_o.t() (transposed in
    place), then a ParamLinear over the flattened sequence (a vector per sample times W)."""

    def __init__(self, features=5, seq=6, n_embd=8, n_head=2, classes=10):
        super().__init__()
        d = n_embd // n_head
        self.n_head = n_head
        self.inp = ParamLinear(features, n_embd)
        self.W_q = nn.Parameter(torch.randn(n_head, n_embd, d) / math.sqrt(n_embd))
        self.W_k = nn.Parameter(torch.randn(n_embd, d) / math.sqrt(n_embd))
        self.W_v = nn.Parameter(torch.randn(n_embd, d) / math.sqrt(n_embd))
        self.W_o = nn.Parameter(torch.randn(n_embd, n_head * d) / math.sqrt(n_embd))
        self.head = ParamLinear(seq * n_embd, classes)

    def forward(self, x):
        h = torch.tanh(self.inp(x))                         # (N, T, E)
        n, t, e = h.shape
        h4 = h.reshape(n, 1, t, e)
        q = h4 @ self.W_q                                   # (N, 1, T, E) @ (H, E, d) -> (N, H, T, d)
        k = torch.matmul(h4, self.W_k)                      # (N, 1, T, d)
        v = h4.matmul(self.W_v)                             # (N, 1, T, d)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1)   # (N, H, T, T)
        y = (att @ v).transpose(1, 2).reshape(n, t, e)      # (N, T, E)
        y = y @ self.W_o.t()                                # x @ W_o.t(): transpose_b, no copy
        return self.head(y.flatten(1))
