"""Support modules of ``examples/reproduce.py`` (demo-only; not part of the library)."""
