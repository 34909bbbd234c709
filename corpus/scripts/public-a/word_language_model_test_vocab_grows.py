"""pytorch/examples word_language_model (data.py, model.py, main.py), with the test split read late.

The bug: Corpus tokenizes train and valid, the model is built with ntokens =
len(corpus.dictionary), and the test split is tokenized only for the final evaluation.
tokenize() adds the test split's unseen words to the dictionary, so their ids are past the
encoder's num_embeddings. Tokenize every split before building the model (or map unseen words
to <unk>), or resize the embedding to len(corpus.dictionary).
"""

import io
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

random.seed(0)
COMMON = "the of and to in a is that for it as was with be by on not he this are or his from".split()
RARE = "zephyr quokka nebula fjord gossamer halcyon".split()
FILES = {  # stand-ins for wikitext-2's train.txt / valid.txt / test.txt
    "train.txt": "\n".join(" ".join(random.choices(COMMON, k=12)) for _ in range(300)),
    "valid.txt": "\n".join(" ".join(random.choices(COMMON, k=12)) for _ in range(40)),
    "test.txt": "\n".join(" ".join(random.choices(COMMON + RARE, k=12)) for _ in range(40)),
}


class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(path + 'train.txt')
        self.valid = self.tokenize(path + 'valid.txt')

    def tokenize(self, path):
        """Tokenizes a text file."""
        # Add words to the dictionary
        with io.StringIO(FILES[path.rsplit('/', 1)[-1]]) as f:
            for line in f:
                words = line.split() + ['<eos>']
                for word in words:
                    self.dictionary.add_word(word)

        # Tokenize file content
        with io.StringIO(FILES[path.rsplit('/', 1)[-1]]) as f:
            idss = []
            for line in f:
                words = line.split() + ['<eos>']
                ids = []
                for word in words:
                    ids.append(self.dictionary.word2idx[word])
                idss.append(torch.tensor(ids).type(torch.int64))
            ids = torch.cat(idss)

        return ids


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt=35):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


torch.manual_seed(1111)
corpus = Corpus('./data/wikitext-2/')
eval_batch_size = 10
train_data = batchify(corpus.train, 20)
val_data = batchify(corpus.valid, eval_batch_size)

ntokens = len(corpus.dictionary)
model = RNNModel('LSTM', ntokens, 32, 32, 2, 0.2)
criterion = nn.NLLLoss()
lr = 20


def evaluate(data_source):
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, 35):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train():
    model.train()
    hidden = model.init_hidden(20)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, 35)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)


train()
val_loss = evaluate(val_data)
print('| end of epoch | valid loss {:5.2f} | valid ppl {:8.2f}'.format(val_loss, math.exp(val_loss)))

# Run on test data.
test_data = batchify(corpus.tokenize('./data/wikitext-2/test.txt'), eval_batch_size)
test_loss = evaluate(test_data)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(test_loss, math.exp(test_loss)))
