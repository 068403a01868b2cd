"""Session servers for storage tests: S3 (moto), GCS (gcp-storage-emulator), Azure Blob
(Azurite) and a Range-honouring HTTP server (nginx).

All listen on 127.0.0.1 with a free port and are stopped by finalizers. A store's endpoint
and credentials are set in ``os.environ`` only while a test uses it (:func:`s3_env`,
:func:`store`), and only in the server's own subprocess environment otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.io.servers import (
    AZURITE,
    AzureServer,
    FaultProxy,
    GcsServer,
    free_port,
    stop_process,
    wait_port,
)

__all__ = ["AzureServer", "FaultProxy", "GcsServer", "HttpServer", "OutageProxy", "S3Server"]


_wait_port = wait_port
_stop = stop_process


@dataclass
class S3Server:
    """A moto S3 server on 127.0.0.1 that can be stopped and restarted on the same port."""

    port: int
    scheme: str = "s3"
    proc: subprocess.Popen[bytes] | None = None

    def endpoint_env(self, port: int | None = None) -> dict[str, str]:
        """The standard AWS variables pointing at this server (or at ``port``)."""
        return {**self.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port or self.port}"}

    def put_tree(self, bucket: str, root: Path, prefix: str = "") -> str:
        """Upload every file under ``root`` with boto3; return the URI."""
        return s3_put_tree(self, bucket, root, prefix)

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables pointing at this server (dummy credentials)."""
        return {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> None:
        """Start the server (its state starts empty)."""
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, self.proc)

    def stop(self) -> None:
        """Stop the server."""
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server for the whole session."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    server = S3Server(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Point the standard AWS variables at the session's S3 server for one test."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    from zephon_nodes.io.storage import storage

    storage._forget_filesystems()
    return s3_server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """A gcp-storage-emulator for the whole session."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    server = GcsServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzureServer]:
    """An Azurite Blob service for the whole session."""
    pytest.importorskip("adlfs")
    server = AzureServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


Store = S3Server | GcsServer | AzureServer
STORES = ("s3", "gcs", "azure")


def use_store(server: Store, mp: pytest.MonkeyPatch, port: int | None = None) -> None:
    """Point the store's standard variables at ``server`` (or at a proxy on ``port``)."""
    for k, v in server.endpoint_env(port).items():
        mp.setenv(k, v)
    from zephon_nodes.io.storage import storage

    storage._forget_filesystems()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Each object store in turn (S3, GCS, Azure), its variables set for one test."""
    server: Store = request.getfixturevalue(f"{request.param}_server")
    use_store(server, monkeypatch)
    return server


def s3_put_tree(server: S3Server, bucket: str, root: Path, prefix: str = "") -> str:
    """Upload every file under ``root`` to ``s3://bucket/prefix``; return that URI."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.env["AWS_ENDPOINT_URL"], **_creds(server))
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            key = (prefix + "/" if prefix else "") + p.relative_to(root).as_posix()
            client.upload_file(str(p), bucket, key)
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def _creds(server: S3Server) -> dict[str, str]:
    e = server.env
    return {
        "aws_access_key_id": e["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": e["AWS_SECRET_ACCESS_KEY"],
        "region_name": e["AWS_REGION"],
    }


NGINX_CONF = """\
daemon off;
{user}worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /forbidden/ {{ return 403; }}
        location /noetag/ {{ etag off; }}
    }}
}}
"""


def nginx_path() -> str | None:
    """The nginx binary (``/usr/sbin`` is off a non-root user's PATH), or None."""
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )


# One line per missing system package: what needs it and how to install it.
MISSING = {
    "nginx": "nginx is not installed (the HTTP server of the storage tests): "
    "`sudo apt-get install nginx`, or `make test`, which installs it",
    "azurite": "Azurite is not installed (the Azure Blob server of the storage tests; "
    "Node.js and npm): `sudo apt-get install nodejs npm && npm ci --prefix .ci/node`, "
    "or `make test`, which installs both",
}


def _needs(item: pytest.Item) -> set[str]:
    """The system packages a test needs: by its fixtures, or by a ``http``/``azure``
    parameter that a fixture turns into ``request.getfixturevalue`` of that server."""
    names = set(getattr(item, "fixturenames", ()))
    params = set()
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        params = {v for v in callspec.params.values() if isinstance(v, str)}
    needs = set()
    if "http_server" in names or "http" in params:
        needs.add("nginx")
    if "azure_server" in names or "azure" in params:
        needs.add("azurite")
    return needs


def _missing() -> set[str]:
    missing = set()
    if nginx_path() is None:
        missing.add("nginx")
    if not AZURITE.exists() or shutil.which("node") is None:
        missing.add("azurite")
    return missing


_REFUSED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests whose server is not installed are refused before the run: one line per missing
    package (not one error per test), and the session fails at its end."""
    missing = _missing()
    if not missing:
        return
    refused = [item for item in items if _needs(item) & missing]
    if not refused:
        return
    config.hook.pytest_deselected(items=refused)
    gone = set(refused)
    items[:] = [item for item in items if item not in gone]
    config.stash[_REFUSED] = [
        f"{sum(name in _needs(item) for item in refused)} storage tests refused: {MISSING[name]}"
        for name in sorted(missing)
        if any(name in _needs(item) for item in refused)
    ]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in config.stash.get(_REFUSED, []):
        terminalreporter.write_line(f"ERROR: {line}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash.get(_REFUSED, []) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class HttpServer:
    """An nginx serving ``root`` on 127.0.0.1 (honours ``Range``; no ``ETag`` under
    ``/noetag/``, only ``Last-Modified``)."""

    root: Path
    port: int

    def url(self, rel: str) -> str:
        """The URL of ``root/rel``."""
        return f"http://127.0.0.1:{self.port}/{rel}"


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """nginx on a free port serving a session temp dir."""
    nginx = nginx_path()
    if nginx is None:
        pytest.fail(MISSING["nginx"])
    tmp = tmp_path_factory.mktemp("nginx")
    root = tmp / "www"
    root.mkdir()
    port = free_port()
    conf = tmp / "nginx.conf"
    # As root, nginx workers would switch to a user that cannot read the 0700 temp dirs.
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, root=root))
    proc = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        yield HttpServer(root, port)
    finally:
        _stop(proc)


class OutageProxy:
    """A TCP proxy in front of a server that can drop every connection and stop listening.

    ``outage(seconds)`` makes the endpoint disappear (connections reset, new ones refused)
    and come back on the same port, as a restarted S3 endpoint would, without losing the
    server's state.
    """

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        self.restarts = 0
        self.start()

    def start(self) -> None:
        """Listen again on the same port."""
        import threading

        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        t = threading.Thread(target=self._accept, args=(s,), daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Stop listening and reset every open connection."""
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(), so the port is free at once.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                # shutdown wakes the pipe thread blocked in recv(); a bare close() would not
                # (the socket lives on, unanswered, while a thread is inside recv on it).
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                c.close()

    def outage(self, seconds: float) -> None:
        """Disappear for ``seconds``, then come back."""
        self.stop()
        time.sleep(seconds)
        self.start()
        self.restarts += 1
