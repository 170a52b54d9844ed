"""Encoder-decoder Transformers (PyTorch 1.13) as users write them, for psd-export's decoder mapping
(tests/export/check_tdec.py trains each against PyTorch).

Seq2Seq: PyTorch's "Language translation with nn.Transformer" tutorial's Seq2SeqTransformer - source and
target token embeddings scaled by sqrt(E), a sinusoidal positional encoding buffer (with its dropout),
nn.Transformer(batch_first=True), a generator nn.Linear - reading one (N, S + T) id tensor split by slicing
(ids[:, :S] the source, ids[:, S:] the target) or, with inputs="two", forward(src, tgt) (psd-export's several
inputs, joined flat). Its logits (N, T, V) are returned flattened, (N, T*V), for a one-label loss. tgt_mask:
"buffer" (generate_square_subsequent_mask's float -inf mask, a non-persistent buffer), "triu" (a bool
torch.triu of ones made in forward from constant sizes), "none", or "other" (a mask that is not causal: refused).
padding: the tutorial's masks - src_mask all False (torch.zeros((S, S)).type(torch.bool)), src == pad_id as
src_key_padding_mask and memory_key_padding_mask, trg == pad_id as tgt_key_padding_mask.

Decoder: features (N, S + T, F), the first S rows a memory and the last T the target, each through its own
nn.Linear, then an nn.TransformerDecoder (num_layers, a final LayerNorm) with a causal tgt_mask buffer, then
nn.Linear of the flattened sequence: the input gradient reaches both parts through the cross-attention.

DecoderLayer: the same with one nn.TransformerDecoderLayer called directly (pre-norm by default, F.gelu).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "F.relu": F.relu, "F.gelu": F.gelu, "nn.GELU": nn.GELU(),
               "F.silu": F.silu}


class PositionalEncoding(nn.Module):
    """The tutorial's, batch first: a (1, maxlen, E) sinusoid table added to the embedded tokens."""

    def __init__(self, emb_size, dropout, maxlen=32):
        super().__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pe = torch.zeros((maxlen, emb_size))
        pe[:, 0::2] = torch.sin(pos * den)
        pe[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pos_embedding[:, :x.size(1)])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2Seq(nn.Module):
    def __init__(self, src_len=5, tgt_len=4, src_vocab=11, tgt_vocab=9, emb_size=8, nhead=2, num_encoder_layers=2,
                 num_decoder_layers=2, dim_feedforward=16, dropout=0.0, activation="relu", norm_first=False,
                 tgt_mask="buffer", inputs="slice", padding=False, pad_id=1):
        super().__init__()
        self.src_len, self.tgt_len, self.mask_mode, self.inputs = src_len, tgt_len, tgt_mask, inputs
        self.padding, self.pad_id = padding, pad_id
        self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                                          dropout=dropout, activation=ACTIVATIONS[activation], batch_first=True,
                                          norm_first=norm_first)
        self.generator = nn.Linear(emb_size, tgt_vocab)
        self.src_tok_emb = TokenEmbedding(src_vocab, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout)
        if tgt_mask == "buffer":
            self.register_buffer("tgt_mask", nn.Transformer.generate_square_subsequent_mask(tgt_len),
                                 persistent=False)
        elif tgt_mask == "other":
            self.register_buffer("tgt_mask", torch.triu(torch.ones(tgt_len, tgt_len, dtype=torch.bool), 2),
                                 persistent=False)

    def mask(self):
        if self.mask_mode in ("buffer", "other"):
            return self.tgt_mask
        if self.mask_mode == "triu":
            return torch.triu(torch.ones(self.tgt_len, self.tgt_len, dtype=torch.bool), diagonal=1)
        return None

    def translate(self, src, trg):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        if self.padding:   # the tutorial's create_mask: src_mask all False, the ids' padding (the source's also the
            src_mask = torch.zeros((self.src_len, self.src_len)).type(torch.bool)   # memory's)
            src_padding_mask, tgt_padding_mask = src == self.pad_id, trg == self.pad_id
            outs = self.transformer(src_emb, tgt_emb, src_mask=src_mask, tgt_mask=self.mask(),
                                    src_key_padding_mask=src_padding_mask,
                                    tgt_key_padding_mask=tgt_padding_mask,
                                    memory_key_padding_mask=src_padding_mask)
        else:
            outs = self.transformer(src_emb, tgt_emb, tgt_mask=self.mask())
        return self.generator(outs).flatten(1)

    def forward(self, ids, tgt=None):
        if self.inputs == "two":
            return self.translate(ids, tgt)
        return self.translate(ids[:, :self.src_len], ids[:, self.src_len:])


class Seq2SeqTwo(Seq2Seq):
    """Seq2Seq of forward(src, tgt): psd-export's several id inputs."""

    def __init__(self, **kw):
        super().__init__(inputs="two", **kw)

    def forward(self, src, tgt):
        return self.translate(src, tgt)


class Decoder(nn.Module):
    def __init__(self, src_len=5, tgt_len=4, features=3, d_model=8, nhead=2, dim_feedforward=12, num_layers=2,
                 classes=5, dropout=0.0, activation="gelu", norm_first=False, layer_norm_eps=1e-5, final_norm=True,
                 single=False):
        super().__init__()
        self.src_len = src_len
        self.mem_proj = nn.Linear(features, d_model)
        self.tgt_proj = nn.Linear(features, d_model)
        layer = nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                                           activation=ACTIVATIONS[activation], layer_norm_eps=layer_norm_eps,
                                           batch_first=True, norm_first=norm_first)
        self.decoder = layer if single else \
            nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d_model) if final_norm else None)
        self.head = nn.Linear(tgt_len * d_model, classes)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(tgt_len), persistent=False)

    def forward(self, x):
        memory = self.mem_proj(x[:, :self.src_len])
        tgt = self.tgt_proj(x[:, self.src_len:])
        return self.head(self.decoder(tgt, memory, tgt_mask=self.causal).flatten(1))


class DecoderLayer(Decoder):
    # F.gelu, not nn.GELU(): PyTorch 1.13's TransformerDecoderLayer.__setstate__ sets activation = F.relu when
    # its __dict__ has none, which a module activation (held in _modules) never is, so a deepcopy of a layer
    # built with nn.GELU() computes ReLU (the checks deep-copy their references)
    def __init__(self, activation="F.gelu", norm_first=True, **kw):
        super().__init__(activation=activation, norm_first=norm_first, single=True, **kw)


class PaddedDecoder(Decoder):
    """A memory_key_padding_mask given (refused)."""

    def forward(self, x):
        memory = self.mem_proj(x[:, :self.src_len])
        tgt = self.tgt_proj(x[:, self.src_len:])
        pad = x[:, :self.src_len, 0] == 0
        return self.head(self.decoder(tgt, memory, tgt_mask=self.causal, memory_key_padding_mask=pad).flatten(1))
