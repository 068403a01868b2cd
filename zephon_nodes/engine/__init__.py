"""The engine: work items and WorkSources, lanes, the worker pool, the multiplexer, checkpoints.

``work`` and ``mixing`` deal numbered work items to lanes (pure functions of the recipe),
``lane`` runs them through the operator chain with flush points, ``pool`` is the worker pool,
``multiplexer`` is one rank's view of the global batches, ``checkpoint`` its state, and
``pipeline`` compiles a recipe into all of these.
"""
