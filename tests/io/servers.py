"""Storage servers for tests on 127.0.0.1: GCS (gcp-storage-emulator), Azure Blob (Azurite),
and an HTTP server that ignores ``If-Match``.

Each object store is reached the way a user reaches the real one: through the backend's
standard environment variables (``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``,
the ``AWS_*`` variables for S3), and filled by the vendor's own client library, not by the
code under test. ``FaultProxy`` sits in front of any of them and cuts responses or answers a
fixed HTTP status.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Where `make install-test` puts Azurite (npm ci --prefix .ci/node).
AZURITE = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, documented by Microsoft).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Wait until ``proc`` listens on ``port``; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not start in {timeout} s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class GcsServer:
    """gcp-storage-emulator (the GCS JSON API) on 127.0.0.1, in memory."""

    port: int
    scheme: str = "gs"
    proc: subprocess.Popen[bytes] | None = None

    def endpoint_env(self, port: int | None = None) -> dict[str, str]:
        """The standard variable pointing gcsfs at the emulator (or at ``port``)."""
        # NO_GCE_CHECK: google-auth never probes a metadata server for credentials.
        return {
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port or self.port}",
            "NO_GCE_CHECK": "True",
        }

    def start(self) -> None:
        """Start the emulator (its state starts empty)."""
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gcp_storage_emulator", "start"),
                *("--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "-q"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, self.proc)

    def stop(self) -> None:
        """Stop the emulator."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def put_tree(self, bucket: str, root: Path, prefix: str = "") -> str:
        """Upload every file under ``root`` with google-cloud-storage; return the URI."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": f"http://127.0.0.1:{self.port}"},
        )
        b = client.bucket(bucket)
        if not b.exists():
            client.create_bucket(bucket)
        for p in sorted(root.rglob("*")):
            if p.is_file():
                key = (prefix + "/" if prefix else "") + p.relative_to(root).as_posix()
                b.blob(key).upload_from_filename(str(p))
        return f"gs://{bucket}/{prefix}" if prefix else f"gs://{bucket}"


@dataclass
class AzureServer:
    """Azurite's Blob service on 127.0.0.1, in memory."""

    port: int
    scheme: str = "az"
    proc: subprocess.Popen[bytes] | None = None

    def connection_string(self, port: int | None = None, key: str = AZURE_KEY) -> str:
        """The connection string of the development account (at ``port`` if given)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint=http://127.0.0.1:{port or self.port}/{AZURE_ACCOUNT};"
        )

    def endpoint_env(self, port: int | None = None) -> dict[str, str]:
        """The standard variable pointing adlfs at Azurite (or at ``port``)."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string(port)}

    def start(self) -> None:
        """Start Azurite (its state starts empty)."""
        if not AZURITE.exists():
            raise RuntimeError(
                f"{AZURITE} is missing: install Azurite with `npm ci --prefix .ci/node` "
                "(`make install-test` does it)"
            )
        self.proc = subprocess.Popen(
            [
                str(AZURITE),
                *("--blobHost", "127.0.0.1", "--blobPort", str(self.port)),
                *("--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck"),
                "--silent",
            ],
            cwd=str(AZURITE.parents[2]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_port(self.port, self.proc)

    def stop(self) -> None:
        """Stop Azurite."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def put_tree(self, bucket: str, root: Path, prefix: str = "") -> str:
        """Upload every file under ``root`` with azure-storage-blob; return the URI."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(self.connection_string())
        container = service.get_container_client(bucket)
        with contextlib.suppress(ResourceExistsError):
            container.create_container()
        for p in sorted(root.rglob("*")):
            if p.is_file():
                key = (prefix + "/" if prefix else "") + p.relative_to(root).as_posix()
                with open(p, "rb") as f:
                    container.upload_blob(key, f, overwrite=True)
        return f"az://{bucket}/{prefix}" if prefix else f"az://{bucket}"


_STATUS_BODIES = {
    "s3": (
        "application/xml",
        '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
        "<Message>Access Denied</Message></Error>",
    ),
    "gs": ("application/json", '{"error": {"code": 403, "message": "Forbidden"}}'),
}


@dataclass
class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port`` that misbehaves on purpose.

    ``cut=N``: the first ``faults`` connections pass the request on, then send back only
    the first ``N`` bytes of what the server answers and close (``N = 0``: the connection is
    closed once the request arrived, before any response); later connections pass. With
    ``status`` (e.g. 403) every request is answered with that status and ``body``, like a
    server that refuses access.
    """

    target_port: int
    cut: int | None = None
    faults: int = 0
    status: int | None = None
    body: tuple[str, str] = ("text/plain", "refused")
    port: int = field(default_factory=free_port)
    cuts: int = 0
    connections: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def refusing(cls, target_port: int, status: int, scheme: str) -> FaultProxy:
        """A proxy that answers every request with ``status`` in ``scheme``'s error format."""
        return cls(target_port, status=status, body=_STATUS_BODIES.get(scheme, cls.body))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                cut = self.cut if self.cut is not None and self.cuts < self.faults else None
                if cut is not None:
                    self.cuts += 1
            threading.Thread(target=self._serve, args=(client, cut), daemon=True).start()

    def _answer(self, client: socket.socket) -> None:
        kind, text = self.body
        blob = text.encode()
        head = (
            f"HTTP/1.1 {self.status} Refused\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(blob)}\r\nConnection: close\r\n\r\n"
        ).encode()
        with contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    break
                data += chunk
            client.sendall(head + blob)

    def _serve(self, client: socket.socket, cut: int | None) -> None:
        if self.status is not None:
            self._answer(client)
            _close(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            _close(client)
            return
        if cut == 0:
            with contextlib.suppress(OSError):
                client.recv(65536)  # the request arrives; no response ever leaves
            _close(client, upstream)
            return
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        sent = 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if cut is not None and sent + len(data) >= cut:
                    client.sendall(data[: cut - sent])
                    break
                client.sendall(data)
                sent += len(data)
        _close(client, upstream)

    def close(self) -> None:
        """Stop listening."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := a.recv(65536):
            b.sendall(data)
    with contextlib.suppress(OSError):
        b.shutdown(socket.SHUT_WR)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


class IgnoringIfMatchServer:
    """An HTTP server on 127.0.0.1 serving ``blob`` as ``/a.jsonl``: it honours ``Range`` and
    sends a strong ``ETag`` (the content's MD5) but ignores ``If-Match``, as some servers and
    proxies do. ``conditions`` lists the ``If-Match`` values received."""

    def __init__(self, blob: bytes) -> None:
        import hashlib
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.blob = blob
        self.conditions: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _head(self) -> tuple[int, bytes]:
                if self.path != "/a.jsonl":  # e.g. a dataset index looked for beside it
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return 404, b""
                data = outer.blob
                tag = hashlib.md5(data).hexdigest()
                rng = self.headers.get("Range")
                if self.headers.get("If-Match"):
                    outer.conditions.append(self.headers["If-Match"])
                body, status = data, 200
                if rng:
                    lo, _, hi = rng.removeprefix("bytes=").partition("-")
                    body = data[int(lo) : int(hi) + 1 if hi else len(data)]
                    status = 206
                self.send_response(status)
                self.send_header("ETag", f'"{tag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body) if rng else len(data)))
                if rng:
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
                self.end_headers()
                return status, body

            def do_HEAD(self) -> None:
                self._head()

            def do_GET(self) -> None:
                _, body = self._head()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a.jsonl"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
