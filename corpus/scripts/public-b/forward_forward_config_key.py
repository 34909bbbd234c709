"""Forward-forward training on MNIST-shaped data, cut from pytorch/examples
mnist_forward_forward/main.py, with its argparse options moved into a `config` dict (random
normalised 784-pixel 'images', 1000 samples, CPU).

The bug: Layer.train() logs every `config["log-interval"]` epochs, but the dict spells the
key "log_interval" (the argparse flag's attribute name). A plain Python KeyError in the
user's configuration, raised after the first optimisation step; no PyTorch fault. Use
config["log_interval"].
"""

import torch
import torch.nn as nn
from torch.optim import Adam

config = {
    "epochs": 60,
    "lr": 0.03,
    "seed": 1,
    "train_size": 1000,
    "threshold": 2,
    "log_interval": 10,
}
device = torch.device("cpu")


def get_y_neg(y):
    y_neg = y.clone()
    for idx, y_samp in enumerate(y):
        allowed_indices = list(range(10))
        allowed_indices.remove(y_samp.item())
        y_neg[idx] = torch.tensor(allowed_indices)[torch.randint(len(allowed_indices), size=(1,))].item()
    return y_neg.to(device)


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Net(torch.nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = []
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1]).to(device)]

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer: ", i)
            h_pos, h_neg = layer.train(h_pos, h_neg)


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=config["lr"])
        self.threshold = config["threshold"]
        self.num_epochs = config["epochs"]

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log1p(torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if i % config["log-interval"] == 0:
                print("Loss: ", loss.item())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


if __name__ == "__main__":
    torch.manual_seed(config["seed"])
    # stands in for MNIST with ToTensor(), Normalize((0.1307,), (0.3081,)) and flatten
    x = torch.randn(config["train_size"], 784)
    y = torch.randint(0, 10, (config["train_size"],))
    net = Net([784, 500, 500])
    x_pos = overlay_y_on_x(x, y)
    y_neg = get_y_neg(y)
    x_neg = overlay_y_on_x(x, y_neg)
    net.train(x_pos, x_neg)
