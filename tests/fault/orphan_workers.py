"""Helper process: start a process-runner pool, print its worker pids, wait to be SIGKILLed."""

from __future__ import annotations

import time

from tests.fault.faulty_ops import worker_pid
from zephon_nodes import WorkerPool


def main() -> None:
    pool = WorkerPool(2, "process", timeout_s=120)
    futures = [pool.submit(worker_pid, 0.2) for _ in range(8)]
    pids = sorted({f.result(timeout=120) for f in futures})
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
