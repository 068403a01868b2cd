"""Helper process (a rank): a worker holds an unsent shared-memory result; wait for SIGKILL.

Prints ``<worker pid> <file prefix>`` once the file exists.
"""

from __future__ import annotations

import os
import time

from tests.fault.faulty_ops import worker_pid
from tests.fault.shm_ops import export_then
from zephon_nodes import WorkerPool


def main() -> None:
    pool = WorkerPool(1, "process", timeout_s=120)
    pid = pool.submit(worker_pid, 0.0).result(timeout=120)
    prefix = pool._prefix
    pool.submit(export_then, (prefix, "hang"))
    while not any(n.startswith(prefix) for n in os.listdir("/dev/shm")):
        time.sleep(0.05)
    print(pid, prefix, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
