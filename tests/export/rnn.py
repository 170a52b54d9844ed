"""Small sequence models around nn.LSTM and nn.GRU (PyTorch 1.13) as users write them, for psd-export's
recurrent layers (tests/export/check_rnn.py trains each against PyTorch).

TextRNN: token ids (N, T) -> nn.Embedding -> nn.LSTM or nn.GRU (batch_first=True) -> the last step -> nn.Linear.
read selects how the last step is read: "out" (out, _ = rnn(x); out[:, -1]), "out3" (out[:, -1, :]), "h"
(out, (h, c) = lstm(x) / out, h = gru(x); h[-1]), "h_n" (_, (h_n, _) = lstm(x); h_n[-1]), and for the
refusals "c" (an LSTM's c_n[-1]), "h0" (h[0] of a 2-layer RNN: not the last layer), "hx" (an initial state: zeros; "hx1" ones).
Bidirectional ones also "cat" (torch.cat((h_n[-2], h_n[-1]), dim=1): the last layer's two directions) and
"slice" (h = h_n[-2:]; torch.cat((h[0], h[1]), 1)); read "h" of a bidirectional one is its reverse direction's
final state (h[-1]) alone, and "out" both directions at the last step.

SeqRNN: features (N, T, F) -> nn.LSTM / nn.GRU -> nn.Linear on every step (the whole output sequence).
"""
import torch
import torch.nn as nn


class TextRNN(nn.Module):
    def __init__(self, vocab=20, embed=8, hidden=12, num_layers=1, classes=5, cell="LSTM", read="out",
                 bias=True, dropout=0.0, batch_first=True, bidirectional=False):
        super().__init__()
        self.read, self.cell = read, cell
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = getattr(nn, cell)(embed, hidden, num_layers=num_layers, bias=bias, batch_first=batch_first,
                                     dropout=dropout, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional and read not in ("h", "h_n", "h0") else 1), classes)

    def forward(self, ids):
        x = self.embed(ids)
        if self.read == "out":
            out, _ = self.rnn(x)
            last = out[:, -1]
        elif self.read == "out3":
            out, _ = self.rnn(x)
            last = out[:, -1, :]
        elif self.read == "h" and self.cell == "LSTM":
            out, (h, c) = self.rnn(x)
            last = h[-1]
        elif self.read == "h":
            out, h = self.rnn(x)
            last = h[-1]
        elif self.read == "h_n":
            _, (h_n, _) = self.rnn(x)
            last = h_n[-1]
        elif self.read == "c":
            _, (h, c) = self.rnn(x)
            last = c[-1]
        elif self.read in ("cat", "slice"):
            _, h_n = self.rnn(x)
            if self.cell == "LSTM":
                h_n = h_n[0]
            if self.read == "cat":
                last = torch.cat((h_n[-2], h_n[-1]), dim=1)
            else:
                h = h_n[-2:]
                last = torch.cat((h[0], h[1]), 1)
        elif self.read == "h0":
            _, h = self.rnn(x)
            last = (h[0] if self.cell == "GRU" else h[0][0])
        elif self.read in ("hx", "hx1"):   # zeros; hx1: ones
            h0 = x.new_full((self.rnn.num_layers, x.shape[0], self.rnn.hidden_size), float(self.read == "hx1"))
            out, _ = self.rnn(x, h0 if self.cell == "GRU" else (h0, h0))
            last = out[:, -1]
        else:
            raise ValueError(self.read)
        return self.head(last)


class SeqRNN(nn.Module):
    def __init__(self, features=5, hidden=6, num_layers=2, classes=4, cell="GRU", bidirectional=False):
        super().__init__()
        self.rnn = getattr(nn, cell)(features, hidden, num_layers=num_layers, batch_first=True,
                                     bidirectional=bidirectional)
        self.head = nn.Linear(6 * hidden * (2 if bidirectional else 1), classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out.flatten(1))
