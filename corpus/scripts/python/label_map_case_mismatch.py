"""Image classification from an annotations list whose class names use another spelling.

Not a PyTorch failure: CLASS_TO_IDX has lower-case names, the annotation export wrote
"Truck" with a capital letter, and the dict lookup in __getitem__ raises KeyError.
"""

import torch
from torch.utils.data import DataLoader, Dataset

CLASS_TO_IDX = {"car": 0, "truck": 1, "bus": 2, "bicycle": 3}


class Annotated(Dataset):
    def __init__(self, annotations):
        self.annotations = annotations

    def __len__(self):
        return len(self.annotations)

    def __getitem__(self, i):
        record = self.annotations[i]
        image = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(record["id"]))
        return image, CLASS_TO_IDX[record["label"]]


def main():
    names = ["car", "bus", "truck", "bicycle"] * 6
    annotations = [{"id": i, "label": name} for i, name in enumerate(names)]
    annotations[9]["label"] = "Truck"  # one annotator's spelling
    loader = DataLoader(Annotated(annotations), batch_size=4, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
