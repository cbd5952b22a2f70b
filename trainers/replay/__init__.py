"""Replay storage of the DQN family: uniform and prioritized buffers, the sum tree, replay files."""
