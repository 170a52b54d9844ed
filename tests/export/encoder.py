"""Small models around nn.TransformerEncoder and nn.TransformerEncoderLayer (PyTorch 1.13) as users write
them, for psd-export's encoder mapping (tests/export/check_encoder.py trains each one step against
PyTorch).

TextClassifier: token ids (N, T) -> nn.Embedding -> nn.TransformerEncoder (num_layers, an optional final
LayerNorm, an optional causal mask buffer) -> the mean over the tokens -> nn.Linear. With batch_first=False
the encoder reads (T, N, E): forward transposes the embedded tokens to it and takes the mean over dim 0, as
code written for the sequence-first layout does.

LayerClassifier: features (N, T, F) -> nn.Linear -> one nn.TransformerEncoderLayer called directly -> the
flattened sequence -> nn.Linear.

mode selects the masks: "causal" (a float -inf buffer as generate_square_subsequent_mask writes it),
"causal_bool" (a bool triu(ones, 1) buffer), "other" (a bool mask that is not causal: refused), "padding"
(src_key_padding_mask = ids == 0, the token ids' padding), "causal_padding" (both), "return_seq" (the
encoder's output returned as it is: with batch_first=False a (T, N, E) tensor, refused).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "F.relu": F.relu, "F.gelu": F.gelu, "nn.GELU": nn.GELU(),
               "F.silu": F.silu}


def _mask(mode, seq):
    if mode in ("causal", "causal_padding"):
        return torch.triu(torch.full((seq, seq), float("-inf")), 1)
    if mode == "causal_bool":
        return torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    if mode == "other":
        return torch.triu(torch.ones(seq, seq, dtype=torch.bool), 2)
    return None


class TextClassifier(nn.Module):
    def __init__(self, vocab=20, seq=6, d_model=16, nhead=4, dim_feedforward=24, num_layers=2, classes=5,
                 dropout=0.0, activation="relu", layer_norm_eps=1e-5, batch_first=True, norm_first=False,
                 final_norm=False, mode="plain"):
        super().__init__()
        self.batch_first, self.mode = batch_first, mode
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                                           activation=ACTIVATIONS[activation], layer_norm_eps=layer_norm_eps,
                                           batch_first=batch_first, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers,
                                             norm=nn.LayerNorm(d_model, eps=layer_norm_eps) if final_norm else None)
        self.head = nn.Linear(d_model, classes)
        mask = _mask(mode, seq)
        if mask is not None:
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids):
        x = self.embed(ids)
        if not self.batch_first:
            x = x.transpose(0, 1)                   # (T, N, E)
        if self.mode == "padding":
            x = self.encoder(x, src_key_padding_mask=ids == 0)
        elif self.mode == "causal_padding":
            x = self.encoder(x, mask=self.mask, src_key_padding_mask=ids == 0)
        elif hasattr(self, "mask"):
            x = self.encoder(x, mask=self.mask)
        else:
            x = self.encoder(x)
        if self.mode == "return_seq":
            return x                                # the encoder's output as it is
        x = x.mean(dim=1 if self.batch_first else 0)
        return self.head(x)


class LayerClassifier(nn.Module):
    def __init__(self, features=5, seq=6, d_model=12, nhead=3, dim_feedforward=20, classes=5, dropout=0.0,
                 activation="gelu", layer_norm_eps=1e-6, batch_first=True, norm_first=True, mode="plain"):
        super().__init__()
        self.mode = mode
        self.embed = nn.Linear(features, d_model)
        self.layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                                                activation=ACTIVATIONS[activation], layer_norm_eps=layer_norm_eps,
                                                batch_first=batch_first, norm_first=norm_first)
        self.head = nn.Linear(seq * d_model, classes)
        mask = _mask(mode, seq)
        if mask is not None:
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        x = self.embed(x)
        x = self.layer(x, src_mask=self.mask) if hasattr(self, "mask") else self.layer(x)
        return self.head(x.flatten(1))
