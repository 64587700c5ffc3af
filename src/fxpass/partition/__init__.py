"""Partitioning: operator support, capability / pattern / source partitions, and fusing them."""
