"""Property-test kit for people who write their own operators, nodes and recipes.

Checks (each raises ``AssertionError`` on a minimal counterexample):

- :func:`assert_worker_invariant`: a stateless operator gives the same output whatever the
  pool, worker or thread it runs on;
- :func:`assert_flush_replay_exact`: an accumulator keeps nothing across a flush and
  restores exactly by replay;
- :func:`assert_state_roundtrip`: a node's ``get_state`` returns a JSON-safe copy that
  restores exactly from any position;
- :func:`assert_save_load_state`: torchdata's save/load contract (mid-epoch, next epoch,
  end of epoch) through a ``Loader``;
- :func:`assert_elastic`: a whole recipe gives identical global batches at every dp size,
  worker count and resume.

Strategies for your own tests are in :mod:`zephon_nodes.testing.strategies`. Needs
``hypothesis`` (``pip install zephon-nodes[testing]``).
"""

from zephon_nodes.testing import strategies
from zephon_nodes.testing.checks import (
    ListWorkSource,
    assert_elastic,
    assert_flush_replay_exact,
    assert_save_load_state,
    assert_state_roundtrip,
    assert_worker_invariant,
    list_source,
)

__all__ = [
    "ListWorkSource",
    "assert_elastic",
    "assert_flush_replay_exact",
    "assert_save_load_state",
    "assert_state_roundtrip",
    "assert_worker_invariant",
    "list_source",
    "strategies",
]
