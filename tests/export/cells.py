"""Recurrent cells called in a Python loop (nn.LSTMCell / nn.GRUCell, as PyTorch's
time_sequence_prediction example and seq2seq decoders write them), for tests/it_cells.sh:

  LSTMLoop     an nn.LSTMCell over the 5 steps of (N, 5, 6) from x.new_zeros states, the last h into a Linear
  GRULoop      an nn.GRUCell whose first call has no state (cell(x_t): zeros), then cell(x_t, h); the last h
               into a Linear
  StackedCells time_sequence_prediction's two nn.LSTMCell stacked (the second reads the first's h), states from
               x.new_zeros and torch.zeros_like of one; each step's second h through one Linear (shared too),
               the outputs torch.stack(outs, 1), flattened into a Linear
  MixedCells   an nn.GRUCell from h = None feeding an nn.LSTMCell(bias=False) from state = None, its (h, c)
               passed on whole (state = self.lstm(h, state)), the last h + c into the head
  Decoder      a seq2seq decoder: a GRUCell from an encoder's state (a computed h at the first call), each
               step's output (a shared Linear) the next step's input, the outputs stacked into a head
  HalfZeros    refused: an LSTMCell's h zeros, c computed

torch.fx unrolls each loop: one call of the cell per step, the same module; psd-export writes a node per call,
the later ones sharing the first's parameters (share:).
"""
import torch
import torch.nn as nn

STEPS, FEATURES, CLASSES = 5, 6, 4


class LSTMLoop(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(FEATURES, hidden)
        self.fc = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        h = x.new_zeros(x.size(0), self.hidden)
        c = x.new_zeros(x.size(0), self.hidden)
        for t in range(STEPS):
            h, c = self.cell(x[:, t], (h, c))
        return self.fc(h)


class GRULoop(nn.Module):
    def __init__(self, hidden=12):
        super().__init__()
        self.cell = nn.GRUCell(FEATURES, hidden)
        self.fc = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        h = self.cell(x[:, 0])
        for t in range(1, STEPS):
            h = self.cell(x[:, t], h)
        return self.fc(h)


class StackedCells(nn.Module):
    """time_sequence_prediction's Sequence: two LSTMCells, a Linear per step, the outputs stacked."""
    def __init__(self, hidden=10):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(FEATURES, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 2)
        self.head = nn.Linear(2 * STEPS, CLASSES)

    def forward(self, x):
        h1 = x.new_zeros(x.size(0), self.hidden)
        c1 = torch.zeros_like(h1)
        h2 = torch.zeros_like(h1)
        c2 = x.new_zeros((x.size(0), self.hidden))
        outs = []
        for t in range(STEPS):
            h1, c1 = self.lstm1(x[:, t], (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outs.append(self.linear(h2))
        return self.head(torch.stack(outs, 1).flatten(1))


class MixedCells(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.gru = nn.GRUCell(FEATURES, hidden)
        self.lstm = nn.LSTMCell(hidden, hidden, bias=False)
        self.fc = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        h = None
        state = None
        for t in range(STEPS):
            h = self.gru(x[:, t], h)
            state = self.lstm(h, state)
        return self.fc(state[0] + state[1])


class HalfZeros(nn.Module):
    """Refused: an LSTMCell whose h is zeros and c computed (psd's cell starts from zeros for both or takes both)."""
    def __init__(self, hidden=4):
        super().__init__()
        self.cell = nn.LSTMCell(FEATURES, hidden)
        self.c0 = nn.Linear(FEATURES, hidden)
        self.fc = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        h = x.new_zeros(x.size(0), 4)
        h, c = self.cell(x[:, 0], (h, self.c0(x[:, 0])))
        return self.fc(h)



class Decoder(nn.Module):
    """A seq2seq decoder: the state from an encoder (a computed initial h), each step's output (a Linear, shared)
    the next step's input, the outputs stacked into the head."""
    def __init__(self, hidden=10):
        super().__init__()
        self.enc = nn.Linear(STEPS * FEATURES, hidden)
        self.cell = nn.GRUCell(FEATURES, hidden)
        self.out = nn.Linear(hidden, FEATURES)
        self.head = nn.Linear(STEPS * FEATURES, CLASSES)

    def forward(self, x):
        h = torch.tanh(self.enc(x.flatten(1)))
        y = x[:, 0]
        outs = []
        for _ in range(STEPS):
            h = self.cell(y, h)
            y = self.out(h)
            outs.append(y)
        return self.head(torch.stack(outs, 1).flatten(1))
