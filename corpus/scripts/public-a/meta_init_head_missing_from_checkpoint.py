"""The PyTorch recipe "Tips for Loading an nn.Module from a Checkpoint" (meta device + assign=True),
applied to fine-tuning: the pretrained checkpoint holds the backbone, the new model adds a head.

The bug: the model is built under torch.device('meta') and filled with
load_state_dict(state_dict, assign=True, strict=False). strict=False lets the missing
head.weight / head.bias through, and they stay meta tensors without data, so the first forward
meets a meta weight. Materialise what the checkpoint lacks: model.head.to_empty(device='cpu')
then model.head.reset_parameters() (or build the head after loading, outside the meta context).
"""

import io

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SomeModule(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.linears = torch.nn.ModuleList([torch.nn.Linear(size, size) for i in range(4)])

    def forward(self, x):
        for linear in self.linears:
            x = torch.relu(linear(x))
        return x


class Classifier(SomeModule):
    """The pretrained SomeModule plus a fresh classification head."""

    def __init__(self, size, num_classes):
        super().__init__(size)
        self.head = nn.Linear(size, num_classes)

    def forward(self, x):
        return self.head(super().forward(x))


# The pretrained backbone's checkpoint (torch.save / torch.load through memory instead of checkpoint.pth).
buffer = io.BytesIO()
torch.save(SomeModule(256).state_dict(), buffer)
buffer.seek(0)
state_dict = torch.load(buffer, mmap=False, weights_only=True)

with torch.device('meta'):
    meta_m = Classifier(256, num_classes=5)
result = meta_m.load_state_dict(state_dict, assign=True, strict=False)
print("missing keys:", result.missing_keys)

loader = DataLoader(TensorDataset(torch.randn(64, 256), torch.randint(0, 5, (64,))), batch_size=16)
optimizer = torch.optim.AdamW(meta_m.parameters(), lr=1e-4)
criterion = nn.CrossEntropyLoss()
for features, labels in loader:
    loss = criterion(meta_m(features), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
