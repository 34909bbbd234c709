"""The PyTorch tutorial "Text classification with the torchtext library" (AG_NEWS, EmbeddingBag).

The bug: AG_NEWS labels are 1..4 (World, Sports, Business, Sci/Tec) and num_class is 4, but
label_pipeline passes int(x) through, where the tutorial has int(x) - 1. A Sci/Tec headline
(label 4) is out of range for the 4-way classifier.
"""

import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

device = torch.device("cpu")
WORDS = ("match goal team season stocks shares market profit rocket space nasa chip election war "
         "minister talks league coach bank oil software internet").split()


def AG_NEWS(split="train", n=240):
    """Stands in for torchtext.datasets.AG_NEWS: (label, text) pairs with labels 1..4, as the CSV holds them."""
    rng = random.Random(0 if split == "train" else 1)
    return [(rng.randint(1, 4), " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))) for _ in range(n)]


def tokenizer(line):
    return line.lower().split()


train_iter = AG_NEWS(split="train")
vocab = {"<unk>": 0}
for _, text in train_iter:
    for token in tokenizer(text):
        vocab.setdefault(token, len(vocab))

text_pipeline = lambda x: [vocab.get(token, 0) for token in tokenizer(x)]
label_pipeline = lambda x: int(x)


def collate_batch(batch):
    label_list, text_list, offsets = [], [], [0]
    for _label, _text in batch:
        label_list.append(label_pipeline(_label))
        processed_text = torch.tensor(text_pipeline(_text), dtype=torch.int64)
        text_list.append(processed_text)
        offsets.append(processed_text.size(0))
    label_list = torch.tensor(label_list, dtype=torch.int64)
    offsets = torch.tensor(offsets[:-1]).cumsum(dim=0)
    text_list = torch.cat(text_list)
    return label_list.to(device), text_list.to(device), offsets.to(device)


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super(TextClassificationModel, self).__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self):
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets):
        embedded = self.embedding(text, offsets)
        return self.fc(embedded)


num_class = len(set([label for (label, text) in train_iter]))
vocab_size = len(vocab)
emsize = 64
model = TextClassificationModel(vocab_size, emsize, num_class).to(device)


def train(dataloader):
    model.train()
    total_acc, total_count = 0, 0
    log_interval = 5
    start_time = time.time()
    for idx, (label, text, offsets) in enumerate(dataloader):
        optimizer.zero_grad()
        predicted_label = model(text, offsets)
        loss = criterion(predicted_label, label)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        total_acc += (predicted_label.argmax(1) == label).sum().item()
        total_count += label.size(0)
        if idx % log_interval == 0 and idx > 0:
            print(f"| {idx:5d}/{len(dataloader):5d} batches | accuracy {total_acc / total_count:8.3f}"
                  f" | {time.time() - start_time:.2f}s")
            total_acc, total_count = 0, 0


EPOCHS = 2
LR = 5
BATCH_SIZE = 16
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)
train_dataloader = DataLoader(train_iter, batch_size=BATCH_SIZE, shuffle=True, collate_fn=collate_batch)

for epoch in range(1, EPOCHS + 1):
    train(train_dataloader)
    scheduler.step()
