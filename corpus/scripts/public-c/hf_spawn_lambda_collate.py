"""A Hugging Face-style fine-tuning loop (run_glue_no_trainer.py's shape) run on macOS, where multiprocessing
starts workers with spawn; the collator is a lambda that binds the tokenizer's pad id.

The bug: with `num_workers=2` and the spawn start method the DataLoader pickles its collate_fn to send it to
each worker, and a lambda (here `main.<locals>.<lambda>`) cannot be pickled. Use a module-level function
(`functools.partial(pad_collate, pad_token_id=...)`) or a collator object such as DataCollatorWithPadding.
"""

import multiprocessing

import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class ToyTokenizer:
    pad_token_id = 0

    def __init__(self):
        self.vocab = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2}

    def __call__(self, text, truncation=True, max_length=32):
        ids = [1] + [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()][: max_length - 2] + [2]
        return {"input_ids": ids}


def pad_collate(features, pad_token_id):
    longest = max(len(f["input_ids"]) for f in features)
    input_ids = torch.tensor([f["input_ids"] + [pad_token_id] * (longest - len(f["input_ids"])) for f in features])
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_token_id).long(),
            "labels": torch.tensor([f["labels"] for f in features])}


class SequenceClassifier(nn.Module):
    def __init__(self, vocab_size=1000, hidden=32, num_labels=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        logits = self.classifier((self.embeddings(input_ids) * mask).sum(1) / mask.sum(1))
        return nn.functional.cross_entropy(logits, labels), logits


def main():
    multiprocessing.set_start_method("spawn")  # the default on macOS and Windows
    tokenizer = ToyTokenizer()
    g = torch.Generator().manual_seed(0)
    words = ["the", "movie", "was", "great", "boring", "plot", "actors", "not", "really", "fine"]
    train_dataset = []
    for n, label in zip(torch.randint(4, 14, (32,), generator=g).tolist(), torch.randint(0, 2, (32,), generator=g).tolist()):
        features = tokenizer(" ".join(words[j] for j in torch.randint(0, 10, (n,), generator=g).tolist()))
        features["labels"] = label
        train_dataset.append(features)

    train_dataloader = DataLoader(
        train_dataset, shuffle=True, batch_size=8, num_workers=2,
        collate_fn=lambda features: pad_collate(features, pad_token_id=tokenizer.pad_token_id),
    )
    model = SequenceClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for step, batch in enumerate(train_dataloader):
        loss, _ = model(**batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
