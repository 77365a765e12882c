"""Benchmark of redistribution strategies: shared cases, XLA's plans, a network model."""
