"""Helper process: an operator blocks forever; the loader must raise, the process must exit.

Usage: ``python blocked_exit.py RUNNER TIMEOUT_S PIDFILE``. Prints ``raised <seconds>`` and
returns; the parent checks the process exits and (process runner) the worker is gone.
"""

from __future__ import annotations

import sys
import time

from tests.fault.common import memory_pipeline
from tests.fault.faulty_ops import Faulty
from zephon_nodes import WorkerError, WorkerPool


def main() -> None:
    runner, timeout_s, pidfile = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    pipe = memory_pipeline()
    pipe.stateless = Faulty(pipe.stateless, "pidfile_block", path=pidfile)
    pool = WorkerPool(2, runner, timeout_s=timeout_s)
    node = pipe.rank_node(1, 0, pool=pool)
    node.reset(None)
    t0 = time.monotonic()
    try:
        while True:
            next(node)
    except WorkerError as e:
        print(f"raised {time.monotonic() - t0:.2f} {e}", flush=True)
    # deliberately no pool.close(): a crashing trainer may not close its loader either


if __name__ == "__main__":
    main()
