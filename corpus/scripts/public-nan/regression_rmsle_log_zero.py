#!/usr/bin/env python
"""pytorch/examples regression/main.py, fitting a count target with a hand-written RMSLE loss.

The bug: the loss takes torch.log of the targets, and counts include 0: log(0) = -inf, so the loss is inf at
the first batch, the gradient is inf/NaN, and the plain SGD update writes NaN into the weights. RMSLE is
defined on log(1 + y): torch.log1p.
"""
from __future__ import print_function

import torch
import torch.nn.functional as F

POLY_DEGREE = 4
torch.manual_seed(3)
W_target = torch.randn(POLY_DEGREE, 1) * 0.5
b_target = torch.randn(1) * 0.5


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


def f(x):
    """Approximated function: a count (daily rentals, say) whose rate follows the polynomial."""
    rate = torch.exp(x.mm(W_target) + b_target.item()).clamp(max=50)
    return torch.poisson(rate)


def get_batch(batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.randn(batch_size)
    x = make_features(random)
    y = f(x)
    return x, y


def rmsle(prediction, target):
    return torch.sqrt(F.mse_loss(torch.log(prediction), torch.log(target)))


# Define model
fc = torch.nn.Linear(W_target.size(0), 1)

for batch_idx in range(1, 201):
    batch_x, batch_y = get_batch()
    fc.zero_grad()
    output = rmsle(F.softplus(fc(batch_x)), batch_y)
    loss = output.item()
    output.backward()
    for param in fc.parameters():
        param.data.add_(-0.1 * param.grad)
    if loss < 1e-3:
        break

print('Loss: {:.6f} after {} batches'.format(loss, batch_idx))
print('==> Learned weights:\t{}'.format(fc.weight.view(-1).tolist()))
