"""A DQN update step after the environment gained a fifth action ("no-op").

The bug: the replay buffer now holds actions 0..4, but the Q-network still has 4 outputs
(N_ACTIONS was not updated where the network is built), so gathering Q(s, a) for
action 4 is out of bounds. Size the output layer from the environment's action space.
"""

import random

import torch
import torch.nn as nn

ENV_ACTIONS = ["left", "right", "up", "down", "noop"]
N_ACTIONS = 4  # set before "noop" was added


def q_network(state_dim=8):
    return nn.Sequential(nn.Linear(state_dim, 64), nn.ReLU(), nn.Linear(64, N_ACTIONS))


def main():
    random.seed(0)
    torch.manual_seed(0)
    policy, target = q_network(), q_network()
    target.load_state_dict(policy.state_dict())
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    buffer = [(torch.randn(8), random.randrange(len(ENV_ACTIONS)), random.random(), torch.randn(8)) for _ in range(256)]
    for step in range(20):
        states, actions, rewards, next_states = zip(*random.sample(buffer, 32))
        states, next_states = torch.stack(states), torch.stack(next_states)
        actions, rewards = torch.tensor(actions), torch.tensor(rewards)
        q = policy(states).gather(1, actions.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            expected = rewards + 0.99 * target(next_states).max(dim=1).values
        loss = nn.functional.smooth_l1_loss(q, expected)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
