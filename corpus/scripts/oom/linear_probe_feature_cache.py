"""Linear probing: cache a frozen backbone's feature maps for the whole dataset, then fit a head.

The bug: the cache is preallocated for the un-pooled feature maps of every image,
torch.empty(1_281_167, 2048, 7, 7) float32 = 514 GB of host RAM. Pool the features
before caching (2048 floats per image), or cache to a memory-mapped file.
"""

import torch
import torch.nn as nn

NUM_IMAGES = 1_281_167  # ImageNet-1k train split
BATCH = 256


def backbone():
    return nn.Sequential(nn.Conv2d(3, 64, 7, stride=4, padding=3), nn.ReLU(), nn.Conv2d(64, 2048, 3, stride=8, padding=1)).eval()


def extract_features(model, images):
    cache = torch.empty(NUM_IMAGES, 2048, 7, 7)
    with torch.no_grad():
        for start in range(0, len(images), BATCH):
            cache[start:start + BATCH] = model(images[start:start + BATCH])
    return cache


def main():
    torch.manual_seed(0)
    model = backbone()
    images = torch.randn(BATCH, 3, 224, 224)  # stands in for the image stream
    features = extract_features(model, images)
    head = nn.Linear(2048, 1000)
    print(head(features.mean(dim=(2, 3))[:8]).shape)


if __name__ == "__main__":
    main()
