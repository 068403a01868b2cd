"""The bottom layer: what every other room may import and which imports nothing of the package.

Errors, the settings object, flush points, seeding, work items and canonical JSON.
"""
