"""A local Ray cluster of several nodes on this machine, started with the ``ray`` CLI.

Each node is ``ray start --block`` in its own session (so the whole node can be stopped, or
killed like a lost machine, without touching other Ray processes on the machine), bound to
127.0.0.1 with explicitly chosen free ports and a private temp dir.

Every process of a node (``ray start``, GCS, raylet, agents, the workers its raylet starts)
inherits the environment variable ``MARKER=<cluster temp dir>:node<i>``, so a node or the whole
cluster is found by that marker, not by the process tree (a process whose parent died is
re-parented and leaves the tree). A watchdog process, in its own session, holds a pipe from the
test process: when the test process ends in any way (even ``_exit`` or SIGKILL, where no
finalizer runs) it SIGKILLs every process of the cluster, so no Ray process outlives the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
MARKER = "ZEPHON_TEST_RAY_CLUSTER"
# Ray 2.60 starts an OpenTelemetry metrics reader thread per ray.init that ray.shutdown does
# not stop; once the cluster is stopped its exports fail and it logs, and a log while the
# process exits (static destructors) segfaults in spdlog (exit status 139 after the tests
# passed; core dump: OpenTelemetryMetricExporter::Export -> RayLog). The tests need no metrics.
NO_METRICS = {"RAY_enable_open_telemetry": "0"}
# A lost node is noticed within ~2 s instead of Ray's default ~30 s.
FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound, then released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def marked_pids(prefix: str) -> list[int]:
    """Live processes whose ``MARKER`` value starts with ``prefix`` (zombies are not)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var.startswith(f"{MARKER}={prefix}".encode()):
                out.append(int(entry))
                break
    return out


def kill_marked(prefix: str, timeout_s: float = 30.0) -> None:
    """SIGKILL every process marked ``prefix...`` until none is left (new ones included)."""
    deadline = time.monotonic() + timeout_s
    while pids := marked_pids(prefix):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray processes {pids} ({MARKER}={prefix}...) survive SIGKILL")
        time.sleep(0.02)


# Run by the watchdog process: wait for EOF on stdin (the test process closed the pipe or
# died), then kill the cluster's processes and remove its temp dir.
_WATCHDOG = """
import shutil, sys
sys.stdin.buffer.read()
from tests.distributed.ray_cluster import kill_marked
kill_marked(sys.argv[1])
shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


class RayNode:
    """One ``ray start --block`` process and every process it started."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, marker: str) -> None:
        self.proc = proc
        self.log = log
        self.marker = marker

    def pids(self) -> list[int]:
        """The node's live processes (found by their ``MARKER``)."""
        return marked_pids(self.marker)

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as when its machine is lost."""
        kill_marked(self.marker)
        self.proc.wait(timeout=30)


class LocalRayCluster:
    """A head node plus ``extra_nodes`` worker nodes, ``cpus`` CPUs each, on 127.0.0.1."""

    def __init__(self, extra_nodes: int = 1, cpus: int = 1) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="zr-"))
        self.nodes: list[RayNode] = []
        self.cpus = cpus
        self.env = dict(
            os.environ,
            **FAST_HEALTH,
            **NO_METRICS,
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="disabled",
        )
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.getcwd(), self.env.get("PYTHONPATH", "")) if p
        )
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.tag = f"{self.tmp}:node"
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, self.tag, str(self.tmp)],
            stdin=subprocess.PIPE,
            env={k: v for k, v in self.env.items() if k != MARKER},
            start_new_session=True,
        )
        try:
            self._start(head=True)
            for _ in range(extra_nodes):
                self._start(head=False)
        except BaseException:
            self.stop()
            raise

    def _start(self, head: bool) -> RayNode:
        ports = free_ports(7)
        i = len(self.nodes)
        cmd = [
            RAY, "start", "--block", "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.cpus}", f"--object-store-memory={96 * 1024 * 1024}",
            f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-listen-port={ports[2]}",
            f"--dashboard-agent-grpc-port={ports[3]}",
            f"--runtime-env-agent-port={ports[4]}", f"--metrics-export-port={ports[5]}",
            "--disable-usage-stats",
        ]  # fmt: skip
        if head:
            cmd += [
                "--head", f"--port={self.port}", "--include-dashboard=false",
                f"--ray-client-server-port={ports[6]}", f"--temp-dir={self.tmp / 'ray'}",
            ]  # fmt: skip
        else:
            cmd += [f"--address={self.address}"]
        log = self.tmp / f"node{i}.log"
        marker = f"{self.tag}{i}:"  # the colon keeps node1 from matching node10
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                env=dict(self.env, **{MARKER: marker}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node = RayNode(proc, log, marker)
        self.nodes.append(node)
        self._wait_nodes(len(self.nodes))
        return node

    def _wait_nodes(self, n: int, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"ray start exited ({node.proc.returncode}):\n"
                        + node.log.read_text(errors="replace")[-3000:]
                    )
            text = self.nodes[-1].log.read_text(errors="replace")
            if "Ray runtime started" in text or "--block" in text:
                return
            time.sleep(0.2)
        raise TimeoutError(f"ray node {n} did not start within {timeout_s}s")

    def stop(self) -> None:
        """Stop every node (worker nodes first), kill what is left; the temp dir is removed."""
        import shutil

        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=20)
        try:
            kill_marked(self.tag)  # agents and workers a stopped node left behind
            for node in self.nodes:
                node.proc.wait(timeout=30)
        finally:
            if self.watchdog.stdin is not None:
                self.watchdog.stdin.close()  # the watchdog sweeps once more, then exits
            self.watchdog.wait(timeout=60)
            shutil.rmtree(self.tmp, ignore_errors=True)
