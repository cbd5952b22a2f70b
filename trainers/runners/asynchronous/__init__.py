"""Asynchronous sampling and optimisation: a collector process beside the optimiser."""
