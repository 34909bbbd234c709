"""Seq2seq chatbot training step, cut from the PyTorch chatbot tutorial
(beginner_source/chatbot_tutorial.py): EncoderRNN, LuongAttnDecoderRNN with 'dot' attention,
maskNLLLoss, teacher forcing; random padded batches instead of the Cornell corpus, CPU.

The bug: the encoder is wrapped in torch.compile(encoder, fullgraph=True) for speed, but
EncoderRNN.forward() calls nn.utils.rnn.pack_padded_sequence, a function Dynamo is told
to skip; with fullgraph=True that graph break is an error on the first batch. Compile
without fullgraph=True (the packing then runs eagerly), or compile only the decoder.
"""

import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

device = torch.device("cpu")
PAD_token, SOS_token, EOS_token = 0, 1, 2
MAX_LENGTH = 10


class EncoderRNN(nn.Module):
    def __init__(self, hidden_size, embedding, n_layers=1, dropout=0):
        super(EncoderRNN, self).__init__()
        self.n_layers = n_layers
        self.hidden_size = hidden_size
        self.embedding = embedding
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers,
                          dropout=(0 if n_layers == 1 else dropout), bidirectional=True)

    def forward(self, input_seq, input_lengths, hidden=None):
        embedded = self.embedding(input_seq)
        packed = nn.utils.rnn.pack_padded_sequence(embedded, input_lengths)
        outputs, hidden = self.gru(packed, hidden)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs)
        outputs = outputs[:, :, :self.hidden_size] + outputs[:, :, self.hidden_size:]
        return outputs, hidden


class LuongAttnDecoderRNN(nn.Module):
    def __init__(self, embedding, hidden_size, output_size, n_layers=1, dropout=0.1):
        super(LuongAttnDecoderRNN, self).__init__()
        self.hidden_size = hidden_size
        self.n_layers = n_layers
        self.embedding = embedding
        self.embedding_dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers, dropout=(0 if n_layers == 1 else dropout))
        self.concat = nn.Linear(hidden_size * 2, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)

    def forward(self, input_step, last_hidden, encoder_outputs):
        embedded = self.embedding_dropout(self.embedding(input_step))
        rnn_output, hidden = self.gru(embedded, last_hidden)
        attn_weights = F.softmax(torch.sum(rnn_output * encoder_outputs, dim=2).t(), dim=1).unsqueeze(1)
        context = attn_weights.bmm(encoder_outputs.transpose(0, 1))
        concat_input = torch.cat((rnn_output.squeeze(0), context.squeeze(1)), 1)
        concat_output = torch.tanh(self.concat(concat_input))
        output = F.softmax(self.out(concat_output), dim=1)
        return output, hidden


def maskNLLLoss(inp, target, mask):
    nTotal = mask.sum()
    crossEntropy = -torch.log(torch.gather(inp, 1, target.view(-1, 1)).squeeze(1))
    loss = crossEntropy.masked_select(mask).mean()
    return loss, nTotal.item()


def random_batch(num_words, batch_size):
    """Stands in for batch2TrainData(voc, pairs): padded (max_len, batch) tensors, lengths sorted descending."""
    lengths = sorted((random.randint(3, MAX_LENGTH) for _ in range(batch_size)), reverse=True)
    inp = torch.full((MAX_LENGTH, batch_size), PAD_token, dtype=torch.long)
    for b, n in enumerate(lengths):
        inp[:n, b] = torch.randint(3, num_words, (n,))
        inp[n - 1, b] = EOS_token
    target = torch.randint(3, num_words, (MAX_LENGTH, batch_size))
    mask = torch.ones(MAX_LENGTH, batch_size, dtype=torch.bool)
    return inp, torch.tensor(lengths), target, mask, MAX_LENGTH


def train(input_variable, lengths, target_variable, mask, max_target_len, encoder, decoder,
          encoder_optimizer, decoder_optimizer, batch_size, clip):
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    loss = 0
    print_losses = []
    n_totals = 0

    encoder_outputs, encoder_hidden = encoder(input_variable, lengths)
    decoder_input = torch.LongTensor([[SOS_token for _ in range(batch_size)]])
    decoder_hidden = encoder_hidden[:decoder.n_layers]
    for t in range(max_target_len):
        decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden, encoder_outputs)
        decoder_input = target_variable[t].view(1, -1)  # teacher forcing
        mask_loss, nTotal = maskNLLLoss(decoder_output, target_variable[t], mask[t])
        loss += mask_loss
        print_losses.append(mask_loss.item() * nTotal)
        n_totals += nTotal

    loss.backward()
    _ = nn.utils.clip_grad_norm_(encoder.parameters(), clip)
    _ = nn.utils.clip_grad_norm_(decoder.parameters(), clip)
    encoder_optimizer.step()
    decoder_optimizer.step()
    return sum(print_losses) / n_totals


def main():
    random.seed(0)
    torch.manual_seed(0)
    num_words, hidden_size, batch_size, clip = 50, 32, 8, 50.0
    embedding = nn.Embedding(num_words, hidden_size)
    encoder = EncoderRNN(hidden_size, embedding, n_layers=2, dropout=0.1)
    decoder = LuongAttnDecoderRNN(embedding, hidden_size, num_words, n_layers=2, dropout=0.1)
    encoder_optimizer = optim.Adam(encoder.parameters(), lr=1e-4)
    decoder_optimizer = optim.Adam(decoder.parameters(), lr=5e-4)
    encoder = torch.compile(encoder, fullgraph=True)
    encoder.train()
    decoder.train()
    for iteration in range(1, 6):
        input_variable, lengths, target_variable, mask, max_target_len = random_batch(num_words, batch_size)
        loss = train(input_variable, lengths, target_variable, mask, max_target_len, encoder, decoder,
                     encoder_optimizer, decoder_optimizer, batch_size, clip)
        print("Iteration: {}; Average loss: {:.4f}".format(iteration, loss))


if __name__ == "__main__":
    main()
