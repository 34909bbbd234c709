"""pytorch/examples reinforcement_learning/actor_critic.py, on a small corridor environment instead of gym's CartPole.

The bug: the returns are normalised with `returns.std()`, and an episode that ends after a single step
(the agent starts next to the goal) has one return, whose std (with Bessel's correction) is NaN. The NaN
loss makes every weight NaN after optimizer.step(), and the next `Categorical(probs)` rejects [nan, nan].
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
parser.add_argument('--gamma', type=float, default=0.99, metavar='G')
parser.add_argument('--seed', type=int, default=543, metavar='N')
parser.add_argument('--log-interval', type=int, default=10, metavar='N')
args = parser.parse_args()


class Corridor:
    """Walk left or right along 12 cells; reaching either end gives reward 1 and ends the episode."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.size = 12

    def reset(self):
        self.pos = int(self.rng.integers(1, self.size - 1))
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos / self.size, 1.0 - self.pos / self.size,
                         float(self.pos == 1), float(self.pos == self.size - 2)], dtype=np.float32)

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        terminated = self.pos in (0, self.size - 1)
        return self._obs(), 1.0 if terminated else 0.0, terminated, False, {}


env = Corridor(args.seed)
torch.manual_seed(args.seed)

SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])


class Policy(nn.Module):
    """
    implements both actor and critic in one model
    """
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)
        self.saved_actions = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.affine1(x))
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

    optimizer.zero_grad()
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    loss.backward()
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
        if i_episode >= 500:
            break


if __name__ == '__main__':
    main()
