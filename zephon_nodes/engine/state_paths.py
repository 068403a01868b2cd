"""Former home of the ``Loader``-state search; it lives in :mod:`zephon_nodes.state.locate`."""

from __future__ import annotations

from zephon_nodes.state.locate import LocatedState, locate_state, replace_state

__all__ = ["LocatedState", "locate_state", "replace_state"]
