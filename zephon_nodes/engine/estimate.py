"""The token estimate a mixture is planned with: tokens per record, from a seeded sample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon_nodes.core.seeding import permutation
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.dataset import Dataset

__all__ = ["estimate_tokens_per_record"]

_ESTIMATE_TAG = 0x45535449  # "ESTI"


def _round6(x: float) -> float:
    return float(f"{x:.6g}")


def estimate_tokens_per_record(
    datasets: Sequence[Dataset],
    chain: Callable[[WorkItem], Any],
    seed: int,
    records: int,
) -> list[float]:
    """Estimate non-padding tokens per record of each dataset from a seeded sample.

    Work items are drawn in a seeded order until ``records`` records are read; each is run
    through ``chain`` (parse, filters, maps, tokenize: the lane's stateless operators), and
    the ``n - 1`` (input, label) pairs of every document are counted. Records skipped or
    filtered count as records with no token. Values are rounded to 6 significant digits.

    Returns:
        Tokens per record, per dataset (recipe order).
    """
    out = []
    for d, ds in enumerate(datasets):
        order = permutation(ds.num_work_items, seed, d, _ESTIMATE_TAG)
        tokens = read = 0
        for item in order.tolist():
            shard, start, stop = ds.locate(item)
            work = WorkItem(d, ds.name, ds.text_field, item, 0, ds.shards[shard], start, stop, 0, 0)
            batch = chain(work)
            tokens += int(np.maximum(batch.lengths - 1, 0).sum())
            read += stop - start
            if read >= records:
                break
        out.append(_round6(tokens / read) if read else 0.0)
    return out
