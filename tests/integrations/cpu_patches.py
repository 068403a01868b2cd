"""The CPU patches moved into the library: :mod:`zephon_nodes.integrations.torchtitan_cpu`."""

from zephon_nodes.integrations.torchtitan_cpu import apply

__all__ = ["apply"]
