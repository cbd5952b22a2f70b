"""The algorithms: A2C and PPO on the on-policy base, the DQN family on its own base."""
