"""A local Ray cluster of several nodes on this machine, started with the ``ray`` CLI.

Each node is ``ray start --block`` in its own session (so the whole node can be stopped, or
killed like a lost machine, without touching other Ray processes on the machine), bound to
127.0.0.1 with explicitly chosen free ports and a private temp dir.
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


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


class RayNode:
    """One ``ray start --block`` process and everything it started."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def pids(self) -> list[int]:
        """The node's processes (the ``ray start`` process and its descendants)."""
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as when its machine is lost."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pid in pids:  # wait for the others to be gone (reaped by init)
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                try:
                    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                            break
                except OSError:
                    break
                time.sleep(0.02)


class LocalRayCluster:
    """A head node plus ``extra_nodes`` worker nodes, ``cpus`` CPUs each, on 127.0.0.1."""

    def __init__(self, extra_nodes: int = 1, cpus: int = 1) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="zr-"))
        self.nodes: list[RayNode] = []
        self.cpus = cpus
        self.env = dict(
            os.environ, **FAST_HEALTH, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"
        )
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.getcwd(), self.env.get("PYTHONPATH", "")) if p
        )
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
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
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        node = RayNode(proc, log)
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
        """Stop every node (worker nodes first); the temp dir is removed."""
        import shutil

        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=20)
            node.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
