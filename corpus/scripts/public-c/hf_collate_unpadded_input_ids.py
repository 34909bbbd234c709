"""A Hugging Face-style fine-tuning loop (run_glue_no_trainer.py's shape) with its own data collator, on a toy
tokenizer and random sentences.

The bug: the tokenizer was called with `padding=False` (the script's `--pad_to_max_length` was off) and the
hand-written `collate_fn` builds the batch with `torch.tensor(...)` straight from the lists of token ids, which
have different lengths. Pad in the collator (`DataCollatorWithPadding`, or pad each list to the longest in the
batch) or tokenize with `padding="max_length"`.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

VOCAB = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2}


def tokenize(text, padding=False, max_length=32):
    ids = [1] + [VOCAB.setdefault(word, len(VOCAB)) for word in text.split()][: max_length - 2] + [2]
    if padding == "max_length":
        ids = ids + [0] * (max_length - len(ids))
    return {"input_ids": ids, "attention_mask": [int(i != 0) for i in ids]}


def preprocess_function(examples, padding):
    result = [tokenize(text, padding=padding) for text in examples["sentence"]]
    for r, label in zip(result, examples["label"]):
        r["labels"] = label
    return result


def collate_fn(features):
    batch = {k: torch.tensor([f[k] for f in features]) for k in ("input_ids", "attention_mask")}
    batch["labels"] = torch.tensor([f["labels"] for f in features])
    return batch


class SequenceClassifier(nn.Module):
    def __init__(self, vocab_size=1000, hidden=32, num_labels=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embeddings(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.classifier(pooled)
        return nn.functional.cross_entropy(logits, labels), logits


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    words = ["the", "movie", "was", "great", "boring", "plot", "actors", "not", "really", "fine"]
    raw = {"sentence": [" ".join(words[int(j)] for j in torch.randint(0, 10, (int(n),), generator=g))
                        for n in torch.randint(4, 14, (32,), generator=g)],
           "label": torch.randint(0, 2, (32,), generator=g).tolist()}
    train_dataset = preprocess_function(raw, padding=False)
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=collate_fn, batch_size=8)
    model = SequenceClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    for step, batch in enumerate(train_dataloader):
        loss, _ = model(**batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
