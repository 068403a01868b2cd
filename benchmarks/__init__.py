"""Benchmarks: zephon-nodes side by side with Grain, TorchTitan and torchdata.nodes."""
