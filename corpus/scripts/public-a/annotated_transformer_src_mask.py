"""The Annotated Transformer (harvardnlp), encoder side, trained on its synthetic copy task.

The bug: Batch builds the padding mask as (src != pad), a [batch, seq] tensor, where the
original has (src != pad).unsqueeze(-2), [batch, 1, seq]. MultiHeadedAttention adds the head
dimension with mask.unsqueeze(1), so [batch, 1, seq] would broadcast over heads and queries;
[batch, seq] becomes [batch, 1, seq] and lines its batch up against the 8 heads of the
[batch, 8, seq, seq] scores.
"""

import copy
import math

import torch
import torch.nn as nn


def clones(module, N):
    "Produce N identical layers."
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.Module):
    "Construct a layernorm module (See citation for details)."

    def __init__(self, features, eps=1e-6):
        super(LayerNorm, self).__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super(SublayerConnection, self).__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        "Apply residual connection to any sublayer with the same size."
        return x + self.dropout(sublayer(self.norm(x)))


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        "Take in model size and number of heads."
        super(MultiHeadedAttention, self).__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            # Same mask applied to all h heads.
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value))
        ]
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super(PositionwiseFeedForward, self).__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class EncoderLayer(nn.Module):
    "Encoder is made up of self-attn and feed forward (defined below)"

    def __init__(self, size, self_attn, feed_forward, dropout):
        super(EncoderLayer, self).__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)
        self.size = size

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    "Core encoder is a stack of N layers"

    def __init__(self, layer, N):
        super(Encoder, self).__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super(Embeddings, self).__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class CopyTagger(nn.Module):
    "The encoder half of EncoderDecoder with a per-token Generator: predicts each source token."

    def __init__(self, vocab, N=2, d_model=64, d_ff=128, h=8, dropout=0.1):
        super(CopyTagger, self).__init__()
        c = copy.deepcopy
        attn = MultiHeadedAttention(h, d_model)
        ff = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.src_embed = Embeddings(d_model, vocab)
        self.encoder = Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N)
        self.generator = nn.Linear(d_model, vocab)

    def forward(self, src, src_mask):
        return self.generator(self.encoder(self.src_embed(src), src_mask)).log_softmax(dim=-1)


class Batch:
    """Object for holding a batch of data with mask during training."""

    def __init__(self, src, pad=2):
        self.src = src
        self.src_mask = (src != pad)
        self.ntokens = (src != pad).sum()


def data_gen(V, batch_size, nbatches):
    "Generate random data for a src-tgt copy task."
    for i in range(nbatches):
        data = torch.randint(3, V, size=(batch_size, 10))
        data[:, 0] = 1
        data[:, 7:] = 2  # padded tail
        yield Batch(data.clone().detach(), 2)


def run_epoch(data_iter, model, criterion, optimizer):
    for i, batch in enumerate(data_iter):
        out = model.forward(batch.src, batch.src_mask)
        loss = criterion(out.reshape(-1, out.size(-1)), batch.src.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"Epoch Step: {i:6d} | Loss: {loss.item():6.2f}")


torch.manual_seed(0)
V = 11
model = CopyTagger(V)
criterion = nn.NLLLoss(ignore_index=2)
optimizer = torch.optim.Adam(model.parameters(), lr=0.5e-3, betas=(0.9, 0.98), eps=1e-9)
for epoch in range(2):
    model.train()
    run_epoch(data_gen(V, batch_size=4, nbatches=5), model, criterion, optimizer)
