"""Subcommands of the ``zephon`` command line (one module each, see ``zephon_nodes.cli``)."""
