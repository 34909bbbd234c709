"""REINFORCE on a CartPole-like task, cut from pytorch/examples reinforcement_learning/reinforce.py.

The bug: select_action() samples the action with numpy from the policy's probabilities,
`np.random.choice(2, p=probs.numpy()[0])`. probs comes out of the policy and requires grad,
so .numpy() refuses. Use probs.detach().numpy() for the sampling (the saved log_prob keeps
its graph, so the policy gradient is unchanged).
"""

import argparse
from collections import deque
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

parser = argparse.ArgumentParser(description='PyTorch REINFORCE example')
parser.add_argument('--gamma', type=float, default=0.99, metavar='G')
parser.add_argument('--seed', type=int, default=543, metavar='N')
parser.add_argument('--log-interval', type=int, default=10, metavar='N')
args = parser.parse_args()


class CartPole:
    """A stand-in for gym's CartPole-v1: 4 observations, 2 actions, episodes of 8 to 40 steps."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.t = 0

    def reset(self):
        self.t = 0
        return self.rng.normal(size=4).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        state = self.rng.normal(size=4).astype(np.float32)
        terminated = self.t >= 8 and (self.rng.random() < 0.1 or self.t >= 40)
        return state, 1.0, terminated, False, {}


env = CartPole(args.seed)
torch.manual_seed(args.seed)


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


policy = Policy()
optimizer = optim.Adam(policy.parameters(), lr=1e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(state)
    action = np.random.choice(2, p=probs.numpy()[0])
    m = Categorical(probs)
    policy.saved_log_probs.append(m.log_prob(torch.tensor([action])))
    return action


def finish_episode():
    R = 0
    policy_loss = []
    returns = deque()
    for r in policy.rewards[::-1]:
        R = r + args.gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for log_prob, R in zip(policy.saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]


def main():
    running_reward = 10
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for t in range(1, 10000):  # Don't infinite loop while learning
            action = select_action(state)
            state, reward, terminated, truncated, _ = env.step(action)
            policy.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break

        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        finish_episode()
        if i_episode % args.log_interval == 0:
            print(f'Episode {i_episode}\tLast reward: {ep_reward:.2f}\tAverage reward: {running_reward:.2f}')
        if i_episode >= 50:
            break


if __name__ == '__main__':
    main()
