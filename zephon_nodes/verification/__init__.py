"""Checking the promise: global batch digests, simulated ranks, the settings matrix, reports.

``digest`` defines the byte layout, ``simulate`` runs ``R`` ranks in one process, ``matrix``
runs a recipe under many physical settings (``zephon verify``), ``report`` draws the result and
``baselines`` holds the naive rank-sharded loader it is compared with.
"""
