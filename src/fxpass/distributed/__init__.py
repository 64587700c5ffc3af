"""Tensor parallelism for captured programs (in progress)."""
