"""Actor-critic on a CartPole-like task, cut from pytorch/examples reinforcement_learning/actor_critic.py.

The bug: finish_episode() updates the critic first (value_loss.backward(retain_graph=True),
optimizer.step()) and then back-propagates the actor loss through the same graph. The
step has already changed `action_head.weight` in place, and the policy loss's backward
needs the old value of the shared `affine2.weight`. The original sums both losses, calls backward() once, then steps.
"""

import argparse
from collections import namedtuple
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

parser = argparse.ArgumentParser(description='PyTorch actor-critic example')
parser.add_argument('--gamma', type=float, default=0.99)
parser.add_argument('--seed', type=int, default=543)
parser.add_argument('--log-interval', type=int, default=10)
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

SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])


class Policy(nn.Module):
    """implements both actor and critic in one model"""

    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 128)
        self.affine2 = nn.Linear(128, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)
        self.saved_actions = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.affine1(x))
        x = F.relu(self.affine2(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


model = Policy()
optimizer = optim.Adam(model.parameters(), lr=3e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float()
    probs, state_value = model(state)
    m = Categorical(probs)
    action = m.sample()
    model.saved_actions.append(SavedAction(m.log_prob(action), state_value))
    return action.item()


def finish_episode():
    R = 0
    saved_actions = model.saved_actions
    policy_losses = []
    value_losses = []
    returns = []
    for r in model.rewards[::-1]:
        R = r + args.gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)

    for (log_prob, value), R in zip(saved_actions, returns):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))

    policy_loss = torch.stack(policy_losses).sum()
    value_loss = torch.stack(value_losses).sum()

    # critic update, then actor update
    optimizer.zero_grad()
    value_loss.backward(retain_graph=True)
    optimizer.step()
    optimizer.zero_grad()
    policy_loss.backward()
    optimizer.step()

    del model.rewards[:]
    del model.saved_actions[:]


def main():
    running_reward = 10
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for t in range(1, 10000):
            action = select_action(state)
            state, reward, terminated, truncated, _ = env.step(action)
            model.rewards.append(reward)
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
