"""Networks (the Nature CNN, the MinAtar network, MLPs and their actor-critic and Q heads) and the flat optimisers for small ones."""
