"""pytorch/examples gcn/main.py (a two-layer GCN on Cora), with the model built from the wrong axis.

The bug: GCN(features.shape[0], ...) passes the number of nodes (2708) as input_dim, where the
example passes features.shape[1], the 1433 bag-of-words features per node. gc1's kernel is
built as [2708, 16] and torch.mm(input_tensor, self.kernel) on the sparse [2708, 1433] feature
matrix fails. Build the model with GCN(features.shape[1], ...).
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Adam


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=False):
        super(GraphConv, self).__init__()

        # Initialize the weight matrix W (in this case called `kernel`)
        self.kernel = nn.Parameter(torch.Tensor(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)  # Initialize the weights using Xavier initialization

        # Initialize the bias (if use_bias is True)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.Tensor(output_dim))
            nn.init.zeros_(self.bias)  # Initialize the bias to zeros

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)  # Matrix multiplication between input and weight matrix
        output = torch.spmm(adj_mat, support)  # Sparse matrix multiplication between adjacency matrix and support
        # Add the bias (if bias is not None)
        if self.bias is not None:
            output = output + self.bias

        return output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_bias=True, dropout_p=0.1):
        super(GCN, self).__init__()

        # Define the Graph Convolution layers
        self.gc1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gc2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)

        # Define the dropout layer
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        # Perform the first graph convolutional layer
        x = self.gc1(input_tensor, adj_mat)
        x = F.relu(x)  # Apply ReLU activation function
        x = self.dropout(x)  # Apply dropout regularization

        # Perform the second graph convolutional layer
        x = self.gc2(x, adj_mat)

        # Apply log-softmax activation function for classification
        return F.log_softmax(x, dim=1)


def load_cora(device='cpu', V=2708, n_features=1433, n_classes=7, E=5429):
    """Cora's sizes, random content (no download): the same normalisation steps as the example."""
    rng = np.random.default_rng(0)
    features = torch.FloatTensor((rng.random((V, n_features)) < 0.0127).astype(np.int32))
    scale_vector = torch.sum(features, dim=1)  # Compute sum of features for each node
    scale_vector = 1 / scale_vector  # Compute reciprocal of the sums
    scale_vector[scale_vector == float('inf')] = 0  # Handle division by zero cases
    scale_vector = torch.diag(scale_vector).to_sparse()  # Convert the scale vector to a sparse diagonal matrix
    features = scale_vector @ features  # Scale the features using the scale vector

    labels = torch.LongTensor(rng.integers(0, n_classes, V))

    edges = rng.integers(0, V, size=(E, 2))
    adj_mat = torch.sparse_coo_tensor(edges.T, torch.ones(E), (V, V), dtype=torch.int64)
    adj_mat = torch.eye(V) + adj_mat  # Add self-loops to the adjacency matrix

    degree_mat = torch.sum(adj_mat, dim=1)  # Compute the sum of each row in the adjacency matrix (degree matrix)
    degree_mat = torch.sqrt(1 / degree_mat)  # Compute the reciprocal square root of the degrees
    degree_mat[degree_mat == float('inf')] = 0  # Handle division by zero cases
    degree_mat = torch.diag(degree_mat).to_sparse()  # Convert the degree matrix to a sparse diagonal matrix

    adj_mat = degree_mat @ adj_mat @ degree_mat  # Apply the renormalization trick

    return features.to_sparse().to(device), labels.to(device), adj_mat.to_sparse().to(device)


def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val, print_every=10):
    model.train()
    optimizer.zero_grad()

    # Forward pass
    output = model(*input)
    loss = criterion(output[mask_train], target[mask_train])  # Compute the loss using the training mask

    loss.backward()
    optimizer.step()
    if epoch % print_every == 0:
        print(f'Epoch: {epoch:04d} loss_train: {loss.item():.4f}')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='PyTorch Graph Convolutional Network')
    parser.add_argument('--epochs', type=int, default=5)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--l2', type=float, default=5e-4)
    parser.add_argument('--dropout-p', type=float, default=0.5)
    parser.add_argument('--hidden-dim', type=int, default=16)
    parser.add_argument('--include-bias', action='store_true')
    parser.add_argument('--seed', type=int, default=42, metavar='S')
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device('cpu')

    print('Loading dataset...')
    features, labels, adj_mat = load_cora(device=device)
    idx = torch.randperm(len(labels)).to(device)
    idx_test, idx_val, idx_train = idx[:1000], idx[1000:1500], idx[1500:]

    gcn = GCN(features.shape[0], args.hidden_dim, labels.max().item() + 1, args.include_bias, args.dropout_p).to(device)
    optimizer = Adam(gcn.parameters(), lr=args.lr, weight_decay=args.l2)
    criterion = nn.NLLLoss()

    for epoch in range(args.epochs):
        train_iter(epoch + 1, gcn, optimizer, criterion, (features, adj_mat), labels, idx_train, idx_val)
