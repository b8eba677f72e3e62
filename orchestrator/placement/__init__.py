"""Placement: tensor or pipeline parallelism, and each rank's share of the model."""
