"""What runs around the training loop: logging, signals, seeding, ranks, schedules and episode counts."""
