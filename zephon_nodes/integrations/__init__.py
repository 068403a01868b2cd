"""Integrations with training frameworks (TorchTitan)."""
