"""Planning: layouts in, an immutable :class:`~mpiredist.planning.plans.Plan` out.

The normal form and its candidates, byte counts, routing (who talks to whom),
the memory-budget model, the alpha-beta time model and the numpy simulator.
Pure functions of values; no MPI (import-linter checks that in CI).
"""
