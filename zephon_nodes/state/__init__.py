"""Checkpoint state: the schema, codec, files, multi-rank layout, merge, lineage and DCP codec.

One package owns every byte of a saved state; the engine, the CLI and both TorchTitan adapters
read and write checkpoints only through it.
"""
