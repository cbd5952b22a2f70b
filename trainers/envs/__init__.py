"""The envs trainers sample from: their set-up by kind (Atari, MinAtar, classic control, PettingZoo) and batched simulators."""
