"""Benchmarks that speak to a running server: `bench serve` (serve.py), its request sets
(datasets.py) and the numbers it reports (metrics.py)."""
