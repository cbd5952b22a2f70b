"""Asynchronous sampling and optimisation: a sampler process beside the optimiser."""
