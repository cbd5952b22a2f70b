"""The one checkpoint format: the atomic, checksummed file, and the replay buffer's section of it."""
