"""DINO's k-NN evaluation (eval_knn.py, knn_classifier) on random features, in a job with a memory limit.

The bug: `num_chunks` was set to 1 ("no need to chunk on a big node"), so the similarity of all 10000 test
features against all 50000 train features, a 10000 x 50000 float32 matrix (2.0 GB), is allocated in one go,
beyond what the job may use. Keep eval_knn's chunking (100 chunks: 20 MB each) or compute on fewer test images
at a time.

The job's limit (SLURM's --mem, `ulimit -v`) is set by the script itself: 1 GiB above what it already uses,
so the failure is quick and harmless on any machine.
"""

import resource

import torch
import torch.nn as nn


def job_memory_limit(extra_bytes=1 << 30):
    with open("/proc/self/status") as status:
        vm_size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = vm_size_kb * 1024 + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


@torch.no_grad()
def knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes=1000, num_chunks=100):
    top1, top5, total = 0.0, 0.0, 0
    train_features = train_features.t()
    num_test_images = test_labels.shape[0]
    imgs_per_chunk = num_test_images // num_chunks
    retrieval_one_hot = torch.zeros(k, num_classes)
    for idx in range(0, num_test_images, imgs_per_chunk):
        features = test_features[idx: min((idx + imgs_per_chunk), num_test_images), :]
        targets = test_labels[idx: min((idx + imgs_per_chunk), num_test_images)]
        batch_size = targets.shape[0]

        similarity = torch.mm(features, train_features)
        distances, indices = similarity.topk(k, largest=True, sorted=True)
        candidates = train_labels.view(1, -1).expand(batch_size, -1)
        retrieved_neighbors = torch.gather(candidates, 1, indices)

        retrieval_one_hot.resize_(batch_size * k, num_classes).zero_()
        retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
        distances_transform = distances.clone().div_(T).exp_()
        probs = torch.sum(torch.mul(retrieval_one_hot.view(batch_size, -1, num_classes),
                                    distances_transform.view(batch_size, -1, 1)), 1)
        _, predictions = probs.sort(1, True)
        correct = predictions.eq(targets.data.view(-1, 1))
        top1 = top1 + correct.narrow(1, 0, 1).sum().item()
        top5 = top5 + correct.narrow(1, 0, min(5, k)).sum().item()
        total += targets.size(0)
    return top1 * 100.0 / total, top5 * 100.0 / total


def extract_features(model, num_images, batch_size=2500):
    return torch.cat([nn.functional.normalize(model(torch.randn(batch_size, 64)), dim=1, p=2)
                      for _ in range(num_images // batch_size)])


def main():
    job_memory_limit()
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256))
    with torch.no_grad():
        train_features = extract_features(model, 50000)
        test_features = extract_features(model, 10000)
    train_labels, test_labels = torch.randint(0, 1000, (50000,)), torch.randint(0, 1000, (10000,))
    top1, top5 = knn_classifier(train_features, train_labels, test_features, test_labels, k=20, T=0.07, num_chunks=1)
    print(f"20-NN classifier result: Top1: {top1}, Top5: {top5}")


if __name__ == "__main__":
    main()
